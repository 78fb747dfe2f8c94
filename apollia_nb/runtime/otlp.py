"""OTLP trace protobuf, written by hand for the few fields our spans use (pure: values in, bytes out).

The wire format is OpenTelemetry's ``opentelemetry/proto/trace/v1/trace.proto`` and
``collector/trace/v1/trace_service.proto`` (the fields below, stable since opentelemetry-proto
v1.1.0, which added span ``flags``; the tests read our bytes back with the messages the
``opentelemetry-proto`` 1.45 package generates and against the SDK's own encoder): an ``ExportTraceServiceRequest`` of one
``ResourceSpans`` holding one ``ScopeSpans``. A span is encoded once, when it ends, into the
bytes of its ``Span`` message; a request is those bytes framed with the resource and the scope,
encoded once per exporter. Protobuf lets a message's fields be concatenated, so nothing is
re-encoded when spans are batched.

Fields written: ``Span`` trace_id (1), span_id (2), parent_span_id (4), name (5), kind (6,
always ``SPAN_KIND_INTERNAL``), start/end_time_unix_nano (7, 8), attributes (9), status (15:
message 2, code 3 ``STATUS_CODE_ERROR``; empty when unset), flags (16, ``HAS_IS_REMOTE``, as
the OpenTelemetry SDK writes it); ``KeyValue`` key (1) and ``AnyValue`` string (1), bool (2),
int (3), double (4) and array (5) values.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["encode_span", "encode_request_frame", "encode_request", "encode_attributes"]

_PACK_Q = struct.Struct("<Q").pack
_PACK_I = struct.Struct("<I").pack
_PACK_D = struct.Struct("<d").pack
_SHORT = [bytes((n,)) for n in range(128)]

#: ``SPAN_KIND_INTERNAL``; the span flag ``SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`` (a local parent)
_KIND_AND_FLAGS_TAIL = b"\x85\x01" + _PACK_I(0x100)
_KIND = b"\x30\x01"
#: an empty ``Status`` (code ``STATUS_CODE_UNSET``), written as the SDK writes it
_UNSET = b"\x7a\x00"


def _varint(n: int) -> bytes:
    if n < 128:
        return _SHORT[n]
    out = bytearray()
    while n > 127:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, body: bytes) -> bytes:
    n = len(body)
    return tag + (_SHORT[n] if n < 128 else _varint(n)) + body


def _any_value(value: Any) -> bytes:
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value if value >= 0 else value + (1 << 64))
    if isinstance(value, float):
        return b"\x21" + _PACK_D(value)
    if isinstance(value, (list, tuple)):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    return _field(b"\x0a", str(value).encode())


_HASHABLE = frozenset((str, int, bool, float, tuple))


class _KeyValues:
    """Encoded ``KeyValue`` fields (tag 9 of a span), kept for the values that repeat.

    Names, outcomes, rules and the like repeat span after span: their bytes are looked up, not
    rebuilt. A key whose values keep changing (seqs, hashes, call ids) stops being kept after
    ``misses`` of them, so unique values cost no table space and little time; the table is
    cleared if it ever reaches ``limit``."""

    def __init__(self, tag: bytes, limit: int = 8192, misses: int = 64) -> None:
        self._tag = tag
        self._keys: dict[str, bytes] = {}  # key → its encoded ``key`` field
        self._known: dict[tuple[str, type, Any], bytes] = {}
        self._misses: dict[str, int] = {}  # key → its values encoded so far
        self._volatile: set[str] = set()  # keys whose values are no longer kept
        self._limit, self._max_misses = limit, misses

    def encode(self, attributes: Mapping[str, Any]) -> bytes:
        known, keys, volatile, tag, short = self._known, self._keys, self._volatile, self._tag, _SHORT
        parts: list[bytes] = []
        append = parts.append
        for key, value in attributes.items():
            cls = value.__class__
            memo: tuple[str, type, Any] | None = None
            if cls in _HASHABLE and key not in volatile:
                memo = (key, cls, value)
                try:
                    encoded = known.get(memo)
                except TypeError:  # a tuple holding what cannot be hashed
                    encoded = memo = None
                if encoded is not None:
                    append(encoded)
                    continue
            key_field = keys.get(key)
            if key_field is None:
                key_field = keys[key] = _field(b"\x0a", key.encode())
            if cls is str:
                raw = value.encode()
                n = len(raw)
                any_value = b"\x0a" + (short[n] if n < 128 else _varint(n)) + raw
            elif cls is int and value >= 0:
                any_value = b"\x18" + (short[value] if value < 128 else _varint(value))
            else:
                any_value = _any_value(value)
            n = len(any_value)
            body = key_field + b"\x12" + (short[n] if n < 128 else _varint(n)) + any_value
            n = len(body)
            encoded = tag + (short[n] if n < 128 else _varint(n)) + body
            if memo is not None:
                misses = self._misses[key] = self._misses.get(key, 0) + 1
                if misses >= self._max_misses:  # a value per span: not worth keeping
                    volatile.add(key)
                if len(known) >= self._limit:
                    known.clear()
                known[memo] = encoded
            append(encoded)
        return b"".join(parts)


_SPAN_ATTRIBUTES = _KeyValues(b"\x4a")


def encode_attributes(attributes: Mapping[str, Any], tag: bytes = b"\x0a") -> bytes:
    """``attributes`` as repeated ``KeyValue`` fields of number ``tag`` (1: a resource's, a scope's is 3)."""
    return b"".join(_field(tag, _field(b"\x0a", k.encode()) + _field(b"\x12", _any_value(v)))
                    for k, v in attributes.items())


def encode_span(trace_id: bytes, span_id: bytes, parent_id: bytes | None, name: str, start_ns: int,
                end_ns: int, attributes: Mapping[str, Any], error: str | None = None,
                encoder: _KeyValues = _SPAN_ATTRIBUTES) -> bytes:
    """One ``Span`` message's bytes, framed as a field of ``ScopeSpans`` (number 2), ready to concatenate."""
    body = b"".join((
        b"\x0a\x10", trace_id, b"\x12\x08", span_id,
        b"\x22\x08" + parent_id if parent_id is not None else b"",
        _field(b"\x2a", name.encode()), _KIND,
        b"\x39", _PACK_Q(start_ns), b"\x41", _PACK_Q(end_ns),
        encoder.encode(attributes),
        _field(b"\x7a", _field(b"\x12", error.encode()) + b"\x18\x02") if error is not None else _UNSET,
        _KIND_AND_FLAGS_TAIL,
    ))
    return _field(b"\x12", body)


def encode_request_frame(resource: Mapping[str, Any], scope_name: str, scope_version: str) -> tuple[bytes, bytes]:
    """The parts of an ``ExportTraceServiceRequest`` around its spans: ``(resource, scope)``
    fields, encoded once; ``encode_request`` frames spans with them."""
    resource_field = _field(b"\x0a", encode_attributes(resource, b"\x0a"))
    scope_field = _field(b"\x0a", _field(b"\x0a", scope_name.encode()) + _field(b"\x12", scope_version.encode()))
    return resource_field, scope_field


def encode_request(frame: tuple[bytes, bytes], spans: Sequence[bytes] | Iterable[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest`` of ``spans`` (each from ``encode_span``) under ``frame``."""
    resource_field, scope_field = frame
    scope_spans = _field(b"\x12", scope_field + b"".join(spans))
    return _field(b"\x0a", resource_field + scope_spans)
