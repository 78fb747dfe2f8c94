"""Data subjects: which committed fields of a governed call hold one person's data.

A tool says whose data a call is about through one of its arguments: the argument's JSON
Schema carries ``"x-apollia-subject": true`` (its value *is* the subject's id, e.g. a
``customer_id``), or the home's ``apollia.toml`` names it::

    [subjects.tools]
    crm_lookup = "customer_id"          # or a list of argument names

Every entry of such a call whose fields carry that data records it in one more committed
field, ``subjects``::

    "subjects": [{"subject": "hmac-sha256:<hex>", "fields": ["arguments", "reason"]}]

The id itself is personal data, so it is never written: ``subject`` is
HMAC-SHA256 of the id's UTF-8 bytes under a per-home secret (``keys/subjects.key``, 32
random bytes made at the first tagged call, outside the journal, never exported). Without
the secret nobody can test a guessed id against the journal (an unkeyed or merely salted
hash of a short id could be guessed; a per-entry salt would make "every entry of this
person" impossible to find). Finding a subject's entries, and so erasing them, needs the
secret: a home whose ``keys/subjects.key`` is lost can still erase by seq, not by subject.

The functions here are pure (values in, values out) except ``subject_secret`` (the key file).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets as _secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from apollia_nb.errors import BadInput

__all__ = [
    "SUBJECTS_FIELD",
    "SUBJECT_SCHEMA_KEY",
    "SUBJECT_KEY_FILE",
    "TAGGED_FIELDS",
    "subject_secret",
    "runtime_subject_secret",
    "subject_digest",
    "subject_arguments",
    "call_subjects",
    "subjects_field",
    "fields_of_subject",
]

#: The payload field that lists, per subject digest, the entry's fields that are that subject's.
SUBJECTS_FIELD = "subjects"
#: The annotation on a tool argument's JSON Schema saying its value is a data subject's id.
SUBJECT_SCHEMA_KEY = "x-apollia-subject"
#: The per-home secret the digests are keyed with, in the home's keys folder.
SUBJECT_KEY_FILE = "subjects.key"
_PREFIX = "hmac-sha256:"

#: Of each entry kind of a governed call, the fields that carry the call's data: the calls
#: the model's turn asked for, the arguments, the decision's reason (it may quote them), the
#: tool's output and its digest (an unsalted digest of a guessable output would tell it).
TAGGED_FIELDS: Mapping[str, tuple[str, ...]] = {
    "model_response": ("tool_calls",),
    "decision": ("arguments", "reason"),
    "tool_call": ("arguments",),
    "tool_result": ("output", "output_digest"),
}


def subject_secret(keys_dir: Path, *, create: bool) -> bytes | None:
    """The home's subject key (32 bytes); made (mode 0600) when absent and ``create``, else None.

    A file that is not 32 bytes is ``BadInput``: a digest under another key would find nothing."""
    path = keys_dir / SUBJECT_KEY_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if not create:
            return None
        keys_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{SUBJECT_KEY_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, _secrets.token_bytes(32))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # never over a key another process made meanwhile
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        data = path.read_bytes()
    if len(data) != 32:
        raise BadInput(f"{path}: a subject key is 32 bytes, this file has {len(data)}")
    return data


_KEYS: dict[str, tuple[tuple[int, int, int], bytes]] = {}


def runtime_subject_secret(keys_dir: Path) -> bytes:
    """``subject_secret(create=True)`` for every tagged call of a runtime: read again only when the
    file changed (its inode, size and modification time), made when absent."""
    path = keys_dir / SUBJECT_KEY_FILE
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    if st is not None:
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = _KEYS.get(str(path))
        if cached is not None and cached[0] == stamp:
            return cached[1]
    secret = subject_secret(keys_dir, create=True)
    assert secret is not None
    st = path.stat()
    _KEYS[str(path)] = ((st.st_ino, st.st_size, st.st_mtime_ns), secret)
    return secret


def subject_digest(secret: bytes, subject_id: str) -> str:
    """``hmac-sha256:`` and the hex HMAC-SHA256 of the id's UTF-8 bytes under ``secret``."""
    if not isinstance(subject_id, str) or not subject_id:
        raise BadInput("a data subject's id is a non-empty string")
    return _PREFIX + hmac.new(secret, subject_id.encode("utf-8"), hashlib.sha256).hexdigest()


def subject_arguments(tool: str, parameters: Mapping[str, Any],
                      mapping: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The arguments of ``tool`` whose value is a data subject's id: those its schema marks
    ``"x-apollia-subject": true`` and those ``[subjects.tools]`` names, in declared order."""
    properties = parameters.get("properties") or {}
    named = set(mapping.get(tool, ()))
    return tuple(name for name, schema in properties.items()
                 if name in named or (isinstance(schema, Mapping) and schema.get(SUBJECT_SCHEMA_KEY) is True))


def _ids(value: Any) -> list[str]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, int):
        return [str(value)]
    if isinstance(value, list):
        return [i for item in value for i in _ids(item)]
    return []


def call_subjects(secret: bytes, names: Iterable[str], arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The digests of the subject ids a call's ``arguments`` give under ``names`` (a string, an
    integer, or a list of them each), sorted, without repeats."""
    found = {subject_digest(secret, i) for name in names for i in _ids(arguments.get(name))}
    return tuple(sorted(found))


def subjects_field(kind: str, digests: Sequence[str], payload: Mapping[str, Any]) -> dict[str, Any]:
    """``{"subjects": [...]}`` to add to an entry of ``kind`` (its tagged fields it has), or ``{}``."""
    fields = [f for f in TAGGED_FIELDS.get(kind, ()) if f in payload]
    if not digests or not fields:
        return {}
    return {SUBJECTS_FIELD: [{"subject": d, "fields": fields} for d in digests]}


def fields_of_subject(payload: Mapping[str, Any], digest: str) -> list[str]:
    """The fields an entry's ``subjects`` field says are ``digest``'s (unreadable tags: none)."""
    tags = payload.get(SUBJECTS_FIELD)
    if not isinstance(tags, list):
        return []
    out: set[str] = set()
    for tag in tags:
        if isinstance(tag, dict) and tag.get("subject") == digest and isinstance(tag.get("fields"), list):
            out.update(f for f in tag["fields"] if isinstance(f, str) and f != SUBJECTS_FIELD)
    return sorted(out)
