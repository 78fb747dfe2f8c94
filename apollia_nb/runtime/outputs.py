"""Tool outputs are data: any value a tool or a host returns becomes a JSON value that
the digest, the journal and the model can all carry.

``json_value`` is total over what a tool can return; it never raises for the shape
of a value:

    lone surrogates in text or keys   replaced by U+FFFD
    str / int / float subclasses      their plain value (no user ``__str__``)
    NaN, inf                          their repr as text ("nan", "inf")
    ints too long to print            "<int of N bits>"
    a container met again inside
      itself (a cycle)                "<cycle>"
    more than ``NODE_BUDGET`` values,
      or nested deeper than 32        "<list not shown: …>" for the rest
    an object whose repr raises       "<Type (repr failed: Error)>"
    bytes                             UTF-8 text, or a summary when not UTF-8

``clean_text`` makes one string encodable as UTF-8 (used for error messages too).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import json
import math
import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

__all__ = ["MAX_DEPTH", "MIN_SECRET", "NODE_BUDGET", "clean_text", "json_value", "redact", "redacted_outcome", "secret_values"]

#: Values converted per output before the rest is summarised.
NODE_BUDGET = 200_000
MAX_DEPTH = 32
_REPR_CAP = 10_000
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` as a plain ``str`` that encodes as UTF-8 (lone surrogates become U+FFFD)."""
    text = str.__str__(text)
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


def _int(value: int) -> Any:
    plain = int.__int__(value)
    try:
        int.__repr__(plain)  # refuses past the interpreter's digit limit
    except ValueError:
        return f"<int of {plain.bit_length()} bits>"
    return plain


def _float(value: float) -> Any:
    plain = float.__float__(value)
    return plain if math.isfinite(plain) else repr(plain)


def _attr_or_none(value: Any, name: str) -> Any:
    try:
        return getattr(value, name, None)
    except Exception:
        return None


def _untold(value: Any) -> str:
    """What stands for a value past the depth or size budget (no repr: it could be as large)."""
    return f"<{clean_text(type(value).__name__)} not shown: the output is too large or deep>"


def capped_repr(value: Any) -> str:
    try:
        text = repr(value)
        if not isinstance(text, str):
            raise TypeError("repr did not return text")
    except Exception as exc:  # a broken __repr__ must not break the call
        text = f"<{type(value).__name__} (repr failed: {type(exc).__name__})>"
    text = clean_text(text)
    return text if len(text) <= _REPR_CAP else f"{text[:_REPR_CAP]}… [{len(text)} characters]"


class _Walk:
    def __init__(self) -> None:
        self.left = NODE_BUDGET
        self.open: set[int] = set()

    def key(self, key: Any) -> str:
        if isinstance(key, str):
            return clean_text(key)
        if isinstance(key, (bool, int, float)) or key is None:
            return clean_text(json.dumps(self.value(key, 0)))
        return capped_repr(key)

    def value(self, value: Any, depth: int) -> Any:
        self.left -= 1
        if value is None or type(value) is bool:
            return value
        if isinstance(value, str):
            return clean_text(value)
        if isinstance(value, bool):
            return bool.__bool__(value)
        if isinstance(value, int):
            return _int(value)
        if isinstance(value, float):
            return _float(value)
        if depth > MAX_DEPTH or self.left < 0:
            return _untold(value)
        if isinstance(value, enum.Enum):
            return self.value(_attr_or_none(value, "value"), depth + 1)
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                return {"type": "bytes", "length": len(data), "repr": capped_repr(data[:200])}
        if isinstance(value, PurePath):
            return clean_text(str(value))
        if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
            return clean_text(value.isoformat())
        if isinstance(value, (Mapping, list, tuple, set, frozenset)):
            return self.container(value, depth)
        if _attr_or_none(value, "shape") == () and callable(_attr_or_none(value, "item")):
            return self.value(value.item(), depth + 1)  # a numpy-like scalar
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self.container({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, depth,
                                  ident=id(value))
        return capped_repr(value)

    def container(self, value: Any, depth: int, ident: int | None = None) -> Any:
        ident = id(value) if ident is None else ident
        if ident in self.open:
            return "<cycle>"
        self.open.add(ident)
        try:
            if isinstance(value, Mapping):
                return {self.key(k): self.value(v, depth + 1) for k, v in value.items()}
            items = [self.value(v, depth + 1) for v in value]
            if isinstance(value, (set, frozenset)):
                items.sort(key=lambda v: json.dumps(v, sort_keys=True))
            return items
        finally:
            self.open.discard(ident)


def json_value(value: Any) -> Any:
    """A JSON value for whatever a tool returned (see the module docstring)."""
    return _Walk().value(value, 0)


# --- secrets ----------------------------------------------------------------------------------

#: A configured token shorter than this is not searched for (it would match ordinary text).
MIN_SECRET = 6


def secret_values(config: Any) -> dict[str, str]:
    """The tokens configured for hosts and MCP servers (``token_env``), read from the environment
    now: ``{value: variable name}``."""
    import os

    found: dict[str, str] = {}
    tables = [*getattr(config, "hosts", {}).values(), *getattr(config, "mcp_servers", {}).values()]
    for table in tables:
        env = table.get("token_env") if isinstance(table, Mapping) else None
        value = os.environ.get(env) if isinstance(env, str) and env else None
        if value and len(value) >= MIN_SECRET:
            found[value] = env
    return found


def redact(value: Any, secrets: Mapping[str, str]) -> Any:
    """``value`` (a JSON value) with every configured token replaced by ``[redacted: VAR]``."""
    if not secrets:
        return value
    if isinstance(value, str):
        for secret, env in secrets.items():
            if secret in value:
                value = value.replace(secret, f"[redacted: {env}]")
        return value
    if isinstance(value, dict):
        return {redact(k, secrets): redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secrets) for v in value]
    return value


def redacted_outcome(outcome: Any, secrets: Mapping[str, str]) -> Any:
    """A ``ToolOutcome`` whose output and error message carry no configured token."""
    if not secrets:
        return outcome
    if outcome.error is not None:
        outcome.error.message = redact(outcome.error.message, secrets)
    output = redact(outcome.output, secrets)
    return outcome if output is outcome.output else dataclasses.replace(outcome, output=output)
