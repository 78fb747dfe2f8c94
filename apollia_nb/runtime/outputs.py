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
    an image (PNG, JPEG, GIF or WebP
      bytes, a matplotlib figure, an
      object with ``_repr_png_`` /
      ``_repr_jpeg_``, e.g. PIL's)     its descriptor (below)

An image becomes ``{"type": "image", "mime_type", "width", "height", "bytes",
"sha256"}``: what the journal keeps and replay checks is this descriptor, the
SHA-256 of the image's bytes among it; the bytes themselves are never part of an
output. They are held in this process's memory (the newest ``IMAGE_KEEP`` images,
at most ``IMAGE_KEEP_BYTES`` bytes together; none larger than ``IMAGE_MAX_BYTES``)
so that a model that reads images (``[model] images = true``) can be given them
with the tool result (``image_bytes``); an image no longer held, or a run resumed in
another process, stays described. A descriptor only finds bytes that hash to its
``sha256``: naming an image means knowing its digest.

``clean_text`` makes one string encodable as UTF-8 (used for error messages too).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import hashlib
import io
import json
import math
import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import PurePath
from typing import Any

__all__ = ["IMAGE_KEEP", "IMAGE_KEEP_BYTES", "IMAGE_MAX_BYTES", "MAX_DEPTH", "MIN_SECRET", "NODE_BUDGET",
           "clean_text", "image_bytes", "image_descriptor", "image_descriptors", "json_value", "redact",
           "redacted_outcome", "secret_values"]

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


# --- images -----------------------------------------------------------------------------------

#: Images held in memory for the models that read them, newest first; and their bytes together.
IMAGE_KEEP = 64
IMAGE_KEEP_BYTES = 64 * 1024 * 1024
#: An image larger than this is described but never held (the providers refuse larger ones).
IMAGE_MAX_BYTES = 5 * 1024 * 1024
_held: OrderedDict[str, bytes] = OrderedDict()
_held_lock = threading.Lock()


def _png_size(data: bytes) -> tuple[int, int] | None:
    if len(data) >= 24 and data[12:16] == b"IHDR":
        return struct.unpack(">II", data[16:24])
    return None


def _gif_size(data: bytes) -> tuple[int, int] | None:
    return struct.unpack("<HH", data[6:10]) if len(data) >= 10 else None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 9 < len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            at += 2
            continue
        length = struct.unpack(">H", data[at + 2:at + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[at + 5:at + 9])
            return width, height
        at += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return (int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1)
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def _image_kind(data: bytes) -> tuple[str, tuple[int, int] | None] | None:
    """``(mime type, (width, height) or None)`` of image bytes, or None when they are no image."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png", _png_size(data)
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg", _jpeg_size(data)
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif", _gif_size(data)
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "image/webp", _webp_size(data)
    return None


def image_descriptor(data: bytes) -> dict[str, Any] | None:
    """The descriptor of image bytes (holding the bytes for the models), or None if they are none."""
    kind = _image_kind(data)
    if kind is None:
        return None
    mime, size = kind
    digest = hashlib.sha256(data).hexdigest()
    if len(data) <= IMAGE_MAX_BYTES:
        with _held_lock:
            _held[digest] = data
            _held.move_to_end(digest)
            while len(_held) > IMAGE_KEEP or sum(map(len, _held.values())) > IMAGE_KEEP_BYTES:
                _held.popitem(last=False)
    return {"type": "image", "mime_type": mime, "width": size[0] if size else None,
            "height": size[1] if size else None, "bytes": len(data), "sha256": digest}


def image_bytes(descriptor: Mapping[str, Any]) -> bytes | None:
    """The bytes of the image a descriptor names, while this process holds them; else None."""
    digest = descriptor.get("sha256")
    if not isinstance(digest, str):
        return None
    with _held_lock:
        data = _held.get(digest)
    kind = _image_kind(data) if data is not None else None
    if kind is None or kind[0] != descriptor.get("mime_type"):
        return None
    return data


def image_descriptors(value: Any, depth: int = 0) -> Iterator[dict[str, Any]]:
    """The image descriptors inside a JSON value, in order."""
    if depth > MAX_DEPTH:
        return
    if isinstance(value, dict):
        if value.get("type") == "image" and isinstance(value.get("sha256"), str):
            yield value
            return
        for item in value.values():
            yield from image_descriptors(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from image_descriptors(item, depth + 1)


def _rendered_image(value: Any) -> bytes | None:
    """The image bytes of a figure or of an object that renders itself as PNG or JPEG; None when
    it is no image or rendering fails (the value is then described like any other)."""
    kind = type(value)
    try:
        if kind.__module__.startswith("matplotlib.") and callable(getattr(value, "savefig", None)):
            out = io.BytesIO()
            value.savefig(out, format="png")
            return out.getvalue()
        for name in ("_repr_png_", "_repr_jpeg_"):
            if callable(getattr(kind, name, None)):
                data = getattr(value, name)()
                if isinstance(data, tuple) and data:  # (data, metadata), as IPython allows
                    data = data[0]
                if isinstance(data, (bytes, bytearray)) and _image_kind(bytes(data)) is not None:
                    return bytes(data)
    except Exception:  # a figure that fails to draw is described by its repr
        return None
    return None


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
            image = image_descriptor(data)
            if image is not None:
                return image
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
        rendered = _rendered_image(value)
        if rendered is not None:
            image = image_descriptor(rendered)
            if image is not None:
                return image
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
            found[value] = env  # type: ignore[assignment]  # env is a str here
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
