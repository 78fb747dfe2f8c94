"""The home is out of reach of every tool, and a deny rule on a path sees the file the tool uses.

A real ``Runtime`` over a real home, a scripted agent and a real workspace on disk:
what the agent tries, and that the effect did not happen. Registration through the
CLI (a subprocess) and ``POST /api/v1/agents`` (a real ``apollia-os serve``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from apollia_nb.errors import WorkspaceOverlapsHome
from apollia_nb.home import Home
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.breaker import Breakers
from apollia_nb.runtime.models import ScriptedModel
from apollia_nb.runtime.builtins import builtin_tools
from apollia_nb.runtime.paths import check_workspace_apart_from_home, resolve_tool_path
from apollia_nb.runtime.tools import ToolDef, ToolRegistry, invoke
from runtime_helpers import call, manifest

APOLLIA = [sys.executable, "-m", "apollia_nb"]
SECRET = "the secret itself"


def payloads(rt, run_id, kind):
    return [json.loads(e.payload) for e in rt.journal.entries(run_id=run_id) if e.kind == kind]


def everything_journaled(rt) -> str:
    return "\n".join(bytes(e.payload).decode("utf-8") for e in rt.journal.entries())


def results_by_call(rt, run_id) -> list[dict]:
    return payloads(rt, run_id, "tool_result")


async def each_in_a_task(rt, agent: str, calls: list[dict]) -> list[str]:
    """Register ``agent`` and make each call in a task of its own, one after the other (task ``i``'s
    actor makes call ``i``, then says it is done); their run ids."""
    def actor(role, messages, tools):
        if role != "actor" or messages[-1].role == "tool":
            return None
        goal = [m.content for m in messages if m.role == "user"][-1]
        return {"tool_calls": [calls[int(goal.split()[-1])]]}

    await rt.register_agent(manifest(agent), model=ScriptedModel.from_function(actor))
    return [(await (await rt.submit(agent, f"attempt {i}"))).run_id for i in range(len(calls))]


def across(rt, run_ids: list[str], kind: str) -> list[dict]:
    return [p for run_id in run_ids for p in payloads(rt, run_id, kind)]


# --- the home -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_no_path_an_agent_writes_reaches_the_home_and_its_files_stay_unread_and_whole(home):
    work = Path.cwd()  # the agent's workspace ("."), beside the home
    (work / "via-link").symlink_to(home.path)
    (work / "key-link").symlink_to(home.keys_dir / "journal.key")
    (work / "policy-link").symlink_to(home.policy_path)  # dangling: the policy does not exist yet
    up = os.path.relpath(home.path, work)  # "../home"
    attempts = [
        call("read_file", path="via-link/keys/journal.key"),
        call("read_file", path="key-link"),
        call("read_file", path=str(home.keys_dir / "journal.key")),
        call("read_file", path=f"{up}/keys/journal.key"),
        call("read_file", path=f"x/../{up}//keys/./journal.key"),
        call("list_dir", path="via-link/keys"),
        call("list_dir", path=str(home.path)),
        call("delete_file", path="via-link/governance.db"),
        call("delete_file", path=str(home.journal_db)),
        call("write_file", path="via-link/policy/organisation.toml", content="[refuse]\n"),
        call("write_file", path=f"{up}/apollia.toml", content="broken = \n"),
        call("write_file", path="policy-link", content="[refuse]\n"),
        call("delete_file", path="key-link/"),
    ]
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="operator")
        await rt.register_agent(manifest(actor=[{"tool_calls": attempts}, {"text": "done"}]))
        key = (home.keys_dir / "journal.key").read_bytes()
        governance_db = home.governance_db.stat().st_size
        task = await (await rt.submit("clerk", "Take the keys"))
        assert task.status == "completed", task.error
        results = results_by_call(rt, task.run_id)
        assert [(r["tool"], r["status"], r["error_code"]) for r in results] == [
            (a["name"], "error", "PATH_IN_HOME") for a in attempts
        ]
        assert payloads(rt, task.run_id, "tool_call") == []  # refused before a decision, never run
        journaled = everything_journaled(rt)
        assert key.hex() not in journaled and key.decode("latin-1") not in journaled
        assert json.dumps(key.decode("latin-1"))[1:-1] not in journaled
    assert (home.keys_dir / "journal.key").read_bytes() == key
    assert home.governance_db.exists() and home.governance_db.stat().st_size >= governance_db
    assert home.journal_db.exists()
    assert not home.policy_path.exists() and not home.config_path.exists()


@pytest.mark.anyio
async def test_the_file_tools_refuse_the_home_even_from_a_workspace_that_contains_it(tmp_path):
    home = Home.at(tmp_path / "home")
    (home.keys_dir / "journal.key").write_text(SECRET)
    home.governance_db.write_text("rules")
    registry = ToolRegistry(builtin_tools(tmp_path, home=home.path))  # built by hand, not registered
    breakers = Breakers()

    async def run(tool: str, **arguments):
        return await invoke(registry.get(tool), arguments, breakers=breakers)

    for path in ("home/keys/journal.key", "./home/keys/../keys/journal.key", "home//keys/journal.key",
                 str(home.keys_dir / "journal.key")):
        outcome = await run("read_file", path=path)
        assert (outcome.error_code, outcome.output) == ("PATH_IN_HOME", None), path
        assert "apollia home" in outcome.error.message
    for path in ("home", "home/.", "home/keys"):
        assert (await run("list_dir", path=path)).error_code == "PATH_IN_HOME", path
    assert (await run("delete_file", path="home/governance.db")).error_code == "PATH_IN_HOME"
    assert (await run("write_file", path="home/policy/organisation.toml", content="x")).error_code == "PATH_IN_HOME"
    assert (home.keys_dir / "journal.key").read_text() == SECRET
    assert home.governance_db.read_text() == "rules"
    assert not home.policy_path.exists()
    listed = await run("list_dir", path=".")  # the folder around it is the workspace: it lists, no more
    assert listed.ok and "home" in [e["name"] for e in listed.output["entries"]]


@pytest.mark.anyio
async def test_without_a_home_given_the_tools_keep_out_of_the_home_this_process_uses(tmp_path, monkeypatch):
    monkeypatch.setenv("APOLLIA_HOME", str(tmp_path / "ws" / ".apollia"))
    (tmp_path / "ws" / ".apollia").mkdir(parents=True)
    (tmp_path / "ws" / ".apollia" / "journal.db").write_text("journal")
    registry = ToolRegistry(builtin_tools(tmp_path / "ws"))
    outcome = await invoke(registry.get("read_file"), {"path": ".apollia/journal.db"}, breakers=Breakers())
    assert outcome.error_code == "PATH_IN_HOME"


@pytest.mark.anyio
async def test_the_executors_run_in_the_workspace_without_the_homes_location_or_the_token(tmp_path, monkeypatch):
    monkeypatch.setenv("APOLLIA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("APOLLIA_TOKEN", "s3cret-token")
    ws = tmp_path / "ws"
    ws.mkdir()
    registry = ToolRegistry(builtin_tools(ws, home=tmp_path / "home"))
    breakers = Breakers()
    bash = await invoke(registry.get("bash_executor"), {"command": "pwd; env"}, breakers=breakers)
    assert bash.ok
    assert bash.output["stdout"].splitlines()[0] == os.path.realpath(ws)
    assert "APOLLIA_" not in bash.output["stdout"] and "s3cret-token" not in bash.output["stdout"]
    assert "PATH=" in bash.output["stdout"]  # the rest of the environment is kept
    code = "import os; print(sorted(k for k in os.environ if k.startswith('APOLLIA')), os.getcwd())"
    python = await invoke(registry.get("python_executor"), {"code": code}, breakers=breakers)
    assert python.ok and python.output["stdout"].strip() == f"[] {os.path.realpath(ws)}"


# --- registration -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_registration_refuses_a_workspace_that_contains_is_or_lies_inside_the_home(home, tmp_path):
    (tmp_path / "to-parent").symlink_to(tmp_path)
    (tmp_path / "work" / "to-home").symlink_to(home.path)
    overlapping = {
        "contains it (root '.' beside it)": (".", tmp_path),
        "the home itself": (str(home.path), None),
        "inside it": (str(home.path / "agents" / "scratch"), None),
        "a link to its parent": (str(tmp_path / "to-parent"), None),
        "a link to the home": ("to-home", None),
        "up and over": ("../home/keys", None),
    }
    async with Runtime(home) as rt:
        for why, (root, cwd) in overlapping.items():
            with pytest.raises(WorkspaceOverlapsHome) as refused:
                await rt.register_agent(manifest(workspace=root), cwd=cwd)
            assert refused.value.code == "WORKSPACE_OVERLAPS_HOME", why
            assert "[workspace] root" in refused.value.message and "apollia home" in refused.value.message, why
            assert rt.agents() == [], why
        assert not (home.path / "agents" / "scratch").exists()  # nothing was created inside the home
        beside = await rt.register_agent(manifest(workspace="../proj"))  # a folder next to the home is fine
        assert beside.workspace.resolve() == (tmp_path / "proj").resolve()
        assert beside.state.state.value == "active"


def test_the_overlap_check_compares_written_and_resolved_paths(tmp_path):
    home = tmp_path / "user" / ".apollia"
    home.mkdir(parents=True)
    check_workspace_apart_from_home(tmp_path / "user" / "proj", home)  # beside: fine
    check_workspace_apart_from_home(tmp_path / "user" / ".apollia-other", home)  # a name that only starts alike
    for ws in (tmp_path / "user", home, home / "x", tmp_path):
        with pytest.raises(WorkspaceOverlapsHome):
            check_workspace_apart_from_home(ws, home, agent="agent 'clerk'")


def test_cli_agents_register_refuses_a_workspace_that_contains_the_home(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "clerk.toml").write_text(manifest())  # [workspace] root = "." run from ~ with the home in ~/.apollia
    home = user / ".apollia"
    env = {**os.environ, "APOLLIA_HOME": str(home)}
    refused = subprocess.run([*APOLLIA, "agents", "register", "clerk.toml"], cwd=user, env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "WORKSPACE_OVERLAPS_HOME" in refused.stderr and "[workspace] root" in refused.stderr
    listed = subprocess.run([*APOLLIA, "agents", "list", "--json"], cwd=user, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    (user / "proj").mkdir()
    accepted = subprocess.run([*APOLLIA, "agents", "register", "../clerk.toml"], cwd=user / "proj", env=env,
                              capture_output=True, text=True, timeout=120)
    assert accepted.returncode == 0, accepted.stderr
    assert "registered clerk: active" in accepted.stdout


def test_post_agents_over_http_refuses_a_workspace_that_contains_the_home_with_422(tmp_path):
    home = tmp_path / "home"
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline(), proc.stderr.read()
        info = json.loads((home / "server.json").read_text())
        headers = {"Authorization": f"Bearer {info['token']}"}
        with httpx.Client(base_url=info["url"] + "/api/v1", headers=headers, timeout=60) as http:
            refused = http.post("/agents", json={"manifest": manifest()})  # "." is the server's folder
            assert refused.status_code == 422, refused.text
            assert refused.json()["code"] == "WORKSPACE_OVERLAPS_HOME"
            assert "[workspace] root" in refused.json()["message"]
            assert http.get("/agents").json() == []
            accepted = http.post("/agents", json={"manifest": manifest(workspace="proj")})
            assert accepted.status_code in (200, 201), accepted.text
            assert accepted.json()["workspace"] == str(tmp_path / "proj")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()


# --- deny rules on paths ---------------------------------------------------------------------


@pytest.fixture
def secrets(home):
    """A workspace with a denied folder, a folder whose name only starts alike, and a link to the first."""
    work = Path.cwd()
    (work / "secrets").mkdir()
    (work / "secrets" / "k").write_text(SECRET)
    (work / "secretsX").mkdir()
    (work / "secretsX" / "k").write_text("not denied")
    (work / "public").mkdir()
    (work / "public" / "p").write_text("public")
    (work / "alias").symlink_to(work / "secrets")
    return work


def spellings(work: Path) -> list[str]:
    """Ways of naming ``secrets/k`` that the tool resolves to the same file."""
    name = work.name
    return [
        "secrets/k",
        str(work / "secrets" / "k"),
        "/" + str(work / "secrets" / "k"),  # //abs
        f"x/../../{name}/secrets/k",
        "secrets//k",
        "./secrets/./k",
        "public/../secrets/k",
        "alias/k",
        str(work / "alias" / "k"),
        "alias/../alias/k",
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("prefix", ["secrets/", "./secrets", "secrets", "secrets//", "ABS"])
async def test_a_read_deny_rule_refuses_every_spelling_of_the_path(home, secrets, prefix):
    prefix = str(secrets / "secrets") if prefix == "ABS" else prefix
    reads = [call("read_file", path=p) for p in spellings(secrets)] + [call("list_dir", path="secrets/."),
                                                                       call("list_dir", path="alias")]
    async with Runtime(home) as rt:
        rt.governance.add_rule("read_file", "deny", prefix=prefix, by="operator")
        rt.governance.add_rule("list_dir", "deny", prefix=prefix, by="operator")
        runs = await each_in_a_task(rt, "clerk", reads)
        decisions = across(rt, runs, "decision")
        assert [(d["outcome"], d["line"]) for d in decisions] == [("refuse", 2)] * len(reads)
        assert [d["arguments"]["path"] for d in decisions] == [r["arguments"]["path"] for r in reads]  # as asked
        assert [d["path"] for d in decisions] == ["secrets/k"] * (len(reads) - 2) + ["secrets", "secrets"]
        assert all(f"under {prefix!r}" in d["reason"] for d in decisions)
        assert decisions[1]["reason"].endswith("matches the path 'secrets/k'")
        assert [r["status"] for r in across(rt, runs, "tool_result")] == ["refused"] * len(reads)
        assert across(rt, runs, "tool_call") == []
        assert SECRET not in everything_journaled(rt)


@pytest.mark.anyio
async def test_a_directory_prefix_matches_at_a_component_boundary_and_a_plain_one_as_text(home, secrets):
    reads = [call("read_file", path="secretsX/k"), call("read_file", path=str(secrets / "public/p"))]
    async with Runtime(home) as rt:
        rt.governance.add_rule("read_file", "deny", prefix="secrets/", agent="clerk", by="operator")
        rt.governance.add_rule("read_file", "deny", prefix="secrets", agent="scout", by="operator")
        clerk = await each_in_a_task(rt, "clerk", reads)
        scout = await each_in_a_task(rt, "scout", reads)
        assert [(r["status"], r["output"]) for r in across(rt, clerk, "tool_result")] == [
            ("ok", "not denied"), ("ok", "public")
        ]
        assert [r["status"] for r in across(rt, scout, "tool_result")] == ["refused", "ok"]


@pytest.mark.anyio
async def test_write_and_delete_deny_rules_refuse_every_spelling_and_the_file_is_untouched(home, secrets):
    writes = [call("write_file", path=p, content="overwritten") for p in spellings(secrets)]
    deletes = [call("delete_file", path=p) for p in spellings(secrets)]
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="operator")
        rt.governance.add_rule("write_file", "deny", prefix="secrets/", by="operator")
        rt.governance.add_rule("delete_file", "deny", prefix=str(secrets / "secrets") + "/", by="operator")
        runs = await each_in_a_task(rt, "clerk", writes + deletes)
        decisions = across(rt, runs, "decision")
        assert [(d["tool"], d["outcome"], d["line"], d["path"]) for d in decisions] == [
            (c["name"], "refuse", 2, "secrets/k") for c in writes + deletes
        ]
        assert across(rt, runs, "tool_call") == []
    assert (secrets / "secrets" / "k").read_text() == SECRET
    assert (secrets / "alias").is_symlink()


@pytest.mark.anyio
async def test_paths_an_agent_may_try_on_a_denied_folder(home, secrets):
    (secrets / "\u0455ecrets").mkdir()  # Cyrillic "ѕ": a different folder, with its own file
    (secrets / "\u0455ecrets" / "k").write_text("look-alike")
    (secrets / "secrets" / "new\nline").write_text("under secrets")
    tries = [
        call("read_file", path="\u0455ecrets/k"),  # a different file: allowed, and it is not the secret
        call("read_file", path="secrets/new\nline"),  # a newline is part of a name: still under secrets/
        call("read_file", path="secrets/k\x00.txt"),  # NUL: refused before anything is decided
        call("read_file", path=""),  # empty: a bad argument
        call("read_file", path="~/secrets/k"),  # "~" is a plain name in the workspace, never expanded
        call("read_file", path="secrets"),  # the folder itself
        call("read_file", path=str(secrets / "secrets") + "/."),
    ]
    async with Runtime(home) as rt:
        rt.governance.add_rule("read_file", "deny", prefix="secrets/", by="operator")
        runs = await each_in_a_task(rt, "clerk", tries)
        results = across(rt, runs, "tool_result")
        assert [(r["status"], r.get("error_code")) for r in results] == [
            ("ok", None), ("refused", "REFUSED"), ("error", "PATH_ESCAPE"), ("error", "BAD_ARGUMENT"),
            ("error", "TOOL_PERMANENT"), ("refused", "REFUSED"), ("refused", "REFUSED"),
        ]
        assert results[0]["output"] == "look-alike"
        assert [d["path"] for d in across(rt, runs, "decision")] == [
            "\u0455ecrets/k", "secrets/new\nline", "~/secrets/k", "secrets", "secrets",
        ]
        assert SECRET not in everything_journaled(rt)


@pytest.mark.anyio
async def test_a_card_shows_the_path_as_asked_and_as_resolved(home, secrets):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="./notes//a.txt",
                                                                        content="hi")]}]))
        handle = await rt.submit("clerk", "Write a note")
        await handle.settled()
        [card] = handle.pending
        assert card.arguments["path"] == "./notes//a.txt" and card.path == "notes/a.txt"
        assert card.to_dict()["path"] == "notes/a.txt"
        from apollia_nb.notebook.render import card_html, card_text

        assert "resolves to notes/a.txt" in card_text(card.to_dict())
        assert "<code>notes/a.txt</code>" in card_html(card.to_dict())
        card.answer("refuse")
        await handle


@pytest.mark.anyio
async def test_a_path_that_cannot_be_resolved_is_never_decided_on_a_guess(home):
    ran = []

    def peek(path: str) -> str:
        """A custom file tool with a resolver that fails."""
        ran.append(path)
        return "read"

    def broken(path):
        raise RuntimeError("cannot tell")

    tool = ToolDef.from_function(peek, "read", resolve_path=broken)
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("peek", path="a")]}, {"text": "done"}]),
                                tools=[tool])
        task = await (await rt.submit("clerk", "Peek"))
        [result] = results_by_call(rt, task.run_id)
        assert (result["status"], result["error_code"]) == ("error", "TOOL_PERMANENT")
        assert payloads(rt, task.run_id, "decision") == [] and ran == []


def test_one_resolver_names_the_file_for_the_tool_and_for_governance(tmp_path):
    ws = tmp_path / "ws"
    (ws / "secrets").mkdir(parents=True)
    (tmp_path / "ws-link").symlink_to(ws)
    (ws / "alias").symlink_to(ws / "secrets")
    resolved = resolve_tool_path(tmp_path / "ws-link", "alias//k", home=tmp_path / "home")
    real = os.path.realpath(ws)
    assert resolved.relative == "secrets/k" and str(resolved.real) == f"{real}/secrets/k"
    assert str(resolved.entry) == f"{real}/secrets/k"
    assert set(resolved.names) == {
        "secrets/k", "alias/k", f"{real}/secrets/k", f"{real}/alias/k", f"{tmp_path}/ws-link/alias/k",
        f"{tmp_path}/ws-link/secrets/k",
    }
    link = resolve_tool_path(ws, "alias", home=tmp_path / "home")
    assert (link.relative, str(link.entry)) == ("secrets", f"{real}/alias")  # delete_file removes the link


@pytest.mark.anyio
async def test_an_agent_restored_elsewhere_keeps_the_workspace_resolved_when_it_was_registered(home, monkeypatch):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(workspace="desk"))  # relative: resolved once, where it is registered
        registered = rt.agent("clerk").workspace
    inside_home = home.path / "logs"
    inside_home.mkdir(exist_ok=True)
    monkeypatch.chdir(inside_home)  # opened again from inside the home: "desk" is not read again here
    async with Runtime(home) as rt:
        assert [a.name for a in rt.agents()] == ["clerk"]
        assert rt.agent("clerk").workspace == registered
    assert not (inside_home / "desk").exists()


@pytest.mark.anyio
async def test_an_agent_restored_where_its_workspace_would_fall_inside_the_home_is_stopped(home, monkeypatch):
    import duckdb

    async with Runtime(home) as rt:
        await rt.register_agent(manifest(workspace="desk"))
    # A record from before workspaces were recorded: its relative workspace is resolved where the home opens.
    con = duckdb.connect(str(home.path / "runtime.db"))
    con.execute("UPDATE agents SET workspace = NULL")
    con.close()
    inside_home = home.path / "logs"
    inside_home.mkdir(exist_ok=True)
    monkeypatch.chdir(inside_home)  # opened again from inside the home: "desk" would be home/logs/desk
    warnings: list[str] = []
    rt = Runtime(home)
    rt.subscribe(lambda kind, obj: warnings.append(str(obj)) if kind == "warning" else None)
    async with rt:
        assert rt.agents() == []
        assert [(r["name"], r["state"]) for r in rt.records.agents()] == [("clerk", "stopped")]
    assert not (inside_home / "desk").exists()
    assert any("WORKSPACE_OVERLAPS_HOME" in w for w in warnings), warnings


@pytest.mark.anyio
async def test_an_answer_is_for_the_file_asked_about_not_one_a_link_swapped_in_meanwhile(home, secrets):
    notes = secrets / "notes"
    notes.mkdir()
    async with Runtime(home) as rt:
        rt.governance.add_rule("write_file", "deny", prefix="secrets/", by="operator")
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="notes/k", content="x")]}]))
        handle = await rt.submit("clerk", "Write a note")
        await handle.settled()
        [card] = handle.pending
        assert card.path == "notes/k"
        notes.rmdir()
        notes.symlink_to(secrets / "secrets")  # while the card waits, notes/ becomes the denied folder
        card.answer("once")
        task = await handle
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        assert "now resolves to 'secrets/k'" in task.error["message"]
        assert payloads(rt, task.run_id, "tool_call") == []
    assert (secrets / "secrets" / "k").read_text() == SECRET


@pytest.mark.anyio
async def test_an_answered_card_whose_path_now_leaves_the_workspace_ends_with_the_tools_error(home, secrets, tmp_path):
    (secrets / "notes").mkdir()
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="notes/k", content="x")]},
                                                {"text": "done"}]))
        handle = await rt.submit("clerk", "Write a note")
        await handle.settled()
        (secrets / "notes").rmdir()
        (secrets / "notes").symlink_to(home.keys_dir)
        handle.pending[0].answer("once")
        task = await handle
        [result] = payloads(rt, task.run_id, "tool_result")
        assert (result["status"], result["error_code"]) == ("error", "PATH_IN_HOME")
        assert payloads(rt, task.run_id, "tool_call") == []  # resolved again before it ran: it never ran
        assert not (home.keys_dir / "k").exists()
