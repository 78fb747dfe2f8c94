"""A home's files are accounted for, and governance state never disappears into permission.

A real home made by the real CLI (``apollia-os demo``, ``rules add``), then a
file deleted, corrupted or replaced, and the CLI run as a user runs it (a
subprocess), ``apollia-os serve`` as a subprocess, or a real ``Runtime`` with a
scripted agent while the home is open.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from apollia_nb.errors import HomeFileMissing
from apollia_nb.governance.policy import keygen, sign
from apollia_nb.home import Home
from apollia_nb.journal.entry import readable_payload
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def cli(*args: str, home: Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True, timeout=120,
                          cwd=home.parent)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def refused(done: subprocess.CompletedProcess[str], code: str, *words: str) -> str:
    """The one line a refused command prints: ``error: CODE: message``, exit 3, no traceback."""
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {code}: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def journal_rows(home: Path) -> list[tuple[str, dict[str, Any]]]:
    con = duckdb.connect(str(home / "journal.db"), read_only=True)
    try:
        rows = con.execute("SELECT kind, payload FROM entries ORDER BY seq").fetchall()
    finally:
        con.close()
    return [(kind, readable_payload(bytes(payload))) for kind, payload in rows]  # the fields, not their salts


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home used as a user would: the demo (agents, a task, decisions), then a deny rule."""
    home = tmp_path_factory.mktemp("made") / "home"
    cli("demo", home=home, check=True)
    cli("rules", "add", "write_file", "--effect", "deny", "--prefix", "secrets/", home=home, check=True)
    return home


@pytest.fixture
def copy(made: Path, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    shutil.copytree(made, home)
    return home


def test_the_journal_records_each_file_when_it_is_first_made(made: Path) -> None:
    files = [p for k, p in journal_rows(made) if k == "home_file_created"]
    store_id = duckdb.connect(str(made / "governance.db"), read_only=True).execute(
        "SELECT value FROM meta WHERE key = 'store_id'").fetchone()[0]
    assert files == [{"file": "runtime.db"}, {"file": "governance.db", "id": store_id}]


# --- runtime.db ------------------------------------------------------------------------------


def test_a_missing_runtime_db_refuses_to_start_until_repaired_on_purpose(copy: Path) -> None:
    (copy / "runtime.db").unlink()
    line = refused(cli("agents", "list", home=copy), "HOME_FILE_MISSING", str(copy / "runtime.db"),
                   "apollia-os home repair --new-runtime-db")
    assert "journal records that it existed" in line
    assert not (copy / "runtime.db").exists()  # never a silent empty store

    repaired = cli("home", "repair", "--new-runtime-db", "--by", "ops", home=copy, check=True)
    assert "started an empty" in repaired.stdout
    kind, payload = journal_rows(copy)[-1]  # the repair is journaled
    assert kind == "home_repaired" and payload["file"] == "runtime.db" and payload["by"] == "ops"
    assert payload["moved_to"] is None and "missing" in payload["problem"]
    assert cli("agents", "list", home=copy, check=True).stdout.strip() == "no agents registered"
    assert cli("audit", "verify", home=copy, check=True).stdout.startswith("ok:")
    refused(cli("home", "repair", "--new-runtime-db", home=copy), "BAD_INPUT", "nothing to repair")


def test_a_corrupt_runtime_db_refuses_to_start_and_serve_says_so_without_a_traceback(copy: Path) -> None:
    damaged = b"not a database " * 400
    (copy / "runtime.db").write_bytes(damaged)
    refused(cli("agents", "list", home=copy), "HOME_FILE_CORRUPT", str(copy / "runtime.db"),
            "apollia-os home repair --new-runtime-db")
    serve = subprocess.run([*APOLLIA, "serve", "--home", str(copy), "--port", "0"], capture_output=True,
                           text=True, timeout=120, cwd=copy.parent)
    refused(serve, "HOME_FILE_CORRUPT", "runtime.db")
    assert serve.stdout == "" and not (copy / "server.json").exists()
    assert (copy / "runtime.db").read_bytes() == damaged  # nothing was changed

    cli("home", "repair", "--new-runtime-db", home=copy, check=True)
    [aside] = copy.glob("runtime.db.damaged-*")
    assert aside.read_bytes() == damaged  # moved aside, never deleted
    assert cli("agents", "list", home=copy, check=True).returncode == 0


# --- the signing key and the journal ---------------------------------------------------------


def test_a_missing_key_refuses_to_start_and_no_new_key_is_put_on_the_old_chain(copy: Path) -> None:
    saved = (copy / "keys" / "journal.key").read_bytes()
    shutil.rmtree(copy / "keys")
    refused(cli("agents", "list", home=copy), "HOME_FILE_MISSING", str(copy / "keys" / "journal.key"),
            "home repair --archive-journal")
    assert not (copy / "keys" / "journal.key").exists()
    (copy / "keys").mkdir(exist_ok=True)  # the folder may be made again; the key never is
    (copy / "keys" / "journal.key").write_bytes(saved)  # restored from a backup: it starts again
    assert cli("agents", "list", home=copy, check=True).stdout.startswith("clerk")
    assert cli("audit", "verify", home=copy, check=True).stdout.startswith("ok:")


def test_another_key_is_a_mismatch_and_archiving_starts_a_new_chain_that_names_the_old(copy: Path) -> None:
    old = journal_rows(copy)
    keygen(copy.parent / "other.key")
    (copy / "keys" / "journal.key").write_bytes((copy.parent / "other.key").read_bytes())
    (copy / "keys" / "journal.pub").unlink()
    refused(cli("agents", "list", home=copy), "HOME_KEY_MISMATCH", "is not the key that signed")
    assert journal_rows(copy) == old  # nothing was signed with the wrong key

    done = cli("home", "repair", "--archive-journal", "--by", "ops", "--json", home=copy, check=True)
    data = json.loads(done.stdout)
    archived = Path(data["archived_to"])
    assert archived.parent == copy / "archive" and (archived / "journal.db").exists()
    assert data["old_seq"] == len(old)
    rows = journal_rows(copy)
    assert rows[0][0] == "home_repaired" and rows[0][1]["action"] == "archive_journal"
    assert rows[0][1]["old_seq"] == len(old) and rows[0][1]["by"] == "ops"
    assert {p["file"] for k, p in rows if k == "home_file_created"} == {"runtime.db", "governance.db"}
    assert cli("audit", "verify", home=copy, check=True).stdout.startswith("ok:")
    assert cli("agents", "list", home=copy, check=True).stdout.startswith("clerk")


def test_a_corrupt_journal_refuses_to_start(copy: Path) -> None:
    (copy / "journal.db").write_bytes(b"\x00garbage" * 1000)
    refused(cli("agents", "list", home=copy), "HOME_FILE_CORRUPT", str(copy / "journal.db"))


def test_an_older_journal_that_only_implies_runtime_db_still_refuses(home: Home) -> None:
    from apollia_nb.journal import Journal

    with Journal.open(home) as journal:  # written before files were recorded: a task ran here
        journal.append("task_status", {"task_id": "t-1", "status": "running"}, run_id="r-1")

    async def open_it() -> None:
        async with Runtime(home):
            pass

    import anyio

    with pytest.raises(HomeFileMissing, match="runtime.db is missing"):
        anyio.run(open_it)
    assert not home.runtime_db.exists()


@pytest.mark.anyio
async def test_an_older_journal_that_only_implies_governance_db_starts_fail_closed(home: Home) -> None:
    from apollia_nb.journal import Journal

    with Journal.open(home) as journal:  # written before files were recorded: a rule was added here
        journal.append("rule_added", {"id": "r-1", "tool": "write_file", "prefix": None, "effect": "deny",
                                      "agent": "*", "by": "ops"})
    async with Runtime(home) as rt:
        view = rt.governance.view()
        assert not view.readable and "governance.db is missing" in view.unreadable_reason
        task = await _guarded_write(rt)
        assert task.status == "failed" and task.error["code"] == "REFUSED"
    assert not home.governance_db.exists()


# --- governance.db at rest -------------------------------------------------------------------


async def _guarded_write(rt: Runtime, path: str = "secrets/key") -> Any:
    """A write the deny rule guards, in a run that holds a grant for writing (allowed without the rule)."""
    await rt.register_agent(manifest(name="scribe", actor=[{"tool_calls": [call("write_file", path=path,
                                                                                  content="x")]}]))
    return await (await rt.submit("scribe", "Write the secret", grants=["write"]))


@pytest.mark.anyio
async def test_a_deleted_governance_db_fails_closed_and_is_never_recreated_empty(copy: Path) -> None:
    (copy / "governance.db").unlink()
    refused(cli("rules", "list", home=copy), "GOVERNANCE_UNREADABLE", "governance.db is missing",
            "apollia-os home repair --new-governance-db")
    refused(cli("rules", "add", "bash_executor", "--effect", "deny", home=copy), "GOVERNANCE_UNREADABLE")
    assert not (copy / "governance.db").exists()

    async with Runtime(copy) as rt:  # starts, fail closed
        assert not rt.governance.view().readable
        task = await _guarded_write(rt)
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        assert not (rt.agent("scribe").workspace / "secrets" / "key").exists()
    assert not (copy / "governance.db").exists()
    assert "governance.db is missing" in [p for k, p in journal_rows(copy) if k == "home_damaged"][-1]["reason"]

    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(copy), "--port", "0", "--print-token", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=copy.parent)
    try:  # the server starts, fail closed, and says why
        info = json.loads(proc.stdout.readline() or proc.stderr.read())
        from apollia_nb.sdk import Client, errors

        with Client(info["url"], info["token"]) as api, pytest.raises(errors.GovernanceUnreadable) as raised:
            api.rules()
        assert "governance.db is missing" in str(raised.value)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()

    cli("home", "repair", "--new-governance-db", home=copy, check=True)
    assert cli("rules", "list", home=copy, check=True).stdout.strip() == "no fine rules"
    kind, payload = [r for r in journal_rows(copy) if r[0] == "home_repaired"][-1]
    assert payload["file"] == "governance.db" and payload["id"].startswith("g-")


@pytest.mark.anyio
async def test_a_governance_db_replaced_at_rest_is_not_the_homes(copy: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    cli("devmode", "on", home=other, check=True)  # a valid governance.db, without the deny rule
    shutil.copy(other / "governance.db", copy / "governance.db")
    refused(cli("rules", "list", home=copy), "GOVERNANCE_UNREADABLE", "replaced")
    async with Runtime(copy) as rt:
        view = rt.governance.view()
        assert not view.readable and "replaced" in view.unreadable_reason
        task = await _guarded_write(rt)
        assert task.status == "failed" and task.error["code"] == "REFUSED"


# --- governance.db under a live home ---------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_governance_db_deleted_or_replaced_under_a_live_home_keeps_the_deny_rule(
    home: Home, tmp_path: Path, how: str
) -> None:
    other = tmp_path / "other"
    cli("devmode", "off", home=other, check=True)
    cli("consents", "list", home=other, check=True)
    async with Runtime(home) as rt:
        rt.governance.add_rule("write_file", "deny", prefix="secrets/", by="ops")
        assert rt.governance.view().readable
        if how == "deleted":
            home.governance_db.unlink()
        else:
            empty = other / "empty.db"
            con = duckdb.connect(str(empty))
            con.execute("CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
            con.close()
            os.replace(empty, home.governance_db)
        task = await _guarded_write(rt)
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        assert not (rt.agent("scribe").workspace / "secrets" / "key").exists()
        view = rt.governance.view()
        assert not view.readable and ("missing" in view.unreadable_reason or "replaced" in view.unreadable_reason)
        with pytest.raises(Exception, match="home repair --new-governance-db"):
            rt.governance.add_rule("bash_executor", "deny", by="ops")
    if how == "deleted":
        assert not home.governance_db.exists()  # never recreated empty over the lost one
    [damaged] = [p for k, p in journal_rows(home.path) if k == "home_damaged"]  # journaled, once
    assert damaged["file"] == "governance.db" and "home repair --new-governance-db" in damaged["reason"]


# --- the organisation policy -----------------------------------------------------------------

POLICY = b'[refuse]\nfamilies = ["send"]\n'


def _deposit(home: Path, data: bytes = POLICY) -> None:
    key = home.parent / "org.key"
    if not key.exists():
        keygen(key)
    public = (home.parent / "org.key.pub").read_text().strip()
    (home / "policy").mkdir(parents=True, exist_ok=True)
    (home / "policy" / "organisation.toml").write_bytes(data)
    sign(home / "policy" / "organisation.toml", key)
    (home / "apollia.toml").write_text(f'[policy]\ntrusted_keys = ["{public}"]\n')


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that counts the requests it receives."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"sent")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/x", hits
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.anyio
async def test_a_policy_deleted_under_a_live_home_keeps_refusing_the_send(
    home: Home, listener: tuple[str, list[str]]
) -> None:
    url, hits = listener
    _deposit(home.path)
    async with Runtime(home) as rt:
        assert rt.governance.policy_state().status == "accepted"
        home.policy_path.unlink()
        home.policy_sig_path.unlink()
        await rt.register_agent(manifest(name="mailer", actor=[{"tool_calls": [call("http_request", url=url)]}]))
        task = await (await rt.submit("mailer", "Send it", grants=["send"]))
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        state = rt.governance.policy_state()
        assert state.status == "refused" and "apollia-os policy remove" in state.reason
    assert hits == []  # the request was not sent
    assert [p["status"] for k, p in journal_rows(home.path) if k.startswith("policy_")] == ["accepted", "refused"]


@pytest.mark.anyio
async def test_a_validly_re_signed_policy_is_loaded_and_journaled(home: Home) -> None:
    _deposit(home.path)
    async with Runtime(home) as rt:
        first = rt.governance.policy_state()
        _deposit(home.path, b'[refuse]\ntools = ["http_request"]\n')
        second = rt.governance.policy_state()
        assert second.status == "accepted" and second.digest != first.digest
        assert rt.governance.view().readable
    loaded = [p for k, p in journal_rows(home.path) if k == "policy_loaded"]
    assert [p["digest"] for p in loaded] == [first.digest, second.digest]


def test_a_vanished_policy_is_refused_everywhere_until_removed_on_purpose(copy: Path) -> None:
    _deposit(copy)
    cli("agents", "list", home=copy, check=True)  # the owner loads (and journals) the policy
    (copy / "policy" / "organisation.toml").unlink()
    (copy / "policy" / "organisation.toml.sig").unlink()

    check = cli("policy", "check", home=copy)
    assert check.returncode == 1 and check.stdout.splitlines()[0] == "policy: refused"
    assert "organisation.toml is missing" in check.stdout and "apollia-os policy remove" in check.stdout

    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(copy), "--port", "0", "--print-token", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=copy.parent)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        info = json.loads(line)
        from apollia_nb.sdk import Client

        with Client(info["url"], info["token"]) as api:
            policy = api.policy()
        assert policy.status == "refused" and "apollia-os policy remove" in policy.reason
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()

    removed = cli("policy", "remove", "--by", "ops", home=copy, check=True)
    assert "removed the organisation policy" in removed.stdout
    check = cli("policy", "check", home=copy)
    assert check.returncode == 0 and check.stdout.splitlines()[0] == "policy: none"
    kinds = [k for k, _ in journal_rows(copy) if k.startswith("policy_")]
    assert kinds[-1] == "policy_removed"
    refused(cli("policy", "remove", home=copy), "NOT_FOUND", "no organisation policy")


@pytest.mark.anyio
async def test_repairing_runtime_db_refuses_the_waiting_decisions_of_the_lost_tasks(home: Home) -> None:
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]}]))
        handle = await rt.submit("clerk", "Write", watched=False)
        await handle.settled()
        assert handle.status == "waiting"
        [pending] = rt.pending_decisions()
    home.runtime_db.unlink()
    refused(cli("pending", "list", home=home.path), "HOME_FILE_MISSING", "runtime.db")

    done = cli("home", "repair", "--new-runtime-db", "--json", home=home.path, check=True)
    assert json.loads(done.stdout)["refused_decisions"] == [pending["id"]]
    assert cli("pending", "list", home=home.path, check=True).stdout.strip() == "nothing is waiting"
    answer = [p for k, p in journal_rows(home.path) if k == "answer"][-1]
    assert (answer["decision_id"], answer["answer"]) == (pending["id"], "refuse")
    assert "the task is gone" in answer["reason"]
    assert cli("audit", "verify", home=home.path, check=True).stdout.startswith("ok:")
