"""Model providers behind one small streaming interface (see :mod:`.base`).

``build_model(manifest["model"])`` turns a manifest's ``[model]`` table into a
provider: ``scripted`` (the offline, deterministic default), ``openai`` (any
OpenAI-compatible chat-completions endpoint, or with ``api = "responses"`` OpenAI's
Responses API) or ``anthropic``. The HTTP providers are imported
only when asked for, so an offline agent never loads httpx.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from apollia_nb.errors import ManifestInvalid

from .base import PLAN_TOOL, VERDICT_TOOL, ModelProvider, collect, parse_plan, parse_verdict
from .kit import *  # noqa: F403 - the values and stream events re-exported below (see .kit)
from .scripted import ScriptedModel

__all__ = [
    "PROVIDERS",
    "build_model",
    "ModelProvider",
    "ToolSpec",
    "ToolCallRequest",
    "Message",
    "ModelResponse",
    "ReasoningPart",
    "StreamEvent",
    "TextDelta",
    "ReasoningDelta",
    "ToolCallStarted",
    "ToolCallArgumentsDelta",
    "Completed",
    "PLAN_TOOL",
    "VERDICT_TOOL",
    "parse_plan",
    "parse_verdict",
    "collect",
    "RetryPolicy",
    "ScriptedModel",
]

PROVIDERS = ("scripted", "openai", "anthropic")


def build_model(
    model_table: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    retry: RetryPolicy | None = None,
) -> ModelProvider:
    """The provider a manifest's ``[model]`` table declares.

    ``provider`` defaults to ``"scripted"``. ``env`` (default ``os.environ``)
    is where ``api_key_env`` is looked up; ``retry`` overrides the backoff and
    sleep of the HTTP providers (``max_retries`` comes from the table).
    Unknown keys and wrong types raise ``ManifestInvalid`` naming the key.
    """
    if not isinstance(model_table, Mapping):
        raise ManifestInvalid(f"model: must be a table, got {model_table!r}")
    provider = model_table.get("provider", "scripted")
    environ: Mapping[str, str] = os.environ if env is None else env
    if provider == "scripted":
        return ScriptedModel.from_table(model_table, "model")
    if provider == "openai":  # lazy: the HTTP providers import httpx when used
        from .openai import OpenAIModel, api_of

        if api_of(model_table, "model") == "responses":
            from .responses import ResponsesModel

            return ResponsesModel.from_table(model_table, environ, "model", retry=retry)
        return OpenAIModel.from_table(model_table, environ, "model", retry=retry)
    if provider == "anthropic":
        from .anthropic import AnthropicModel

        return AnthropicModel.from_table(model_table, environ, "model", retry=retry)
    raise ManifestInvalid(f"model.provider: unknown provider {provider!r} (expected scripted, openai or anthropic)")
