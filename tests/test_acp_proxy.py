"""``apollia-os acp-proxy``: a real ACP client and a real ACP agent (the Python ACP SDK from PyPI, in
its own environment installed by dev/install-test-acp.sh) over stdio, the proxy between them.

The agent (tests/acp_peers/agent.py) reports each tool call, asks permission, and replies with what
it was answered; the client (tests/acp_peers/client.py) prints the reply and every tool call update
it saw. Each test has its own home and project under ``tmp_path``; a served home listens on port 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import duckdb
import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.home import Home
from apollia_nb.runtime import Runtime

REPO = Path(__file__).resolve().parent.parent
PEERS = Path(__file__).resolve().parent / "acp_peers"
ACP_PYTHON = REPO / ".test-peers" / "venv-acp" / "bin" / "python"
TOKEN = "acp-proxy-token"
AGENT = "acp-agent--proj"  # tests/acp_peers/agent.py run by python, for the project folder "proj"


@pytest.fixture
def acp_python() -> Path:
    if not ACP_PYTHON.exists():
        message = "the ACP SDK is missing: run `bash dev/install-test-acp.sh`"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return ACP_PYTHON


@pytest.fixture
def places(tmp_path: Path) -> tuple[Home, Path]:
    home = Home.at(tmp_path / "home")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "notes.txt").write_text("notes\n")
    return home, project


def call(id: str, kind: str, raw_input: Any, *, title: str | None = None, ask: bool = True) -> dict[str, Any]:
    return {"id": id, "kind": kind, "title": title or f"{kind} {id}", "raw_input": raw_input, "ask": ask}


def client_command(acp_python: Path, home: Path, calls: list[dict[str, Any]], *proxy_args: str) -> list[str]:
    return [str(acp_python), str(PEERS / "client.py"), json.dumps(calls), "--",
            sys.executable, "-m", "apollia_nb", "acp-proxy", "--home", str(home), *proxy_args, "--",
            str(acp_python), str(PEERS / "agent.py")]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("APOLLIA_HOME", "APOLLIA_TOKEN")}


def run_client(acp_python: Path, home: Path, project: Path, calls: list[dict[str, Any]],
               *proxy_args: str) -> dict[str, Any]:
    done = subprocess.run(client_command(acp_python, home, calls, *proxy_args), cwd=project, env=environment(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def by_id(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in result["reply"]}


def journal_rows(home: Home, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def governed(home: Home, fn: Any) -> Any:
    async def main() -> Any:
        async with Runtime(home) as rt:
            return fn(rt)
    return anyio.run(main)


def test_a_denied_command_is_rejected_with_the_reason_and_an_allowed_read_passes(acp_python, places):
    home, project = places
    governed(home, lambda rt: rt.governance.add_rule("bash_executor", "deny", "rm", by="test"))
    result = run_client(acp_python, home.path, project, [
        call("read", "read", {"path": "notes.txt"}),
        call("search", "search", {"pattern": "x"}, ask=False),  # never asked: journaled all the same
        call("rm", "execute", {"command": "rm -rf build"}),
        call("rm-argv", "execute", {"command": ["rm", "-rf", "build"]}),  # an argument vector: the same command
        call("rm-args", "execute", {"command": "rm", "args": ["-rf", "build"]}),
        call("escape", "edit", {"path": "../outside.txt"}),
        call("abs", "delete", {"file_path": "/etc/passwd"}),
        call("home", "read", {"path": str(home.journal_db)}),
        call("located", "edit", {}, ),
    ], "--ask-timeout", "1")
    got = by_id(result)
    assert result["asked_client"] == 0  # the proxy answers every permission itself
    assert got["read"]["option"] == "yes" and got["read"]["meta"]["line"] == 3
    for denied in ("rm", "rm-argv", "rm-args"):
        assert got[denied]["option"] == "no", got[denied]
        assert got[denied]["meta"]["line"] == 2 and "deny" in got[denied]["meta"]["reason"], got[denied]
    assert got["escape"]["option"] == "no" and "PATH_ESCAPE" in got["escape"]["meta"]["reason"]
    assert got["abs"]["option"] == "no" and "PATH_ESCAPE" in got["abs"]["meta"]["reason"]
    assert got["home"]["option"] == "no" and "PATH_IN_HOME" in got["home"]["meta"]["reason"]
    # no path to read: unclassified, asked, refused when nobody answers
    assert got["located"]["option"] == "no" and got["located"]["meta"]["answer"] == "refuse"
    assert "refused by timeout" in got["located"]["meta"]["reason"]

    decisions = {r[0]: r[1:] for r in journal_rows(home, "SELECT tool || ':' || outcome || ':' || line, agent, "
                                                        "answered_by FROM decisions")}
    assert {"read_file:allow:3", "bash_executor:refuse:2", "write_file:refuse:0", "delete_file:refuse:0",
            "read_file:refuse:0", "write_file:ask:6"} <= set(decisions)
    assert all(agent == AGENT for agent, _ in decisions.values())
    calls = {r[0]: r[1:] for r in journal_rows(home, "SELECT call_id, tool, status FROM tool_calls")}
    assert calls["search"] == ("read_file", "ok")  # reported by the agent alone, still on the record
    assert calls["read"] == ("read_file", "ok") and calls["rm"] == ("bash_executor", "error")
    sources = journal_rows(home, "SELECT DISTINCT payload->>'source' FROM journal WHERE kind IN "
                                 "('decision', 'tool_call', 'tool_result')")
    assert sources == [("acp",)]  # every entry of the agent's calls says where it comes from
    said = journal_rows(home, "SELECT kind, payload->>'source_tool' FROM journal WHERE payload->>'call_id' = 'rm' "
                              "OR payload->>'caused_by' = 'rm' ORDER BY seq")
    assert said == [("tool_call", "execute"), ("decision", "execute"), ("tool_result", "execute")]
    verify = subprocess.run([sys.executable, "-m", "apollia_nb", "audit", "verify", "--home", str(home.path)],
                            capture_output=True, text=True, env=environment(), timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def wait_pending(api: httpx.Client, tool: str, proc: subprocess.Popen[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [p for p in api.get("/pending-decisions").json() if p["tool"] == tool]
        if found:
            return found[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"no pending decision for {tool}")


def test_asked_calls_are_answered_over_rest_and_always_is_standing_only_where_line_6_offers_it(acp_python, places):
    home, project = places
    governed(home, lambda rt: rt.governance.set_developer_mode(True, by="test"))
    calls = [call("edit-a", "edit", {"path": "a.txt", "content": "x"}),
             call("edit-b", "edit", {"path": "b.txt"}),  # the standing consent answers it
             call("ls", "execute", {"command": "ls -la"}),  # always here is a rule, never the agent's always
             call("fetch", "fetch", {"url": "https://example.org/"})]  # refused over REST
    with ServerThread(home, token=TOKEN) as srv, \
            httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=30) as api:
        proc = subprocess.Popen(client_command(acp_python, home.path, calls), cwd=project, env=environment(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            edit = wait_pending(api, "write_file", proc)
            assert edit["agent"] == AGENT and edit["answers"] == ["once", "always", "refuse"], edit
            assert edit["arguments"]["path"] == "a.txt"
            assert api.post("/pending-decisions/decide", json={"id": edit["id"], "answer": "always"}).status_code == 200
            shell = wait_pending(api, "bash_executor", proc)
            assert shell["answers"] == ["once", "always", "refuse"] and shell["line"] == 4, shell
            assert api.post("/pending-decisions/decide", json={"id": shell["id"], "answer": "always"}).status_code == 200
            fetch = wait_pending(api, "http_request", proc)
            assert api.post("/pending-decisions/decide", json={"id": fetch["id"], "answer": "refuse"}).status_code == 200
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err
    got = by_id(json.loads(out))
    assert got["edit-a"]["option"] == "yes-always" and got["edit-a"]["meta"]["answer"] == "always"
    assert got["edit-b"]["option"] == "yes" and got["edit-b"]["meta"]["line"] == 5
    assert got["ls"]["option"] == "yes" and got["ls"]["meta"]["answer"] == "always"  # a rule, not the agent's
    assert got["fetch"]["option"] == "no" and "refused by" in got["fetch"]["meta"]["reason"]

    def after(rt: Any) -> Any:
        return ({(c.agent, c.family.value) for c in rt.governance.consents()},
                [(r.tool, r.prefix, r.agent, r.effect.value) for r in rt.governance.rules()])
    consents, rules = governed(home, after)
    assert consents == {(AGENT, "write")}
    assert ("bash_executor", "ls -la", AGENT, "allow") in rules
    answers = journal_rows(home, "SELECT tool, answer FROM decisions WHERE answer IS NOT NULL ORDER BY seq")
    assert answers == [("write_file", "always"), ("bash_executor", "always"), ("http_request", "refuse")]


def test_a_home_that_cannot_be_opened_rejects_every_permission_and_the_relay_goes_on(acp_python, places, tmp_path):
    home, project = places
    calls = [call("read", "read", {"path": "notes.txt"}), call("ls", "execute", {"command": "ls"})]
    missing = run_client(acp_python, tmp_path / "nowhere", project, calls)
    assert [r["option"] for r in missing["reply"]] == ["no", "no"]
    assert all("HOME_FILE_MISSING" in r["meta"]["reason"] for r in missing["reply"])
    assert missing["stop"] == "end_turn" and len(missing["updates"]) == 4  # relayed all the same
    assert not (tmp_path / "nowhere").exists()  # no home was made up

    async def held() -> dict[str, Any]:
        async with Runtime(home):  # owned by this process, with no server to talk to
            return await anyio.to_thread.run_sync(lambda: run_client(acp_python, home.path, project, calls))
    locked = anyio.run(held)
    assert [r["option"] for r in locked["reply"]] == ["no", "no"]
    assert all("HOME_LOCKED" in r["meta"]["reason"] for r in locked["reply"])


def test_a_cancelled_prompt_turn_answers_the_waiting_permission_cancelled(acp_python, places, tmp_path):
    home, project = places
    signal_file = tmp_path / "cancel-now"
    calls = [call("edit", "edit", {"path": "a.txt"}), call("read", "read", {"path": "notes.txt"})]
    with ServerThread(home, token=TOKEN) as srv, \
            httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=30) as api:
        proc = subprocess.Popen(client_command(acp_python, home.path, calls), cwd=project,
                                env={**environment(), "ACP_TEST_CANCEL_WHEN": str(signal_file)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            pending = wait_pending(api, "write_file", proc)
            signal_file.write_text("now")
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, err
        assert all(p["id"] != pending["id"] for p in api.get("/pending-decisions").json())
        late = api.post("/pending-decisions/decide", json={"id": pending["id"], "answer": "once"})
        assert late.status_code in (404, 409), late.text  # nobody may answer a question no longer asked
    got = by_id(json.loads(out))
    assert got["edit"]["outcome"] == "cancelled" and got["edit"]["option"] is None
    assert got["read"]["option"] == "yes"  # the session goes on
    assert journal_rows(home, "SELECT answer, answered_by FROM decisions WHERE tool = 'write_file'") == \
        [("refuse", "system")]


def test_no_permission_request_reaches_the_client_around_the_proxy(acp_python, places):
    home, project = places
    governed(home, lambda rt: rt.governance.add_rule("bash_executor", "deny", "rm", by="test"))
    command = [str(acp_python), str(PEERS / "client.py"), "[]", "--", sys.executable, "-m", "apollia_nb",
               "acp-proxy", "--home", str(home.path), "--", sys.executable, str(PEERS / "raw_agent.py")]
    done = subprocess.run(command, cwd=project, env=environment(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["asked_client"] == 0  # in a batch, as a notification, under a key given twice: never the client's
    assert result["reply"] == [{"id": "100", "outcome": "selected", "option": "no", "meta": None},
                               {"id": "101", "outcome": "selected", "option": "no", "meta": None}]
    assert journal_rows(home, "SELECT tool, outcome, line FROM decisions") == [("bash_executor", "refuse", 2)] * 2


def test_a_served_home_whose_server_stops_mid_session_rejects_the_next_permissions(acp_python, places):
    home, project = places
    calls = [call("edit", "edit", {"path": "a.txt"})]
    srv = ServerThread(home, token=TOKEN)
    srv.start()
    try:
        with httpx.Client(base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=30) as api:
            proc = subprocess.Popen(client_command(acp_python, home.path, calls, "--ask-timeout", "3"), cwd=project,
                                    env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                wait_pending(api, "write_file", proc)
                srv.stop()  # the home goes down while the agent waits on a person
                out, err = proc.communicate(timeout=120)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
    finally:
        srv.stop()
    assert proc.returncode == 0, err
    got = by_id(json.loads(out))
    assert got["edit"]["option"] == "no", got  # answered, and no, whatever the home does meanwhile
    assert "the home did not answer within 33 s" in got["edit"]["meta"]["reason"], got
