"""``journal.log``: the journal's durable tail, written before entries reach ``journal.db``.

A DuckDB write transaction costs about 0.4 ms of CPU before any disk work (even
in memory), and a governed call needs two durable appends: the decision and call
before the tool runs, the result after. So the writer makes each group of
entries durable here — one record, one ``write`` and one ``fdatasync`` (about
0.2 ms) — releases its appenders, and copies the entries into ``journal.db`` in
batches (one DuckDB transaction per batch), truncating this file after each
copy. Every entry an ``append`` returned is in one of the two files; a clean close
leaves everything in ``journal.db`` and removes this file.

Record layout (all integers big-endian)::

    magic  b"AJT1"                  4 bytes
    length of body                  4 bytes
    SHA-256 of body                32 bytes
    body                           JSON: a list of rows, one per entry:
                                   [seq, ts, run_id, agent, kind, payload (base64),
                                    prev_hash (hex), hash (hex), signature (hex), key_id]

A record is one writer group: all its entries or none. Reading stops at the
first record that is cut short or fails its checksum *at the end of the file*:
it was being written when the process died and nobody was told it was
written, so it is dropped. A bad record with more bytes after it is damage, not
a torn write, and reading refuses (``IntegrityError``): nothing is dropped or
rewritten then. The entries themselves are checked by whoever takes them
(hash, chain and signature), not here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

from apollia_nb.errors import IntegrityError

__all__ = ["TailLog", "TailRead", "read_tail", "tail_path"]

MAGIC = b"AJT1"
_HEADER = struct.Struct(">4sI32s")
#: No group is near this; a larger length is damage, not data.
MAX_BODY = 256 * 1024 * 1024


def tail_path(db_path: Path) -> Path:
    """``journal.db`` → ``journal.log`` (beside it)."""
    return Path(db_path).with_suffix(".log")


def encode_rows(rows: list[tuple[Any, ...]]) -> bytes:
    """One record (header and body) for rows in the journal's column order."""
    body = json.dumps(
        [
            [seq, ts, run_id, agent, kind, base64.b64encode(payload).decode("ascii"),
             prev.hex(), h.hex(), sig.hex(), key_id]
            for seq, ts, run_id, agent, kind, payload, prev, h, sig, key_id in rows
        ],
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode("ascii")
    return _HEADER.pack(MAGIC, len(body), hashlib.sha256(body).digest()) + body


def _decode_body(body: bytes) -> list[tuple[Any, ...]]:
    rows = []
    for item in json.loads(body):
        seq, ts, run_id, agent, kind, payload, prev, h, sig, key_id = item
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise ValueError(f"seq {seq!r} is not an integer")
        rows.append((seq, ts, run_id, agent, kind, base64.b64decode(payload, validate=True),
                     bytes.fromhex(prev), bytes.fromhex(h), bytes.fromhex(sig), key_id))
    return rows


class TailRead:
    """What a tail file holds: its rows in order, and the length of its valid prefix."""

    __slots__ = ("rows", "valid_length", "size", "torn")

    def __init__(self, rows: list[tuple[Any, ...]], valid_length: int, size: int) -> None:
        self.rows = rows
        self.valid_length = valid_length
        self.size = size
        self.torn = valid_length < size


def read_tail(path: Path) -> TailRead:
    """Parse a tail file (missing: empty). Raises ``IntegrityError`` on damage before its end."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return TailRead([], 0, 0)
    except OSError as exc:
        raise IntegrityError(f"{path} cannot be read: {exc}") from exc
    rows: list[tuple[Any, ...]] = []
    offset = 0
    record = 0
    while offset < len(data):
        record += 1
        header_end = offset + _HEADER.size
        if header_end > len(data):
            break  # a header cut short: the last write, never acknowledged
        magic, length, digest = _HEADER.unpack_from(data, offset)
        end = header_end + length
        if magic != MAGIC or length > MAX_BODY:
            if not data[offset:].strip(b"\0"):
                break  # zeros where the last write was to go (a crash of the machine)
            raise IntegrityError(
                f"{path} is damaged at byte {offset} (record {record} has no valid header); "
                "nothing was changed"
            )
        if end > len(data):
            break  # a body cut short: the last write
        body = data[header_end:end]
        if hashlib.sha256(body).digest() != digest:
            if end == len(data):
                break  # the last record, torn mid-write
            raise IntegrityError(
                f"{path} is damaged at byte {offset} (record {record} fails its checksum "
                "and more records follow); nothing was changed"
            )
        try:
            rows.extend(_decode_body(body))
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise IntegrityError(f"{path}: record {record} at byte {offset} does not parse: {exc}") from exc
        offset = end
    return TailRead(rows, offset, len(data))


class TailLog:
    """The writer's handle on the tail file: append a durable record, truncate after a copy.

    Used by one thread (the journal's writer).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        existed = self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o600)
        self._length = os.fstat(self._fd).st_size
        if not existed:
            _fsync_dir(self.path.parent)

    @property
    def length(self) -> int:
        return self._length

    def append(self, rows: list[tuple[Any, ...]]) -> None:
        """Write one record and ``fdatasync``: durable when this returns.

        On failure the file is cut back to where it was (so a later record never
        follows a partial one) and the error is raised; if even that fails, the
        file is left for the next open to judge and the error says so.
        """
        record = encode_rows(rows)
        try:
            view = memoryview(record)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fdatasync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._length)
                os.fdatasync(self._fd)
            except OSError as again:
                raise OSError(f"{exc}; and {self.path} could not be cut back: {again}") from exc
            raise
        self._length += len(record)

    def truncate(self, length: int = 0) -> None:
        """Cut the file to ``length`` bytes, durably."""
        os.ftruncate(self._fd, length)
        os.fdatasync(self._fd)
        self._length = length

    def close(self, *, remove_if_empty: bool = True) -> None:
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        if remove_if_empty and self._length == 0:
            try:
                self.path.unlink()
                _fsync_dir(self.path.parent)
            except OSError:
                pass  # an empty tail is harmless


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
