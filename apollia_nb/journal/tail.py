"""``journal.log``: the journal's durable tail, written before entries reach ``journal.db``.

A DuckDB write transaction costs about 0.4 ms of CPU before any disk work (even
in memory), and a governed call needs two durable appends: the decision and call
before the tool runs, the result after. So the writer makes each group of
entries durable here — one record, one ``pwrite`` and one ``fdatasync`` (about
0.15 ms) — and releases its appenders; a second thread (the copier) copies the
entries into ``journal.db`` in batches meanwhile (one DuckDB transaction per batch). Every entry an ``append`` returned is in one of the two files; a clean close
leaves everything in ``journal.db`` and removes this file.

Record layout (all integers big-endian)::

    magic  b"AJT1"                  4 bytes
    length of body                  4 bytes
    SHA-256 of body                32 bytes
    body                           JSON: a list of rows, one per entry:
                                   [seq, ts, run_id, agent, kind, payload (base64),
                                    prev_hash (hex), hash (hex), signature (hex), key_id]

A record is one writer group: all its entries or none. The file is
preallocated and records are written in place, one after the other; zeros
follow the last. Reading stops at a record that is cut short or fails its
checksum when nothing but zeros follows it: it was being written when the
process died and nobody was told it was written, so it is dropped. A bad
record with more records after it is damage, not a torn write, and reading
refuses (``IntegrityError``): nothing is dropped or rewritten then. The writer
always leaves at least one zero byte after its last record (it writes one with
each record, and the file has room for it), so a file that ends inside a
record or right at a record's end was cut (``TailRead.cut``): records after the
cut, acknowledged, may be gone, and whoever reads the log must not take its
end for the journal's. Records
already copied into ``journal.db`` stay until the file starts over; whoever
reads the log skips them after checking they are the very entries
``journal.db`` holds. The entries themselves are checked by whoever takes them
(hash, chain and signature), not here.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

from apollia_nb.dbutil import fault_point
from apollia_nb.errors import IntegrityError
from apollia_nb.journal.entry import compact_json_encoder

__all__ = ["TailLog", "TailRead", "read_tail", "tail_path"]

MAGIC = b"AJT1"
_HEADER = struct.Struct(">4sI32s")
#: No group is near this; a larger length is damage, not data.
MAX_BODY = 256 * 1024 * 1024


#: Where a row starts in a record's body (``[[seq,`` first, ``],[seq,`` after): to read the seqs a cut left.
_ROW_START = re.compile(rb"(?:^\[|\],)\[(\d{1,18}),")


def tail_path(db_path: Path) -> Path:
    """``journal.db`` → ``journal.log`` (beside it)."""
    return Path(db_path).with_suffix(".log")


#: ``json.dumps(value, separators=(",", ":"), ensure_ascii=True)``, its encoder made once (built
#: on every call, it is a third of a small record's cost); the same text. A record's rows are
#: lists of text, integers and None: no cycle to check for.
_encode_body = compact_json_encoder(sort_keys=False, ensure_ascii=True, allow_nan=True) or (
    lambda value: json.dumps(value, separators=(",", ":"), ensure_ascii=True))


def encode_rows(rows: list[tuple[Any, ...]]) -> bytes:
    """One record (header and body) for rows in the journal's column order."""
    body = _encode_body([
        [seq, ts, run_id, agent, kind, base64.b64encode(payload).decode("ascii"),
         prev.hex(), h.hex(), sig.hex(), key_id]
        for seq, ts, run_id, agent, kind, payload, prev, h, sig, key_id in rows
    ]).encode("ascii")
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
    """What a tail file holds: its rows in order, where its valid records end, whether a
    torn last write was dropped after them, and whether the file was cut (``cut``: it
    ends inside a record or right at the end of one, without the zero the writer always
    leaves after its last record; ``size`` is the file's length)."""

    __slots__ = ("rows", "valid_length", "torn", "cut", "size", "cut_seen", "records", "data_end")

    def __init__(self, rows: list[tuple[Any, ...]], valid_length: int, torn: bool,
                 cut: bool = False, size: int = 0, cut_seen: int | None = None,
                 records: tuple[int, ...] = (), data_end: int = 0) -> None:
        self.rows = rows
        self.valid_length = valid_length
        self.torn = torn
        self.cut = cut
        self.size = size
        #: the highest seq the part of a record the cut left still shows (its body is rows that
        #: start ``[seq,``): entries up to it were committed and are gone; None when none shows
        self.cut_seen = cut_seen
        #: how many of ``rows`` each valid record holds, in order (one commit a record)
        self.records = records
        #: where the file's last non-zero byte ends (past ``valid_length``: a torn write's bytes)
        self.data_end = data_end


def read_tail(path: Path) -> TailRead:
    """Parse a tail file (missing: empty). Raises ``IntegrityError`` on damage before its end.

    The file is preallocated: zeros follow the last record. A record that is
    cut short, has no valid header or fails its checksum is the write a crash
    interrupted when nothing but zeros follows it (for a bad header: when no
    other record's magic follows it); otherwise it is damage. A file whose last
    byte is not a zero, or whose last record reaches its end, was cut
    (``TailRead.cut``): the writer never leaves one so.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return TailRead([], 0, False)
    except OSError as exc:
        raise IntegrityError(f"{path} cannot be read: {exc}") from exc
    end_of_data = len(data.rstrip(b"\0"))
    # The writer leaves a zero after its last record: a file ending without one was cut.
    cut = 0 < end_of_data == len(data)
    cut_seen: int | None = None
    rows: list[tuple[Any, ...]] = []
    counts: list[int] = []
    offset = 0
    record = 0
    while offset < end_of_data:
        record += 1
        header_end = offset + _HEADER.size
        if header_end >= len(data):
            cut = True  # a header the end of the file cuts: the file is shorter than its writer left it
            break
        magic, length, digest = _HEADER.unpack_from(data, offset)
        if magic != MAGIC or length > MAX_BODY:
            if data.find(MAGIC, offset + 1) < 0:
                break  # a header the crash interrupted: nothing of a later record follows
            raise IntegrityError(
                f"{path} is damaged at byte {offset} (record {record} has no valid header); "
                "nothing was changed"
            )
        end = header_end + length
        if end >= len(data):
            cut = True  # a body the end of the file cuts, or that ends the file: it was cut
            if end > len(data):
                seen = [int(m) for m in _ROW_START.findall(data[header_end:])]
                cut_seen = max(seen) if magic == MAGIC and seen else None
                break
        body = data[header_end:end]
        if hashlib.sha256(body).digest() != digest:
            if end >= end_of_data:
                break  # the last record, torn mid-write
            raise IntegrityError(
                f"{path} is damaged at byte {offset} (record {record} fails its checksum "
                "and more records follow); nothing was changed"
            )
        try:
            decoded = _decode_body(body)
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise IntegrityError(f"{path}: record {record} at byte {offset} does not parse: {exc}") from exc
        rows.extend(decoded)
        counts.append(len(decoded))
        offset = end
    return TailRead(rows, offset, offset < end_of_data, cut, len(data), cut_seen, tuple(counts), end_of_data)


#: Space the log takes ahead of its records, so a commit's sync writes data, not the file's size.
PREALLOCATE = 4 * 1024 * 1024

#: Zeros written ahead of the records, a piece at a time. Preallocated space is "unwritten" until
#: written (ext4, XFS): the first write into it makes ``fdatasync`` also commit the file system's
#: journal. Writing the zeros once, with the record that reaches a new piece, leaves the
#: records after it plain overwrites (measured here: 0.11-0.14 ms a commit against 0.16-0.19 ms).
ZERO_AHEAD = 256 * 1024


class TailLog:
    """The writer's handle on the tail file: write a durable record; start over when copied.

    The file is preallocated (``PREALLOCATE`` bytes of zeros) and records are
    written in place, so ``fdatasync`` need not also commit a new file size
    (measured here: 0.14-0.16 ms against 0.28 ms for an append). Records stay
    after they are copied into ``journal.db``; the file starts over (cut to
    zero and preallocated again) only when the next record does not fit, after
    everything is copied. Used by one thread (the journal's writer).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        existed = self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        self._length = 0
        self._allocated = 0
        self._zeroed = 0  # bytes from the start written (records, then zeros) since the file started over
        try:
            self.reset()
        except OSError:  # a full disk: nothing is allocated yet, and the first commit tries again
            pass
        if not existed:
            _fsync_dir(self.path.parent)

    @property
    def length(self) -> int:
        """Bytes of records written since the file last started over."""
        return self._length

    @property
    def capacity(self) -> int:
        """Bytes the file has room for before it must start over (its preallocated size)."""
        return self._allocated

    def fits(self, size: int) -> bool:
        """Whether a record of ``size`` bytes fits with the zero written after it."""
        return self._length + size < self._allocated

    def reset(self, at_least: int = 0) -> None:
        """Start over: cut the file to nothing and preallocate it again, durably.

        Raises ``OSError`` when the disk has no room for the preallocation (or
        refuses the sync); the file then holds no records and has no space
        allocated, so the next commit calls this again first."""
        self._length = 0
        self._allocated = 0
        self._zeroed = 0
        os.ftruncate(self._fd, 0)
        need = at_least + 1 if at_least else 0  # the record and the zero after it
        size = max(PREALLOCATE, need)
        try:
            fault_point("journal.log")
            try:
                _preallocate(self._fd, size)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not 0 < need < size:
                    raise
                size = need  # a nearly full disk: room for the next record is enough for now
                _preallocate(self._fd, size)
        except OSError as exc:  # a file system without fallocate: the records grow the file instead
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                os.ftruncate(self._fd, 0)
                raise
        self._zero_ahead(0, size)  # the first piece now, synced with the preallocation, not by a commit
        os.fsync(self._fd)
        self._allocated = size

    def write(self, record: bytes) -> None:
        """Write one record after the last and ``fdatasync``: durable when this returns.

        On failure the bytes written are zeroed again (so a later record never
        follows a partial one) and the error is raised; if even that fails, the
        file is left for the next open to judge and the error says so.
        """
        at = self._length
        record = bytes(record) + b"\0"  # the zero that says the file ends here, not cut (the next record overwrites it)
        try:
            fault_point("journal.log")
            view = memoryview(record)
            while view:
                written = _pwrite(self._fd, view, at + len(record) - len(view))
                view = view[written:]
            self._zero_ahead(at + len(record), self._allocated)
            _datasync(self._fd)
        except OSError as exc:
            try:
                _pwrite(self._fd, b"\0" * len(record), at)
                _datasync(self._fd)
            except OSError as again:
                raise OSError(f"{exc}; and {self.path} could not be cleared after it: {again}") from exc
            raise
        self._length = at + len(record) - 1
        self._allocated = max(self._allocated, self._length + 1)

    def _zero_ahead(self, end: int, allocated: int) -> None:
        """Write zeros from ``end`` to the end of its ``ZERO_AHEAD`` piece (within the ``allocated``
        space), once per piece, before the next sync. What is there reads as zeros already, so
        this changes no byte; if it fails, the commit goes on (only later syncs cost more)."""
        if end < self._zeroed or end >= allocated:
            return
        stop = min(allocated, (end // ZERO_AHEAD + 1) * ZERO_AHEAD)
        try:
            at = end
            while at < stop:
                at += _pwrite(self._fd, bytes(stop - at), at)
        except OSError:
            return
        self._zeroed = stop

    def append(self, rows: list[tuple[Any, ...]]) -> None:
        """``write`` the record of these rows."""
        self.write(encode_rows(rows))

    def close(self, *, remove: bool = False) -> None:
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        if remove:
            try:
                self.path.unlink()
                _fsync_dir(self.path.parent)
            except OSError:
                pass  # a log whose entries are all in journal.db is harmless


# Where the platform lacks a call (macOS has no fdatasync or posix_fallocate, Windows no
# pwrite), the nearest one that is at least as durable stands in; looked up at each call.


def _datasync(fd: int) -> None:
    sync = getattr(os, "fdatasync", None)
    (sync or os.fsync)(fd)


def _pwrite(fd: int, data: bytes | memoryview, offset: int) -> int:
    pwrite = getattr(os, "pwrite", None)
    if pwrite is not None:
        return pwrite(fd, data, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # one writer thread: nothing moves the offset meanwhile
    return os.write(fd, data)


def _preallocate(fd: int, size: int) -> None:
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        fallocate(fd, 0, size)


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
