"""One journal entry: its columns, its canonical payload bytes and its hash.

An entry is what gets signed, so it is an immutable value. Everything here is
pure (no clock, no I/O), so the writer, the verifier and an auditor's own
re-implementation compute exactly the same bytes.

Canonical payload
    ``json.dumps(payload, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False, allow_nan=False).encode("utf-8")``. The bytes are stored
    as they were hashed; the verifier hashes the stored bytes and never
    re-serialises. A payload must be a JSON object whose keys are strings all the
    way down, with values from ``None``, ``bool``, ``int``, finite ``float``,
    ``str``, ``list``/``tuple`` and ``dict``; anything else is ``BadInput``.

Entry hash (``ENTRY_HASH_DOMAIN`` version 1)
    ``SHA-256( "apollia-nb/journal-entry/v1" 0x0A
               u64be(seq)
               field(ts) field(run_id) field(agent) field(kind) field(payload)
               prev_hash )``
    where ``field(None) = 0x00`` and ``field(b) = 0x01 || u32be(len(b)) || b``
    (text columns as UTF-8), and ``prev_hash`` is the previous entry's 32-byte
    hash (32 zero bytes for seq 1). ``signature`` is Ed25519 over the 32-byte
    ``hash``; ``key_id`` names the signing key (see ``keys.key_id``).

Salted commitments (``ENTRY_HASH_DOMAIN_V2``, journal format 2)
    A journal of format 2 hashes commitments to its payload's fields instead of
    the payload. Each top-level key ``k`` of the payload (a *field*) gets a fresh
    random salt of ``SALT_SIZE`` bytes and the commitment
    ``c(k) = SHA-256( salt(k) || canonical_json(payload[k]) )``; the *committed
    bytes* are ``canonical_json({k: hex(c(k)) for every field k})``, and the entry
    hash is the version 1 formula with ``ENTRY_HASH_DOMAIN_V2`` and the committed
    bytes in place of ``field(payload)``. The stored ``payload`` (the column and the
    log record) is the canonical JSON of the present fields plus ``"@salts"``
    (``{k: hex(salt)}``, one per present field) and, once fields were erased,
    ``"@erased"`` (``{k: hex(c(k))}``, the commitments of fields whose value and
    salt are gone). Salts never enter the hashed bytes, so a field's value and
    salt can be removed and the entry still hashes the same. Top-level keys that
    start with ``@`` are the format's own; a payload may not use them.

Payload kinds
    The runtime writes the kinds below; the SQL views read the first seven.
    They are typed as ``Literal``-tagged ``TypedDict`` s for readers and tools;
    the journal itself accepts any kind matching ``KIND_PATTERN``.
"""

from __future__ import annotations

import binascii
import bisect
import hashlib
import json
import operator
import re
import struct
from dataclasses import dataclass, field
from datetime import datetime, timezone
from collections.abc import Callable, Iterable
from typing import Any, Literal, NamedTuple, NotRequired, TypedDict

from apollia_nb.errors import BadInput

__all__ = [
    "Entry",
    "ENTRY_HASH_DOMAIN",
    "ENTRY_HASH_DOMAIN_V2",
    "SALT_SIZE",
    "SALTS_KEY",
    "ERASED_KEY",
    "Sealed",
    "seal_payload",
    "commitment",
    "open_sealed",
    "is_sealed",
    "committed_bytes",
    "erase_sealed",
    "readable_payload",
    "stored_entry_hash",
    "stored_entry_bytes",
    "seal_parts",
    "split_stored",
    "sealed_committed",
    "sliced_committed",
    "entry_hash_v2",
    "erased_fields",
    "GENESIS_HASH",
    "HASH_SIZE",
    "SIGNATURE_SIZE",
    "KIND_PATTERN",
    "KINDS",
    "VIEW_KINDS",
    "canonical_json",
    "canonical_payload",
    "entry_hash",
    "entry_bytes",
    "format_ts",
    "check_text",
    "check_kind",
    "ErrorInfo",
    "RunOpen",
    "RunSeal",
    "DecisionPayload",
    "AnswerPayload",
    "ToolCallPayload",
    "ToolResultPayload",
    "ModelToolCall",
    "ModelResponse",
]

HASH_SIZE = 32
SIGNATURE_SIZE = 64
GENESIS_HASH = bytes(HASH_SIZE)
ENTRY_HASH_DOMAIN = b"apollia-nb/journal-entry/v1\n"
ENTRY_HASH_DOMAIN_V2 = b"apollia-nb/journal-entry/v2\n"
#: Bytes of one field's salt (format 2).
SALT_SIZE = 16
#: The stored payload's own keys (format 2): the present fields' salts, the erased fields' commitments.
SALTS_KEY = "@salts"
ERASED_KEY = "@erased"
_SALTS_MARK = b'"@salts":'
KIND_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,63}")

_sha256 = hashlib.sha256
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")


# --- payload kinds ---------------------------------------------------------------


class ErrorInfo(TypedDict):
    code: str
    message: str


class RunOpen(TypedDict):
    """``run_open``: a run starts. ``run_id`` and ``agent`` are the entry's columns."""

    run_kind: str  # "task", "chat", ...
    goal: NotRequired[str]
    task_id: NotRequired[str]


class RunSeal(TypedDict):
    """``run_seal``: a run ends, committing to how many entries it wrote before the seal."""

    status: str
    entries: int  # entries of this run before the seal, including run_open
    error: NotRequired[ErrorInfo]


class DecisionPayload(TypedDict):
    """``decision``: governance decided one tool call."""

    call_id: str
    tool: str
    family: str | None  # None when the tool is unclassified
    arguments: dict[str, Any]
    outcome: Literal["allow", "refuse", "ask"]
    line: int
    answers: list[Literal["once", "always", "refuse"]]
    reason: str
    connection: NotRequired[str | None]
    path: NotRequired[str]  # a file tool's path as resolved, relative to the workspace
    hints: NotRequired[dict[str, Any]]  # the tool's MCP annotations, as shown; never decided on
    caused_by: NotRequired[str]  # a server's request during a call: that call's id
    source: NotRequired[str]  # another agent's call (its hook): the tool, claude-code, codex, cursor, …
    source_tool: NotRequired[str]  # that tool's own name for the call (Bash, apply_patch, …)
    subjects: NotRequired[list[dict[str, Any]]]  # [{subject: keyed digest, fields}] (journal.subjects)


class AnswerPayload(TypedDict):
    """``answer``: a person (or code on their behalf) answered an asked call."""

    call_id: str
    answer: Literal["once", "always", "refuse"]
    answered_by: str
    reason: NotRequired[str]
    values: NotRequired[dict[str, Any]]  # a server's question answered once (sensitive fields redacted)


class ToolCallPayload(TypedDict):
    """``tool_call``: the tool is about to run (appended before its effect)."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    subjects: NotRequired[list[dict[str, Any]]]  # [{subject: keyed digest, fields}] (journal.subjects)


class ToolResultPayload(TypedDict):
    """``tool_result``: how the call ended; ``refused`` when it never ran."""

    call_id: str
    tool: str
    status: Literal["ok", "error", "refused"]
    error_code: NotRequired[str | None]
    output: NotRequired[Any]
    output_digest: str
    source: NotRequired[str]  # another agent's call: the tool that reported (or was refused) it
    source_tool: NotRequired[str]  # that tool's own name for the call
    subjects: NotRequired[list[dict[str, Any]]]  # [{subject: keyed digest, fields}] (journal.subjects)


class ModelToolCall(TypedDict):
    call_id: str
    name: str
    arguments: dict[str, Any]


class ModelResponse(TypedDict):
    """``model_response``: one captured model turn."""

    role: str
    turn: int
    text: str
    tool_calls: list[ModelToolCall]
    structured: NotRequired[list[ModelToolCall]]  # the planner's and critic's answers
    usage: NotRequired[dict[str, Any]]  # the provider's token counts for the turn
    reasoning: NotRequired[Any]  # [{source, text, signature?, redacted?, detail?}], or cut like an output
    reasoning_digest: NotRequired[str]  # of the whole reasoning
    subjects: NotRequired[list[dict[str, Any]]]  # the subjects of the calls it asks for (journal.subjects)


#: Kinds the SQL views derive from, with their payload types.
VIEW_KINDS: dict[str, type] = {
    "run_open": RunOpen,
    "run_seal": RunSeal,
    "decision": DecisionPayload,
    "answer": AnswerPayload,
    "tool_call": ToolCallPayload,
    "tool_result": ToolResultPayload,
    "model_response": ModelResponse,
}

#: Every kind the runtime writes. The governance and status kinds need no view.
KINDS: frozenset[str] = frozenset(
    {
        *VIEW_KINDS,
        "rule_added",
        "rule_removed",
        "consent_granted",
        "consent_revoked",
        "consent_expired",
        "devmode_changed",
        "policy_loaded",
        "policy_refused",
        "policy_removed",
        "home_file_created",
        "home_repaired",
        "home_damaged",
        "task_submitted",
        "task_status",
        "session_status",
        "plan",
        "verdict",
        "tool_progress",
        "erasure",
        "approval",
        "answer_refused",
        "approval_refused",
        "agent_identity",
        "person_added",
        "person_revoked",
        "person_rotated",
    }
)


# --- canonical bytes ----------------------------------------------------------------


def _check_json(value: Any, path: str) -> None:
    """Refuse what canonical JSON cannot carry faithfully (non-string keys, odd types)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadInput(f"payload key {key!r} at {path} is not a string")
            _check_json(item, f"{path}.{key}")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json(item, f"{path}[{i}]")
        return
    raise BadInput(f"payload value at {path} is a {type(value).__name__}, not JSON")


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain_json(value: Any) -> bool:
    """True when ``value`` is built of exactly the JSON types (no subclasses), keys all strings.

    The walk every append makes, so it builds no path strings; False sends the value
    to ``_check_json``, which accepts subclasses too and names where a bad value is."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _SCALARS and not _plain_json(item)):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:
            if type(item) not in _SCALARS and not _plain_json(item):
                return False
        return True
    return kind in _SCALARS


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def compact_json_encoder(*, sort_keys: bool, ensure_ascii: bool, allow_nan: bool) -> Callable[[Any], str] | None:
    """``json.dumps(value, separators=(",", ":"), sort_keys=..., ensure_ascii=..., allow_nan=...)``
    made once: its C encoder, called directly (None on a Python without it).

    ``json.dumps`` builds an encoder for every call (most of its cost for a small
    value); this one is built once and gives the very same text. It keeps no record
    of the containers it is inside (no cycle check): give it only values that cannot
    hold a cycle (walked already, or built of plain rows)."""
    try:
        from json.encoder import (  # type: ignore[attr-defined]  # the C accelerator typeshed leaves out
            c_make_encoder, encode_basestring, encode_basestring_ascii)
    except ImportError:  # pragma: no cover - a Python without the C accelerator
        return None
    if c_make_encoder is None:  # pragma: no cover
        return None
    strings = encode_basestring_ascii if ensure_ascii else encode_basestring
    encode = c_make_encoder(None, _not_json, strings, None, ":", ",", sort_keys, False, allow_nan)
    return lambda value: "".join(encode(value, 0))


#: The canonical options. A value reaches it only after ``_plain_json``/``_check_json``
#: walked it, which a cycle never passes.
_encode_canonical = compact_json_encoder(sort_keys=True, ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of any JSON value; ``BadInput`` for anything else."""
    try:
        if not _plain_json(value):
            _check_json(value, "$")
    except RecursionError:
        raise BadInput("payload is nested too deeply") from None
    try:
        if _encode_canonical is not None:
            return _encode_canonical(value).encode("utf-8")
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        return text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # NaN/inf, cycles, lone surrogates
        raise BadInput(f"payload is not canonical JSON: {exc}") from None


def canonical_payload(payload: Any) -> bytes:
    """A journal payload: a JSON object, as canonical bytes; ``BadInput`` otherwise."""
    if not isinstance(payload, dict):
        raise BadInput(f"a journal payload must be a JSON object, not {type(payload).__name__}")
    return canonical_json(payload)


def check_text(name: str, value: object, *, nullable: bool) -> None:
    """Refuse a column value that is not text (or None where allowed)."""
    if value is None and nullable:
        return
    if not isinstance(value, str):
        raise BadInput(f"journal {name} must be a string, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"journal {name} is not valid Unicode") from None


def check_kind(kind: object) -> str:
    if not isinstance(kind, str) or not KIND_PATTERN.fullmatch(kind):
        raise BadInput(f"journal kind {kind!r} must match {KIND_PATTERN.pattern}")
    return kind


def format_ts(moment: datetime) -> str:
    """UTC ISO-8601 with microseconds and ``Z``: ``2026-11-29T12:34:56.123456Z``."""
    if moment.tzinfo is None:
        raise BadInput("journal timestamps must be timezone-aware")
    if moment.tzinfo is not timezone.utc:
        moment = moment.astimezone(timezone.utc)
    if moment.year >= 1000:  # ``isoformat`` writes what ``strftime`` does, in a third of the time
        return moment.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def entry_hash(
    seq: int,
    ts: str,
    run_id: str | None,
    agent: str | None,
    kind: str,
    payload: bytes,
    prev_hash: bytes,
) -> bytes:
    """SHA-256 over the unambiguous encoding described in the module docstring (``entry_bytes``).

    The usual column types (text as ``str``, ``payload`` and ``prev_hash`` as
    ``bytes``) take a path that builds the same bytes with fewer steps (a
    verifier hashes every entry); anything else goes through ``entry_bytes``."""
    if (type(ts) is str and type(kind) is str and type(payload) is bytes and type(prev_hash) is bytes
            and (run_id is None or type(run_id) is str) and (agent is None or type(agent) is str)):
        t, k, p = ts.encode("utf-8"), kind.encode("utf-8"), payload
        r = b"\x00" if run_id is None else _text_field(run_id)
        a = b"\x00" if agent is None else _text_field(agent)
        return _sha256(b"".join((
            ENTRY_HASH_DOMAIN, _U64.pack(seq), b"\x01", _U32.pack(len(t)), t, r, a,
            b"\x01", _U32.pack(len(k)), k, b"\x01", _U32.pack(len(p)), p, prev_hash,
        ))).digest()
    return _sha256(entry_bytes(seq, ts, run_id, agent, kind, payload, prev_hash)).digest()


def _text_field(value: str) -> bytes:
    data = value.encode("utf-8")
    return b"\x01" + _U32.pack(len(data)) + data


def entry_bytes(
    seq: int,
    ts: str,
    run_id: str | None,
    agent: str | None,
    kind: str,
    payload: bytes,
    prev_hash: bytes,
) -> bytes:
    """The exact bytes the entry hash is the SHA-256 of."""
    parts = [ENTRY_HASH_DOMAIN, _U64.pack(seq)]
    append = parts.append
    for value in (ts, run_id, agent, kind, payload):
        if value is None:
            append(b"\x00")
        else:
            data = value.encode("utf-8") if type(value) is str else bytes(value)  # type: ignore[arg-type]  # not str: bytes
            append(b"\x01" + _U32.pack(len(data)))
            append(data)
    append(prev_hash)
    return b"".join(parts)



def entry_hash_v2(
    seq: int,
    ts: str,
    run_id: str | None,
    agent: str | None,
    kind: str,
    committed: bytes,
    prev_hash: bytes,
) -> bytes:
    """The format 2 entry hash: the version 1 encoding under ``ENTRY_HASH_DOMAIN_V2``, with the
    committed bytes (``committed_bytes``) where version 1 has the payload."""
    t, k = ts.encode("utf-8"), kind.encode("utf-8")
    r = b"\x00" if run_id is None else _text_field(run_id)
    a = b"\x00" if agent is None else _text_field(agent)
    return _sha256(b"".join((
        ENTRY_HASH_DOMAIN_V2, _U64.pack(seq), b"\x01", _U32.pack(len(t)), t, r, a,
        b"\x01", _U32.pack(len(k)), k, b"\x01", _U32.pack(len(committed)), committed, prev_hash,
    ))).digest()


# --- salted commitments (format 2) ---------------------------------------------------


try:
    from json.encoder import c_encode_basestring as _c_key  # type: ignore[attr-defined]  # C accelerator
except ImportError:  # pragma: no cover - a Python without the C accelerator
    _c_key = None
_encode_key: Callable[[str], str] = _c_key or (lambda k: json.dumps(k, ensure_ascii=False))
#: A string value as the canonical encoder writes it (the same function it calls for strings).
_encode_string: Callable[[str], str] = _c_key or (lambda k: json.dumps(k, ensure_ascii=False))


def commitment(salt: bytes, value_bytes: bytes) -> bytes:
    """``SHA-256(salt || canonical_json(value))``: one field's commitment (``value_bytes`` canonical)."""
    return _sha256(salt + value_bytes).digest()


#: Payload keys as JSON text (a journal's keys are a few dozen names): made once each.
_NAMES: dict[str, bytes] = {}
try:  # CPython's own SHA-256 makes a small digest in about 3/4 of OpenSSL's time (no EVP context)
    from _sha2 import sha256 as _sha256_small  # type: ignore[import-not-found,unused-ignore]  # 3.12+
except ImportError:
    _sha256_small = _sha256  # before 3.12 CPython's own module (_sha256) is slower than OpenSSL here


def _name(key: str) -> bytes:
    name = _encode_key(key).encode("utf-8")
    if len(_NAMES) < 4096:
        _NAMES[key] = name
    return name


def seal_payload(payload: Any, salts: bytes) -> tuple[bytes, bytes]:
    """A payload as format 2 stores and hashes it: ``(stored, committed)`` (``seal_parts``)."""
    stored, committed, _ = seal_parts(payload, salts)
    return stored, committed


def seal_parts(payload: Any, salts: bytes) -> tuple[bytes, bytes, bytes]:
    """A payload as format 2 stores and hashes it: ``(stored, committed, readable)``, the last
    the canonical JSON of the payload itself (what ``Entry.payload`` holds).

    ``salts`` holds ``SALT_SIZE`` random bytes per field, taken in sorted key order (the
    caller draws them: this stays a function of values). ``stored`` is
    ``canonical_json({**payload, "@salts": {k: hex(salt)}})``, ``committed`` the bytes the
    entry hash covers. ``BadInput`` for what ``canonical_payload`` refuses, a key starting
    with ``@``, or salts of the wrong length.

    The three are filled into templates made once per list of field names (``_Seal``);
    each value is encoded once, and the salted SHA-256 of every field made in C loops."""
    if not isinstance(payload, dict):
        raise BadInput(f"a journal payload must be a JSON object, not {type(payload).__name__}")
    if not _plain_json(payload):
        canonical_json(payload)  # raises BadInput naming what is wrong
        payload = json.loads(json.dumps(payload, ensure_ascii=False))  # subclasses as plain JSON
    keys = sorted(payload)
    if len(salts) != SALT_SIZE * len(keys):
        raise BadInput(f"{len(keys)} field(s) need {SALT_SIZE * len(keys)} bytes of salt, not {len(salts)}")
    seal = _SEALS.get(tuple(keys)) or _new_seal(keys)
    encode, string = _encode_canonical, _encode_string
    try:
        if encode is None:  # pragma: no cover - a Python without the C accelerator
            values = [canonical_json(payload[k]) for k in keys]
        else:
            values = [(string(v) if type(v) is str else encode(v)).encode("utf-8") for v in map(payload.__getitem__, keys)]
    except (TypeError, ValueError, UnicodeEncodeError) as exc:  # NaN/inf, lone surrogates
        raise BadInput(f"payload is not canonical JSON: {exc}") from None
    except RecursionError:
        raise BadInput("payload is nested too deeply") from None
    if not keys:
        return seal.stored, seal.committed, seal.readable
    sha = _sha256 if _sha256_small is _sha256 or max(map(len, values)) >= 512 else _sha256_small
    digests = b"".join(map(_HASH_DIGEST, map(sha, map(_JOIN, seal.salts(salts), values))))
    hexed = binascii.hexlify(salts, b"-", SALT_SIZE).split(b"-")
    at = seal.at
    return (seal.stored % tuple(values[:at] + hexed + values[at:] if at else hexed + values),
            seal.committed % tuple(binascii.hexlify(digests, b"-", HASH_SIZE).split(b"-")),
            seal.readable % tuple(values))


class _Seal(NamedTuple):
    """What payloads with one list of field names are sealed into: where ``"@salts"`` goes among
    the fields, how to take each field's salt, and the stored, committed and readable bytes
    with ``%s`` where each salt's hex, value and commitment's hex go."""

    at: int
    salts: Callable[[bytes], tuple[bytes, ...]]
    stored: bytes
    committed: bytes
    readable: bytes


#: Seals by their field names (a journal's payloads have a few dozen lists of names); at most 1024.
_SEALS: dict[tuple[str, ...], _Seal] = {}


def _new_seal(keys: list[str]) -> _Seal:
    """The seal of payloads with the sorted field names ``keys``; ``BadInput`` for a name starting
    with ``@`` (the format's own)."""
    # where "@salts" goes among the sorted keys: after those before "@" (digits, most punctuation),
    # before letters; keys starting with "@" (the format's own) would sort right there
    at = bisect.bisect_left(keys, "@")
    if at < len(keys) and keys[at][:1] == "@":
        raise BadInput(f"payload key {keys[at]!r} starts with '@', which the journal keeps for itself")
    names = [(_NAMES.get(k) or _name(k)).replace(b"%", b"%%") for k in keys]
    fields = [n + b":%s" for n in names]
    hexes = b",".join([n + b':"%s"' for n in names])
    seal = _Seal(
        at, _salt_taker(len(keys)),
        b"{" + b",".join(fields[:at] + [b'"@salts":{' + hexes + b"}"] + fields[at:]) + b"}",
        b"{" + hexes + b"}",
        b"{" + b",".join(fields) + b"}",
    )
    if len(_SEALS) >= 1024:
        _SEALS.clear()
    _SEALS[tuple(keys)] = seal
    return seal


class Sealed(NamedTuple):
    """A format 2 stored payload taken apart: the present fields, their salts, the erased fields' commitments."""

    fields: dict[str, Any]
    salts: dict[str, bytes]
    erased: dict[str, str]


def is_sealed(stored: bytes) -> bool:
    """Whether stored payload bytes are a format 2 payload (a JSON object with ``"@salts"``)."""
    if _SALTS_MARK not in stored:
        return False
    try:
        data = json.loads(stored)
    except ValueError:
        return False
    return isinstance(data, dict) and SALTS_KEY in data


def _hex_map(value: Any, size: int, what: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f"its {what} are not an object")
    for key, item in value.items():
        if not isinstance(item, str) or len(item) != 2 * size:
            raise ValueError(f"field {key!r}: its {what[:-1]} is not {size} bytes of hex")
        try:
            bytes.fromhex(item)
        except ValueError:
            raise ValueError(f"field {key!r}: its {what[:-1]} is not {size} bytes of hex") from None
    return value


def open_sealed(stored: bytes | dict[str, Any]) -> Sealed:
    """Take a format 2 stored payload apart; ``ValueError`` naming the field when it does not hold
    together (a field without its salt, a salt without its field, a field both present and erased)."""
    data = json.loads(stored) if not isinstance(stored, dict) else dict(stored)
    if not isinstance(data, dict) or SALTS_KEY not in data:
        raise ValueError("it is not a salted payload")
    salts_hex = _hex_map(data.pop(SALTS_KEY), SALT_SIZE, "salts")
    erased = _hex_map(data.pop(ERASED_KEY, {}), HASH_SIZE, "commitments")
    for key in data:
        if key.startswith("@"):
            raise ValueError(f"field {key!r} is not a payload field")
        if key not in salts_hex:
            raise ValueError(f"field {key!r} has no salt")
        if key in erased:
            raise ValueError(f"field {key!r} is both present and erased")
    for key in salts_hex:
        if key not in data:
            raise ValueError(f"field {key!r} has a salt but no value")
    return Sealed(data, {k: bytes.fromhex(v) for k, v in salts_hex.items()}, erased)


class _NotCanonical(Exception):
    """A salted payload's part that does not hold together (its message names the field)."""


def _unhex(text: str, key: str, what: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise _NotCanonical(f"field {key!r}: its {what} is not hex") from None


def sealed_committed(stored: bytes, data: dict[str, Any] | None = None) -> tuple[bytes, list[str]]:
    """A format 2 stored payload's committed bytes and its erased fields, checking on the way that
    the bytes are exactly the canonical JSON of what they hold (rebuilt from the parts the
    commitments need, not re-serialised whole); ``ValueError`` naming what is wrong. ``data``:
    the stored bytes parsed already."""
    if data is None:
        data = json.loads(stored)
    if type(data) is not dict or SALTS_KEY not in data:
        raise ValueError("it is not a salted payload")
    data = dict(data)
    salts = data.pop(SALTS_KEY)
    erased = data.pop(ERASED_KEY, None)
    if type(salts) is not dict:
        raise ValueError("its salts are not an object")
    if erased is not None and (type(erased) is not dict or not erased):
        raise ValueError("its erased commitments are not an object of fields")
    encode = _encode_canonical or (lambda v: canonical_json(v).decode("utf-8"))
    small, large = _sha256_small, _sha256
    width = 2 * SALT_SIZE
    commits: dict[str, bytes] = {}
    parts: dict[str, bytes] = {}
    try:
        for key, value in data.items():
            if key[:1] == "@":
                raise _NotCanonical(f"field {key!r} is not a payload field")
            salt = salts.get(key)
            if type(salt) is not str or len(salt) != width:
                raise _NotCanonical(f"field {key!r} has no salt" if salt is None else
                                 f"field {key!r}: its salt is not {SALT_SIZE} bytes of hex")
            v = encode(value).encode("utf-8")
            name = _NAMES.get(key) or _name(key)
            parts[key] = name + b":" + v
            commits[key] = name + b':"' + (small if len(v) < 512 else large)(
                _unhex(salt, key, "salt") + v).hexdigest().encode("ascii") + b'"'
        if len(salts) != len(data):
            extra = sorted(set(salts) - set(data))
            raise _NotCanonical(f"field {extra[0]!r} has a salt but no value" if extra else "its salts do not match")
        if erased:
            for key, digest in erased.items():
                if key in commits:
                    raise _NotCanonical(f"field {key!r} is both present and erased")
                if key[:1] == "@" or type(digest) is not str or len(digest) != 2 * HASH_SIZE:
                    raise _NotCanonical(f"field {key!r}: its commitment is not {HASH_SIZE} bytes of hex")
                _unhex(digest, key, "commitment")
                commits[key] = (_NAMES.get(key) or _name(key)) + b':"' + digest.encode("ascii") + b'"'
            parts[ERASED_KEY] = b'"@erased":' + encode(erased).encode("utf-8")
        parts[SALTS_KEY] = b'"@salts":' + encode(salts).encode("utf-8")
    except _NotCanonical as exc:
        raise ValueError(str(exc)) from None
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError, OverflowError) as exc:
        raise ValueError(f"it does not hold canonical JSON ({type(exc).__name__}: {exc})") from None
    if b"{" + b",".join([parts[k] for k in sorted(parts)]) + b"}" != stored:
        raise ValueError("it is not stored as its canonical JSON")
    return b"{" + b",".join([commits[k] for k in sorted(commits)]) + b"}", sorted(erased or ())


# The verifier's way to the committed bytes: slices of the stored bytes, never parsed whole.
# A stored payload whose fields all sort after "@salts" (every field name the runtime
# writes) lays out as ``{["@erased":{…},]"@salts":{"k1":"<salt>",…},"k1":v1,…}``: the salts
# name the fields in order, so each value is the span between its key and the next, and
# its commitment hashes that span. A span is taken only when it is, by itself, canonical
# JSON: a string, integer or literal the canonical encoder would write exactly so (checked
# by pattern), or anything else that its canonical encoding gives back byte for byte. A span
# cut short at a nested key of the same name is a container cut in two, which neither check
# passes. Whatever this cannot vouch for is None, and ``sealed_committed`` decides it.
_FAST_HEAD = re.compile(rb'\{"@salts":\{([^{}\\]*)\}')
#: ``,"name":"<salt>"``, a name as JSON without escapes that sorts after "@salts" (every name the runtime writes)
_SALT_ITEM = re.compile(rb',"([\x41-\x5b\x5d-\xff][^"\\\x00-\x1f]*)":"[0-9a-f]{%d}"' % (2 * SALT_SIZE))
#: A value the canonical encoder writes exactly so: a string with the escapes it makes and no
#: others, an integer of at most 16 digits (not ``-0``), a literal, an empty array or object.
_PLAIN_VALUE = (rb'"(?:[^"\\\x00-\x1f]++|\\(?:["\\bfnrt]|u00(?:0[0-7bef]|1[0-9a-f])))*+"'
                rb'|(?:0|-?[1-9][0-9]{0,15}|true|false|null|\[\]|\{\})(?=%s)')
_HEX_DIGITS = b"0123456789abcdef"


class _Layout(NamedTuple):
    """What stored payloads with one list of field names share: a pattern of the whole payload
    (capturing each salt, then each value and, for a value it cannot vouch for, that value
    again), how to take each field's salt out of the salts end to end, and the committed
    bytes' template."""

    names: tuple[bytes, ...]
    size: int
    pattern: re.Pattern[bytes]
    salts: Callable[[bytes], tuple[bytes, ...]]
    template: bytes


def _salt_taker(size: int) -> Callable[[bytes], tuple[bytes, ...]]:
    """A function from ``size`` salts end to end to the tuple of them, one C call for all."""
    cuts = [slice(i * SALT_SIZE, (i + 1) * SALT_SIZE) for i in range(size)]
    if size > 1:
        return operator.itemgetter(*cuts)
    return (lambda salts: (salts,)) if size else (lambda salts: ())


#: Layouts by the stored bytes up to the salts' end without their hex digits, which names that differ
#: only in hex digits share (each layout is checked whole); at most ``_LAYOUTS_KEPT`` in all.
_LAYOUTS: dict[bytes, list[_Layout]] = {}
_LAYOUTS_KEPT = 256
#: Values found canonical by parsing and encoding them again (a journal repeats many values).
_CANONICAL: set[bytes] = set()


def _new_layout(stored: bytes, key: bytes) -> _Layout | None:
    """The layout of ``stored``'s field names (kept for the next payload under ``key``), or None
    when its salts are not ``"name":"<salt>"`` pairs in strictly ascending order or its names have
    a layout already (which it does not fit)."""
    head = _FAST_HEAD.match(stored)
    if head is None:
        return None
    part = head.group(1)
    names = _SALT_ITEM.findall(b"," + part) if part else []
    # the matches tile the part exactly when their lengths (each a name and 6 + 32 bytes) add up
    if part and sum([len(k) for k in names]) + (6 + 2 * SALT_SIZE) * len(names) != len(part) + 1:
        return None
    if any(a >= b for a, b in zip(names, names[1:])):
        return None
    if any(known.names == tuple(names) for known in _LAYOUTS.get(key, ())):
        return None
    pattern = [re.escape(b'{"@salts":{'), b",".join(
        [re.escape(b'"' + k + b'":"') + b'(.{%d})"' % (2 * SALT_SIZE) for k in names]), b"\\}"]
    for i, name in enumerate(names):
        # what follows the value: the next field's mark, or the payload's end. A value the pattern
        # cannot vouch for runs to the first such mark (no backtracking: linear in the bytes).
        nxt = re.escape(b',"' + names[i + 1] + b'":') if i + 1 < len(names) else b"\\}\\Z"
        rest = (b'(?:[^,]++|,(?!%s))*+' % re.escape(b'"' + names[i + 1] + b'":') if i + 1 < len(names)
                else b"(?:[^}]++|\\}(?!\\Z))*+")
        pattern.append(re.escape(b',"' + name + b'":') + b"((?>" + _PLAIN_VALUE % nxt + b"|([\\[{\\-0-9]" + rest + b")))")
    pattern.append(b"\\}")
    keys = [k.decode("utf-8") for k in names]
    layout = _Layout(
        tuple(names), len(names), re.compile(b"".join(pattern), re.DOTALL), _salt_taker(len(names)),
        ("{" + ",".join(['"' + k.replace("%", "%%") + '":"%s"' for k in keys]) + "}").encode("utf-8"),
    )
    if sum(map(len, _LAYOUTS.values())) >= _LAYOUTS_KEPT:
        _LAYOUTS.clear()
    _LAYOUTS.setdefault(key, []).append(layout)
    return layout


def _canonical_value(value: bytes) -> bool:
    """Whether ``value`` is the canonical JSON of one JSON value (kept when short)."""
    if _encode_canonical is None:  # pragma: no cover - a Python without the C accelerator
        return False
    try:
        if _encode_canonical(json.loads(value.decode("utf-8"))).encode("utf-8") != value:
            return False
    except (ValueError, TypeError, RecursionError, UnicodeError, OverflowError):
        return False
    if len(value) <= 256:
        if len(_CANONICAL) >= 4096:
            _CANONICAL.clear()
        _CANONICAL.add(value)
    return True


#: The layout the last payload had (a journal's entries of one kind share one): tried first.
_LAST: list[_Layout | None] = [None]
_HASH_DIGEST = type(_sha256()).digest
_JOIN = bytes.__add__


def sliced_committed(stored: bytes) -> tuple[bytes, list[str]] | None:
    """A format 2 stored payload's committed bytes and erased fields as ``sealed_committed`` gives
    them, computed from the stored bytes' own spans without parsing them; None when the bytes are
    not laid out as this expects (then ``sealed_committed`` decides, and says what is wrong).
    Whatever this answers, ``sealed_committed`` answers the same.

    A layout's pattern matches only payloads with its field names (and so its key), so trying
    the last layout first finds what the key would. Each field's salt, salted span, SHA-256 and
    digest are made in C loops (``map``), the digests turned to hex in one call: what is left per
    field is hashlib's own cost."""
    if not stored.isascii():
        try:
            stored.decode("utf-8")
        except UnicodeDecodeError:
            return None
    layout = _LAST[0]
    match = layout.pattern.fullmatch(stored) if layout is not None else None
    if match is None:
        key = stored[:stored.find(b"}")].translate(None, _HEX_DIGITS)
        for known in _LAYOUTS.get(key, ()):
            match = known.pattern.fullmatch(stored)
            if match is not None:
                layout = known
                break
        else:
            layout = _new_layout(stored, key)
            match = layout.pattern.fullmatch(stored) if layout is not None else None
        if match is not None:
            _LAST[0] = layout
    if match is None or layout is None:
        return None
    groups = match.groups()
    n = layout.size
    if any(unsure := groups[n + 1::2]):
        for value in unsure:
            if value is not None and value not in _CANONICAL and not _canonical_value(value):
                return None
    if not n:
        return layout.template, []
    hexed = b"".join(groups[:n])  # the pattern takes any 32 bytes for a salt: lowercase hex digits only
    if hexed.translate(None, _HEX_DIGITS):
        return None
    salts = layout.salts(binascii.unhexlify(hexed))
    digests = b"".join(map(_HASH_DIGEST, map(_sha256, map(_JOIN, salts, groups[n::2]))))
    return layout.template % tuple(binascii.hexlify(digests, b"-", HASH_SIZE).split(b"-")), []


def _committed_of_parsed(data: dict[str, Any]) -> bytes | None:
    """``committed_bytes(open_sealed(data))`` for parsed stored payload, None when it does not hold together."""
    try:
        return committed_bytes(open_sealed(data))
    except (ValueError, TypeError, KeyError):
        return None


def committed_bytes(sealed: Sealed) -> bytes:
    """The bytes a format 2 entry hash covers: every field's commitment, present or erased."""
    commits = {key: _sha256(sealed.salts[key] + canonical_json(value)).hexdigest()
               for key, value in sealed.fields.items()}
    commits.update(sealed.erased)
    return canonical_json(commits)


def erase_sealed(stored: bytes, names: Iterable[str]) -> bytes:
    """The stored payload with fields ``names`` erased: value and salt gone, commitment kept under
    ``"@erased"``. Fields erased already stay so; a field the payload never had is ``BadInput``."""
    try:
        sealed = open_sealed(stored)
    except ValueError as exc:
        raise BadInput(f"the payload cannot be erased from: {exc}") from None
    fields, salts, erased = dict(sealed.fields), dict(sealed.salts), dict(sealed.erased)
    for name in names:
        if name in erased:
            continue
        if name not in fields:
            raise BadInput(f"the payload has no field {name!r}")
        erased[name] = commitment(salts.pop(name), canonical_json(fields.pop(name))).hex()
    out: dict[str, Any] = {**fields, SALTS_KEY: {k: v.hex() for k, v in salts.items()}}
    if erased:
        out[ERASED_KEY] = erased
    return canonical_json(out)


def readable_payload(stored: bytes) -> dict[str, Any]:
    """The payload a reader sees: its present fields (a format 2 payload without its own ``@`` keys)."""
    data = json.loads(stored)
    if isinstance(data, dict) and SALTS_KEY in data:
        data.pop(SALTS_KEY, None)
        data.pop(ERASED_KEY, None)
    return data


def erased_fields(stored: bytes) -> list[str]:
    """The fields of a stored payload that were erased (sorted; empty for format 1)."""
    if b'"@erased":' not in stored:
        return []
    data = json.loads(stored)
    erased = data.get(ERASED_KEY) if isinstance(data, dict) and SALTS_KEY in data else None
    return sorted(erased) if isinstance(erased, dict) else []


def stored_entry_bytes(
    seq: int,
    ts: str,
    run_id: str | None,
    agent: str | None,
    kind: str,
    payload: bytes,
    prev_hash: bytes,
) -> bytes:
    """The exact bytes an entry's hash is the SHA-256 of, from its stored columns: for a salted
    payload (format 2) the v2 encoding of its committed bytes, else ``entry_bytes``."""
    if is_sealed(payload):
        committed = committed_bytes(open_sealed(payload))
        return ENTRY_HASH_DOMAIN_V2 + entry_bytes(seq, ts, run_id, agent, kind, committed, prev_hash)[
            len(ENTRY_HASH_DOMAIN):]
    return entry_bytes(seq, ts, run_id, agent, kind, payload, prev_hash)


def stored_entry_hash(
    seq: int,
    ts: str,
    run_id: str | None,
    agent: str | None,
    kind: str,
    payload: bytes,
    prev_hash: bytes,
) -> bytes:
    """The hash of an entry as stored: format 2 for a salted payload, version 1 otherwise.
    ``ValueError`` (naming the field) for a salted payload that does not hold together."""
    if _SALTS_MARK in payload:
        sliced = sliced_committed(payload)
        if sliced is not None:
            return entry_hash_v2(seq, ts, run_id, agent, kind, sliced[0], prev_hash)
        try:
            data = json.loads(payload)
        except ValueError:
            data = None
        if isinstance(data, dict) and SALTS_KEY in data:
            return entry_hash_v2(seq, ts, run_id, agent, kind, sealed_committed(payload, data)[0], prev_hash)
    return entry_hash(seq, ts, run_id, agent, kind, payload, prev_hash)


def split_stored(stored: bytes) -> tuple[bytes, bytes | None]:
    """A payload column's bytes as ``(payload, stored)`` for an ``Entry``: a salted payload's
    present fields as canonical JSON and the column's bytes; anything else ``(stored, None)``."""
    if _SALTS_MARK not in stored:
        return stored, None
    try:
        data = json.loads(stored)
    except ValueError:
        return stored, None
    if type(data) is not dict or SALTS_KEY not in data:
        return stored, None
    data.pop(SALTS_KEY, None)
    data.pop(ERASED_KEY, None)
    try:
        return canonical_json(data), stored
    except BadInput:  # not what the writer stores: the column as it is (its hash will not match)
        return stored, None


# --- the entry ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One row of the journal, as stored and hashed.

    ``payload`` is the payload a reader sees: canonical JSON of its fields. For an entry of
    format 2 the row holds more (each field's salt, the commitments of erased fields):
    ``stored`` keeps those bytes, exactly as stored and hashed (``as_row``, ``computed_hash``);
    it is None when they are ``payload`` itself (format 1), or not carried (a served home's
    answers show fields alone). Two entries are equal when their columns are: ``stored`` is how
    one was kept or carried, and its hash already commits to it."""

    seq: int
    ts: str
    run_id: str | None
    agent: str | None
    kind: str
    payload: bytes
    prev_hash: bytes
    hash: bytes
    signature: bytes
    key_id: str
    stored: bytes | None = field(default=None, compare=False)

    COLUMNS = (
        "seq", "ts", "run_id", "agent", "kind", "payload",
        "prev_hash", "hash", "signature", "key_id",
    )  # fmt: skip

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Entry:
        """Build from a row in ``COLUMNS`` order (as DuckDB returns it)."""
        seq, ts, run_id, agent, kind, payload, prev_hash, hash_, signature, key_id = row
        payload = bytes(payload)
        readable, stored = split_stored(payload)
        return cls(
            int(seq), ts, run_id, agent, kind, readable,
            bytes(prev_hash), bytes(hash_), bytes(signature), key_id, stored,
        )  # fmt: skip

    @property
    def row_payload(self) -> bytes:
        """The payload column's bytes, exactly as stored and hashed."""
        return self.payload if self.stored is None else self.stored

    def as_row(self) -> tuple[Any, ...]:
        return (
            self.seq, self.ts, self.run_id, self.agent, self.kind, self.row_payload,
            self.prev_hash, self.hash, self.signature, self.key_id,
        )  # fmt: skip

    def computed_hash(self) -> bytes:
        """The hash the entry's columns give (format 2 when its payload is salted); ``ValueError``
        for a salted payload that does not hold together."""
        return stored_entry_hash(
            self.seq, self.ts, self.run_id, self.agent, self.kind, self.row_payload, self.prev_hash
        )

    def data(self) -> dict[str, Any]:
        """The payload as a Python object: its present fields."""
        return json.loads(self.payload)

    def erased(self) -> list[str]:
        """The payload fields erased from this entry (its value and salt gone)."""
        return erased_fields(self.stored) if self.stored is not None else []

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: payload parsed, binary columns as lowercase hex."""
        return {
            "seq": self.seq,
            "ts": self.ts,
            "run_id": self.run_id,
            "agent": self.agent,
            "kind": self.kind,
            "payload": self.data(),
            "prev_hash": self.prev_hash.hex(),
            "hash": self.hash.hex(),
            "signature": self.signature.hex(),
            "key_id": self.key_id,
        }
