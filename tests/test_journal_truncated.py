"""A journal never forgets an acknowledged entry and never gives a seq twice.

Real processes killed with SIGKILL (at the journal's fault points where a window matters),
real files cut as a disk or a hostile hand would cut them, the real CLI and server:

* offline ``audit verify`` / ``audit export`` work on every home a kill -9 leaves, a log with
  nothing left to copy included;
* a home whose ``journal.log`` (or what a stored checkpoint covers) holds less than was
  acknowledged refuses to start (``JOURNAL_TRUNCATED``), changing nothing; ``audit verify`` says so;
* ``apollia-os home repair --lost-entries`` says what is lost and changes nothing without ``--yes``;
  with it, the loss is recorded (signed ``entry_lost`` placeholders and a ``home_repaired`` record),
  the home starts, no seq is reused, and ``audit verify`` passes showing the loss;
* a journal (and a server) whose own verification fails refuses governed work, and says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import httpx
import pytest

from apollia_nb.errors import IntegrityError, JournalTruncated
from apollia_nb.journal import Journal, verify_journal
from apollia_nb.journal.export import export_home
from apollia_nb.journal.tail import read_tail
from apollia_nb.journal.verify import verify_home

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def _log(home) -> Path:
    return home.journal_db.with_suffix(".log")


def _db_seqs(home) -> list[int]:
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        return [r[0] for r in con.execute("SELECT seq FROM entries ORDER BY seq").fetchall()]
    finally:
        con.close()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""


def _cli(*args: str, home) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APOLLIA, *args, "--home", str(home.path)], capture_output=True, text=True, timeout=120)


def killed(home, steps: str, fault: str | None = None) -> list[tuple[int, str]]:
    """A child process runs ``steps`` (Python, with ``j`` the open journal and ``acked`` the list of
    ``(seq, hash)`` of every append that returned) and is killed with SIGKILL, by ``fault`` or at its end.
    Returns what it acknowledged."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from apollia_nb.home import Home
        from apollia_nb.journal import Journal, store
        store.IMPORT_IDLE_SECS = 3600  # copies only when a read asks: what is copied is the test's choice
        j = Journal.open(Home.at({str(home.path)!r}))
        def said(entries):
            for e in entries:
                os.write(1, b"%d %s\\n" % (e.seq, e.hash.hex().encode()))
        def add(n, run="run-1", kind="plan"):
            for i in range(n):
                said([j.append(kind, {{"i": i}}, run_id=run, agent="clerk")])
        def many(n, run="run-1"):
            said(j.append_many([("plan", {{"i": i}}, run, "clerk") for i in range(n)]))
        """
    ) + textwrap.dedent(steps) + "\nos.kill(os.getpid(), signal.SIGKILL)\n"
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_FAULT"}
    if fault:
        env["APOLLIA_FAULT"] = fault
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == -signal.SIGKILL, out.stderr
    return [(int(seq), digest) for seq, digest in (line.split() for line in out.stdout.splitlines())]


# --- a log with nothing left to copy ---------------------------------------------------------------


def test_verify_and_export_work_offline_after_kill_nine_with_nothing_left_to_copy(home, tmp_path):
    # The copy of everything committed is in journal.db; the log still holds those records.
    acked = killed(home, "many(20)\nj.entries()", fault="journal.after_copy:kill")
    left = read_tail(_log(home))
    assert left.rows and max(r[0] for r in left.rows) <= max(_db_seqs(home))
    assert not left.cut

    verified = _cli("audit", "verify", home=home)
    assert verified.returncode == 0 and verified.stdout.startswith("ok: 20 entries"), verified.stdout + verified.stderr
    assert verify_home(home).entries == len(acked) == 20
    assert export_home(home, tmp_path / "bundle").entries == 20
    with Journal.open(home) as journal:
        assert [(e.seq, e.hash.hex()) for e in journal.entries()] == acked
        assert journal.append("plan", {"after": True}).seq == 21


# --- a log cut in its uncopied part: the start is refused ------------------------------------------


def _cut_in_uncopied_part(home, how: str) -> tuple[list[tuple[int, str]], int]:
    """Entries 1..4 copied into journal.db, 5..10 committed to the log only, then the log cut.
    Returns what was acknowledged and the highest seq the cut log still holds whole."""
    acked = killed(home, "add(4)\nj.entries()\nadd(3)\nadd(3)")
    log = _log(home)
    read = read_tail(log)
    assert [r[0] for r in read.rows] == list(range(1, 11)) and _db_seqs(home) == [1, 2, 3, 4]
    data = log.read_bytes()
    ends = _record_ends(data)
    if how == "mid-record":
        log.write_bytes(data[:ends[-1] - 9])  # the last record (entry 10) cut inside its body
        return acked, 9
    if how == "record boundary":
        log.write_bytes(data[:ends[-1]])  # right after the last record: the zero after it is gone
        return acked, 10
    if how == "mid-header":
        log.write_bytes(data[:ends[-2] + 6])  # a few bytes of the last record's header
        return acked, 9
    if how == "emptied":
        log.write_bytes(b"")  # nothing the log can tell: a stored checkpoint has to
        return acked, 4
    raise AssertionError(how)


def _record_ends(data: bytes) -> list[int]:
    ends, offset = [], 0
    while data[offset:offset + 4] == b"AJT1":
        offset += 40 + int.from_bytes(data[offset + 4:offset + 8], "big")
        ends.append(offset)
    return ends


@pytest.mark.parametrize("how", ["mid-record", "record boundary", "mid-header"])
def test_a_log_cut_in_its_uncopied_part_refuses_the_start_and_changes_nothing(home, how):
    acked, whole = _cut_in_uncopied_part(home, how)
    before = (_digest(_log(home)), _db_seqs(home))
    with pytest.raises(JournalTruncated, match="journal.log was cut") as refused:
        Journal.open(home)
    assert refused.value.code == "JOURNAL_TRUNCATED" and "home repair --lost-entries" in refused.value.message
    assert (_digest(_log(home)), _db_seqs(home)) == before  # nothing was changed, no seq given again

    report = verify_home(home)
    assert not report.ok and report.first_bad_seq == whole + 1 and "was cut" in report.problem
    verified = _cli("audit", "verify", home=home)
    assert verified.returncode == 1 and "was cut" in verified.stdout, verified.stdout + verified.stderr


def test_a_served_home_whose_log_was_cut_does_not_start(home):
    _cut_in_uncopied_part(home, "mid-record")
    served = subprocess.run([*APOLLIA, "serve", "--home", str(home.path), "--port", "0", "--token", "t"],
                            capture_output=True, text=True, timeout=120)
    assert served.returncode == 3, served.stdout + served.stderr
    assert "JOURNAL_TRUNCATED" in served.stderr and "home repair --lost-entries" in served.stderr
    assert _db_seqs(home) == [1, 2, 3, 4]


def test_a_stored_checkpoint_larger_than_what_is_left_refuses_the_start(home):
    # The checkpoint of 10 entries is stored while 5..10 are still in the log only; the log is then lost.
    killed(home, "add(4)\nj.entries()\nadd(6)\nj.checkpoint()")
    assert _db_seqs(home) == [1, 2, 3, 4]
    for gone in ("emptied", "deleted"):
        if gone == "emptied":
            _log(home).write_bytes(b"")
        else:
            _log(home).unlink()
        with pytest.raises(JournalTruncated, match="newest stored checkpoint covers 10 entries, the journal holds 4"):
            Journal.open(home)
        assert _db_seqs(home) == [1, 2, 3, 4]
        report = verify_home(home)
        assert not report.ok and report.first_bad_seq == 5


# --- a log cut in its copied part: verify says so ----------------------------------------------------


def test_a_log_cut_in_its_copied_part_is_reported_by_verify_and_refuses_the_start(home):
    # 1..6 copied, 7..9 in the log only; the log is cut inside the records already copied.
    killed(home, "add(3)\nadd(3)\nj.entries()\nadd(3)")
    assert _db_seqs(home) == list(range(1, 7))
    log = _log(home)
    data = log.read_bytes()
    log.write_bytes(data[:_record_ends(data)[3] + 20])  # inside the fifth record (entry 5)
    report = verify_home(home)
    assert not report.ok and report.entries == 6 and report.first_bad_seq == 7
    assert "journal.log was cut after entry 4" in report.problem
    with pytest.raises(JournalTruncated):
        Journal.open(home)


# --- the repair --------------------------------------------------------------------------------------


def test_repair_says_what_is_lost_changes_nothing_without_yes_then_records_it(home):
    acked = killed(home, "add(2, 'run-1', 'run_open')\nadd(2)\nj.entries()\nadd(2, 'run-2', 'run_open')\nadd(3, 'run-2')"
                         "\nj.checkpoint()")
    assert [s for s, _ in acked] == list(range(1, 10)) and _db_seqs(home) == [1, 2, 3, 4]
    data = _log(home).read_bytes()
    _log(home).write_bytes(data[:_record_ends(data)[5] - 3])  # keeps entries 1..5; 6..9 were acknowledged
    before = (_digest(_log(home)), _digest(home.journal_db))

    dry = _cli("home", "repair", "--lost-entries", "--json", home=home)
    assert dry.returncode == 0, dry.stderr
    said = json.loads(dry.stdout)
    assert said["recorded"] is False and said["kept"] == 5 and said["lost"] == [6, 9]
    assert said["cut"] is True and said["cut_after"] == 5 and said["checkpoints"] == [9]
    assert [r["run_id"] for r in said["runs"]] == ["run-1", "run-2"]  # neither was sealed: both lost their end
    text = _cli("home", "repair", "--lost-entries", home=home)
    assert "entries 6..9 were acknowledged and are gone" in text.stdout and "nothing was changed" in text.stdout
    assert (_digest(_log(home)), _digest(home.journal_db)) == before
    with pytest.raises(JournalTruncated):
        Journal.open(home)

    done = _cli("home", "repair", "--lost-entries", "--yes", "--json", home=home)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["recorded"] is True and json.loads(done.stdout)["record_seq"] == 10

    verified = _cli("audit", "verify", home=home)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "loss: entry 10 records that acknowledged entries were lost after entry 5" in verified.stdout
    report = verify_home(home)
    assert report.ok and report.losses == ({"seq": 10, "kept": 5, "lost": [6, 9], "cut": True, "superseded": [9]},)
    with Journal.open(home) as journal:
        entries = journal.entries()
        assert [(e.seq, e.hash.hex()) for e in entries[:5]] == acked[:5]  # what was kept is untouched
        assert [e.kind for e in entries[5:9]] == ["entry_lost"] * 4
        assert all(e.data() == {"lost": [6, 9]} for e in entries[5:9])
        record = entries[9].data()
        assert entries[9].kind == "home_repaired" and record["action"] == "record_lost_entries"
        assert record["lost"] == [6, 9] and record["cut_after"] == 5 and record["checkpoints"][0]["size"] == 9
        # No seq is given twice: the next entry comes after every seq that was ever acknowledged.
        assert journal.append("plan", {"after": "repair"}).seq == 11
        assert verify_journal(journal).ok

    again = _cli("home", "repair", "--lost-entries", home=home)
    assert again.returncode == 3 and "nothing to repair" in again.stderr


def test_repair_of_a_cut_nobody_else_witnessed_records_the_cut_and_the_next_seq_follows_the_log(home):
    _cut_in_uncopied_part(home, "mid-record")  # 1..9 whole in the log, entry 10 cut, no checkpoint beyond
    done = _cli("home", "repair", "--lost-entries", "--yes", home=home)
    assert done.returncode == 0, done.stderr
    assert "the cut record of journal.log still shows entry 10" in done.stdout and "cannot be counted" in done.stdout
    report = verify_home(home)
    assert report.ok and report.losses[0]["lost"] == [10, 10] and report.losses[0]["cut"] is True
    with Journal.open(home) as journal:  # entry 10, acknowledged and cut, is never given again
        assert journal.get(10).kind == "entry_lost" and journal.get(11).kind == "home_repaired"
        assert journal.append("plan", {"after": "repair"}).seq == 12


def test_repair_needs_yes_only_for_lost_entries_and_refuses_a_healthy_journal(home):
    with Journal.open(home) as journal:
        journal.append("plan", {"n": 1})
    stray = _cli("home", "repair", "--new-runtime-db", "--yes", home=home)
    assert stray.returncode == 3 and "BAD_INPUT" in stray.stderr
    healthy = _cli("home", "repair", "--lost-entries", "--yes", home=home)
    assert healthy.returncode == 3 and "nothing to repair" in healthy.stderr
    assert _db_seqs(home) == [1]


def test_a_crash_while_the_loss_is_recorded_leaves_the_home_refusing_or_repaired(home):
    _cut_in_uncopied_part(home, "mid-record")
    # The loss record committed into journal.db, the log not yet started over: the cut is accounted for.
    with pytest.raises(JournalTruncated):
        Journal.open(home)
    journal = Journal.open(home, record_loss={"by": "test"})
    head = journal.head()[0]
    journal.close()
    assert head == 11
    with Journal.open(home) as again:
        assert again.head()[0] == 11


# --- a journal that finds its chain broken refuses governed work ------------------------------------


def test_a_journal_whose_verification_fails_refuses_appends_and_reads_go_on(home):
    with Journal.open(home) as journal:
        for n in range(3):
            journal.append("plan", {"n": n})
        assert verify_journal(journal).ok
        journal.append("plan", {"n": 3})  # a verification that passes changes nothing
        cursor = journal.cursor()
        try:
            cursor.execute("UPDATE entries SET agent = 'mallory' WHERE seq = 2")
        finally:
            cursor.close()
        report = verify_journal(journal)
        assert not report.ok and report.first_bad_seq == 2
        with pytest.raises(IntegrityError, match="does not verify") as refused:
            journal.append("plan", {"n": 4})
        assert refused.value.code == "INTEGRITY_FAILURE"
        assert journal.refusing is not None and "FAILED at seq 2" in journal.refusing.message
        assert journal.head()[0] == 4 and len(journal.entries()) == 4  # reads go on


def test_a_server_whose_verification_fails_refuses_governed_work_and_says_why(home):
    from apollia_nb.api.server import ServerThread
    from apollia_nb.journal import store
    from runtime_helpers import manifest

    with ServerThread(home, token="t") as srv, httpx.Client(
            base_url=srv.url + "/api/v1", headers={"Authorization": "Bearer t"}, timeout=60) as api:
        assert api.post("/agents", json={"manifest": manifest()}).status_code == 201
        assert api.get("/audit/verify").json()["ok"] is True
        journal = store._OPEN[home.journal_db.resolve()]
        cursor = journal.cursor()
        try:
            cursor.execute("UPDATE entries SET agent = 'mallory' WHERE seq = 1")
        finally:
            cursor.close()
        report = api.get("/audit/verify").json()
        assert report["ok"] is False and report["first_bad_seq"] == 1
        head = len(api.get("/audit/entries", params={"limit": 1000}).json()["entries"])
        sub = api.post("/tasks", json={"agent": "clerk", "goal": "anything"})
        if sub.status_code == 202:  # recorded in runtime.db; its run cannot journal a thing
            task = api.get(f"/tasks/{sub.json()['id']}/wait", params={"until": "finished", "timeout": 60}).json()
            assert task["status"] == "failed"
            error = task["error"]
        else:
            error = sub.json()
        assert error["code"] == "INTEGRITY_FAILURE" and "does not verify" in error["message"], error
        entries = api.get("/audit/entries", params={"limit": 1000})
        assert entries.status_code == 200 and len(entries.json()["entries"]) == head  # auditors still read
