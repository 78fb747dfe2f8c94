"""What an HTTP provider is written with, in one list: the interface's values and stream events,
the HTTP edge, the manifest-table readers, the wire helpers and the model errors.

Every provider module (``openai``, ``responses``, ``anthropic``) takes them with one
``from .kit import *``; a provider that needs another name of :mod:`.base` adds it here, so
the providers keep one vocabulary. Nothing is defined here: each name is :mod:`.base`'s (or
:mod:`apollia_nb.errors`').
"""

from __future__ import annotations

from apollia_nb.errors import ManifestInvalid, ModelKeyMissing, ModelPermanent, ModelTransient

from .base import (
    STRUCTURED_MODES,
    Completed,
    HttpProvider,
    HttpRequest,
    Message,
    ModelResponse,
    ReasoningDelta,
    ReasoningPart,
    RetryPolicy,
    StreamEvent,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallRequest,
    ToolCallStarted,
    ToolSpec,
    check_keys,
    check_role,
    decode_arguments,
    field_value,
    http_stream,
    loads_json,
    tool_images,
    typed_event,
)

__all__ = [
    "STRUCTURED_MODES", "Completed", "HttpProvider", "HttpRequest", "Message", "ModelResponse", "ReasoningDelta",
    "ReasoningPart", "RetryPolicy", "StreamEvent", "TextDelta", "ToolCallArgumentsDelta", "ToolCallRequest",
    "ToolCallStarted", "ToolSpec", "check_keys", "check_role", "decode_arguments", "field_value", "http_stream",
    "loads_json", "tool_images", "typed_event",
    "ManifestInvalid", "ModelKeyMissing", "ModelPermanent", "ModelTransient",
]
