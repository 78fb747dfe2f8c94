"""The CLI and the auditor on a served home work as on an owned one.

A home is owned by one process: the CLI itself, or a real `apollia-os serve` subprocess whose clients
the commands then are. Each command runs as a user runs it (a subprocess) on both kinds of home, and
must print the same thing (ids, times, hashes and counts normalised) with the same exit status. One
server is started for the module.

A server that has stopped and left its ``server.json`` behind is ``SERVER_NOT_RUNNING`` saying to
start the server (or remove the stale file), from the CLI, a client ``Runtime`` and the SDK.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from apollia_nb.errors import ServerNotRunning
from apollia_nb.home import Home
from apollia_nb.runtime import Runtime

APOLLIA = [sys.executable, "-m", "apollia_nb"]

HOLDER = textwrap.dedent("""
    import sys
    from apollia_nb.home import Home, OwnerLock
    lock = OwnerLock(Home.at(sys.argv[1])).acquire()
    print("holding", flush=True)
    sys.stdin.read()
""")


def cli(home: Path, *args: str, cwd: Path | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    return subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True, input=stdin,
                          env=env, cwd=cwd, timeout=180)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


@contextlib.contextmanager
def holding(home: Path) -> Iterator[int]:
    """Another live process owns ``home`` (its owner lock) and serves nothing; yields its pid."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(home)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def advertise(home: Path, pid: int, port: int) -> None:
    (home / "server.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}", "token": "t" * 43,
                                                  "pid": pid}))


def made(tmp: Path) -> Path:
    home = tmp / "home"
    out = cli(home, "agents", "list")
    assert out.returncode == 0, out.stderr
    return home


def assert_not_running(out: subprocess.CompletedProcess[str], why: str) -> None:
    assert out.returncode == 3, out.stdout + out.stderr
    line = out.stderr.strip()
    assert "\n" not in line and line.startswith("error: SERVER_NOT_RUNNING: the server is not running"), line
    assert why in line and "start `apollia-os serve`" in line.lower() and "remove the stale server.json" in line
    assert "INTEGRITY_FAILURE" not in line and "Traceback" not in out.stderr


# --- a server that is not running ---------------------------------------------------------------------


@pytest.mark.parametrize("command", [["runs", "list"], ["agents", "list"], ["audit", "verify"], ["rules", "list"],
                                     ["pending", "list"], ["audit", "checkpoint"]])
def test_a_stale_server_json_while_another_process_holds_the_home_says_the_server_is_not_running(
        tmp_path, command):
    home = made(tmp_path)
    with holding(home) as pid:
        advertise(home, pid, closed_port())  # the holder advertises itself, and nothing listens there
        assert_not_running(cli(home, *command), "refuses connections")
        advertise(home, dead_pid(), closed_port())  # a server that stopped; another process holds the home
        out = cli(home, *command)
        assert_not_running(out, "has stopped")
        assert f"owned by process {pid}" in out.stderr


def test_a_stale_server_json_on_a_home_nobody_holds_lets_the_command_own_it(tmp_path):
    home = made(tmp_path)
    advertise(home, dead_pid(), closed_port())
    for command in (["runs", "list"], ["audit", "verify"], ["agents", "list"]):
        out = cli(home, *command)
        assert out.returncode == 0, out.stderr


def test_a_client_runtime_finding_a_stopped_server_is_server_not_running(tmp_path):
    home = made(tmp_path)

    async def open_it() -> None:
        async with Runtime(home):
            pass

    with holding(home) as pid:
        advertise(home, pid, closed_port())
        with pytest.raises(ServerNotRunning, match="the server is not running.*refuses connections"):
            anyio.run(open_it)
        advertise(home, dead_pid(), closed_port())
        with pytest.raises(ServerNotRunning, match="has stopped.*remove the stale server.json"):
            anyio.run(open_it)


def test_the_sdk_from_a_stale_server_json_is_server_not_running(tmp_path):
    from apollia_nb.sdk import AsyncClient, Client, errors

    home = made(tmp_path)
    advertise(home, dead_pid(), closed_port())
    with pytest.raises(errors.ServerNotRunning, match="has stopped.*Start `apollia-os serve`"):
        Client.from_home(home)
    with pytest.raises(errors.ServerNotRunning, match="has stopped"):
        AsyncClient.from_home(home)
    advertise(home, os.getpid(), closed_port())  # alive, and nothing listens at its address
    with pytest.raises(errors.ServerNotRunning, match="refuses connections"):
        Client.from_home(home)
    assert issubclass(errors.ServerNotRunning, errors.HomeLocked)


def start_server(home: Path, cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    assert proc.stdout.readline(), proc.stderr.read()
    return proc


def stop_server(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    proc.stdout.close()
    proc.stderr.close()


def test_a_client_runtime_whose_server_stops_is_told_the_server_is_not_running(tmp_path):
    home = made(tmp_path)
    server = start_server(home, tmp_path)

    async def main() -> None:
        async with Runtime(home) as rt:
            assert rt.mode == "client"
            rt.journal.append("note", {"text": "before"})
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=30)
            with pytest.raises(ServerNotRunning, match="nothing was sent.*the server is not running"):
                rt.journal.append("note", {"text": "after"})
            view = rt.governance.view()
            assert not view.readable  # governance fails closed, as before

    try:
        anyio.run(main)
    finally:
        stop_server(server)
    assert Home.at(home).server_json.exists()  # left behind by the killed server: the stale file


# --- every command, on an owned home and on a served one ----------------------------------------------

from runtime_helpers import call, manifest  # noqa: E402
from test_cli_client import User  # noqa: E402  (the same normalisation of ids, times, hashes and paths)

CLERK = manifest(actor=[{"tool_calls": [call("write_file", path="out.txt", content="hi")]}, {"text": "Wrote it."}] * 3)
LISTER = manifest("lister", planner=[{"steps": ["look", "report"]}] * 2, actor=[{"text": "Reported."}] * 4)


class Pair:
    """The same user on two homes: one the commands own, one a real `apollia-os serve` owns."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.users = {}
        for which in ("owned", "served"):
            (tmp / which / "work").mkdir(parents=True)
            user = User(tmp / which / "home", tmp / which / "work")
            (user.work / "clerk.toml").write_text(CLERK)
            (user.work / "lister.toml").write_text(LISTER)
            (user.work / "items.jsonl").write_text('{"topic": "a"}\n{"topic": "b"}\n')
            self.users[which] = user
        self.users["owned"]("agents", "list")
        self.users["served"]("agents", "list")
        elsewhere = tmp / "served" / "server-cwd"
        elsewhere.mkdir()
        self.server = start_server(self.users["served"].home, elsewhere)

    def __call__(self, *args: str, numbers: bool = False, stdin: str = "",
                 same_stdout: bool = True) -> dict[str, subprocess.CompletedProcess[str]]:
        """Run the command on both homes (``{which}`` in an argument: that home's folder); assert both
        print the same and exit the same."""
        outs = {}
        for which, user in self.users.items():
            given = [a.replace("{dir}", str(self.tmp / which)) for a in args]
            outs[which] = user(*given, stdin=stdin, numbers=numbers)
        owned, served = (self.users[w].seen[-1] for w in ("owned", "served"))
        served_text = tuple(_norm(t, self.tmp / "served") for t in served[2:])
        owned_text = tuple(_norm(t, self.tmp / "owned") for t in owned[2:])
        assert served[1] == owned[1], (args, served, owned)
        assert "Traceback" not in served[3], served[3]
        if same_stdout:
            assert served_text == owned_text, (args, served_text, owned_text)
        return outs

    def close(self) -> None:
        stop_server(self.server)
        assert not (self.users["served"].home / "server.json").exists()


def _norm(text: str, where: Path) -> str:
    import re

    return re.sub(r"\bbatch-[0-9a-f]{6,}\b", "batch-<ID>", text.replace(str(where), "<T>"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    both = Pair(tmp_path_factory.mktemp("pair"))
    try:
        both("agents", "register", "clerk.toml")
        both("agents", "register", "lister.toml")
        both("run", "clerk", "Write out.txt", "--unattended")  # a run that waits on a person
        both("run", "lister", "Look and report")  # a run that completes
        yield both
    finally:
        both.close()


@pytest.mark.parametrize("args", [
    ["runs", "list"], ["agents", "list"], ["pending", "list"], ["consents", "list"], ["rules", "list"],
    ["devmode"], ["policy", "check"], ["audit", "views"],
])
@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_reading_commands_print_the_same_on_a_served_home(pair, args, json_out):
    outs = pair(*args, *(["--json"] if json_out else []), numbers=args[0] in ("runs",))
    assert outs["served"].returncode == 0, outs["served"].stderr


def test_runs_list_on_a_served_home_lists_the_journal_runs(pair):
    outs = pair("runs", "list", "--json", numbers=True)
    runs = json.loads(outs["served"].stdout)
    assert {r["agent"] for r in runs} >= {"clerk", "lister"}
    assert "HOME_LOCKED" not in outs["served"].stderr


def test_governance_changes_work_the_same_through_the_server(pair):
    rule = pair("rules", "add", "bash_executor", "--effect", "deny", "--prefix", "rm", "--by", "alice", "--json")
    rule_id = json.loads(rule["served"].stdout)["id"]
    owned_id = json.loads(rule["owned"].stdout)["id"]
    pair("rules", "remove", "r-nope", "--by", "alice")
    pair("devmode", "on", "--by", "alice")
    pair("devmode", "off", "--by", "alice")
    pair("consents", "revoke", "clerk", "write", "--by", "alice")
    for which, rid in (("served", rule_id), ("owned", owned_id)):
        assert pair.users[which]("rules", "remove", rid, "--by", "alice").returncode == 0


def test_pending_decide_resumes_the_run_the_same_way(pair):
    pair("run", "clerk", "Write out.txt", "--unattended")
    ids = {w: json.loads(pair.users[w]("pending", "list", "--json").stdout)[0]["id"] for w in pair.users}
    pair.users["owned"].seen.pop()
    pair.users["served"].seen.pop()
    pair("pending", "decide", "pd-nope", "once")
    for which, decision in ids.items():
        out = pair.users[which]("pending", "decide", decision, "once", "--by", "alice")
        assert out.returncode == 0, out.stderr
    assert pair.users["served"].seen[-1][1:] == pair.users["owned"].seen[-1][1:]


def test_run_and_batch_work_the_same_through_the_server(pair):
    pair("run", "lister", "Look and report", "--approve-plan", stdin="y\n")
    pair("run", "ghost", "boo")
    out = pair("batch", "lister", "items.jsonl", "--goal", "look at {topic}", "--out", "{dir}/results.jsonl")
    assert out["served"].returncode == 0, out["served"].stderr
    rows = [json.loads(line) for line in (pair.tmp / "served" / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["completed", "completed"]


@pytest.mark.parametrize("args", [
    ["audit", "verify"], ["audit", "verifier-key"], ["audit", "checkpoint", "--out", "{dir}/cp.txt"],
    ["audit", "prove", "2"], ["audit", "prove", "99999"], ["audit", "prove", "2", "--format", "tlog-proof"],
    ["audit", "replay", "run-nope"],
])
def test_audit_commands_print_the_same_on_a_served_home(pair, args):
    pair(*args, numbers=True)


def test_audit_proofs_against_kept_checkpoints_and_replays_through_the_server(pair):
    pair("audit", "checkpoint", "--out", "{dir}/kept.txt", numbers=True)
    pair("run", "lister", "Look and report", numbers=True)  # the journal grows past the kept tree
    pair("audit", "consistency", "--from", "{dir}/kept.txt", numbers=True)
    pair("audit", "consistency", "--from", "{dir}/kept.txt", "--json", numbers=True)
    pair("audit", "prove", "2", "--against", "{dir}/kept.txt", numbers=True)
    pair("audit", "verify", "--checkpoint", "{dir}/kept.txt", numbers=True)
    runs = {w: json.loads(u("runs", "list", "--json").stdout) for w, u in pair.users.items()}
    for user in pair.users.values():
        user.seen.pop()
    for which, user in pair.users.items():
        run_id = next(r["run_id"] for r in runs[which] if r["agent"] == "lister")
        out = user("audit", "replay", run_id)
        assert out.returncode == 0 and out.stdout.startswith("identical"), out.stdout + out.stderr
    assert pair.users["served"].seen[-1] == pair.users["owned"].seen[-1]


def test_audit_export_through_the_server_is_the_owners_bundle(pair):
    out = pair("audit", "export", "{dir}/bundle", numbers=True)
    assert out["served"].returncode == 0, out["served"].stderr
    pair("audit", "verify", "--bundle", "{dir}/bundle", numbers=True)


def test_commands_that_need_the_home_to_themselves_refuse_with_a_coded_message_while_served(pair):
    served = pair.users["served"]
    for args in (["home", "repair", "--new-runtime-db"], ["policy", "remove"]):
        out = served(*args)
        assert out.returncode == 3
        line = out.stderr.strip()
        assert "\n" not in line and line.startswith("error: HOME_LOCKED: ") and "stop the server" in line


# --- the auditor's face: a client holds no copy of the journal -----------------------------------------

from test_served_audit import build_home  # noqa: E402  (a journal of a few thousand entries, a checkpoint)


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, object]]:
    """A home of a few thousand entries with the owner's bundle of it, then served in this process."""
    from apollia_nb.api.server import ServerThread
    from apollia_nb.journal.export import export_journal
    from apollia_nb.journal.store import Journal
    from apollia_nb.runtime.remote import RemoteHome, ServerAddress

    tmp = tmp_path_factory.mktemp("audited")
    home = build_home(tmp / "home")
    with Journal.open(home) as journal:
        export_journal(journal, tmp / "owner-bundle")
    with ServerThread(home) as server:
        remote = RemoteHome(home, ServerAddress(server.url, server.token, os.getpid()))
        try:
            yield tmp, home.path, remote
        finally:
            remote.close()


def test_a_clients_verify_reads_bounded_pages_and_checks_them_under_the_homes_key(audited):
    _tmp, _home, remote = audited
    journal = remote.journal
    pages: list[int] = []
    paged = journal.entry_pages

    def counted(high: int, *, page: int | None = None):
        for rows in paged(high, page=page):
            pages.append(len(rows))
            yield rows

    journal.entry_pages = counted
    try:
        report = journal.verify_paged(page=300)
    finally:
        del journal.entry_pages
    high = journal.head()[0]
    assert report.ok and report.entries == high and report.checked_checkpoints >= 1
    assert max(pages) <= 300 and sum(pages) == high and len(pages) == -(-high // 300)
    assert not hasattr(journal, "cursor") and not hasattr(journal, "snapshot_rows")  # no copy to query


def test_a_clients_verify_finds_what_the_owners_finds_under_another_key(audited):
    from apollia_nb.journal.store import Journal

    tmp, _home, remote = audited
    other = build_home(tmp / "other")
    with Journal.open(other) as journal:
        foreign = journal.latest_checkpoint()
    report = remote.journal.verify_paged(foreign)
    assert not report.ok and "the given checkpoint" in report.problem


def test_a_clients_sql_and_proofs_are_answered_by_the_server_and_checked_here(audited):
    import datetime as dt

    from apollia_nb.errors import BadInput, IntegrityError
    from apollia_nb.journal.store import Journal

    tmp, home, remote = audited
    journal = remote.journal
    rows = journal.sql("SELECT seq, hash, ts, payload FROM entries WHERE seq <= ? ORDER BY seq", [3])
    assert [r[0] for r in rows] == [1, 2, 3]
    assert all(isinstance(r[1], bytes) and len(r[1]) == 32 for r in rows)
    assert rows[0][1] == journal.get(1).hash
    by_hash = journal.sql("SELECT seq FROM entries WHERE hash = ?", [rows[1][1]])  # a blob as a parameter
    assert by_hash == [(2,)]
    assert isinstance(journal.sql("SELECT now() AS t")[0][0], dt.datetime)
    for query in ("DELETE FROM entries", "SELECT * FROM read_text('/etc/passwd')", "SELECT 1; SELECT 2"):
        with pytest.raises(BadInput):
            journal.sql(query)

    proof = journal.inclusion_proof(2)
    proof.verify(journal.verifier())
    assert proof.entry_hash == rows[1][1]
    consistency = journal.consistency_proof(10, 2_000)
    assert (consistency.old_size, consistency.new_size) == (10, 2_000)
    with pytest.raises(BadInput):
        journal.consistency_proof(0)

    # A proof the server makes for another entry, or under another key, is refused here.
    other = Journal.open(build_home(tmp / "forger"))
    try:
        forged = other.inclusion_proof(2)
    finally:
        other.close()
    with pytest.raises(IntegrityError):
        forged.verify(journal.verifier())


def test_a_clients_export_is_the_owners_bundle_byte_for_byte(audited):
    from apollia_nb.journal.export import export_streamed

    tmp, _home, remote = audited
    owner = tmp / "owner-bundle"
    meta = json.loads((owner / "meta.json").read_text())
    journal = remote.journal
    export_streamed(journal, tmp / "client-bundle", size=meta["entries"], checkpoints=journal.checkpoints())
    client = tmp / "client-bundle"
    for name in ("entries.parquet", "checkpoint.txt", "README.md", "views.sql"):
        if (owner / name).exists():
            assert (client / name).read_bytes() == (owner / name).read_bytes(), name
    assert sorted(p.name for p in client.iterdir()) == sorted(p.name for p in owner.iterdir())
    mine = json.loads((client / "meta.json").read_text())
    assert {k: v for k, v in mine.items() if k != "exported_at"} == {
        k: v for k, v in meta.items() if k != "exported_at"}


def test_the_sql_route_refuses_what_is_not_a_read_of_the_journal_as_bad_input(audited):
    _tmp, _home, remote = audited
    http = remote.http
    for body in ({"query": "SELECT ?", "params": [{"$": "ts", "v": 5}]},
                 {"query": "SELECT ?", "params": [{"$": "nope", "v": "x"}]},
                 {"query": "SELECT ?", "params": [{"$": "blob", "v": "%%%"}]},
                 {"query": "ATTACH 'x.db'"}, {"query": "SELECT 1", "timeout": 0},
                 {"query": "COPY entries TO '/tmp/x.csv'"}):
        answer = http.post("/internal/journal/sql", json=body)
        assert answer.status_code == 422 and answer.json()["code"] == "BAD_INPUT", (body, answer.text)
    assert http.post("/internal/journal/sql", json={"query": "SELECT 1"}, headers={"Authorization": "Bearer x"}
                     ).status_code == 401


def test_stopping_an_agent_that_is_not_registered_says_the_same_on_both_homes(pair):
    out = pair("agents", "stop", "ghost")
    assert out["served"].returncode == 3 and "UNKNOWN_AGENT" in out["served"].stderr
    pair("agents", "stop", "ghost", "--json")


def test_the_refusal_of_a_served_home_names_the_server_and_how_to_stop_it_the_same_for_each_command(pair):
    served = pair.users["served"]
    pid = json.loads((served.home / "server.json").read_text())["pid"]
    said = []
    for args, what in ((["home", "repair", "--archive-journal"], "`home repair`"),
                       (["policy", "remove", "--by", "alice"], "`policy remove`")):
        out = served(*args)
        assert out.returncode == 3, out.stdout + out.stderr
        line = out.stderr.strip()
        assert line.startswith(f"error: HOME_LOCKED: {what} needs the home "), line
        assert f"process {pid}" in line and f"`kill {pid}`" in line, line
        said.append(line.replace(what, "WHAT"))
    assert said[0] == said[1]  # one answer, from one place
    assert (served.home / "journal.db").exists() and not (served.home / "archive").exists()  # nothing moved


def test_witness_push_reports_the_same_on_an_owned_and_a_served_home(tmp_path):
    from witness_helpers import WitnessProcess, configure

    homes = {w: tmp_path / w / "home" for w in ("owned", "served")}
    users = {w: User(h, tmp_path / w) for w, h in homes.items()}
    for user in users.values():
        user.work.mkdir()
        assert user("agents", "list").returncode == 0
        out = user("witness", "push")  # no witness configured: the same refusal on both
        assert out.returncode == 3 and "names no witness" in out.stderr
    keys = [json.loads(u("audit", "verifier-key", "--json").stdout)["verifier_key"] for u in users.values()]
    witness = WitnessProcess(tmp_path / "witness", *keys)
    server = None
    try:
        for home in homes.values():
            configure(Home.at(home), witness)
        server = start_server(homes["served"], tmp_path)
        for user in users.values():
            user.seen.clear()
            out = user("witness", "push", "--checkpoint", "--json")
            assert out.returncode == 0, out.stdout + out.stderr
            [state] = json.loads(out.stdout)["witnesses"]
            assert state["last_error"] is None and not state["pending"] and state["cosigned_size"] >= 1, state
            user("witness", "push", numbers=True)
        owned, served = (users[w].seen for w in ("owned", "served"))
        assert [s[:2] for s in served] == [s[:2] for s in owned]
        assert served[-1][2].replace("<DIR>", "") == owned[-1][2].replace("<DIR>", ""), (served, owned)
        for user in users.values():  # a cosigned checkpoint of every entry: the auditor's check passes
            out = user("audit", "verify", "--witness", witness.key)
            assert "witnesses: ok" in out.stdout, out.stdout + out.stderr
    finally:
        if server is not None:
            stop_server(server)
        witness.stop()


# --- the commands choose nothing: the home's backend is chosen once -----------------------------------------


def test_no_cli_command_asks_where_the_home_lives():
    """Only ``cli/backend.py`` knows of a server: no other module of the CLI reaches the client runtime, the
    SDK or the REST routes, or asks a runtime whether it is a client."""
    import ast

    import apollia_nb.cli as package

    where = Path(package.__file__).parent
    knowing = ("apollia_nb.runtime.remote", "apollia_nb.sdk", "apollia_nb.wire", "apollia_nb.cli.client")
    found = []
    for path in sorted(where.glob("*.py")):
        if path.name == "backend.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(knowing):
                found.append(f"{path.name}:{node.lineno} imports {node.module}")
            elif isinstance(node, ast.Import):
                found += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names
                          if a.name.startswith(knowing)]
            elif isinstance(node, ast.Attribute) and node.attr in ("mode", "server", "served"):
                found.append(f"{path.name}:{node.lineno} reads .{node.attr}")
            elif isinstance(node, ast.Name) and node.id in ("served", "refuse_served", "remote", "route"):
                found.append(f"{path.name}:{node.lineno} uses {node.id}")
    assert found == []
