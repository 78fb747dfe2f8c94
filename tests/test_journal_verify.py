"""The verifier: its pure core over rows, worker processes, bundles, and the open-journal path."""

from __future__ import annotations

import json

import duckdb
import pytest
from nacl.signing import SigningKey

from apollia_nb.errors import BadInput, IntegrityError, NotFound
from apollia_nb.journal import Draft, Journal, export_home, export_journal, verify_bundle, verify_home, verify_journal
from apollia_nb.journal.checkpoint import Checkpoint, NoteSigner
from apollia_nb.journal.entry import GENESIS_HASH, canonical_json, entry_hash
from apollia_nb.journal.keys import key_id
from apollia_nb.journal.merkle import EMPTY_ROOT, leaf_hash, root
from apollia_nb.journal.verify import VerifyReport, verify_rows

ORIGIN = "apollia-nb/test"


def make_rows(n: int, key: SigningKey, *, bad_signature_at: int | None = None) -> list[tuple]:
    rows, prev = [], GENESIS_HASH
    kid = key_id(bytes(key.verify_key))
    for seq in range(1, n + 1):
        ts = f"2026-01-01T00:00:{seq % 60:02d}.000000Z"
        payload = canonical_json({"n": seq})
        digest = entry_hash(seq, ts, "run", None, "plan", payload, prev)
        sig = key.sign(digest).signature
        if seq == bad_signature_at:
            sig = SigningKey.generate().sign(digest).signature
        rows.append((seq, ts, "run", None, "plan", payload, prev, digest, sig, kid))
        prev = digest
    return rows


def note_for(key: SigningKey, rows: list[tuple], size: int) -> str:
    cp = Checkpoint(ORIGIN, size, root([leaf_hash(r[7]) for r in rows[:size]]))
    return NoteSigner(ORIGIN, key).sign(cp.body())


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey(bytes(range(32)))


def check(rows, key, **kw) -> VerifyReport:
    chunks = [rows[i : i + 100] for i in range(0, len(rows), 100)]
    return verify_rows(chunks, public_key=bytes(key.verify_key), origin=ORIGIN, total=len(rows), **kw)


def test_an_empty_journal_verifies(key):
    assert check([], key) == VerifyReport(True, 0, None, None, 0)
    empty = NoteSigner(ORIGIN, key).sign(Checkpoint(ORIGIN, 0, EMPTY_ROOT).body())
    assert check([], key, external=empty).checked_checkpoints == 1


def test_rows_verify_with_stored_and_external_checkpoints(key):
    rows = make_rows(300, key)
    stored = [(size, root([leaf_hash(r[7]) for r in rows[:size]]), note_for(key, rows, size)) for size in (1, 128, 300)]
    report = check(rows, key, checkpoints=stored, external=note_for(key, rows, 257))
    assert report.ok and report.entries == 300 and report.checked_checkpoints == 4
    assert report.to_dict() == {"ok": True, "entries": 300, "first_bad_seq": None, "problem": None,
                                "checked_checkpoints": 4}
    assert report.summary() == "ok: 300 entries verified (chain, hashes, signatures), 4 checkpoint(s)"


def test_the_lowest_failure_wins(key):
    rows = make_rows(300, key, bad_signature_at=250)
    rows[279] = rows[279][:4] + ("verdict",) + rows[279][5:]
    report = check(rows, key)
    assert (report.ok, report.first_bad_seq) == (False, 250)
    assert report.summary() == f"FAILED at seq 250: {report.problem}"


@pytest.mark.parametrize("bad", [1, 150, 299])
def test_worker_processes_find_the_same_bad_signature(key, bad):
    rows = make_rows(300, key, bad_signature_at=bad)
    inline = check(rows, key, workers=1)
    pooled = check(rows, key, workers=2, parallel_min=1)
    assert inline == pooled
    assert (pooled.ok, pooled.first_bad_seq) == (False, bad)
    assert "signature" in pooled.problem


def test_worker_processes_verify_a_clean_journal(key):
    rows = make_rows(500, key)
    assert check(rows, key, workers=2, parallel_min=1) == VerifyReport(True, 500, None, None, 0)


def test_a_structural_failure_and_a_later_bad_signature(key):
    rows = make_rows(300, key, bad_signature_at=280)
    del rows[99]  # seq 100 missing
    report = check(rows, key, workers=2, parallel_min=1)
    assert (report.first_bad_seq, report.entries) == (100, 99)
    assert report.problem == "entry 100 is missing (the next entry has seq 101)"  # the later chunks are not read


def test_malformed_rows_fail_cleanly(key):
    rows = make_rows(5, key)
    rows[2] = rows[2][:9]
    report = check(rows, key)
    assert (report.ok, report.first_bad_seq) == (False, 3)
    rows = make_rows(5, key)
    rows[3] = (4, 12345, "run", None, "plan", None, rows[2][7], rows[3][7], rows[3][8], rows[3][9])
    assert check(rows, key).first_bad_seq == 4
    rows = make_rows(5, key)
    rows[4] = (None,) + rows[4][1:]
    assert check(rows, key).first_bad_seq == 5


def test_a_note_from_another_origin_is_refused(key):
    rows = make_rows(10, key)
    other = NoteSigner("apollia-nb/other", key).sign(Checkpoint("apollia-nb/other", 10, EMPTY_ROOT).body())
    report = check(rows, key, external=other)
    assert not report.ok and report.first_bad_seq is None
    assert "the given checkpoint" in report.problem


def test_a_bad_public_key_is_bad_input(key):
    with pytest.raises(BadInput):
        verify_rows([], public_key=b"short", origin=ORIGIN)


def test_verify_an_open_journal_and_its_home(home):
    with Journal.open(home) as journal:
        journal.append_many(Draft("plan", {"i": i}) for i in range(50))
        journal.checkpoint()
        journal.append("plan", {"i": 50})
        report = verify_journal(journal)
        assert report.ok and report.entries == 51 and report.checked_checkpoints == 1
        note = journal.checkpoint()
        assert verify_journal(journal, note).checked_checkpoints == 3
    assert verify_home(home, external=note).ok


def test_verify_home_needs_a_journal(home):
    with pytest.raises(NotFound) as missing:
        verify_home(home)
    assert missing.value.message == f"no journal at {home.journal_db}"


def test_verify_without_a_key_fails(home):
    with Journal.open(home) as journal:
        journal.append("plan", {})
    for name in ("journal.key", "journal.pub"):
        (home.keys_dir / name).unlink()
    with pytest.raises(IntegrityError):
        verify_home(home)


def test_an_exported_bundle_verifies_and_is_queryable(home, tmp_path):
    with Journal.open(home) as journal:
        journal.append("run_open", {"run_kind": "task", "goal": "g"}, run_id="r1", agent="clerk")
        journal.append("decision", {"call_id": "c1", "tool": "read_file", "family": "read",
                                    "arguments": {"path": "a"}, "outcome": "allow", "line": 3,
                                    "answers": [], "reason": "reads"}, run_id="r1", agent="clerk")
        journal.append("run_seal", {"status": "succeeded", "entries": 2}, run_id="r1", agent="clerk")
        origin, vkey, public = journal.origin, journal.verifier_key(), journal.public_key()
    bundle = tmp_path / "bundle"
    result = export_home(home, bundle)
    assert result.entries == 3 and result.checkpoints == 1
    assert set(result.files) == {p.name for p in bundle.iterdir()}
    assert (bundle / "journal.vkey").read_text().strip() == vkey
    meta = json.loads((bundle / "meta.json").read_text())
    assert meta["origin"] == origin and meta["entries"] == 3
    assert "apollia-os audit verify --bundle" in (bundle / "README.md").read_text()
    report = verify_bundle(bundle, external=(bundle / "checkpoint.txt").read_text())
    assert report.ok and report.entries == 3 and report.checked_checkpoints == 2

    # exact bytes survive Parquet
    con = duckdb.connect()
    live = duckdb.connect(str(home.journal_db), read_only=True)
    assert con.execute(f"SELECT * FROM read_parquet('{bundle / 'entries.parquet'}') ORDER BY seq").fetchall() == \
        live.execute("SELECT * FROM entries ORDER BY seq").fetchall()
    live.close()

    # the views script runs over the bundle
    import os

    cwd = os.getcwd()
    os.chdir(bundle)
    try:
        con.execute((bundle / "views.sql").read_text())
        assert con.execute("SELECT run_id, agent, kind, status, entries FROM runs").fetchall() == \
            [("r1", "clerk", "task", "succeeded", 3)]
        assert con.execute("SELECT tool, outcome FROM decisions").fetchall() == [("read_file", "allow")]
    finally:
        os.chdir(cwd)
        con.close()
    import base64

    assert base64.b64decode((bundle / "journal.pub").read_text()) == public


def test_an_open_journal_exports_though_its_database_opens_no_file(home, tmp_path):
    """The open journal's database is locked to itself (its SQL cannot write a file), yet it exports."""
    with Journal.open(home) as journal:
        # more than one batch of the rows handed to the in-memory writer of the files
        journal.append_many(Draft("plan", {"n": n}, run_id="r1", agent="clerk") for n in range(25_001))
        journal.checkpoint()
        cursor = journal.cursor()
        try:
            with pytest.raises(duckdb.PermissionException):
                cursor.execute(f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'")
        finally:
            cursor.close()
        result = export_journal(journal, tmp_path / "live")
        live = journal.sql("SELECT * FROM entries ORDER BY seq")
    assert result.entries == 25_001 and result.checkpoints == 1 and not (tmp_path / "x.csv").exists()
    assert verify_bundle(tmp_path / "live").ok
    con = duckdb.connect()
    try:
        exported = con.execute(f"SELECT * FROM read_parquet('{tmp_path / 'live' / 'entries.parquet'}') "
                               "ORDER BY seq").fetchall()
        assert exported == live
        export_home(home, tmp_path / "offline")
        schema = "SELECT name, type FROM parquet_schema('{}')"
        assert con.execute(schema.format(tmp_path / "live" / "entries.parquet")).fetchall() == \
            con.execute(schema.format(tmp_path / "offline" / "entries.parquet")).fetchall()
    finally:
        con.close()


def test_a_tampered_bundle_fails(home, tmp_path):
    with Journal.open(home) as journal:
        journal.append_many(Draft("plan", {"i": i}) for i in range(20))
    bundle = tmp_path / "bundle"
    export_home(home, bundle)
    con = duckdb.connect()
    path = bundle / "entries.parquet"
    con.execute(
        f"COPY (SELECT * REPLACE (CASE WHEN seq = 7 THEN CAST('{{}}' AS BLOB) ELSE payload END AS payload) "
        f"FROM read_parquet('{path}')) TO '{tmp_path / 'e.parquet'}' (FORMAT parquet)"
    )
    con.close()
    (tmp_path / "e.parquet").replace(path)
    report = verify_bundle(bundle)
    assert (report.ok, report.first_bad_seq) == (False, 7)


def test_bundle_keys_must_agree(home, tmp_path):
    with Journal.open(home) as journal:
        journal.append("plan", {})
    bundle = tmp_path / "bundle"
    export_home(home, bundle)
    import base64

    (bundle / "journal.pub").write_text(base64.b64encode(bytes(SigningKey.generate().verify_key)).decode())
    with pytest.raises(IntegrityError):
        verify_bundle(bundle)
    with pytest.raises(NotFound):
        verify_bundle(tmp_path / "nothing")


def test_export_refuses_a_folder_with_a_bundle(home, tmp_path):
    with Journal.open(home) as journal:
        journal.append("plan", {})
    export_home(home, tmp_path / "b")
    with pytest.raises(BadInput):
        export_home(home, tmp_path / "b")


def test_chunks_of_a_dead_worker_are_checked_inline(key):
    from apollia_nb.journal.verify import _batch, _Worker

    rows = make_rows(50, key, bad_signature_at=42)
    worker = _Worker(bytes(key.verify_key))
    worker.proc.kill()
    worker.submit(_batch(rows[:25]))
    worker.submit(_batch(rows[25:]))
    assert worker.results(bytes(key.verify_key)) == [42]


def test_verify_home_reads_what_a_killed_writer_committed(home):
    """Read-only verification takes what a kill -9 left behind in journal.log (and DuckDB's WAL)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import os, signal
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal
        journal = Journal.open(Home.at({str(home.path)!r}))
        for i in range(30):
            journal.append("plan", {{"i": i}})
        journal.checkpoint()
        for i in range(5):
            journal.append("plan", {{"i": i}})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == -9
    log = home.path / "journal.log"
    before = log.read_bytes()
    assert before  # the last five were committed to the log only
    report = verify_home(home)
    assert report.ok and report.entries == 35 and report.checked_checkpoints == 1
    assert log.read_bytes() == before  # verifying wrote nothing


@pytest.mark.parametrize("bad", [None, 250])
def test_a_failed_signature_worker_is_reported_and_its_signatures_still_checked(key, bad, monkeypatch):
    # Each worker is killed as it starts: every chunk handed to it must be checked in this process,
    # and the report must say so rather than pass silently.
    monkeypatch.setenv("APOLLIA_FAULT", "verify.signature_worker:kill")
    rows = make_rows(500, key, bad_signature_at=bad)
    report = check(rows, key, workers=2, parallel_min=1)
    if bad is None:
        assert (report.ok, report.entries) == (True, 500)
    else:
        assert (report.ok, report.first_bad_seq) == (False, bad)
        assert "signature does not verify" in report.problem
    assert len(report.notes) == 2
    assert all("signature worker" in note and "killed by signal 9" in note and "checked in this process" in note
               for note in report.notes)
    assert report.to_dict()["notes"] == list(report.notes)
    assert report.summary().splitlines()[1:] == [f"note: {note}" for note in report.notes]


def test_healthy_signature_workers_leave_no_note(key):
    report = check(make_rows(500, key), key, workers=2, parallel_min=1)
    assert report.notes == () and "notes" not in report.to_dict() and "note:" not in report.summary()


def test_a_bad_signature_in_a_later_chunk_of_one_worker(key):
    # 100-row chunks alternate between the two workers: seq 450 is in worker 0's third chunk.
    rows = make_rows(500, key, bad_signature_at=450)
    report = check(rows, key, workers=2, parallel_min=1)
    assert (report.ok, report.first_bad_seq, report.entries) == (False, 450, 449)
    assert report.notes == ()


def test_a_changed_link_with_a_recomputed_hash_and_signature_fails_at_that_entry(key):
    rows = make_rows(10, key)
    seq, ts, run_id, agent, kind, payload, _prev, _digest, _sig, kid = rows[4]
    forged_prev = b"\x01" * 32
    digest = entry_hash(seq, ts, run_id, agent, kind, payload, forged_prev)
    rows[4] = (seq, ts, run_id, agent, kind, payload, forged_prev, digest, key.sign(digest).signature, kid)
    report = check(rows, key)
    assert (report.ok, report.first_bad_seq, report.entries) == (False, 5, 4)


@pytest.mark.parametrize("bad_hash", ["ab" * 32, 12345, None], ids=["str", "int", "NULL"])
def test_a_hash_column_that_is_not_bytes_fails_at_that_entry(key, bad_hash):
    rows = make_rows(10, key)
    rows[6] = rows[6][:7] + (bad_hash,) + rows[6][8:]
    for workers, parallel_min in ((1, 8_000), (2, 1)):
        report = check(rows, key, workers=workers, parallel_min=parallel_min)
        assert (report.ok, report.first_bad_seq, report.entries) == (False, 7, 6)


def test_verify_file_without_an_origin_row_fails_closed(home):
    from apollia_nb.journal.keys import load_public_key
    from apollia_nb.journal.verify import verify_file

    with Journal.open(home) as journal:
        journal.append("plan", {})
    con = duckdb.connect(str(home.journal_db))
    con.execute("DELETE FROM meta WHERE key = 'origin'")
    con.close()
    report = verify_file(home.journal_db, public_key=load_public_key(home))
    assert report == VerifyReport(False, 0, None, "the journal has no origin in its meta table", 0)
    assert report.summary() == "FAILED: the journal has no origin in its meta table"


def test_a_checkpoint_over_a_rewritten_history_fails_and_is_not_counted(key):
    rows = make_rows(20, key)
    # Signed by the journal key, over the root of another history of 10 entries.
    forged = NoteSigner(ORIGIN, key).sign(Checkpoint(ORIGIN, 10, root([b"\x07" * 32] * 10)).body())
    report = check(rows, key, external=forged)
    assert (report.ok, report.first_bad_seq, report.entries, report.checked_checkpoints) == (False, None, 20, 0)
    assert "the first 10 entries do not have its Merkle root" in report.problem
    assert check(rows, key, external=note_for(key, rows, 10)).checked_checkpoints == 1


def test_a_bundle_marked_invalid_fails_with_what_its_exporter_said():
    from apollia_nb.journal.verify import _marked

    ok = VerifyReport(True, 20, None, None, 1)
    marked = _marked(ok, {"first_bad_seq": 9, "problem": "entry 9: bad hash"})
    assert marked == VerifyReport(False, 8, 9, "the bundle was exported marked invalid (meta.json): the journal "
                                  "failed verification: entry 9: bad hash", 1)
    assert _marked(ok, None) is ok


# --- the signature items handed to workers ----------------------------------------------------


def test_signature_items_are_the_signed_message_layout_and_bad_columns_never_verify(key):
    from apollia_nb.journal.verify import _batch, _first_bad_index

    rows = make_rows(8, key)
    pk = bytes(key.verify_key)
    batch = _batch(rows)
    assert batch.seqs == list(range(1, 9))
    assert batch.body == b"".join(r[8] + r[7] for r in rows)  # signature, then the hash it signs
    assert _first_bad_index(pk, batch.body) is None

    # Columns of other binary types are taken as their bytes; wrong sizes or types become items
    # that cannot verify, in place, so every other item keeps its position.
    rows[1] = rows[1][:7] + (bytearray(rows[1][7]),) + (memoryview(rows[1][8]),) + rows[1][9:]
    rows[2] = rows[2][:7] + (rows[2][7] + b"\x00",) + rows[2][8:]
    rows[4] = rows[4][:8] + (rows[4][8][:63],) + rows[4][9:]
    rows[5] = rows[5][:8] + (None,) + rows[5][9:]
    rows[6] = rows[6][:7] + (rows[6][7].hex(),) + rows[6][8:]
    malformed = [rows[3][:9], ("x",) + rows[3][1:]]
    batch = _batch(rows[:3] + malformed + rows[3:])
    assert batch.seqs == list(range(1, 9)) and len(batch.body) == 8 * 96
    verifies = [_first_bad_index(pk, batch.body[i * 96:(i + 1) * 96]) is None for i in range(8)]
    assert verifies == [True, True, False, True, False, False, False, True]
    assert _first_bad_index(pk, batch.body) == 2
    assert _first_bad_index(pk, batch.body[3 * 96:]) == 1
    assert _batch([]) == ([], b"")


def _required(found, installed: bool, not_taken: str, missing: str):
    """``found`` (a signature checker), else: fail when the library is installed (it must be taken),
    fail in CI, skip locally."""
    import os

    if found is not None:
        return found
    assert not installed, not_taken  # only where there is none may the test be skipped
    if os.environ.get("CI") == "true":
        pytest.fail(missing)
    pytest.skip(missing)


def require_system_libsodium():
    """The system libsodium's verify, installed by dev/install-test-libsodium.sh."""
    import ctypes.util

    from apollia_nb.journal.verify import _system_verify

    return _required(_system_verify(), ctypes.util.find_library("sodium") is not None,
                     "the system's libsodium was not taken",
                     "no system libsodium: run `bash dev/install-test-libsodium.sh` (Debian's libsodium23)")


@pytest.mark.parametrize("column, value", [(8, lambda sig: sig[:63]), (7, lambda digest: digest + b"\x00"),
                                           (7, lambda digest: "a" * 32), (8, lambda sig: "s" * 64),
                                           (7, lambda digest: bytearray(digest))],
                         ids=["short signature", "long hash", "text hash", "text signature", "bytearray hash"])
def test_one_odd_column_in_a_chunk_of_bytes_fails_alone(key, column, value):
    from apollia_nb.journal.verify import _batch, _first_bad_index

    rows = make_rows(4, key)
    row = list(rows[2])
    row[column] = value(row[column])
    rows[2] = tuple(row)
    batch = _batch(rows)
    pk = bytes(key.verify_key)
    assert batch.seqs == [1, 2, 3, 4] and len(batch.body) == 4 * 96
    verifies = [_first_bad_index(pk, batch.body[i * 96:(i + 1) * 96]) is None for i in range(4)]
    assert verifies == [True, True, isinstance(row[column], bytearray), True]


def require_zebra():
    """ed25519-zebra's verify, a dependency of the package."""
    import importlib.util

    from apollia_nb.journal.verify import _zebra_verify

    return _required(_zebra_verify(), importlib.util.find_spec("ed25519_zebra") is not None,
                     "ed25519-zebra is installed and was not taken",
                     "ed25519-zebra is not installed (py-ed25519-zebra-bindings, a dependency of the package)")


def clear_checkers(verify_module) -> None:
    verify_module._system_verify.cache_clear()
    verify_module._zebra_verify.cache_clear()


@pytest.fixture(params=["zebra", "system", "pynacl"])
def libsodium(request, monkeypatch):
    """Signatures checked with ed25519-zebra behind libsodium's checks (the default where installed),
    the system's libsodium (``APOLLIA_ED25519=libsodium``) or PyNaCl's own (``APOLLIA_LIBSODIUM=pynacl``),
    here and in the workers (they inherit the environment)."""
    from apollia_nb.journal import verify as verify_module

    monkeypatch.delenv(verify_module.LIBSODIUM_ENV, raising=False)
    monkeypatch.delenv(verify_module.CHECKER_ENV, raising=False)
    if request.param == "pynacl":
        monkeypatch.setenv(verify_module.LIBSODIUM_ENV, "pynacl")
    elif request.param == "system":
        monkeypatch.setenv(verify_module.CHECKER_ENV, "libsodium")
    clear_checkers(verify_module)
    if request.param == "system":
        require_system_libsodium()
    elif request.param == "zebra":
        require_zebra()
    yield request.param
    clear_checkers(verify_module)


@pytest.mark.parametrize("bad", [[101], [200], [130, 170], [30, 60]])
def test_workers_report_the_first_bad_signature_of_a_chunk_at_any_place(key, bad, libsodium):
    # 100-row chunks: seq 101 is the first item of the second worker's first chunk, 200 its last.
    rows = make_rows(300, key)
    for seq in bad:
        other = SigningKey.generate().sign(rows[seq - 1][7]).signature
        rows[seq - 1] = rows[seq - 1][:8] + (other,) + rows[seq - 1][9:]
    inline = check(rows, key, workers=1)
    pooled = check(rows, key, workers=2, parallel_min=1)
    assert inline == pooled
    assert (pooled.ok, pooled.first_bad_seq, pooled.entries) == (False, bad[0], bad[0] - 1)
    assert pooled.problem == f"entry {bad[0]}: signature does not verify under the journal key"
    assert pooled.notes == ()


def second_worker_cannot_start(monkeypatch) -> list:
    """Only the first signature worker of a verification starts (returned); the next raises OSError."""
    from apollia_nb.journal import verify as verify_module

    started = []
    real = verify_module._Worker.__init__

    def second_fails(self, public_key):
        if started:
            raise OSError("no interpreter")
        started.append(self)
        real(self, public_key)

    monkeypatch.setattr(verify_module._Worker, "__init__", second_fails)
    return started


@pytest.mark.parametrize("bad", [None, 50, 150])
def test_a_worker_that_cannot_start_leaves_its_share_to_this_process(key, bad, monkeypatch):
    # The second worker cannot start: the first checks every other chunk's signatures and this
    # process the rest (seq 50 is in the worker's share, 150 in this process's), and the report says so.
    started = second_worker_cannot_start(monkeypatch)
    report = check(make_rows(300, key, bad_signature_at=bad), key, workers=2, parallel_min=1)
    assert len(started) == 1
    if bad is None:
        assert (report.ok, report.entries) == (True, 300)
    else:
        assert (report.ok, report.first_bad_seq, report.entries) == (False, bad, bad - 1)
    assert report.notes == ("1 signature worker(s) could not start (no interpreter); "
                            "their signatures were checked in this process",)


# --- the entry hash the verifier recomputes ----------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_text = st.text(st.characters(codec="utf-8"), max_size=12)
_binary = st.one_of(st.binary(max_size=40), st.binary(max_size=40).map(bytearray),
                    st.binary(max_size=40).map(memoryview))


@settings(max_examples=300, deadline=None)
@given(seq=st.integers(0, 2**64 - 1), ts=_text, run_id=st.none() | _text, agent=st.none() | _text, kind=_text,
       payload=st.none() | _binary, prev=_binary)
def test_entry_hash_is_the_sha256_of_entry_bytes_for_every_column_type(seq, ts, run_id, agent, kind, payload, prev):
    import hashlib

    from apollia_nb.journal.entry import entry_bytes

    assert entry_hash(seq, ts, run_id, agent, kind, payload, prev) == \
        hashlib.sha256(entry_bytes(seq, ts, run_id, agent, kind, payload, prev)).digest()


def test_entry_bytes_are_the_documented_encoding():
    from apollia_nb.journal.entry import entry_bytes

    expected = (b"apollia-nb/journal-entry/v1\n" + (7).to_bytes(8, "big")
                + b"\x01\x00\x00\x00\x02ts" + b"\x00" + b"\x01\x00\x00\x00\x02\xc3\xa9"
                + b"\x01\x00\x00\x00\x04plan" + b"\x01\x00\x00\x00\x02{}" + b"\x05" * 32)
    assert entry_bytes(7, "ts", None, "é", "plan", b"{}", b"\x05" * 32) == expected
    import hashlib

    assert entry_hash(7, "ts", None, "é", "plan", b"{}", b"\x05" * 32) == hashlib.sha256(expected).digest()
    assert entry_hash(7, "ts", "é", None, "plan", b"{}", b"\x05" * 32) != \
        entry_hash(7, "ts", None, "é", "plan", b"{}", b"\x05" * 32)
    with pytest.raises(UnicodeEncodeError):
        entry_hash(7, "\ud800", None, None, "plan", b"{}", b"\x05" * 32)


# --- the libsodium that checks signatures ------------------------------------------------------


#: L, the order of the Ed25519 base point (RFC 8032).
ED25519_L = 2**252 + 27742317777372353535851937790883648493


def _tricky_items(key) -> list[bytes]:
    """Signed-message items (signature, hash) that libsodium's rules accept or refuse in different ways."""
    message = bytes(range(32))
    good = key.sign(message).signature
    s_plus_l = (int.from_bytes(good[32:], "little") + ED25519_L).to_bytes(32, "little")
    return [
        good + message,  # valid
        good[:5] + bytes([good[5] ^ 0x80]) + good[6:] + message,  # R changed
        good[:40] + bytes([good[40] ^ 1]) + good[41:] + message,  # S changed
        good[:32] + s_plus_l + message,  # the same S, not reduced: non-canonical
        bytes([1]) + bytes(31) + good[32:] + message,  # R of small order (the identity)
        bytes(64) + message,  # all zero
        b"\xff" * 32 + good[32:] + message,  # R not a canonical encoding
        good + message[:-1] + b"\x01",  # another message
        good + message,  # valid again
    ]


def test_zebra_the_system_libsodium_and_pynacls_agree_on_every_item(key, monkeypatch):
    from apollia_nb.journal import verify as verify_module

    monkeypatch.delenv(verify_module.LIBSODIUM_ENV, raising=False)
    monkeypatch.delenv(verify_module.CHECKER_ENV, raising=False)
    clear_checkers(verify_module)
    system, zebra = require_system_libsodium(), require_zebra()
    pk = bytes(key.verify_key)
    items = _tricky_items(key)
    results = {}
    for name, found, fast in (("zebra", lambda: system, lambda: zebra), ("system", lambda: system, lambda: None),
                              ("pynacl", lambda: None, lambda: None)):
        monkeypatch.setattr(verify_module, "_system_verify", found)
        monkeypatch.setattr(verify_module, "_zebra_verify", fast)
        results[name] = [verify_module._first_bad_index(pk, item) for item in items]
        body = b"".join(items)
        results[name + " whole"] = (verify_module._first_bad_index(pk, body),
                                    verify_module._first_bad_index(pk, items[0] + items[-1]),
                                    verify_module._first_bad_index(pk, items[0] + items[-1][:95]),
                                    verify_module._first_bad_index(pk, b""))
    assert results["zebra"] == results["system"] == results["pynacl"] == [None, 0, 0, 0, 0, 0, 0, 0, None]
    assert results["zebra whole"] == results["system whole"] == results["pynacl whole"] == (1, None, 1, None)


def test_a_libsodium_that_fails_the_self_test_is_not_used(key):
    from apollia_nb.journal.verify import _self_test, _system_verify

    _system_verify.cache_clear()
    real = require_system_libsodium()
    assert _self_test(real)
    assert not _self_test(lambda *args: 0)  # accepts everything
    assert not _self_test(lambda *args: -1)  # accepts nothing

    def lax_s(signature, message, size, public):  # takes S modulo L, as some libraries do
        s = int.from_bytes(signature[32:], "little")
        return real(signature[:32] + (s % ED25519_L).to_bytes(32, "little"), message, size, public)

    def lax_r(signature, message, size, public):  # takes a small-order R
        return 0 if signature[:32] == bytes([1]) + bytes(31) else real(signature, message, size, public)

    def lax_message(signature, message, size, public):  # looks at the signature only
        return real(signature, bytes(range(32, 64)), size, public)

    assert not _self_test(lax_s) and not _self_test(lax_r) and not _self_test(lax_message)


def test_a_fresh_process_takes_the_system_libsodium_at_its_first_lookup(monkeypatch):
    # A signature worker is a fresh process that looks the library up once: it must get the system's.
    import os
    import subprocess
    import sys
    from pathlib import Path

    import apollia_nb

    monkeypatch.delenv("APOLLIA_LIBSODIUM", raising=False)
    require_system_libsodium()
    root = str(Path(apollia_nb.__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", "from apollia_nb.journal.verify import _system_verify; print(_system_verify())"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": root},
    )
    assert out.returncode == 0 and out.stdout.startswith("<_FuncPtr object"), out.stdout + out.stderr


def test_apollia_libsodium_pynacl_keeps_to_pynacls_libsodium(monkeypatch):
    from apollia_nb.journal import verify as verify_module

    monkeypatch.setenv("APOLLIA_LIBSODIUM", "pynacl")
    clear_checkers(verify_module)
    try:
        assert verify_module._system_verify() is None and verify_module._zebra_verify() is None
    finally:
        clear_checkers(verify_module)


def test_apollia_ed25519_libsodium_leaves_zebra_out_and_keeps_the_system_libsodium(monkeypatch):
    from apollia_nb.journal import verify as verify_module

    monkeypatch.delenv("APOLLIA_LIBSODIUM", raising=False)
    monkeypatch.setenv("APOLLIA_ED25519", "libsodium")
    clear_checkers(verify_module)
    try:
        assert verify_module._zebra_verify() is None
        require_system_libsodium()
    finally:
        clear_checkers(verify_module)


def test_zebra_is_used_by_default_and_not_when_missing_or_failing_its_self_test(monkeypatch):
    import sys
    import types

    from apollia_nb.journal import verify as verify_module

    monkeypatch.delenv("APOLLIA_LIBSODIUM", raising=False)
    monkeypatch.delenv("APOLLIA_ED25519", raising=False)
    clear_checkers(verify_module)
    try:
        import ed25519_zebra

        assert require_zebra() is ed25519_zebra.ed_verify
        for fake in (lambda s, m, k: True, lambda s, m, k: False, lambda s, m, k: 1,  # all, none, not a bool
                     lambda s, m, k: ed25519_zebra.ed_verify(s[:32] + s[32:], bytes(range(32, 64)), k)):
            monkeypatch.setitem(sys.modules, "ed25519_zebra", types.SimpleNamespace(ed_verify=fake))
            clear_checkers(verify_module)
            assert verify_module._zebra_verify() is None
        monkeypatch.setitem(sys.modules, "ed25519_zebra", None)  # not installed: the import fails
        clear_checkers(verify_module)
        assert verify_module._zebra_verify() is None
    finally:
        clear_checkers(verify_module)


def _checked_by(verify_module, checker, pk, body):
    """``_first_bad_index`` with only ``checker`` (zebra, the system's libsodium or PyNaCl's) available."""
    found_system, found_zebra = verify_module._system_verify, verify_module._zebra_verify
    system, zebra = found_system(), found_zebra()
    verify_module._zebra_verify = lambda: zebra if checker == "zebra" else None
    verify_module._system_verify = lambda: system if checker != "pynacl" else None
    try:
        return verify_module._first_bad_index(pk, body)
    finally:
        verify_module._system_verify, verify_module._zebra_verify = found_system, found_zebra


_P = 2**255 - 19
#: y of an Ed25519 point of order 8 (its encoding with the sign bit clear).
_ORDER8_Y = 2707385501144840649318225287225658788936804267575313519463743609750303402022


def _set_y(encoded: bytes, y: int) -> bytes:
    """``encoded`` with its 255 bits of y replaced by ``y`` (the sign bit kept)."""
    return ((int.from_bytes(encoded, "little") & (1 << 255)) | y).to_bytes(32, "little")


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_zebra_behind_libsodiums_checks_agrees_with_libsodium_on_changed_items(data):
    # Signatures changed the ways an attacker without the key could: any byte, S at and past L, R or the key
    # of small order (any sign bit) or not canonical, a message changed. Zebra's answer must be libsodium's.
    import pytest as _pytest

    from apollia_nb.journal import verify as verify_module

    with _pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("APOLLIA_LIBSODIUM", raising=False)
        monkeypatch.delenv("APOLLIA_ED25519", raising=False)
        clear_checkers(verify_module)
        require_system_libsodium(), require_zebra()
        signer = SigningKey(data.draw(st.binary(min_size=32, max_size=32), label="seed"))
        pk = bytes(signer.verify_key)
        message = data.draw(st.binary(min_size=32, max_size=32), label="message")
        signature = bytearray(signer.sign(message).signature)
        small = [0, 1, _P - 1, _P, _P + 1, _ORDER8_Y, _P - _ORDER8_Y]
        how = data.draw(st.sampled_from(["byte", "s", "r small", "r y", "key small", "key y", "message", "none"]))
        if how == "byte":
            at = data.draw(st.integers(0, 63))
            signature[at] ^= data.draw(st.integers(1, 255))
        elif how == "s":
            s = int.from_bytes(signature[32:], "little") + data.draw(st.sampled_from([ED25519_L, 2 * ED25519_L]))
            s = data.draw(st.sampled_from([s, ED25519_L, ED25519_L - 1, 2**252, 2**253 - 1]))
            signature[32:] = (s % 2**256).to_bytes(32, "little")
        elif how == "r small":
            signature[:32] = _set_y(bytes(signature[:32]), data.draw(st.sampled_from(small)))
            signature[31] |= data.draw(st.sampled_from([0, 0x80]))
        elif how == "r y":
            signature[:32] = _set_y(bytes(signature[:32]), data.draw(st.integers(_P - 20, 2**255 - 1)))
        elif how == "key small":
            pk = _set_y(pk, data.draw(st.sampled_from(small))) if data.draw(st.booleans()) else \
                bytes([pk[0]]) + pk[1:31] + bytes([pk[31] ^ 0x80])
        elif how == "key y":
            pk = _set_y(pk, data.draw(st.integers(_P - 20, 2**255 - 1)))
        elif how == "message":
            message = bytes([message[0] ^ 1]) + message[1:]
        body = bytes(signature) + message
        answers = {checker: _checked_by(verify_module, checker, pk, body + body)
                   for checker in ("zebra", "system", "pynacl")}
        clear_checkers(verify_module)
    assert answers["zebra"] == answers["system"] == answers["pynacl"], (how, answers)
    if how == "none":
        assert answers["zebra"] is None


def _secret_scalar(key) -> int:
    """The Ed25519 secret scalar a of ``key`` (RFC 8032: the clamped first half of SHA-512 of the seed)."""
    import hashlib

    a = bytearray(hashlib.sha512(bytes(key)).digest()[:32])
    a[0] &= 248
    a[31] &= 127
    a[31] |= 64
    return int.from_bytes(a, "little")


def test_signatures_made_with_the_key_that_libsodium_refuses_before_its_equation_are_refused(key):
    # With the private key one can make signatures ZIP-215's equation accepts and libsodium's checks
    # refuse: R of small order (any of its encodings, sign bit set or not) with S = H(R, A, M)·a, and a
    # key of small order with R = the identity and S = 0 or R = rB and S = r. The checks before zebra refuse
    # every one.
    import hashlib

    from nacl import bindings

    from apollia_nb.journal import verify as verify_module

    system, zebra = require_system_libsodium(), require_zebra()
    pk, message, a = bytes(key.verify_key), bytes(range(32)), _secret_scalar(key)
    made = []
    for y in (0, 1, _P - 1, _P, _P + 1, _ORDER8_Y, _P - _ORDER8_Y):
        for sign in (0, 1 << 255):
            big_r = (y | sign).to_bytes(32, "little")
            k = int.from_bytes(hashlib.sha512(big_r + pk + message).digest(), "little")
            made.append((big_r + (k * a % ED25519_L).to_bytes(32, "little"), pk))
    identity = (1).to_bytes(32, "little")
    made.append((identity + bytes(32), identity))
    r = (12345).to_bytes(32, "little")  # a key of order 8: R = rB and S = r leave only S·B - R - k·A = -k·A
    made.append((bindings.crypto_scalarmult_ed25519_base_noclamp(r) + r, _ORDER8_Y.to_bytes(32, "little")))
    zebra_alone = [zebra(signature, message, public) for signature, public in made]
    assert zebra_alone.count(True) >= 9 and zebra_alone[-1] is True  # what the checks are there for
    for signature, public in made:
        assert system(signature, message, 32, public) != 0
        assert verify_module._first_bad_index(public, signature + message) == 0


def test_zebra_accepts_an_r_with_a_small_order_part_that_only_the_key_holder_can_make(key):
    # The one documented difference: the holder of the private key can sign with R = rB + T (T of order 8)
    # and S = r + H(R, A, M)·a; ZIP-215's cofactored equation accepts it, libsodium's does not.
    import hashlib

    from nacl import bindings

    from apollia_nb.journal import verify as verify_module

    require_system_libsodium(), require_zebra()
    a_int = _secret_scalar(key)
    pk, message = bytes(key.verify_key), bytes(range(32))
    r = (12345).to_bytes(32, "little")
    t8 = _ORDER8_Y.to_bytes(32, "little")
    big_r = bindings.crypto_core_ed25519_add(bindings.crypto_scalarmult_ed25519_base_noclamp(r), t8)
    k = int.from_bytes(hashlib.sha512(big_r + pk + message).digest(), "little")
    s = (12345 + k * a_int) % ED25519_L
    item = big_r + s.to_bytes(32, "little") + message
    assert verify_module._zebra_verify()(item[:64], message, pk) is True
    assert verify_module._first_bad_index(pk, item) is None  # zebra, the default
    assert verify_module._system_verify()(item[:64], message, 32, pk) != 0  # libsodium refuses it
    proper = key.sign(message).signature
    assert verify_module._first_bad_index(pk, proper + message) is None


def test_no_loadable_libsodium_leaves_pynacls(monkeypatch):
    import ctypes.util

    from apollia_nb.journal import verify as verify_module

    monkeypatch.delenv(verify_module.LIBSODIUM_ENV, raising=False)
    for found in (None, "libsodium-that-is-not-there.so.23", "libc.so.6"):  # none, none that loads, not libsodium
        monkeypatch.setattr(ctypes.util, "find_library", lambda name, found=found: found)
        verify_module._system_verify.cache_clear()
        try:
            assert verify_module._system_verify() is None
        finally:
            verify_module._system_verify.cache_clear()


# --- signature workers that die, or are ended, while the verification runs ----------------------


def record_workers(monkeypatch) -> list:
    """The signature workers the verifications of this test start, in order."""
    from apollia_nb.journal import verify as verify_module

    started = []
    real = verify_module._Worker.__init__

    def recorded(self, public_key):
        real(self, public_key)
        started.append(self)

    monkeypatch.setattr(verify_module._Worker, "__init__", recorded)
    return started


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [None, 185, 195], ids=["clean", "in the dead worker's tenth chunk",
                                                     "in the live worker's tenth chunk"])
def test_a_worker_killed_mid_run_leaves_all_its_later_chunks_to_this_process(key, bad, monkeypatch):
    # 10-row chunks alternate between the two workers (seqs 181..190 are worker 0's tenth chunk, 191..200
    # worker 1's). Worker 0 is killed once the verification has started it and before it is handed a
    # chunk: each of its ten chunks, more than a worker may hold unanswered, is checked in this process.
    started = record_workers(monkeypatch)
    rows = make_rows(200, key, bad_signature_at=bad)

    def chunks():
        dead = started[0]
        dead.proc.kill()
        dead._reader.join()  # its death is seen: nothing more is handed to it
        for i in range(0, 200, 10):
            yield rows[i:i + 10]

    report = verify_rows(chunks(), public_key=bytes(key.verify_key), origin=ORIGIN, total=200,
                         workers=2, parallel_min=1)
    if bad is None:
        assert (report.ok, report.entries, report.first_bad_seq) == (True, 200, None)
    else:
        assert (report.ok, report.entries, report.first_bad_seq) == (False, bad - 1, bad)
        assert report.problem == f"entry {bad}: signature does not verify under the journal key"
    assert report.notes == (f"a signature worker (pid {started[0].proc.pid}) was killed by signal 9; the 10 "
                            "chunk(s) of signatures it did not check were checked in this process",)


def test_a_verification_that_fails_mid_read_leaves_no_worker_behind(key, monkeypatch):
    # The rows cannot be read to the end: the error reaches the caller, and each worker, alive and
    # waiting for its next chunk, is ended and reaped, its pipes and threads closed.
    import os
    import signal

    started = record_workers(monkeypatch)
    rows = make_rows(300, key)

    def chunks():
        yield rows[:100]
        yield rows[100:200]
        raise duckdb.IOException("the disk went away")

    with pytest.raises(duckdb.IOException, match="the disk went away"):
        verify_rows(chunks(), public_key=bytes(key.verify_key), origin=ORIGIN, total=300,
                    workers=2, parallel_min=1)
    assert len(started) == 2
    for worker in started:
        assert worker.proc.returncode == -signal.SIGKILL
        with pytest.raises(ChildProcessError):
            os.waitpid(worker.proc.pid, os.WNOHANG)  # no child left, not even a zombie
        assert worker.proc.stdout.closed and worker.proc.stdin.closed
        assert not worker._feeder.is_alive() and not worker._reader.is_alive()
        # named where a thread dump shows them, and never what keeps an interpreter from exiting
        assert [(t.name, t.daemon) for t in (worker._feeder, worker._reader)] == [
            ("journal-verify-feeder", True), ("journal-verify-reader", True)]


def test_a_journal_key_that_is_not_32_bytes_is_refused_with_what_it_must_be(key):
    pk = bytes(key.verify_key)
    for bad in (b"short", pk + b"\x00", bytearray(pk), pk.hex()[:32], None):
        with pytest.raises(BadInput) as refused:
            verify_rows([make_rows(1, key)], public_key=bad, origin=ORIGIN)
        assert (refused.value.code, refused.value.message) == ("BAD_INPUT", "the journal public key must be 32 bytes")


# --- what each kind of tampering reports: the first bad seq, the entries before it, the exact problem -----


def _replace(rows, seq, column, value):
    row = list(rows[seq - 1])
    row[column] = value
    rows[seq - 1] = tuple(row)


def _rehashed(rows, seq, **columns):
    """Entry ``seq`` with other column values and a hash and signature recomputed over them."""
    names = ("seq", "ts", "run_id", "agent", "kind", "payload", "prev_hash")
    return {**dict(zip(names, rows[seq - 1])), **columns}


def _tamper_duplicate(rows, key):
    rows.insert(4, rows[3])  # seq 4 twice


def _tamper_gap(rows, key):
    del rows[4]


def _tamper_null_seq(rows, key):
    _replace(rows, 5, 0, None)


def _tamper_short_row(rows, key):
    rows[2] = rows[2][:9]


def _tamper_long_row(rows, key):
    rows[2] = rows[2] + ("extra",)


def _tamper_genesis(rows, key):
    _replace(rows, 1, 6, b"\x01" * 32)


def _tamper_link(rows, key):
    _replace(rows, 5, 6, rows[2][7])  # entry 5 links to entry 3


def _tamper_type(rows, key):
    _replace(rows, 4, 3, ["clerk"])  # the agent is neither text nor NULL


def _tamper_payload(rows, key):
    _replace(rows, 7, 5, canonical_json({"n": "forged"}))


def _tamper_key_id(rows, key):
    _replace(rows, 6, 9, "0123456789abcdef")


def _tamper_signature(rows, key):
    _replace(rows, 8, 8, SigningKey.generate().sign(rows[7][7]).signature)


def _tamper_link_and_later_payload(rows, key):
    _replace(rows, 9, 5, canonical_json({"n": "forged"}))
    _replace(rows, 3, 6, bytes(32))


KID = key_id(bytes(SigningKey(bytes(range(32))).verify_key))


@pytest.mark.parametrize("tamper, seq, entries, problem", [
    (_tamper_duplicate, 4, 3, "entry 4 appears more than once"),
    (_tamper_gap, 5, 4, "entry 5 is missing (the next entry has seq 6)"),
    (_tamper_null_seq, 5, 4, "entry 5 is missing (the next entry has no sequence number)"),
    (_tamper_short_row, 3, 2, "entry 3 is malformed (not the ten journal columns)"),
    (_tamper_long_row, 3, 2, "entry 3 is malformed (not the ten journal columns)"),
    (_tamper_genesis, 1, 0, "entry 1: prev_hash is not the genesis value (32 zero bytes)"),
    (_tamper_link, 5, 4, "entry 5: prev_hash does not match the hash of entry 4"),
    (_tamper_type, 4, 3, "entry 4 has a column of the wrong type"),
    (_tamper_payload, 7, 6, "entry 7: hash does not match its contents"),
    (_tamper_key_id, 6, 5, f"entry 6: key id '0123456789abcdef' is not the journal key {KID}"),
    (_tamper_signature, 8, 7, "entry 8: signature does not verify under the journal key"),
    (_tamper_link_and_later_payload, 3, 2, "entry 3: prev_hash does not match the hash of entry 2"),
], ids=lambda value: value.__name__[len("_tamper_"):] if callable(value) else None)
def test_each_kind_of_tampering_fails_at_its_entry_with_what_was_wrong(key, tamper, seq, entries, problem):
    rows = make_rows(10, key)
    tamper(rows, key)
    for workers, parallel_min in ((1, 8_000), (2, 1)):
        report = check(rows, key, workers=workers, parallel_min=parallel_min)
        assert report == VerifyReport(False, entries, seq, problem, 0)
        assert report.summary() == f"FAILED at seq {seq}: {problem}"
        assert report.to_dict() == {"ok": False, "entries": entries, "first_bad_seq": seq, "problem": problem,
                                    "checked_checkpoints": 0}


def _stored(key, rows, size, *, root_of=None):
    note = note_for(key, rows, size)
    return (size, root([leaf_hash(r[7]) for r in rows[:size]]) if root_of is None else root_of, note)


def test_each_kind_of_bad_checkpoint_fails_with_what_was_wrong(key):
    rows = make_rows(10, key)
    longer = make_rows(15, key)
    other = SigningKey(bytes(range(1, 33)))

    def fails(**kw):
        report = check(rows, key, **kw)
        return report.ok, report.entries, report.first_bad_seq, report.problem, report.checked_checkpoints

    # The entries were cut after 10: a checkpoint of 15 says where.
    assert fails(external=note_for(key, longer, 15)) == (
        False, 10, 11, "entry 11 is missing: the given checkpoint (size 15) covers 15 entries, the journal holds 10", 0)
    assert fails(checkpoints=[_stored(key, rows, 4), _stored(key, longer, 15)]) == (
        False, 10, 11, "entry 11 is missing: stored checkpoint of size 15 covers 15 entries, the journal holds 10", 1)
    # A stored row whose size or root is not its note's.
    size4 = _stored(key, rows, 4)
    assert fails(checkpoints=[(5, size4[1], size4[2])]) == (
        False, 10, None, "stored checkpoint of size 5: the checkpoints row does not match its signed note", 0)
    assert fails(checkpoints=[_stored(key, rows, 4, root_of=b"\x00" * 32)]) == (
        False, 10, None, "stored checkpoint of size 4: the checkpoints row does not match its signed note", 0)
    # A cut journal is named by the seq it lacks, before a failure that points at no entry.
    assert fails(external=note_for(key, longer, 15), checkpoints=[(5, size4[1], size4[2])]) == (
        False, 10, 11, "entry 11 is missing: the given checkpoint (size 15) covers 15 entries, the journal holds 10", 0)
    # Signed by another key, or over another history, or a size 0 that is not the empty tree.
    foreign = NoteSigner(ORIGIN, other).sign(Checkpoint(ORIGIN, 4, root([leaf_hash(r[7]) for r in rows[:4]])).body())
    ok, entries, seq, problem, checked = fails(external=foreign)
    assert (ok, entries, seq, checked) == (False, 10, None, 0) and problem.startswith("the given checkpoint: ")
    rewritten = NoteSigner(ORIGIN, key).sign(Checkpoint(ORIGIN, 10, root([b"\x07" * 32] * 10)).body())
    assert fails(external=rewritten) == (
        False, 10, None, "the given checkpoint (size 10): the first 10 entries do not have its Merkle root (history "
        "was rewritten within seqs 1..10; `apollia-os audit consistency` with more kept checkpoints or a kept "
        "bundle narrows it down)", 0)
    not_empty = NoteSigner(ORIGIN, key).sign(Checkpoint(ORIGIN, 0, b"\x07" * 32).body())
    assert fails(external=not_empty) == (
        False, 10, None, "the given checkpoint (size 0): its root is not the root of the empty tree", 0)
    # An entry's failure is named before any checkpoint's; a checkpoint's root past it is not judged.
    _replace(rows, 6, 5, canonical_json({"n": "forged"}))
    assert fails(external=rewritten, checkpoints=[_stored(key, longer, 15)]) == (
        False, 5, 6, "entry 6: hash does not match its contents", 0)
    assert fails(external=foreign) == (False, 5, 6, "entry 6: hash does not match its contents", 0)


def test_verify_file_names_a_missing_journal(tmp_path):
    from apollia_nb.journal.verify import verify_file

    with pytest.raises(NotFound) as missing:
        verify_file(tmp_path / "nothing.db", public_key=bytes(32))
    assert missing.value.message == f"no journal at {tmp_path / 'nothing.db'}"


@pytest.mark.parametrize("said, marked", [
    ({"first_bad_seq": "9", "problem": "p"}, (0, None, "p")),  # hand-edited: the seq points at no entry
    ({"first_bad_seq": 9.0, "problem": "p"}, (0, None, "p")),
    ({"first_bad_seq": True, "problem": "p"}, (0, None, "p")),
    ({"first_bad_seq": 30, "problem": "p"}, (20, 30, "p")),
    ({"first_bad_seq": 0}, (0, 0, "None")),
    ({"problem": "p"}, (0, None, "p")),
    (True, (0, None, "None")),
    (["entry 3"], (0, None, "None")),
])
def test_a_bundle_marked_invalid_fails_whatever_its_meta_json_holds(said, marked):
    from apollia_nb.journal.verify import _marked

    entries, seq, problem = marked
    note = f"the bundle was exported marked invalid (meta.json): the journal failed verification: {problem}"
    assert _marked(VerifyReport(True, 20, None, None, 1), said) == VerifyReport(False, entries, seq, note, 1)
    failed = VerifyReport(False, 4, 5, "entry 5: hash does not match its contents", 0, ("a note",))
    assert _marked(failed, said) == VerifyReport(False, 4, 5, f"entry 5: hash does not match its contents; {note}",
                                                 0, ("a note",))
    for nothing in (None, {}, False, ""):
        assert _marked(failed, nothing) is failed


def _worker_notes(report, how, chunks):
    """The pids the notes name, checked against the notes expected of workers that ended ``how``."""
    import re

    pids = [int(re.match(r"a signature worker \(pid (\d+)\)", note).group(1)) for note in report.notes]
    assert len(pids) == len(chunks), report.notes
    assert report.notes == tuple(f"a signature worker (pid {pid}) {how}; the {n} chunk(s) of signatures it did not "
                                 "check were checked in this process" for pid, n in zip(pids, chunks))
    return pids


def test_a_worker_that_fails_as_it_starts_is_named_with_its_exit_status(key, monkeypatch):
    # The fault raises in each worker: the interpreter exits with status 1, not by a signal.
    monkeypatch.setenv("APOLLIA_FAULT", "verify.signature_worker:raise")
    report = check(make_rows(300, key, bad_signature_at=150), key, workers=2, parallel_min=1)
    assert (report.ok, report.first_bad_seq, report.entries) == (False, 150, 149)
    _worker_notes(report, "exited with status 1", [2, 1])


def test_workers_start_from_the_size_given_and_one_given_no_chunk_is_still_named(key, monkeypatch):
    # Every worker started is killed as it starts, so the notes tell which verifications started them.
    monkeypatch.setenv("APOLLIA_FAULT", "verify.signature_worker:kill")
    rows = make_rows(100, key)  # one chunk: the second worker is handed nothing
    assert check(rows, key, workers=2, parallel_min=101) == VerifyReport(True, 100, None, None, 0)
    assert check(rows, key, workers=1, parallel_min=1) == VerifyReport(True, 100, None, None, 0)
    report = check(rows, key, workers=2, parallel_min=100)
    assert (report.ok, report.entries) == (True, 100)
    assert len(set(_worker_notes(report, "was killed by signal 9", [1, 0]))) == 2
    assert check(rows, key, workers=3, parallel_min=100).notes[2].endswith(
        "the 0 chunk(s) of signatures it did not check were checked in this process")
    unknown = verify_rows([rows], public_key=bytes(key.verify_key), origin=ORIGIN, workers=2, parallel_min=1)
    assert unknown == VerifyReport(True, 100, None, None, 0)  # no total given: checked here


def test_a_worker_whose_interpreter_exits_at_once_is_named_with_status_0(key, monkeypatch):
    # An interpreter that exits 0 without reading a byte checked nothing: its chunks are checked here.
    import shutil
    import sys

    monkeypatch.setattr(sys, "executable", shutil.which("true"))
    report = check(make_rows(300, key, bad_signature_at=250), key, workers=2, parallel_min=1)
    assert (report.ok, report.first_bad_seq, report.entries) == (False, 250, 249)
    _worker_notes(report, "exited with status 0", [2, 1])


def test_the_one_worker_that_started_takes_every_other_chunk(key, monkeypatch):
    # The second worker cannot start and the first is killed as it starts: the first's share, chunks
    # 1, 3 and 5 of five, is checked here and counted in its note.
    started = second_worker_cannot_start(monkeypatch)
    monkeypatch.setenv("APOLLIA_FAULT", "verify.signature_worker:kill")
    report = check(make_rows(500, key, bad_signature_at=420), key, workers=2, parallel_min=1)
    assert (report.ok, report.first_bad_seq, report.entries) == (False, 420, 419)
    assert report.notes[0] == ("1 signature worker(s) could not start (no interpreter); "
                               "their signatures were checked in this process")
    assert report.notes[1:] == (f"a signature worker (pid {started[0].proc.pid}) was killed by signal 9; the 3 "
                                "chunk(s) of signatures it did not check were checked in this process",)


# --- the checkpoints and witness cosignatures `audit verify --witness` reads -------------------------


def test_cosigned_rows_of_a_file_and_of_its_bundle(home, tmp_path):
    from apollia_nb.journal.verify import cosigned_rows_of_bundle, cosigned_rows_of_file

    with Journal.open(home) as journal:
        journal.append_many(Draft("plan", {"i": i}) for i in range(5))
        journal.checkpoint()
        journal.append("plan", {"i": 5})
        journal.checkpoint()
        sizes = [size for size, _root, _note in journal.checkpoints()]
        for size, witness in ((sizes[1], "w2"), (sizes[0], "w1"), (sizes[1], "w1")):  # kept by size
            journal.add_cosignature(size, witness, 1_700_000_000 + size, f"— {witness} line of {size}")
        checkpoints = journal.checkpoints()
    assert sizes == [5, 6] and [type(v) for v in checkpoints[0]] == [int, bytes, str]
    cosignatures = [(5, "— w1 line of 5"), (6, "— w1 line of 6"), (6, "— w2 line of 6")]
    found = cosigned_rows_of_file(home.journal_db)
    assert (found[0], sorted(found[1])) == (checkpoints, cosignatures)
    assert [size for size, _line in found[1]] == [5, 6, 6]
    export_home(home, tmp_path / "bundle")
    found = cosigned_rows_of_bundle(tmp_path / "bundle")
    assert (found[0], sorted(found[1])) == (checkpoints, cosignatures)
    assert [type(v) for v in found[0][0]] == [int, bytes, str] and [size for size, _line in found[1]] == [5, 6, 6]

    # A journal written before cosignatures were kept, and a bundle without them or without checkpoints.
    con = duckdb.connect(str(home.journal_db))
    con.execute("DROP TABLE checkpoint_cosignatures")
    con.close()
    assert cosigned_rows_of_file(home.journal_db) == (checkpoints, [])
    (tmp_path / "bundle" / "cosignatures.parquet").unlink()
    assert cosigned_rows_of_bundle(tmp_path / "bundle") == (checkpoints, [])
    (tmp_path / "bundle" / "checkpoints.parquet").unlink()
    assert cosigned_rows_of_bundle(tmp_path / "bundle") == ([], [])


def test_cosigned_rows_of_a_missing_file_create_nothing(tmp_path):
    from apollia_nb.journal.verify import cosigned_rows_of_file

    with pytest.raises(duckdb.Error):
        cosigned_rows_of_file(tmp_path / "journal.db")
    assert list(tmp_path.iterdir()) == []  # opened read-only: no database is created


# --- the signature worker's wire protocol, and the seq ranges rows are read in -------------------------


def test_the_signature_worker_answers_each_chunk_and_only_with_its_flag(key):
    import os
    import struct
    import subprocess
    import sys
    from pathlib import Path

    import apollia_nb
    from apollia_nb.journal.verify import _batch

    rows = make_rows(6, key, bad_signature_at=5)
    good, bad = _batch(rows[:3]), _batch(rows[3:])  # the second's item 1 (seq 5) does not verify
    chunk = [struct.pack(">I", 3) + b.body for b in (good, bad)]
    root = str(Path(apollia_nb.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root}
    env.pop("APOLLIA_FAULT", None)

    def worker(data, *flag):
        done = subprocess.run([sys.executable, "-m", "apollia_nb.journal.verify", *flag], input=data,
                              capture_output=True, timeout=60, env=env)
        return done.returncode, done.stdout

    pk = bytes(key.verify_key)
    assert worker(pk + chunk[0] + chunk[1], "--signature-worker") == (0, struct.pack(">qq", -1, 1))
    assert worker(pk + chunk[1] + chunk[0][:-1], "--signature-worker") == (0, struct.pack(">q", 1))  # cut: unanswered
    assert worker(pk + chunk[0][:3], "--signature-worker") == (0, b"")
    assert worker(pk[:31], "--signature-worker") == (0, b"")
    assert worker(pk + chunk[0]) == (0, b"")  # without the flag the module does nothing
    assert worker(pk + chunk[0], "--signature-worker", "x") == (0, b"")


def test_rows_are_read_in_seq_ranges_to_the_last_one(home, monkeypatch):
    # The last range may hold one seq: ranges of 3 over 7 entries, and one entry in a range of 50,000.
    from apollia_nb.journal import verify as verify_module

    with Journal.open(home) as journal:
        journal.append("plan", {})
        assert verify_journal(journal) == VerifyReport(True, 1, None, None, 0)
    assert (verify_home(home).ok, verify_home(home).entries) == (True, 1)
    monkeypatch.setattr(verify_module, "RANGE", 3)
    with Journal.open(home) as journal:
        journal.append_many(Draft("plan", {"i": i}) for i in range(6))
        assert verify_journal(journal).entries == 7
    assert (verify_home(home).ok, verify_home(home).entries) == (True, 7)


def test_a_bundle_in_a_folder_with_a_quote_verifies_and_leaves_no_file_behind(home, tmp_path, monkeypatch):
    from apollia_nb.journal.verify import cosigned_rows_of_bundle, cosigned_rows_of_file

    with Journal.open(home) as journal:
        journal.append_many(Draft("plan", {"i": i}) for i in range(4))
    checkpoints, _ = cosigned_rows_of_file(home.journal_db)  # the one the close made
    assert len(checkpoints) == 1
    bundle = tmp_path / "it's here"
    export_home(home, bundle)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert verify_bundle(bundle) == VerifyReport(True, 4, None, None, 1)
    assert cosigned_rows_of_bundle(bundle) == (checkpoints, [])
    assert list(cwd.iterdir()) == []  # read in memory: no database file is created
    (bundle / "checkpoints.parquet").unlink()  # optional: the entries still verify, with no checkpoint
    assert verify_bundle(bundle) == VerifyReport(True, 4, None, None, 0)
    for name in ("journal.vkey", "entries.parquet"):
        (bundle / name).unlink()
        with pytest.raises(NotFound) as missing:
            verify_bundle(bundle)
        assert missing.value.message == f"{bundle} is not an audit bundle: {name} is missing"


def test_a_worker_runs_this_tree_first_then_the_callers_python_path(key, tmp_path, monkeypatch):
    # Another apollia_nb on the caller's PYTHONPATH is not the one a worker runs: this process's is.
    other = tmp_path / "other"
    (other / "apollia_nb" / "journal").mkdir(parents=True)
    for name in ("apollia_nb/__init__.py", "apollia_nb/journal/__init__.py"):
        (other / name).write_text("")
    (other / "apollia_nb" / "journal" / "verify.py").write_text("raise SystemExit(3)\n")
    rows = make_rows(300, key, bad_signature_at=120)
    monkeypatch.chdir(tmp_path)  # not a folder holding this tree: `python -m` looks there first
    monkeypatch.setenv("PYTHONPATH", str(other))
    report = check(rows, key, workers=2, parallel_min=1)
    assert (report.ok, report.first_bad_seq, report.notes) == (False, 120, ())
    # What else the caller's PYTHONPATH holds reaches the worker, after this tree: here a PyNaCl that
    # cannot be imported, so each worker fails, and its chunks are checked here.
    broken = tmp_path / "broken"
    (broken / "nacl").mkdir(parents=True)
    (broken / "nacl" / "__init__.py").write_text("raise ImportError('not this one')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken))
    report = check(rows, key, workers=2, parallel_min=1)
    assert (report.ok, report.first_bad_seq) == (False, 120)
    _worker_notes(report, "exited with status 1", [2, 1])


def test_a_changed_prev_hash_of_entry_2_names_entry_1(key):
    rows = make_rows(5, key)
    rows[1] = rows[1][:6] + (b"\x01" * 32,) + rows[1][7:]
    report = check(rows, key)
    assert (report.first_bad_seq, report.problem) == (2, "entry 2: prev_hash does not match the hash of entry 1")


def test_ranged_reads_give_every_row_once_in_order_across_ranges(monkeypatch):
    import apollia_nb.journal.verify as verify_module

    con = duckdb.connect(":memory:")
    con.execute("CREATE TABLE t (seq BIGINT, v INT)")
    con.execute("INSERT INTO t SELECT range, range FROM range(1, 11)")
    con.execute("INSERT INTO t VALUES (0, -1), (NULL, -2)")
    monkeypatch.setattr(verify_module, "_COLUMNS", "seq, v")
    rows = [r for chunk in verify_module._ranged_chunks(con, "t", 10, size=2, span=3) for r in chunk]
    assert rows == [(0, -1)] + [(i, i) for i in range(1, 11)] + [(None, -2)]


def test_a_report_is_a_value_that_cannot_be_changed(key):
    import dataclasses

    report = check(make_rows(3, key), key)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.ok = False  # type: ignore[misc]
    assert hash(report) == hash(check(make_rows(3, key), key)) and report == check(make_rows(3, key), key)


def test_workers_that_find_every_signature_good_leave_no_note(key):
    from apollia_nb.journal.verify import PARALLEL_MIN

    rows = make_rows(PARALLEL_MIN + 500, key)
    report = check(rows, key, workers=2)
    assert report.ok and report.entries == len(rows) and report.notes == ()


def test_verify_bundle_reads_the_invalid_mark_of_its_meta_json(home, tmp_path):
    with Journal.open(home) as journal:
        journal.append_many(Draft("plan", {"i": i}) for i in range(5))
    bundle = tmp_path / "bundle"
    export_home(home, bundle)
    assert verify_bundle(bundle).ok  # its files are sound
    meta = json.loads((bundle / "meta.json").read_text())
    meta["invalid"] = {"first_bad_seq": 3, "problem": "entry 3: bad hash"}
    (bundle / "meta.json").write_text(json.dumps(meta))
    report = verify_bundle(bundle)
    assert (report.ok, report.entries, report.first_bad_seq) == (False, 2, 3)
    assert report.problem == ("the bundle was exported marked invalid (meta.json): the journal failed "
                              "verification: entry 3: bad hash")


def test_verify_file_opens_the_journal_read_only_beside_another_process_reading_it(home):
    import subprocess
    import sys

    from apollia_nb.journal.keys import load_public_key
    from apollia_nb.journal.verify import verify_file

    with Journal.open(home) as journal:
        journal.append_many(Draft("plan", {"i": i}) for i in range(5))
    # An auditor's own read-only look, held open by another process: a read-only open shares the
    # file with it, a read-write one could not take the file's lock.
    code = ("import duckdb, sys; con = duckdb.connect(sys.argv[1], read_only=True); "
            "print('open', flush=True); sys.stdin.read()")
    reader = subprocess.Popen([sys.executable, "-c", code, str(home.journal_db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "open"
        assert verify_file(home.journal_db, public_key=load_public_key(home)).ok
    finally:
        reader.stdin.close()
        reader.wait(10)
