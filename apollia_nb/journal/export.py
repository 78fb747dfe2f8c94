"""Export the journal as an offline audit bundle: Parquet files, keys and instructions.

A bundle is a folder an auditor can take away and check without the home:

``entries.parquet``      the ``entries`` table, exact bytes (payload, hashes, signatures)
``checkpoints.parquet``  every stored signed checkpoint
``cosignatures.parquet`` every witness cosignature of them (``size, witness, timestamp, signature, created_at``)
``checkpoint.txt``       the latest checkpoint note (when there is one)
``journal.pub``          base64 of the 32-byte Ed25519 public key
``journal.vkey``         the C2SP verifier key for checkpoint notes (``<origin>+<id>+<key>``)
``meta.json``            origin, format, entry count, head hash, key id
``views.sql``            the SQL views over the Parquet files, for the ``duckdb`` CLI
``README.md``            how to verify and query the bundle

Nothing in a bundle is trusted to run on the auditor's machine. The documented way to
query takes the views from the auditor's own install (``apollia-os audit views``, the
same SQL as :func:`~apollia_nb.journal.views.bundle_sql`), and ``audit verify --bundle``
runs :func:`check_bundle_files` first: every file the README tells the auditor to run or
read (``views.sql``, ``README.md`` itself, ``meta.json``, ``checkpoint.txt``,
``journal.pub``, ``journal.vkey``) must be byte for byte what this install writes for the
bundle's verified contents, and every bundle file a plain file (not a link, a folder or a
pipe); anything else is ``BUNDLE_FILE_ALTERED`` naming the file. ``views.sql`` and the
README are conveniences: a bundle without them verifies.

DuckDB writes Parquet itself (``COPY ... (FORMAT parquet)``); no other library
is needed. Everything is read in one transaction, so the files agree. An open
journal's database is locked to itself (it opens no file), so its rows are
handed to a fresh in-memory DuckDB, which writes the files.
"""

from __future__ import annotations

import base64
import json
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from apollia_nb.dbutil import connect_locked, limit_memory
from apollia_nb.errors import BadInput, BundleFileAltered, IntegrityError, NotFound
from apollia_nb.journal.bundle import BUNDLE_FILES, read_bundle_key, read_bundle_meta
from apollia_nb.journal.checkpoint import NoteVerifier
from apollia_nb.journal.keys import key_id, load_public_key
from apollia_nb.journal.store import _SCHEMA, FORMAT_VERSION, entries_with_tail
from apollia_nb.journal.verify import _COLUMNS as _ENTRY_COLUMNS
from apollia_nb.journal.verify import RANGE, _ranged_chunks
from apollia_nb.journal.views import bundle_sql

if TYPE_CHECKING:
    from apollia_nb.home import Home
    from apollia_nb.journal.store import Journal

__all__ = ["BUNDLE_FILES", "BundleFacts", "ExportResult", "bundle_hashes", "bundle_readme", "check_bundle_files",
           "export_home", "export_journal", "export_streamed", "read_bundle_key", "read_bundle_meta"]


_README = """\
# apollia-nb audit bundle

Origin `{origin}`, {entries} entries, head hash `{head}`, key id `{key_id}`.

| file | holds |
|---|---|
| `entries.parquet` | every journal entry, byte for byte: `seq, ts, run_id, agent, kind, payload, prev_hash, hash, signature, key_id` |
| `checkpoints.parquet` | every signed checkpoint: `size, root, note, created_at` |
| `cosignatures.parquet` | witness cosignatures of those checkpoints: `size, witness` (its verifier key), `timestamp`, `signature` (the C2SP note signature line), `created_at` |
| `checkpoint.txt` | the latest signed checkpoint (C2SP signed note) |
| `journal.pub` | base64 of the Ed25519 public key that signs entries and checkpoints |
| `journal.vkey` | the same key as a C2SP verifier key: `{vkey}` |
| `views.sql` | the SQL views `journal`, `decisions`, `tool_calls`, `runs` over these files |

## Verify

Compare `journal.pub` (or the key in `journal.vkey`) with a copy of the key you
hold from elsewhere first: the bundle cannot vouch for its own key. Then:

```sh
apollia-os audit verify --bundle .                      # chain, hashes, signatures, checkpoints
apollia-os audit verify --bundle . --checkpoint SAVED   # also against a checkpoint kept elsewhere
apollia-os audit verify --bundle . --witness WKEY       # the newest checkpoint is cosigned by that witness
```

Exit status 0 means every check passed; 1 prints the first bad sequence number.
`meta.json` says `"verified": false` (and why, under `invalid`) when the journal
was exported although it did not verify; such a bundle never verifies.

By hand: entry `hash` is SHA-256 over
`"apollia-nb/journal-entry/v1\\n" || u64be(seq) || f(ts) || f(run_id) || f(agent) || f(kind) || f(payload) || prev_hash`,
with `f(NULL) = 0x00` and `f(x) = 0x01 || u32be(len(x)) || x` (text as UTF-8);
`prev_hash` of entry 1 is 32 zero bytes; `signature` is Ed25519 over the 32-byte
`hash`; Merkle leaves are `SHA-256(0x00 || hash)` (RFC 6962).

## Query

Take the SQL views from your own apollia-os, not from this folder:

```sh
duckdb -cmd "$(apollia-os audit views --bundle .)"   # any DuckDB from 1.4 on, e.g. pip install duckdb-cli
```

```sql
SELECT kind, count(*) FROM journal GROUP BY kind ORDER BY 2 DESC;
SELECT * FROM decisions WHERE outcome = 'ask' AND answer IS NULL;
SELECT * FROM runs ORDER BY started_at;
```

`views.sql` holds the same SQL. `duckdb -init views.sql` runs whatever that file
holds, DuckDB's dot-commands (`.shell`, `.read`, `.output`) included: run it only
after `apollia-os audit verify --bundle .` passed, which checks that `views.sql`,
this README, `meta.json`, `checkpoint.txt`, `journal.pub` and `journal.vkey` are
byte for byte what apollia-os writes for these entries. Without apollia-os, read
`views.sql` before you run it.
"""


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    entries: int
    checkpoints: int
    files: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "entries": self.entries,
            "checkpoints": self.checkpoints,
            "files": list(self.files),
        }


def bundle_hashes(directory: Path) -> tuple[bytes, ...]:
    """The entry hashes of a bundle, in seq order (not verified here)."""

    path = Path(directory) / BUNDLE_FILES["entries"]
    if not path.exists():
        raise NotFound(f"{directory} is not an audit bundle: {BUNDLE_FILES['entries']} is missing")
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(f"SELECT hash FROM read_parquet({_sql_path(path)}) ORDER BY seq").fetchall()
    finally:
        con.close()
    return tuple(bytes(h) for (h,) in rows)


def _sql_path(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def _prepare_dir(directory: Path) -> Path:
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise BadInput(f"{directory} exists and is not a folder")
    directory.mkdir(parents=True, exist_ok=True)
    clashes = [name for name in BUNDLE_FILES.values() if (directory / name).exists()]
    if clashes:
        raise BadInput(f"{directory} already holds {', '.join(clashes)}; export into an empty folder")
    return directory


def _copy_parquet(con: Any, select: str, path: Path) -> None:
    """``COPY (select) TO path`` on a connection that may open files."""
    con.execute(f"COPY ({select}) TO {_sql_path(path)} (FORMAT parquet)")


def _copy_parquet_aside(con: Any, select: str, path: Path, *, batch: int = 10_000,
                        chunks: Any = None) -> None:
    """The rows of ``select`` (or the row lists ``chunks`` yields, in that order) written to ``path``
    by a side DuckDB: for a database locked to itself, and for rows read range by range.

    The side database is a file beside the bundle, removed after, with bounded memory and one
    thread: it holds a batch of rows at a time however long the journal is, and writes them in
    the order they came (DuckDB keeps insertion order when nothing sorts)."""

    columns = con.execute(f"DESCRIBE {select}").fetchall()
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=path.parent))
    side = duckdb.connect(str(work / "rows.db"))
    try:
        limit_memory(side)
        side.execute("SET threads = 1")
        side.execute(f"SET temp_directory = {_sql_path(work / 'spill')}")
        side.execute("CREATE TABLE rows (" + ", ".join(f'"{name}" {kind}' for name, kind, *_ in columns) + ")")
        if chunks is None:
            cursor = con.execute(select)
            chunks = iter(lambda: cursor.fetchmany(batch), [])
        appender = side.appender("rows")
        for rows in chunks:
            appender.append_rows(rows)
            appender.flush()
        side.execute(f"COPY rows TO {_sql_path(path)} (FORMAT parquet, ROW_GROUP_SIZE {ROW_GROUP})")  # insertion order
    finally:
        side.close()
        shutil.rmtree(work, ignore_errors=True)


#: Rows per Parquet row group of ``entries.parquet`` (a row group is buffered whole while written).
ROW_GROUP = 16_384


def _copy_entries_aside(con: Any, entries_sql: str, path: Path) -> None:
    """``entries.parquet`` from a database locked to itself: rows in seq order, range by range,
    through a side DuckDB (see ``_copy_parquet_aside``)."""
    high = con.execute(f"SELECT coalesce(max(seq), 0) FROM {entries_sql}").fetchone()[0]
    _copy_parquet_aside(con, f"SELECT {_ENTRY_COLUMNS} FROM {entries_sql}", path,
                        chunks=_ranged_chunks(con, entries_sql, int(high)))


def _copy_entries_attached(con: Any, entries_sql: str, path: Path) -> None:
    """``entries.parquet`` from a connection with the side database ``export_side`` attached:
    the entries go into it in seq order one seq range at a time (one sort of every row would
    hold them all in memory), then DuckDB writes that table in its insertion order."""
    con.execute(f"CREATE TABLE export_side.rows AS SELECT {_ENTRY_COLUMNS} FROM {entries_sql} LIMIT 0")
    # Where one ORDER BY seq over everything puts them: seqs below 1 first, NULL seqs last.
    con.execute(f"INSERT INTO export_side.rows SELECT {_ENTRY_COLUMNS} FROM {entries_sql} WHERE seq < 1 ORDER BY seq")
    high = con.execute(f"SELECT coalesce(max(seq), 0) FROM {entries_sql}").fetchone()[0]
    for low in range(1, int(high) + 1, RANGE):
        con.execute(f"INSERT INTO export_side.rows SELECT {_ENTRY_COLUMNS} FROM {entries_sql} "
                    "WHERE seq BETWEEN ? AND ? ORDER BY seq", [low, low + RANGE - 1])
    con.execute(f"INSERT INTO export_side.rows SELECT {_ENTRY_COLUMNS} FROM {entries_sql} WHERE seq IS NULL")
    con.execute(f"COPY export_side.rows TO {_sql_path(path)} (FORMAT parquet, ROW_GROUP_SIZE {ROW_GROUP})")


def _export(con: Any, directory: Path, *, verifier: NoteVerifier, key_id: str,
            entries_sql: str = "entries", copy: Any = _copy_parquet,
            invalid: dict[str, Any] | None = None,
            copy_entries: Any = _copy_entries_aside) -> ExportResult:
    directory = _prepare_dir(directory)
    con.begin()
    try:
        entries = con.execute(f"SELECT count(*) FROM {entries_sql}").fetchone()[0]
        head = con.execute(f"SELECT hash FROM {entries_sql} ORDER BY seq DESC LIMIT 1").fetchone()
        latest = con.execute("SELECT note FROM checkpoints ORDER BY size DESC LIMIT 1").fetchone()
        checkpoints = con.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
        fmt = con.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        copy_entries(con, entries_sql, directory / BUNDLE_FILES["entries"])
        copy(con, "SELECT size, root, note, created_at FROM checkpoints ORDER BY size",
             directory / BUNDLE_FILES["checkpoints"])
        cosigned = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'checkpoint_cosignatures'"
                               ).fetchone()[0]
        if cosigned:  # a journal written before cosignatures were kept has no such table
            copy(con, "SELECT size, witness, timestamp, signature, created_at FROM checkpoint_cosignatures "
                      "ORDER BY size, witness", directory / BUNDLE_FILES["cosignatures"])
    finally:
        con.commit()
    return _finish(directory, verifier=verifier, key_id=key_id, entries=int(entries),
                   head=bytes(head[0]) if head else None, checkpoints=int(checkpoints),
                   latest=latest[0] if latest is not None else None, cosigned=bool(cosigned), invalid=invalid,
                   entry_format=str(fmt[0]) if fmt else FORMAT_VERSION)


def _finish(directory: Path, *, verifier: NoteVerifier, key_id: str, entries: int, head: bytes | None,
            checkpoints: int, latest: str | None, cosigned: bool, invalid: dict[str, Any] | None,
            entry_format: str = FORMAT_VERSION) -> ExportResult:
    """Write the bundle's small files beside its Parquet files; the result names every file."""

    files = [BUNDLE_FILES["entries"], BUNDLE_FILES["checkpoints"]]
    if cosigned:
        files.append(BUNDLE_FILES["cosignatures"])
    if latest is not None:
        (directory / BUNDLE_FILES["checkpoint"]).write_text(latest, encoding="utf-8")
        files.append(BUNDLE_FILES["checkpoint"])
    facts = BundleFacts(verifier, key_id, entries, head.hex() if head else "0" * 64, checkpoints)
    texts = {**_key_texts(verifier), "meta": json.dumps(
        {**_meta_facts(facts), "format": entry_format, "verified": invalid is None, "invalid": invalid},
        indent=2,
    ) + "\n", "views": bundle_sql(), "readme": bundle_readme(facts)}
    for name, text in texts.items():
        (directory / BUNDLE_FILES[name]).write_text(text, encoding="utf-8")
        files.append(BUNDLE_FILES[name])
    return ExportResult(directory, entries, checkpoints, tuple(files))


# --- what verify checks of the files beside the entries ------------------------------------


@dataclass(frozen=True)
class BundleFacts:
    """What a bundle's small files are written from: its key, entry count, head hash, checkpoints."""

    verifier: NoteVerifier
    key_id: str
    entries: int
    head_hex: str
    checkpoints: int


def bundle_readme(facts: BundleFacts) -> str:
    """The README this install writes for a bundle with these facts."""
    return _README.format(origin=facts.verifier.name, entries=facts.entries, head=facts.head_hex,
                          key_id=facts.key_id, vkey=facts.verifier.key())


def _key_texts(verifier: NoteVerifier) -> dict[str, str]:
    return {"pub": base64.b64encode(verifier.public_key).decode() + "\n", "vkey": verifier.key() + "\n"}


def _meta_facts(facts: BundleFacts) -> dict[str, Any]:
    """The keys of ``meta.json`` that follow from the entries (in the order they are written)."""
    return {"origin": facts.verifier.name, "entries": facts.entries, "head_hash": facts.head_hex,
            "key_id": facts.key_id, "checkpoints": facts.checkpoints}


def _plain_files(directory: Path) -> None:
    """Every bundle file present is a plain file: a link, a folder or a pipe is refused before
    anything reads it (a pipe would hold the reader forever, a link read another file)."""

    for name in BUNDLE_FILES.values():
        path = directory / name
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise BundleFileAltered(f"{name}: cannot be read ({exc.strerror})", name) from None
        if stat.S_ISLNK(mode):
            raise BundleFileAltered(f"{name} is a symbolic link; a bundle holds plain files only", name)
        if not stat.S_ISREG(mode):
            raise BundleFileAltered(f"{name} is not a plain file; a bundle holds plain files only", name)


#: More than any key, meta.json or checkpoint note apollia-os writes: such a file is not read whole.
_SMALL_FILE = 1 << 20


def _read_at_most(directory: Path, name: str, limit: int) -> bytes | None:
    """The file's bytes (None when absent), reading at most ``limit`` + 1 of them: a file longer
    than what it must equal differs, however long it is."""
    try:
        with (directory / name).open("rb") as f:
            return f.read(limit + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BundleFileAltered(f"{name}: cannot be read ({exc.strerror})", name) from None


def _must_equal(directory: Path, name: str, expected: str, why: str) -> None:
    want = expected.encode("utf-8")
    got = _read_at_most(directory, name, len(want))
    if got is not None and got != want:
        raise BundleFileAltered(f"{name} is not the file apollia-os writes for this bundle ({why}); "
                                "do not run or trust it", name)


def _bundle_rows(directory: Path) -> tuple[int, str, int, str | None]:
    """Entry count, head hash (hex), checkpoint count and the largest checkpoint's note, read from
    the Parquet files (verified separately by ``verify_bundle``)."""
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET enable_progress_bar = false")
        name = BUNDLE_FILES["entries"]
        try:
            [(count, head)] = con.execute(
                "SELECT count(*), arg_max(hash, seq) FROM read_parquet(?)", [str(directory / name)]).fetchall()
            name = BUNDLE_FILES["checkpoints"]
            cps, latest = 0, None
            if (directory / name).exists():
                [(cps, latest)] = con.execute("SELECT count(*), arg_max(note, size) FROM read_parquet(?)",
                                              [str(directory / name)]).fetchall()
        except duckdb.Error as exc:
            raise BundleFileAltered(f"{name} cannot be read as the bundle's Parquet file: "
                                    f"{str(exc).splitlines()[0]}", name) from None
    finally:
        con.close()
    head_hex = bytes(head).hex() if count and head is not None else "0" * 64
    return int(count), head_hex, int(cps), latest


def check_bundle_files(directory: Path) -> BundleFacts:
    """Check the files beside a bundle's entries against what this install writes for them.

    Every bundle file present must be a plain file; ``journal.vkey`` and ``journal.pub`` must be
    the key's exact text; ``meta.json`` must name the origin, entry count, head hash, key id and
    checkpoint count the Parquet files hold; ``checkpoint.txt`` must be the largest stored
    checkpoint's note; ``views.sql`` and ``README.md``, when present, must be byte for byte what
    this install writes for those facts. Raises ``BUNDLE_FILE_ALTERED`` naming the first file
    that is not (``NOT_FOUND`` when the folder is not a bundle). Reads nothing but the bundle's
    own files, each no further than the length it must have."""

    directory = Path(directory)
    for name in (BUNDLE_FILES["entries"], BUNDLE_FILES["vkey"]):
        if not (directory / name).exists() and not (directory / name).is_symlink():
            raise NotFound(f"{directory} is not an audit bundle: {name} is missing")
    _plain_files(directory)
    for name in (BUNDLE_FILES["vkey"], BUNDLE_FILES["pub"], BUNDLE_FILES["meta"]):
        if (directory / name).exists() and (directory / name).stat().st_size > _SMALL_FILE:
            raise BundleFileAltered(f"{name} holds {(directory / name).stat().st_size} bytes; apollia-os writes "
                                    f"it in under {_SMALL_FILE}", name)
    try:
        verifier = read_bundle_key(directory)
    except (BadInput, IntegrityError) as exc:
        raise BundleFileAltered(f"{BUNDLE_FILES['vkey']}/{BUNDLE_FILES['pub']}: {exc.message}",
                                BUNDLE_FILES["vkey"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleFileAltered(f"{BUNDLE_FILES['vkey']} cannot be read: {exc}", BUNDLE_FILES["vkey"]) from None
    for part, text in _key_texts(verifier).items():
        _must_equal(directory, BUNDLE_FILES[part], text, "the key's exact text, one line")
    entries, head_hex, checkpoints, latest = _bundle_rows(directory)
    facts = BundleFacts(verifier, key_id(verifier.public_key), entries, head_hex, checkpoints)
    name = BUNDLE_FILES["meta"]
    if (directory / name).exists():
        try:
            meta = read_bundle_meta(directory)
        except IntegrityError as exc:
            raise BundleFileAltered(exc.message, name) from None
        for key, value in _meta_facts(facts).items():
            if meta.get(key) != value or type(meta.get(key)) is not type(value):
                raise BundleFileAltered(f"{name} says {key} {meta.get(key)!r}; the bundle's files hold "
                                        f"{value!r}", name)
    name = BUNDLE_FILES["checkpoint"]
    if latest is None:
        if (directory / name).exists():
            raise BundleFileAltered(f"{name} is present, but {BUNDLE_FILES['checkpoints']} holds no checkpoint",
                                    name)
    else:
        _must_equal(directory, name, latest, f"the note of the largest checkpoint in {BUNDLE_FILES['checkpoints']}")
    _must_equal(directory, BUNDLE_FILES["views"], bundle_sql(),
                "the views this install makes; `apollia-os audit views` prints them")
    _must_equal(directory, BUNDLE_FILES["readme"], bundle_readme(facts), "its instructions, for these entries")
    return facts


def export_home(home: Home, directory: Path, *, invalid: dict[str, Any] | None = None) -> ExportResult:
    """Export a home's journal (opened read-only) into ``directory``. ``invalid``: the failed
    verification of a journal exported anyway, recorded in ``meta.json``."""

    if not home.journal_db.exists():
        raise NotFound(f"no journal at {home.journal_db}")
    public_key = load_public_key(home)
    con = connect_locked(home.journal_db, read_only=True)
    try:
        limit_memory(con)
        row = con.execute("SELECT value FROM meta WHERE key = 'origin'").fetchone()
        if row is None:
            raise IntegrityError(f"{home.journal_db} has no origin in its meta table")
        entries_sql = entries_with_tail(con, home.journal_db)
        directory = _prepare_dir(directory)
        work = Path(tempfile.mkdtemp(prefix=".export-", dir=directory))
        try:
            con.execute("SET threads = 1")  # DuckDB keeps insertion order, within bounded memory
            con.execute(f"SET temp_directory = {_sql_path(work / 'spill')}")
            con.execute(f"ATTACH {_sql_path(work / 'rows.db')} AS export_side (READ_WRITE)")
            try:
                return _export(con, directory, verifier=NoteVerifier(row[0], public_key),
                               key_id=key_id(public_key), entries_sql=entries_sql,
                               copy_entries=_copy_entries_attached, invalid=invalid)
            finally:
                con.execute("DETACH export_side")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        con.close()


def export_journal(journal: Journal, directory: Path, *, invalid: dict[str, Any] | None = None) -> ExportResult:
    """Export an open journal into ``directory`` (from one consistent snapshot); ``invalid`` as for
    ``export_home``."""
    cursor = journal.cursor()
    try:
        return _export(cursor, directory, verifier=journal.verifier(), key_id=journal.key_id,
                       copy=_copy_parquet_aside, invalid=invalid)
    finally:
        cursor.close()


def export_streamed(journal: Any, directory: Path, *, size: int, checkpoints: list[tuple[int, bytes, str]],
                    invalid: dict[str, Any] | None = None) -> ExportResult:
    """Export entries 1..``size`` of a journal read a page at a time (``journal.entry_pages``, e.g. the
    server's journal read by its client) into ``directory``: one page is held at a time, however long
    the journal is. ``checkpoints`` are its stored ``(size, root, note)`` rows, read before ``size``
    was fixed; those beyond ``size`` are left out, with their cosignatures. ``invalid`` as for
    ``export_home``."""


    directory = _prepare_dir(directory)
    kept = [(int(s), bytes(r), n) for s, r, n in checkpoints if int(s) <= size]
    largest = max((s for s, _r, _n in kept), default=0)
    cosignatures = [c for c in journal.cosignatures() if kept and int(c[0]) <= largest]
    counted: dict[str, Any] = {"entries": 0, "head": None}

    def pages() -> Any:
        for rows in journal.entry_pages(size):
            counted["entries"] += len(rows)
            counted["head"] = bytes(rows[-1][7])
            yield rows

    con = duckdb.connect(":memory:")
    try:
        limit_memory(con)
        for ddl in _SCHEMA:  # the journal's tables, for their column types
            con.execute(ddl)
        for c in kept:
            con.execute("INSERT INTO checkpoints (size, root, note, created_at) VALUES (?, ?, ?, '')", list(c))
        for c in cosignatures:
            con.execute("INSERT INTO checkpoint_cosignatures (size, witness, timestamp, signature, created_at) "
                        "VALUES (?, ?, ?, ?, '')", list(c))
        _copy_parquet_aside(con, f"SELECT {_ENTRY_COLUMNS} FROM entries", directory / BUNDLE_FILES["entries"],
                            chunks=pages())
        _copy_parquet(con, "SELECT size, root, note, created_at FROM checkpoints ORDER BY size",
                      directory / BUNDLE_FILES["checkpoints"])
        _copy_parquet(con, "SELECT size, witness, timestamp, signature, created_at FROM checkpoint_cosignatures "
                           "ORDER BY size, witness", directory / BUNDLE_FILES["cosignatures"])
    finally:
        con.close()
    latest = max(kept, default=None)
    return _finish(directory, verifier=journal.verifier(), key_id=journal.key_id, entries=counted["entries"],
                   head=counted["head"], checkpoints=len(kept), latest=latest[2] if latest else None,
                   cosigned=True, invalid=invalid, entry_format=str(getattr(journal, "format", FORMAT_VERSION)))
