"""Prove that bytes are gone from a home: scan every file under it for a needle in every form it could take.

``find_everywhere(home, needle)`` reads every file under ``home`` (``journal.db`` and its ``.wal``,
``journal.log``, ``runtime.db`` and its claims file, ``governance.db``, exports, bundles,
DuckDB's temporary folders, leftovers of an interrupted rewrite, anything else) and returns
each place the needle is found, with the file, the byte offset (or the table, column and
row) and the form it was found in. ``assert_absent(home, needle)`` fails listing them.

The forms are those our files can hold a value in:

* ``raw``: the UTF-8 bytes (a canonical payload in ``journal.db``'s ``payload`` column is
  ``ensure_ascii=False`` JSON: text as it is, only ``"``, ``\\`` and control characters escaped);
* ``json`` / ``json-utf8``: the value as a JSON string body, with ``ensure_ascii=True`` (the
  runtime's records, exports, ``\\u00e9`` for ``é``) and ``ensure_ascii=False`` (canonical JSON);
* ``base64@k`` / ``base64url@k`` of each of those, at each of the three alignments ``k`` a
  value can start at inside a longer base64 text (``journal.log`` holds each payload as
  base64 in its JSON record): only the characters the needle alone decides;
* ``utf-16-le`` / ``utf-16-be`` and ``hex``, for files written by other tools.

Compression hides bytes from a byte scan: DuckDB compresses columns (dictionary, FSST),
Parquet pages are compressed, and gzip or zip files are. So besides the bytes, every
DuckDB file (read from a copy, its WAL replayed) and every Parquet file is read row by row
and every value searched; gzip and zip members are scanned decompressed; ``journal.log``'s
records are decoded and their payloads searched. A file that cannot be read fails the
scan: absence is never assumed. Symbolic links are reported, not followed.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Hit", "assert_absent", "find_everywhere", "find_in_bytes", "needle_forms"]

#: A shorter needle would be found by chance (in a hash, a key, compressed bytes).
MIN_NEEDLE = 6

DUCKDB_MAGIC = b"DUCK"  # at byte 8 of a DuckDB database file
PARQUET_MAGIC = b"PAR1"
LOG_MAGIC = b"AJT1"


@dataclass(frozen=True)
class Hit:
    """One place the needle was found."""

    file: Path
    form: str
    offset: int | None = None  # a byte offset in the file (or in its decompressed member)
    where: str = ""  # inside the file: ``table entries, column payload, row 3``, a zip member...

    def __str__(self) -> str:
        place = f"byte {self.offset}" if self.offset is not None else ""
        inside = ", ".join(p for p in (self.where, place) if p)
        return f"{self.file} ({inside}) as {self.form}"


def _base64_pieces(name: str, value: bytes) -> dict[str, bytes]:
    """The base64 characters only ``value`` decides, at each alignment inside a longer text."""
    out: dict[str, bytes] = {}
    n = len(value)
    for shift in range(3):
        start = -(-8 * shift // 6)  # the first character no byte before the value reaches into
        end = 8 * (shift + n) // 6  # the last one no byte after it reaches into, exclusive
        for alphabet, encode in (("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)):
            piece = encode(bytes(shift) + value)[start:end]
            if len(piece) >= MIN_NEEDLE:
                out[f"{alphabet}@{shift} of {name}"] = piece
    return out


def needle_forms(needle: bytes) -> dict[str, bytes]:
    """Every form the needle is searched in, by name (see the module); the same bytes once."""
    if len(needle) < MIN_NEEDLE:
        raise ValueError(f"a needle of {len(needle)} bytes would be found by chance; use {MIN_NEEDLE} or more")
    forms: dict[str, bytes] = {"raw": needle}
    try:
        text = needle.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        forms["json"] = json.dumps(text, ensure_ascii=True)[1:-1].encode("ascii")
        forms["json-utf8"] = json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")
        forms["utf-16-le"] = text.encode("utf-16-le")
        forms["utf-16-be"] = text.encode("utf-16-be")
    forms["hex"] = needle.hex().encode("ascii")
    for name in ("raw", "json", "json-utf8"):
        if name in forms:
            forms.update(_base64_pieces(name, forms[name]))
    unique: dict[str, bytes] = {}
    for name, value in forms.items():
        if value not in unique.values():
            unique[name] = value
    return unique


def find_in_bytes(data: bytes, forms: dict[str, bytes]) -> list[tuple[int, str]]:
    """Every ``(offset, form)`` where a form occurs in ``data``."""
    found = []
    for name, value in forms.items():
        at = data.find(value)
        while at >= 0:
            found.append((at, name))
            at = data.find(value, at + 1)
    return sorted(found)


def _values(value: Any) -> list[bytes]:
    """A database value as the bytes to search: text as UTF-8, blobs as they are, anything else as text."""
    if value is None:
        return []
    if isinstance(value, (bytes, bytearray, memoryview)):
        return [bytes(value)]
    if isinstance(value, str):
        return [value.encode("utf-8", "surrogatepass")]
    if isinstance(value, (list, tuple)):
        return [b for v in value for b in _values(v)]
    if isinstance(value, dict):
        return [b for k, v in value.items() for b in (*_values(k), *_values(v))]
    return [str(value).encode("utf-8")]


def _scan_rows(con: Any, relation: str, label: str, file: Path, forms: dict[str, bytes]) -> list[Hit]:
    cur = con.execute(f"SELECT * FROM {relation}")
    columns = [d[0] for d in cur.description]
    hits = []
    number = 0
    while True:
        batch = cur.fetchmany(2048)
        if not batch:
            break
        for row in batch:
            for column, value in zip(columns, row):
                for data in _values(value):
                    for _, form in find_in_bytes(data, forms):
                        hits.append(Hit(file, form, None, f"{label}, column {column}, row {number}"))
            number += 1
    return hits


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _scan_duckdb(path: Path, forms: dict[str, bytes]) -> list[Hit]:
    """Every live value of a DuckDB file (read from a copy, with its WAL replayed), searched."""
    import duckdb

    with tempfile.TemporaryDirectory(prefix="scan-home-") as tmp:
        copy = Path(tmp) / "copy.db"
        shutil.copyfile(path, copy)
        wal = path.with_name(path.name + ".wal")
        if wal.exists():
            shutil.copyfile(wal, Path(tmp) / "copy.db.wal")
        con = duckdb.connect(str(copy))
        try:
            [(db,)] = con.execute("SELECT current_database()").fetchall()
            tables = con.execute("SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ?",
                                 [db]).fetchall()
            hits = []
            for schema, table in tables:
                hits.extend(_scan_rows(con, f"{_quote(schema)}.{_quote(table)}", f"table {table}", path, forms))
            return hits
        finally:
            con.close()


def _scan_parquet(path: Path, forms: dict[str, bytes]) -> list[Hit]:
    import duckdb

    con = duckdb.connect()
    try:
        return _scan_rows(con, f"read_parquet('{str(path).replace(chr(39), chr(39) * 2)}')", "parquet", path, forms)
    finally:
        con.close()


def _scan_log(path: Path, forms: dict[str, bytes]) -> list[Hit]:
    """The payloads of ``journal.log``'s records, decoded (a damaged log: its bytes are scanned anyway)."""
    from apollia_nb.errors import IntegrityError
    from apollia_nb.journal.tail import read_tail

    try:
        rows = read_tail(path).rows
    except IntegrityError:
        return []
    hits = []
    for row in rows:
        for column, value in zip(("seq", "ts", "run_id", "agent", "kind", "payload"), row):
            for data in _values(value):
                hits.extend(Hit(path, form, None, f"log entry {row[0]}, {column}") for _, form in
                            find_in_bytes(data, forms))
    return hits


def _scan_file(path: Path, forms: dict[str, bytes]) -> list[Hit]:
    data = path.read_bytes()
    hits = [Hit(path, form, at) for at, form in find_in_bytes(data, forms)]
    if data[8:12] == DUCKDB_MAGIC:
        hits.extend(_scan_duckdb(path, forms))
    elif data[:4] == PARQUET_MAGIC and data[-4:] == PARQUET_MAGIC:
        hits.extend(_scan_parquet(path, forms))
    elif data[:2] == b"\x1f\x8b":
        inner = gzip.decompress(data)
        hits.extend(Hit(path, form, at, "gzip member") for at, form in find_in_bytes(inner, forms))
    elif data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                inner = archive.read(member)
                hits.extend(Hit(path, form, at, f"zip member {member}") for at, form in find_in_bytes(inner, forms))
    elif data[:4] == LOG_MAGIC:
        hits.extend(_scan_log(path, forms))
    return hits


def find_everywhere(home: Path, needle: bytes | str) -> list[Hit]:
    """Every place under ``home`` the needle is found, in any of its forms (see the module).

    A file that cannot be read or decoded raises (``OSError``, DuckDB's error): absence is
    never assumed. A symbolic link out of the home is a hit of its own (``form`` ``symlink``): it is
    not followed."""
    if isinstance(needle, str):
        needle = needle.encode("utf-8")
    forms = needle_forms(needle)
    home = Path(home)
    hits: list[Hit] = []
    for path in sorted(home.rglob("*")):
        if path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(home.resolve()):  # one inside the home is scanned where it is
                hits.append(Hit(path, "symlink", None, f"a link out of the home to {target}, not followed"))
        elif path.is_file():
            hits.extend(_scan_file(path, forms))
    return hits


def assert_absent(home: Path, needle: bytes | str) -> None:
    """Fail, naming each file, offset and form, when the needle is anywhere under ``home``."""
    hits = find_everywhere(home, needle)
    if hits:
        lines = "\n".join(f"  {hit}" for hit in hits[:50])
        more = f"\n  ... and {len(hits) - 50} more" if len(hits) > 50 else ""
        raise AssertionError(f"{needle!r} is still in {home}, {len(hits)} place(s):\n{lines}{more}")
