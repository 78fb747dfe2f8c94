"""decide(): the six lines as a table of cases, one row per behaviour."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest

from apollia_nb.governance import (
    Answer,
    Call,
    Decision,
    Effect,
    Family,
    GovernanceView,
    Outcome,
    Policy,
    Rule,
    decide,
)
from apollia_nb.governance import shellcheck
from apollia_nb.governance.decision import first_argument, leaf_texts, path_prefix_matches, rule_matches, url_form

ALL = ("once", "always", "refuse")
ONCE_REFUSE = ("once", "refuse")
BASH = "bash_executor"

SIMPLE = ["git status", "git status --short", "ls -la", "pytest -q tests"]
NOT_SIMPLE = [
    "git status; rm -rf /",
    "git status && rm -rf /",
    "ls | wc -l",
    "echo hi > out.txt",
    "echo $(whoami)",
    "echo `whoami`",
    "sleep 10 &",
    "git status\nrm -rf /",
    "(cd /tmp)",
    "cat <<EOF\nhi\nEOF",
]


def call(
    family: str | None = None,
    *,
    agent: str = "clerk",
    tool: str = "tool",
    args: dict[str, Any] | None = None,
    connection: str | None = None,
    grants: tuple[str, ...] = (),
) -> Call:
    return Call(
        agent=agent, tool=tool, family=family, arguments=args or {}, connection=connection,
        run_grants=set(grants),
    )


def run(command: str, *, agent: str = "clerk", tool: str = BASH) -> Call:
    return call("execute", agent=agent, tool=tool, args={"command": command})


def view(**kw: Any) -> GovernanceView:
    return GovernanceView(**kw)


def check(d: Decision) -> Decision:
    """What holds for every decision: words for a reason, answers only when asking."""
    assert isinstance(d.reason, str) and any(c.isalpha() for c in d.reason), d
    if d.outcome == "ask":
        assert d.answers and set(d.answers) <= set(ALL) and "once" in d.answers and "refuse" in d.answers
    else:
        assert d.answers == ()
    assert d.line in range(7)
    assert (d.line == 0) <= (d.outcome == "refuse")
    return d


def expect(d: Decision, outcome: str, line: int, answers: tuple[str, ...] = ()) -> None:
    check(d)
    assert (d.outcome, d.line, d.answers) == (outcome, line, answers), d


# --- the six lines, and line 0 ---------------------------------------------------------

DEV_GIT = view(developer_mode=True, rules=[Rule(BASH, "allow", "git status")])
CONSENTED = view(consents={("clerk", f) for f in Family})

LINES = [
    # line 1: organisation policy
    ("1 policy refuses the tool", call("read", tool="web_fetch"),
     view(policy=Policy(refuse_tools={"web_fetch"})), "refuse", 1, ()),
    ("1 policy refuses the connection", call("read", tool="list_issues", connection="github"),
     view(policy=Policy(refuse_connections={"github"})), "refuse", 1, ()),
    ("1 policy refuses the family", call("send", tool="mail"),
     view(policy=Policy(refuse_families={"send"})), "refuse", 1, ()),
    ("1 policy beats a consent and a grant", call("send", tool="mail", grants=("send",)),
     view(policy=Policy(refuse_families={"send"}), consents={("clerk", "send")}), "refuse", 1, ()),
    ("1 policy beats reading", call("conversation", tool="say"),
     view(policy=Policy(refuse_tools={"say"})), "refuse", 1, ()),
    ("1 policy beats a deny rule", call("write"),
     view(policy=Policy(refuse_tools={"tool"}), rules=[Rule("tool")]), "refuse", 1, ()),
    ("1 policy beats an allow rule", run("git status"),
     view(developer_mode=True, rules=[Rule(BASH, "allow", "git status")],
          policy=Policy(refuse_families={"execute"})), "refuse", 1, ()),
    ("1 policy refuses on an unreadable view", call("read", tool="web_fetch"),
     view(readable=False, policy=Policy(refuse_tools={"web_fetch"})), "refuse", 1, ()),
    # line 2: a fine deny rule
    ("2 deny rule without prefix", call("write", tool="write_file", args={"path": "a.txt"}),
     view(rules=[Rule("write_file", "deny")]), "refuse", 2, ()),
    ("2 deny rule under a prefix", call("write", tool="write_file", args={"path": "secrets/key"}),
     view(rules=[Rule("write_file", "deny", "secrets/")]), "refuse", 2, ()),
    ("2 deny rule beats reading", call("read", tool="read_file", args={"path": "secrets/key"}),
     view(rules=[Rule("read_file", "deny", "secrets/")]), "refuse", 2, ()),
    ("2 deny rule on an unreadable view", call("read", tool="read_file"),
     view(readable=False, rules=[Rule("read_file")]), "refuse", 2, ()),
    ("2 deny rule on an unclassified tool", call(None, tool="mystery"),
     view(rules=[Rule("mystery")]), "refuse", 2, ()),
    # line 3: reading, the conversation, the agent's own memory
    ("3 read", call("read"), view(), "allow", 3, ()),
    ("3 conversation", call("conversation"), view(), "allow", 3, ()),
    ("3 memory", call("memory"), view(), "allow", 3, ()),
    ("3 read on an unreadable view", call("read"), view(readable=False), "allow", 3, ()),
    ("3 memory on an unreadable view", call("memory"), view(readable=False), "allow", 3, ()),
    # line 4: executing code
    ("4 allow: developer mode, allow rule, simple command", run("git status --short"),
     DEV_GIT, "allow", 4, ()),
    ("4 ask with always: developer mode, simple, no rule", run("ls -la"),
     view(developer_mode=True), "ask", 4, ALL),
    ("4 ask with always: developer mode, simple, rule for another prefix", run("ls -la"),
     DEV_GIT, "ask", 4, ALL),
    ("4 ask once/refuse: developer mode off, rule matches", run("git status"),
     view(rules=[Rule(BASH, "allow", "git status")]), "ask", 4, ONCE_REFUSE),
    ("4 ask once/refuse: developer mode, rule prefix, chained", run("git status; rm -rf /"),
     DEV_GIT, "ask", 4, ONCE_REFUSE),
    ("4 ask once/refuse: developer mode, no argument", call("execute", tool=BASH),
     view(developer_mode=True), "ask", 4, ONCE_REFUSE),
    # line 5: profile asks; consents and run grants allow the rest
    ("5 profile asks every time", call("profile"), view(), "ask", 5, ONCE_REFUSE),
    ("5 profile asks despite consent and grant", call("profile", grants=("profile",)),
     view(consents={("clerk", "profile")}), "ask", 5, ONCE_REFUSE),
    ("5 standing consent for write", call("write"), view(consents={("clerk", "write")}), "allow", 5, ()),
    ("5 standing consent for send", call("send"), view(consents={("clerk", "send")}), "allow", 5, ()),
    ("5 standing consent for read_personal", call("read_personal"),
     view(consents={("clerk", "read_personal")}), "allow", 5, ()),
    ("5 run grant for write", call("write", grants=("write",)), view(), "allow", 5, ()),
    # line 6: anything left asks
    ("6 write without consent", call("write"), view(), "ask", 6, ALL),
    ("6 consent for another family", call("write"), view(consents={("clerk", "send")}), "ask", 6, ALL),
    ("6 consent of another agent", call("write"), view(consents={("other", "write")}), "ask", 6, ALL),
    ("6 grant for another family", call("send", grants=("write",)), view(), "ask", 6, ALL),
    ("6 unclassified: once/refuse only", call(None), view(), "ask", 6, ONCE_REFUSE),
    ("6 unclassified despite consents", call(None), CONSENTED, "ask", 6, ONCE_REFUSE),
    # line 0: fail closed
    ("0 write with consent, unreadable", call("write"),
     view(readable=False, consents={("clerk", "write")}), "refuse", 0, ()),
    ("0 send with run grant, unreadable", call("send", grants=("send",)),
     view(readable=False), "refuse", 0, ()),
    ("0 execute allowed by rule, unreadable", run("git status"),
     view(readable=False, developer_mode=True, rules=[Rule(BASH, "allow", "git status")]), "refuse", 0, ()),
    ("0 read_personal, unreadable", call("read_personal"), view(readable=False), "refuse", 0, ()),
    ("0 profile, unreadable", call("profile"), view(readable=False), "refuse", 0, ()),
    ("0 unclassified, unreadable", call(None), view(readable=False), "refuse", 0, ()),
]


@pytest.mark.parametrize(("c", "v", "outcome", "line", "answers"), [r[1:] for r in LINES], ids=[r[0] for r in LINES])
def test_lines(c: Call, v: GovernanceView, outcome: str, line: int, answers: tuple[str, ...]) -> None:
    expect(decide(c, v), outcome, line, answers)


def test_fail_closed_reason_says_why() -> None:
    d = decide(call("write"), view(readable=False, unreadable_reason="policy signature does not verify"))
    assert d.line == 0 and "policy signature does not verify" in d.reason
    assert "fail closed" in decide(call("write"), view(readable=False)).reason


# --- every family ----------------------------------------------------------------------

EMPTY_VIEW = [
    ("read", "allow", 3, ()),
    ("read_personal", "ask", 6, ALL),
    ("write", "ask", 6, ALL),
    ("send", "ask", 6, ALL),
    ("execute", "ask", 4, ONCE_REFUSE),
    ("conversation", "allow", 3, ()),
    ("memory", "allow", 3, ()),
    ("profile", "ask", 5, ONCE_REFUSE),
    (None, "ask", 6, ONCE_REFUSE),
]

# Consents and grants for every family (execute and profile included) change only lines 5.
EVERYTHING_CONSENTED = [
    ("read", "allow", 3, ()),
    ("read_personal", "allow", 5, ()),
    ("write", "allow", 5, ()),
    ("send", "allow", 5, ()),
    ("execute", "ask", 4, ONCE_REFUSE),
    ("conversation", "allow", 3, ()),
    ("memory", "allow", 3, ()),
    ("profile", "ask", 5, ONCE_REFUSE),
    (None, "ask", 6, ONCE_REFUSE),
]


def test_the_families_are_the_specs() -> None:
    assert {f.value for f in Family} == {r[0] for r in EMPTY_VIEW} - {None}


@pytest.mark.parametrize(("family", "outcome", "line", "answers"), EMPTY_VIEW, ids=lambda v: str(v))
def test_every_family_on_an_empty_view(family: str | None, outcome: str, line: int, answers: tuple[str, ...]) -> None:
    expect(decide(call(family, args={"command": "ls -la"}), view()), outcome, line, answers)


@pytest.mark.parametrize(("family", "outcome", "line", "answers"), EVERYTHING_CONSENTED, ids=lambda v: str(v))
@pytest.mark.parametrize("how", ["consent", "grant"])
def test_every_family_with_every_consent_or_grant(
    how: str, family: str | None, outcome: str, line: int, answers: tuple[str, ...]
) -> None:
    families = [f.value for f in Family]
    if how == "consent":
        c, v = call(family, args={"command": "ls -la"}), CONSENTED
    else:
        c, v = call(family, args={"command": "ls -la"}, grants=tuple(families)), view()
    expect(decide(c, v), outcome, line, answers)


# --- scope: one agent or every agent ----------------------------------------------------

SCOPE = [
    ("deny for a, call by a", Rule("write_file", agent="a"), "a", "write", "refuse", 2),
    ("deny for a, call by b", Rule("write_file", agent="a"), "b", "write", "ask", 6),
    ("deny for *, call by a", Rule("write_file", agent="*"), "a", "write", "refuse", 2),
    ("deny for *, call by b", Rule("write_file", agent="*"), "b", "write", "refuse", 2),
    ("deny for a, read by b", Rule("write_file", agent="a"), "b", "read", "allow", 3),
    ("allow for a, run by a", Rule("write_file", "allow", "git status", agent="a"), "a", "execute", "allow", 4),
    ("allow for a, run by b", Rule("write_file", "allow", "git status", agent="a"), "b", "execute", "ask", 4),
    ("allow for *, run by b", Rule("write_file", "allow", "git status", agent="*"), "b", "execute", "allow", 4),
]


@pytest.mark.parametrize(("rule", "agent", "family", "outcome", "line"), [r[1:] for r in SCOPE], ids=[r[0] for r in SCOPE])
def test_rule_scope(rule: Rule, agent: str, family: str, outcome: str, line: int) -> None:
    c = call(family, agent=agent, tool="write_file", args={"x": "git status"})
    d = check(decide(c, view(rules=[rule], developer_mode=True)))
    assert (d.outcome, d.line) == (outcome, line)
    assert rule_matches(rule, c) is (rule.agent in ("*", agent))  # a bool, True exactly in scope


def test_a_rule_for_an_agent_named_star_is_the_every_agent_rule() -> None:
    assert decide(call("write", agent="*"), view(rules=[Rule("tool", agent="*")])).line == 2
    assert decide(call("write", agent="*"), view(rules=[Rule("tool", agent="a")])).line == 6


def test_rules_name_exactly_one_tool() -> None:
    v = view(rules=[Rule("write_file")])
    assert decide(call("write", tool="write_file2"), v).line == 6
    # A deny rule names its tool in any case: a rule that matched nothing would refuse too little.
    assert decide(call("write", tool="Write_file"), v).line == 2
    allowing = view(developer_mode=True, rules=[Rule("Bash_executor", "allow", "ls")])
    assert decide(run("ls"), allowing).outcome == "ask"  # an allow rule names its tool exactly
    assert rule_matches(v.rules[0], call("write", tool="write_file2")) is False
    assert rule_matches(v.rules[0], call("write", tool="Write_file")) is True
    assert rule_matches(allowing.rules[0], run("ls")) is False


@pytest.mark.parametrize("spelling", ["write_file", "WRITE_FILE", "Write_File"])
def test_deny_rules_in_two_spellings_of_a_tool_both_apply(spelling: str) -> None:
    rules = [Rule("write_file", prefix="a/", id="lower"), Rule("WRITE_FILE", prefix="b/", id="upper")]
    v = view(rules=rules, consents={("clerk", "write")})
    for path, rule_id in [("a/x", "lower"), ("b/x", "upper")]:
        d = decide(call("write", tool=spelling, args={"path": path}), v)
        assert (d.outcome, d.line, d.rule_id) == ("refuse", 2, rule_id)
    expect(decide(call("write", tool=spelling, args={"path": "c/x"}), v), "allow", 5)


# --- deny before allow ------------------------------------------------------------------

DENY_FIRST = [
    ("deny beats allow rule", run("git push origin"),
     view(developer_mode=True, rules=[Rule(BASH, "allow", "git push"), Rule(BASH, "deny", "git push")])),
    ("deny listed after allow still wins", run("git push"),
     view(developer_mode=True, rules=[Rule(BASH, "allow", "git"), Rule(BASH, "deny", "git push", agent="clerk")])),
    ("deny beats consent", call("write", tool="write_file", args={"path": "x"}),
     view(consents={("clerk", "write")}, rules=[Rule("write_file")])),
    ("deny beats run grant", call("send", tool="mail", args={"to": "x"}, grants=("send",)),
     view(rules=[Rule("mail", prefix="x")])),
    ("agent deny beats every-agent allow", run("git status", agent="a"),
     view(developer_mode=True, rules=[Rule(BASH, "allow", "git status"), Rule(BASH, "deny", "git", agent="a")])),
]


@pytest.mark.parametrize(("c", "v"), [r[1:] for r in DENY_FIRST], ids=[r[0] for r in DENY_FIRST])
def test_deny_comes_before_anything_that_allows(c: Call, v: GovernanceView) -> None:
    expect(decide(c, v), "refuse", 2)


def test_the_first_matching_deny_rule_in_view_order_is_named() -> None:
    rules = [
        Rule("write_file", prefix="notes/", id="r1"),
        Rule("write_file", prefix="secrets/", agent="clerk", id="r2"),
        Rule("write_file", prefix="secrets/k", id="r3"),
        Rule("write_file", prefix="secret", id="r4"),
    ]
    d = decide(call("write", tool="write_file", args={"path": "secrets/key"}), view(rules=rules))
    assert (d.outcome, d.line, d.rule_id) == ("refuse", 2, "r2")
    assert "'secrets/'" in d.reason and "agent 'clerk'" in d.reason
    d = decide(call("write", agent="b", tool="write_file", args={"path": "secrets/key"}), view(rules=rules))
    assert d.rule_id == "r3" and "every agent" in d.reason


def test_the_first_matching_allow_rule_in_view_order_is_named() -> None:
    rules = [
        Rule(BASH, "allow", "git log", id="r1"),
        Rule(BASH, "allow", "git status --short", id="r2"),
        Rule(BASH, "allow", "git status", agent="clerk", id="r3"),
        Rule(BASH, "allow", "git", id="r4"),
    ]
    d = decide(run("git status --short"), view(developer_mode=True, rules=rules))
    assert (d.outcome, d.line, d.rule_id) == ("allow", 4, "r2")
    assert "'git status --short'" in d.reason


# --- policy ---------------------------------------------------------------------------

POLICY = [
    ("tool", call("read", tool="shell"), Policy(refuse_tools={"shell"}), 1),
    ("other tool", call("read", tool="read_file"), Policy(refuse_tools={"shell"}), 3),
    ("connection: an MCP server", call("read", tool="list_issues", connection="github"),
     Policy(refuse_connections={"github"}), 1),
    ("connection: a host", call("write", tool="crm_update", connection="crm.example.com"),
     Policy(refuse_connections={"crm.example.com"}), 1),
    ("other connection", call("read", tool="list_issues", connection="gitlab"),
     Policy(refuse_connections={"github"}), 3),
    ("no connection", call("read", tool="list_issues"), Policy(refuse_connections={"github"}), 3),
    ("family", call("write"), Policy(refuse_families={"write"}), 1),
    ("family as enum", call("write"), Policy(refuse_families={Family.WRITE}), 1),
    ("other family", call("read"), Policy(refuse_families={"write"}), 3),
    ("unclassified is no family", call(None), Policy(refuse_families=set(Family)), 6),
    ("empty policy", call("write"), Policy(), 6),
]


@pytest.mark.parametrize(("c", "policy", "line"), [r[1:] for r in POLICY], ids=[r[0] for r in POLICY])
def test_policy(c: Call, policy: Policy, line: int) -> None:
    d = check(decide(c, view(policy=policy)))
    assert d.line == line
    if line == 1:
        assert d.outcome == "refuse" and "organisation policy" in d.reason


def test_no_policy_refuses_nothing() -> None:
    assert decide(call("send", tool="mail", connection="x"), view(policy=None)).line == 6


# --- always -----------------------------------------------------------------------------

ALWAYS = [
    # (id, call, developer mode, always on offer)
    ("execute, dev, simple", run("ls -la"), True, True),
    ("execute, dev, chained", run("ls -la; rm -rf /"), True, False),
    ("execute, dev, pipe", run("ls | wc -l"), True, False),
    ("execute, no dev, simple", run("ls -la"), False, False),
    ("execute, dev, no command", call("execute", tool=BASH), True, False),
    ("execute, dev, integer command", call("execute", tool=BASH, args={"command": 5}), True, False),
    ("execute, dev, argv list", call("execute", tool=BASH, args={"argv": ["ls", "-la"]}), True, False),
    ("unclassified, dev", call(None, args={"command": "ls -la"}), True, False),
    ("unclassified, no dev", call(None), False, False),
    ("profile, dev", call("profile"), True, False),
    ("profile, no dev", call("profile"), False, False),
    ("write", call("write"), False, True),
    ("send", call("send"), True, True),
    ("read_personal", call("read_personal"), False, True),
]


@pytest.mark.parametrize(("c", "dev", "offered"), [r[1:] for r in ALWAYS], ids=[r[0] for r in ALWAYS])
def test_always_is_offered_only_where_the_spec_says(c: Call, dev: bool, offered: bool) -> None:
    d = check(decide(c, view(developer_mode=dev)))
    assert d.outcome == "ask"
    assert ("always" in d.answers) is offered
    if offered:
        assert d.line == 4 or (d.line == 6 and c.family is not None)


@pytest.mark.parametrize("command", NOT_SIMPLE, ids=repr)
def test_no_always_for_commands_that_are_not_simple(command: str) -> None:
    d = decide(run(command), view(developer_mode=True, rules=[Rule(BASH, "allow", command.split()[0])]))
    expect(d, "ask", 4, ONCE_REFUSE)


# --- builtins that evaluate, and always on wrappers ----------------------------------------

EVALUATING = [
    # (command, the allow rule an operator wrote for it)
    ("printf -v 'a[$(rm -rf x)]' y", "printf"),
    ("test -v 'a[$(rm -rf x)]'", "test"),
    ("read 'a[$(rm -rf x)]'", "read"),
    ("let 'a[$(rm -rf x)]'", "let"),
    ("trap 'rm -rf x' EXIT", "trap"),
    ("eval 'rm -rf x'", "eval"),
    ("command rm -rf x", "command"),
    ("exec rm -rf x", "exec"),
    ("compgen -C 'rm -rf x' y", "compgen"),
]


@pytest.mark.parametrize(("command", "prefix"), EVALUATING, ids=[c for c, _ in EVALUATING])
def test_an_allow_rule_on_a_builtin_that_evaluates_allows_nothing_and_deny_sees_inside(command: str, prefix: str) -> None:
    allowed = view(developer_mode=True, rules=[Rule(BASH, "allow", prefix)])
    d = check(decide(run(command), allowed))
    expect(d, "ask", 4, ONCE_REFUSE)
    assert d.reason == f"executes code; not a single simple command (the shell builtin {prefix!r} may evaluate its arguments as code)"
    denied = view(developer_mode=True, rules=[Rule(BASH, "deny", "rm", id="no-rm"), Rule(BASH, "allow", prefix)])
    d = check(decide(run(command), denied))
    assert (d.outcome, d.line, d.rule_id) == ("refuse", 2, "no-rm")


WIDER = [
    # (the question, a command the rule written by always would then allow)
    ("env", "env rm -rf /"),
    ("find .", "find . -delete"),
    ("xargs", "xargs rm -rf"),
    ("timeout 9", "timeout 9 rm -rf /"),
    ("python3", "python3 -c 'import shutil; shutil.rmtree(\"/\")'"),
    ("git", "git -c alias.x='!rm -rf /' x"),
    ("sh -c '\"$@\"' sh", "sh -c '\"$@\"' sh rm -rf /"),
    ("/usr/bin/env", "/usr/bin/env rm -rf /"),
    ("tee out.txt", "tee out.txt /etc/passwd"),
    ("rm tmp.txt", "rm tmp.txt -rf /"),
]


@pytest.mark.parametrize(("question", "wider"), WIDER, ids=[q for q, _ in WIDER])
def test_always_is_not_offered_where_the_rule_it_writes_allows_more(question: str, wider: str) -> None:
    d = check(decide(run(question), view(developer_mode=True)))
    expect(d, "ask", 4, ONCE_REFUSE)
    assert "no always:" in d.reason
    # What the rule would have allowed: a rule with the question as its prefix matches the wider command.
    would = decide(run(wider), view(developer_mode=True, rules=[Rule(BASH, "allow", question, agent="clerk")]))
    assert would.allowed


def test_an_operators_rule_on_a_wrapper_stands_and_deny_rules_still_look_through_it() -> None:
    rules = [Rule(BASH, "allow", "env", id="env")]
    expect(check(decide(run("env rm -rf x"), view(developer_mode=True, rules=rules))), "allow", 4)
    rules = [Rule(BASH, "deny", "rm", id="no-rm"), *rules]
    d = check(decide(run("env rm -rf x"), view(developer_mode=True, rules=rules)))
    assert (d.outcome, d.line, d.rule_id) == ("refuse", 2, "no-rm")


# --- execute is never allowed by a consent or a grant -------------------------------------

@pytest.mark.parametrize("dev", [False, True], ids=["dev off", "dev on"])
@pytest.mark.parametrize("command", ["ls -la", "git status; rm -rf /"], ids=["simple", "chained"])
def test_consent_and_grant_for_execute_allow_nothing(dev: bool, command: str) -> None:
    c = call("execute", tool=BASH, args={"command": command}, grants=("execute",))
    d = check(decide(c, view(developer_mode=dev, consents={("clerk", "execute")})))
    assert (d.outcome, d.line) == ("ask", 4)


def test_allow_rules_act_on_execute_only() -> None:
    rules = [Rule("write_file", "allow", "notes"), Rule("write_file", "allow")]
    d = decide(call("write", tool="write_file", args={"path": "notes"}), view(developer_mode=True, rules=rules))
    expect(d, "ask", 6, ALL)


def test_an_allow_rule_without_prefix_allows_nothing() -> None:
    for prefix in (None, ""):
        v = view(developer_mode=True, rules=[Rule(BASH, "allow", prefix)])
        expect(decide(run("ls -la"), v), "ask", 4, ALL)
        assert rule_matches(v.rules[0], run("ls -la")) is False


@pytest.mark.parametrize(
    ("c", "matches"),
    [
        (run("ls -la"), True),
        (run("lsof"), False),
        (run("ls; rm x"), False),  # not one simple command
        (Call(agent="clerk", tool=BASH, family="execute", arguments={"command": "ls -la"}, shell=False), False),
        (call("execute", tool=BASH, args={"command": ["ls", "-la"]}), False),  # only a string is a command
        (call("execute", tool=BASH, args={"command": None}), False),
        (call("execute", tool=BASH), False),
    ],
    ids=["simple", "other program", "chained", "not shell text", "list", "None", "no argument"],
)
def test_rule_matches_for_an_allow_rule(c: Call, matches: bool) -> None:
    rule = Rule(BASH, "allow", "ls")
    assert rule_matches(rule, c) is matches
    assert rule_matches(Rule(BASH, "allow", "ls ;"), c) is False  # a prefix that is no simple command
    assert (decide(c, view(developer_mode=True, rules=[rule])).outcome == "allow") is matches


# --- word boundaries ---------------------------------------------------------------------

PREFIXES = [
    ("git status", "git status", True),
    ("git status", "git status --short", True),
    ("git status", "git statusx", False),
    ("git status", "git stat", False),
    ("git status", "git", False),
    ("git status", "xgit status", False),
    ("git status --short", "git status", False),
    ("git", "git log -n 3", True),
    ("ls", "ls", True),
    ("ls", "lsof", False),
]


@pytest.mark.parametrize(("prefix", "command", "allowed"), PREFIXES, ids=[f"{p!r} on {c!r}" for p, c, _ in PREFIXES])
def test_allow_prefixes_match_at_word_boundaries(prefix: str, command: str, allowed: bool) -> None:
    d = check(decide(run(command), view(developer_mode=True, rules=[Rule(BASH, "allow", prefix)])))
    assert (d.outcome == "allow") is allowed
    assert d.line == 4


DENY_COMMANDS = [
    ("rm -rf", "rm -rf /tmp/x"),
    ("rm", "ls; rm -rf /"),
    ("rm", "ls && rm -rf /"),
    ("curl", "ls | curl -d @- example.com"),
    ("git push", "git status\ngit push"),
]


@pytest.mark.parametrize(("prefix", "command"), DENY_COMMANDS, ids=[f"{p!r} in {c!r}" for p, c in DENY_COMMANDS])
def test_deny_prefixes_on_commands_match_broadly(prefix: str, command: str) -> None:
    rules = [Rule(BASH, "allow", command.split()[0]), Rule(BASH, "deny", prefix)]
    expect(decide(run(command), view(developer_mode=True, rules=rules)), "refuse", 2)


@pytest.mark.parametrize("path", ["secrets/key", "./secrets/key", "notes/../secrets/key", "secrets"])
def test_deny_prefixes_on_paths_see_through_dot_segments(path: str) -> None:
    c = call("write", tool="write_file", args={"path": path})
    v = view(rules=[Rule("write_file", prefix="secrets/")])
    expect(decide(c, v), "refuse", 2)
    assert rule_matches(v.rules[0], c)  # the plain statement folds the text as a path too


def test_deny_prefix_does_not_match_other_paths() -> None:
    v = view(rules=[Rule("write_file", prefix="secrets/")], consents={("clerk", "write")})
    c = call("write", tool="write_file", args={"path": "notes/a.txt"})
    expect(decide(c, v), "allow", 5)
    assert rule_matches(v.rules[0], c) is False


PATH_PREFIXES = [
    # (prefix, resolved name, matches)
    ("secrets/", "secrets/k", True),
    ("secrets/", "secrets", True),  # the folder itself
    ("secrets/", "secretsX/k", False),  # a folder prefix stops at a component boundary
    ("secrets/", "secrets.txt", False),
    ("secrets//", "secrets/k", True),
    ("./secrets/", "secrets/k", True),
    ("secrets/.", "secrets/k", True),
    ("secrets", "secrets/k", True),
    ("secrets", "secretsX/k", True),  # a plain prefix matches as text
    ("./secrets", "secrets.txt", True),
    ("secrets", "public/secrets", False),
    ("notes/draft", "notes/draft-2.md", True),
    ("notes/draft", "notes/final.md", False),
    ("/ws/secrets/", "/ws/secrets/k", True),
    ("//ws/secrets/", "/ws/secrets/k", True),
    ("/ws/secrets/", "secrets/k", False),  # absolute prefixes see absolute names
    ("secrets/", "/ws/secrets/k", False),  # and relative ones relative names
    (".", "secrets/k", True),
    ("./", "a", True),
    (".", ".", True),
    ("/", "/ws/a", True),
    ("/", "a", False),
    ("..", "secrets/k", False),
    ("..", "..foo", False),  # ".." names a folder: not a file whose name starts with ".."
    ("secrets/.", "secretsX/k", False),  # so does a prefix ending in "/." or "/.."
    ("z/b/..", "z/k", True),
    ("z/b/..", "zX/k", False),
    ("/ws/", "//Xws/k", False),  # two leading slashes are one: the name is /Xws/k
    ("//Xws/", "/Xws/k", True),
]


@pytest.mark.parametrize(("prefix", "name", "matches"), PATH_PREFIXES, ids=[f"{p!r} on {n!r}" for p, n, _ in PATH_PREFIXES])
def test_a_deny_prefix_on_a_file_tool_matches_the_resolved_names(prefix: str, name: str, matches: bool) -> None:
    assert path_prefix_matches(prefix, name) is matches
    asked = call("read", tool="read_file", args={"path": "anything/else"})
    resolved = Call(agent="clerk", tool="read_file", family="read", arguments={"path": "anything/else"}, paths=(name,))
    v = view(rules=[Rule("read_file", prefix=prefix)])
    assert decide(asked, v).outcome == "allow"  # the text alone does not match
    assert (decide(resolved, v).outcome == "refuse") is matches
    assert rule_matches(v.rules[0], resolved) is matches
    if matches:
        assert decide(resolved, v).reason.endswith(f"matches the path {name!r}")


def test_a_file_tool_call_is_matched_on_its_resolved_names_not_its_folded_text() -> None:
    v = view(rules=[Rule("read_file", prefix="secrets/")])
    # "secretsX" folds to "secretsX", which a folder prefix does not match once the call is resolved,
    # while the text of the argument still matches as text: "secrets/../public" starts with "secrets/".
    loose = Call(agent="clerk", tool="read_file", family="read", arguments={"path": "secretsX/k"})
    resolved = Call(agent="clerk", tool="read_file", family="read", arguments={"path": "secretsX/k"},
                    paths=("secretsX/k",))
    detour = Call(agent="clerk", tool="read_file", family="read", arguments={"path": "secrets/../public/p"},
                  paths=("public/p",))
    assert decide(loose, v).outcome == "refuse"  # without names: the folded text, matched as text
    assert decide(resolved, v).outcome == "allow"
    assert decide(detour, v).outcome == "refuse"
    # rule_matches says the same: a resolved call's text is matched as text, never folded as a path.
    assert [rule_matches(v.rules[0], c) for c in (loose, resolved, detour)] == [True, False, True]
    with pytest.raises(TypeError):
        Call(agent="clerk", tool="read_file", paths="secrets/k")


# --- arguments ----------------------------------------------------------------------------

def test_the_first_item_is_the_first_argument() -> None:
    v = view(rules=[Rule("write_file", prefix="secrets/")], consents={("clerk", "write")})
    first = call("write", tool="write_file", args={"path": "secrets/k", "text": "notes/"})
    second = call("write", tool="write_file", args={"text": "notes/", "path": "secrets/k"})
    assert decide(first, v).line == 2
    assert decide(second, v).line == 5
    assert first_argument(first) == "secrets/k"


ODD_ARGUMENTS = [
    # (id, arguments, deny prefix, refused)
    ("no arguments, prefixed deny", {}, "x", False),
    ("no arguments, deny without prefix", {}, None, True),
    ("first argument None", {"path": None}, "x", False),
    ("integer", {"n": 42}, "42", True),
    ("integer, other prefix", {"n": 42}, "5", False),
    ("float", {"n": 1.5}, "1.5", True),
    ("bool", {"b": True}, "True", True),
    ("nested dict", {"a": {"b": {"c": "secrets"}}}, "{'b'", True),
    ("empty dict", {"a": {}}, "{}", True),
    ("argv list", {"argv": ["rm", "-rf", "/"]}, "rm -rf", True),
    ("argv list, other prefix", {"argv": ["ls"]}, "rm", False),
    ("bytes", {"data": b"secrets/k"}, "secrets/k", True),
    ("bytes, other prefix", {"data": b"notes/a"}, "secrets/", False),
    ("bytearray", {"data": bytearray(b"secrets/k")}, "secrets/k", True),
    ("dict, a string inside", {"a": {"b": ["notes", "secrets/k"]}}, "secrets/k", True),
    ("dict, other prefix", {"a": {"b": "notes/a"}}, "secrets/", False),
    ("list, a string inside", {"paths": ["notes/a", "secrets/k"]}, "secrets/k", True),
    ("empty string", {"path": ""}, "x", False),
]


@pytest.mark.parametrize(("args", "prefix", "refused"), [r[1:] for r in ODD_ARGUMENTS], ids=[r[0] for r in ODD_ARGUMENTS])
@pytest.mark.parametrize("family", ["write", "execute", None], ids=str)
def test_odd_first_arguments_are_matched_broadly(args: dict[str, Any], prefix: str | None, refused: bool, family: str | None) -> None:
    d = check(decide(call(family, args=args), view(rules=[Rule("tool", prefix=prefix)])))
    assert (d.outcome == "refuse" and d.line == 2) is refused, d


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")

    __repr__ = __str__


@pytest.mark.parametrize("family", ["write", "execute", None], ids=str)
def test_an_argument_without_text_matches_every_deny_rule(family: str | None) -> None:
    c = call(family, args={"x": Unprintable()})
    expect(decide(c, view(rules=[Rule("tool", prefix="anything")])), "refuse", 2)
    assert rule_matches(Rule("tool", prefix="anything"), c) is True
    assert first_argument(c) is None
    assert decide(c, view(consents={("clerk", "write")})).outcome in ("ask", "allow")


@pytest.mark.parametrize(
    "args", [{"command": 5}, {"command": ["git", "status"]}, {"command": {"git": "status"}}, {"command": None}, {}],
    ids=["int", "list", "dict", "None", "empty"],
)
def test_only_a_string_is_a_command(args: dict[str, Any]) -> None:
    rules = [Rule(BASH, "allow", "5"), Rule(BASH, "allow", "git status"), Rule(BASH, "allow", "git")]
    d = decide(call("execute", tool=BASH, args=args), view(developer_mode=True, rules=rules))
    expect(d, "ask", 4, ONCE_REFUSE)


def test_an_empty_prefix_is_no_prefix() -> None:
    assert Rule("t", prefix="").prefix is None
    expect(decide(call("read", tool="tool", args={"p": "anything"}), view(rules=[Rule("tool", prefix="")])), "refuse", 2)


# --- construction: types and strings --------------------------------------------------------

@pytest.mark.parametrize("family", ["READ", "Read", "shell", "", "execute "], ids=repr)
def test_an_unknown_family_is_refused_at_construction(family: str) -> None:
    with pytest.raises(ValueError):
        Call(agent="a", tool="t", family=family)
    with pytest.raises(ValueError):
        Call(agent="a", tool="t", run_grants={family})
    with pytest.raises(ValueError):
        GovernanceView(consents={("a", family)})
    with pytest.raises(ValueError):
        Policy(refuse_families={family})


@pytest.mark.parametrize(
    "build",
    [
        lambda: Call(agent=None, tool="t"),  # type: ignore[arg-type]
        lambda: Call(agent="a", tool=3),  # type: ignore[arg-type]
        lambda: Call(agent="a", tool="t", arguments=["ls"]),  # type: ignore[arg-type]
        lambda: Call(agent="a", tool="t", connection=7),  # type: ignore[arg-type]
        lambda: Rule(tool="t", agent=None),  # type: ignore[arg-type]
        lambda: Rule(tool="t", prefix=3),  # type: ignore[arg-type]
        lambda: GovernanceView(rules=[{"tool": "t"}]),  # type: ignore[list-item]
        lambda: GovernanceView(policy={"refuse_tools": ["t"]}),  # type: ignore[arg-type]
        lambda: GovernanceView(readable="false"),  # type: ignore[arg-type]
        lambda: GovernanceView(developer_mode=1),  # type: ignore[arg-type]
        lambda: GovernanceView(readable=None),  # type: ignore[arg-type]
    ],
    ids=["agent None", "tool int", "arguments list", "connection int", "rule agent None", "prefix int",
         "rule as dict", "policy as dict", "readable as text", "developer mode as int", "readable None"],
)
def test_wrong_types_are_refused_at_construction(build: Any) -> None:
    with pytest.raises(TypeError):
        build()


def test_rule_effect_must_be_allow_or_deny() -> None:
    with pytest.raises(ValueError):
        Rule(tool="t", effect="permit")


def test_defaults_and_none() -> None:
    c = Call(agent="a", tool="t", arguments=None, run_grants=None)  # type: ignore[arg-type]
    assert (c.family, c.arguments, c.connection, c.run_grants) == (None, {}, None, frozenset())
    v = GovernanceView(rules=None, consents=None)  # type: ignore[arg-type]
    assert (v.rules, v.consents, v.developer_mode, v.policy, v.readable) == ((), frozenset(), False, None, True)
    r = Rule(tool="t")
    assert (r.effect, r.prefix, r.agent, r.id) == ("deny", None, "*", None)


def test_strings_and_enums_compare_equal() -> None:
    d = decide(call("read"), view())
    assert d.outcome == "allow" and d.outcome is Outcome.ALLOW and str(d.outcome) == "allow"
    a = decide(call("write"), view())
    assert a.answers == ("once", "always", "refuse") == (Answer.ONCE, Answer.ALWAYS, Answer.REFUSE)
    assert Family.EXECUTE == "execute" and Effect.DENY == "deny" and str(Family.READ_PERSONAL) == "read_personal"
    assert [str(e) for e in (Outcome.ASK, Answer.ALWAYS, Effect.DENY, Family.WRITE)] == ["ask", "always", "deny", "write"]
    assert Call(agent="a", tool="t", family="write").family is Family.WRITE
    assert Rule(tool="t", effect="allow").effect is Effect.ALLOW
    assert GovernanceView(consents={("a", "write")}).consents == {("a", Family.WRITE)}
    assert GovernanceView(consents=[["a", "write"]]).consents == {("a", "write")}  # as read from JSON
    assert Policy(refuse_families={"send"}).refuse_families == {Family.SEND}


def test_the_public_face() -> None:
    names = lambda cls: [f.name for f in dataclasses.fields(cls)]  # noqa: E731
    assert names(Call) == ["agent", "tool", "family", "arguments", "connection", "run_grants", "paths", "shell", "aliases",
                           "code_places"]
    assert names(Rule) == ["tool", "effect", "prefix", "agent", "id"]  # no session, no project
    # approvals: who may answer a card ([approvals] four eyes); decide() never reads it
    assert names(Policy) == ["refuse_tools", "refuse_connections", "refuse_families", "approvals"]
    assert names(Decision)[:4] == ["outcome", "line", "answers", "reason"]
    assert [f.name for f in dataclasses.fields(GovernanceView) if f.init] == [
        "rules", "consents", "developer_mode", "policy", "readable", "unreadable_reason",
    ]


def test_the_values_are_frozen_and_show_only_their_fields() -> None:
    values = [
        Call(agent="a", tool="t"), Rule(tool="t"), Policy(), GovernanceView(rules=[Rule("t", prefix="x")]),
        decide(call("read"), view()),
    ]
    for value in values:
        field = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, getattr(value, field))
        assert not hasattr(value, "__dict__")  # slots: no attribute can be added either
    shown = repr(values[3])
    assert shown.startswith("GovernanceView(rules=(Rule(tool='t'") and shown.endswith("unreadable_reason='')")
    assert "_index" not in shown and "_by_tool" not in shown and "_spellings" not in shown


def test_construction_errors_name_the_field_and_the_type() -> None:
    cases = [
        (lambda: Call(agent=None, tool="t"), "agent must be a string, not NoneType"),
        (lambda: Call(agent="a", tool=3), "tool must be a string, not int"),
        (lambda: Call(agent="a", tool="t", shell="false"), "shell must be True or False, not 'false'"),
        (lambda: Call(agent="a", tool="t", arguments=["ls"]), "arguments must be a mapping, not list"),
        (lambda: Call(agent="a", tool="t", connection=7), "connection must be a string, not int"),
        (lambda: Call(agent="a", tool="t", paths="p"), "paths must be a sequence of strings, not a string"),
        (lambda: Call(agent="a", tool="t", paths=["p", 1]), "path must be a string, not int"),
        (lambda: Call(agent="a", tool="t", aliases="u"), "aliases must be a sequence of strings, not a string"),
        (lambda: Call(agent="a", tool="t", aliases=[b"u"]), "alias must be a string, not bytes"),
        (lambda: Rule(tool=1), "tool must be a string, not int"),
        (lambda: Rule(tool="t", agent=None), "agent must be a string, not NoneType"),
        (lambda: Rule(tool="t", prefix=3), "prefix must be a string, not int"),
        (lambda: Policy(refuse_tools=[1]), "tool must be a string, not int"),
        (lambda: Policy(refuse_connections=[None]), "connection must be a string, not NoneType"),
        (lambda: GovernanceView(rules=[{"tool": "t"}]), "rules must be Rule values, not dict"),
        (lambda: GovernanceView(consents={(1, "write")}), "agent must be a string, not int"),
        (lambda: GovernanceView(developer_mode=1), "developer_mode must be True or False, not 1"),
        (lambda: GovernanceView(readable=None), "readable must be True or False, not None"),
        (lambda: GovernanceView(unreadable_reason=0), "unreadable_reason must be a string, not int"),
        (lambda: GovernanceView(policy={}), "policy must be a Policy or None, not dict"),
    ]
    for build, message in cases:
        with pytest.raises(TypeError) as caught:
            build()
        assert str(caught.value) == message


def test_the_spec_example() -> None:
    view_ = GovernanceView(
        rules=[Rule(tool="bash_executor", prefix="git status", effect="allow", agent="*")],
        consents={("clerk", "write")},
        developer_mode=True,
        policy=Policy(refuse_families={"send"}),
        readable=True,
    )
    c = Call(agent="clerk", tool="bash_executor", family="execute",
             arguments={"command": "git status"}, connection=None, run_grants=set())
    d = decide(c, view_)
    assert (d.outcome, d.line, d.answers) == ("allow", 4, ())
    assert d.reason


def test_views_compare_by_content_not_by_index() -> None:
    a = GovernanceView(rules=[Rule("t", prefix="x")], consents={("a", "write")})
    b = GovernanceView(rules=(Rule("t", prefix="x"),), consents=frozenset({("a", Family.WRITE)}))
    assert a == b and hash(a) == hash(b)
    assert a.rules_for("t") == (Rule("t", prefix="x"),) and a.rules_for("u") == ()
    assert "_index" not in repr(a)


def test_decide_reads_its_inputs_and_changes_nothing() -> None:
    args = {"command": "git status"}
    v = GovernanceView(rules=[Rule(BASH, "allow", "git status")], developer_mode=True)
    c = call("execute", tool=BASH, args=args)
    first = decide(c, v)
    assert all(decide(c, v) == first for _ in range(3))
    assert args == {"command": "git status"} and v == GovernanceView(rules=[Rule(BASH, "allow", "git status")], developer_mode=True)


# --- many rules: the index must answer as a scan of every rule would ------------------------

DECOYS = [Rule(BASH, "deny", f"tool{i} sub{i}", id=f"decoy{i}") for i in range(300)] + [
    Rule(BASH, "deny", "/usr/local/bin/zzz", id="path decoy"),
    Rule(BASH, "deny", "'quoted decoy'", id="quoted decoy"),
]
WRITTEN_AS_RM = [
    "r'm' -rf /", '"rm" -rf /', "\\rm -rf /", "r\\\nm -rf /", 'r""m -rf /', "ls;r'm' x",
    "bash -c 'rm -rf /'", "sudo /bin/rm -rf /", "sh -c \"sh -c 'rm x'\"", "echo $(rm -rf /)",
    "echo `rm x`", "r$()m x", "ｒｍ -rf /", "env FOO=1 rm -rf /", "xargs rm < list", "ls && \\\nrm x",
    "(rm x)", "ls|rm x", "ls #\nrm x",
]


def scan(c: Call, rules: list[Rule]) -> str | None:
    return next((r.id for r in rules if r.effect == "deny" and rule_matches(r, c)), None)


@pytest.mark.parametrize("command", WRITTEN_AS_RM, ids=repr)
@pytest.mark.parametrize("family", ["execute", None], ids=str)
def test_a_deny_rule_among_many_sees_through_quoting_and_wrappers(command: str, family: str | None) -> None:
    rules = [*DECOYS, Rule(BASH, "deny", "rm", id="rm")]
    c = call(family, tool=BASH, args={"command": command})
    d = decide(c, view(rules=rules, developer_mode=True))
    assert (d.outcome, d.line, d.rule_id) == ("refuse", 2, "rm") and scan(c, rules) == "rm"


@pytest.mark.parametrize(
    "command",
    ["ls -la", "git status; ls", "tool1 sub2", "echo 'rm'x", "farm x", "ls *.py", "find . -name '*.py'", "cat ~/x",
     "rm[0-9] x", "echo $HOME", "r{a,b}m", "/bin/r? -rf /", "{r,}m -rf /", "r* x", "[r]m x", "/? x", "x/? x", "/* x"],
    ids=repr,
)
def test_the_index_answers_as_a_scan_would(command: str) -> None:
    rules = [*DECOYS, Rule(BASH, "deny", "rm", id="rm")]
    c = run(command)
    assert decide(c, view(rules=rules)).rule_id == scan(c, rules)


@pytest.mark.parametrize("command", ["/usr/bin/r? -rf /", "/usr/bin/r* x", "x/usr/bin/r? x", "/usr/b?n/rm x"], ids=repr)
def test_a_glob_names_a_program_written_as_a_relative_path_among_many_rules(command: str) -> None:
    # The deny matcher reads "/usr/bin/r?" as possibly "/usr/bin/rm", a path ending in "usr/bin/rm":
    # the index must find that rule by the glob's head, past its first "/".
    rules = [*DECOYS, Rule(BASH, "deny", "usr/bin/rm", id="rm")]
    c = run(command)
    assert scan(c, rules) == "rm"
    d = decide(c, view(rules=rules))
    assert (d.outcome, d.line, d.rule_id) == ("refuse", 2, "rm")


@pytest.mark.parametrize("command", ["/bin/rm -rf /", "sudo /bin/rm -rf /", "'/bin/rm' -rf /", "/bin/r'm' -rf /"], ids=repr)
def test_a_deny_rule_on_a_program_path_refuses_it_among_many_rules(command: str) -> None:
    rules = [*DECOYS, Rule(BASH, "deny", "/bin/rm -rf", id="rm")]
    c = run(command)
    assert scan(c, rules) == "rm"
    assert scan(run("/usr/bin/rm -rf /"), rules) is None  # another path is another program
    d = decide(c, view(rules=rules))
    assert (d.outcome, d.line, d.rule_id) == ("refuse", 2, "rm")


# 2,000 rules on one shell, and commands that try
# to get a program past a deny rule with a glob or an expansion.
MANY = [
    Rule(BASH, "deny" if i % 2 else "allow", f"{p}{i} {s}", "*" if i % 3 else f"agent{i % 7}", id=f"many{i}")
    for i in range(2_000)
    for p, s in [(["git", "ls", "cat", "make", "curl", "tar"][i % 6], ["status", "-la", "push", "-q"][i % 4])]
]
SNEAKY = [
    "/bin/r? -rf /", "/bin/[r]m -rf /", "/usr/bin/[r]m -rf /", "/b?n/rm -rf /", "{r,}m -rf /", "r* -rf /",
    "$HOME/rm -rf /", "${X:-rm} -rf /", "${X:-/bin/rm} -rf /", "r${X}m -rf /", "sudo /bin/r? -rf /",
    "bash -c '/bin/r? -rf /'", "ls; /bin/[[:lower:]]m -rf /", "[ && rm -rf /", "{a/,b}x; /bin/r? x",
    "x* -rf /", "x?r? -rf /", "x[/]r[m] -rf /", "rmx? -rf /; rm x", "${X:-rm}z? -rf /",
]


@pytest.mark.parametrize("command", SNEAKY, ids=repr)
@pytest.mark.parametrize("scope", ["clerk", "*"])
def test_a_glob_or_an_expansion_does_not_get_past_a_deny_rule_among_many(command: str, scope: str) -> None:
    rules, v = many_with_rm(scope)
    c = run(command)
    assert rule_matches(rules[1_000], c)
    d = decide(c, v)
    # A glob that cannot be read (``{a/,b}x``) names every program: an earlier rule refuses first.
    assert (d.outcome, d.line) == ("refuse", 2) and d.rule_id == scan(c, rules)
    other = run(command, agent="scout")  # a rule for one agent does not refuse another
    assert decide(other, v).rule_id == scan(other, rules)
    if scope != "*":
        assert scan(other, rules) != "rm"


@functools.cache
def many_with_rm(scope: str) -> tuple[list[Rule], GovernanceView]:
    rules = [*MANY[:1_000], Rule(BASH, "deny", "rm", scope, id="rm"), *MANY[1_000:]]
    return rules, view(rules=rules, developer_mode=True)


def prefixes_asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The prefixes the deny matcher is asked about from now on, in order."""
    asked: list[str] = []
    real = shellcheck.deny_prefix_matches

    def counting(prefix: str, text: str) -> bool:
        asked.append(prefix)
        return real(prefix, text)

    monkeypatch.setattr(shellcheck, "deny_prefix_matches", counting)
    return asked


@pytest.mark.parametrize(
    "command", ["git status ~/src/*.py", "ls -la $HOME/x", "cat ${X:-notes}.md", "ls [ab]*.txt", "echo {a,b}c",
                "tar -q 'a b' \"$PWD\"/*", "ls ./*/../x?"],
    ids=repr,
)
def test_a_glob_or_an_expansion_is_matched_against_few_of_many_rules(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deny matcher runs on the rules that may match, not on all 1,000 deny rules."""
    v = many_with_rm("nobody")[1]
    c = run(command, agent="agent1")
    expected = scan(c, list(v.rules))
    asked = prefixes_asked(monkeypatch)
    assert decide(c, v).rule_id == expected
    assert len(asked) <= 50, len(asked)


@pytest.mark.parametrize(
    "command", ["/bin/r? -rf /", "/usr/bin/[r]m -rf /", "/b?n/rm -rf /", "x/r? -rf /", "{r,}m -rf /", "/bin/r[a-z] -rf /"],
    ids=repr,
)
@pytest.mark.parametrize("prefix", ["rm -rf", "  rm -rf"], ids=repr)
def test_a_glob_names_a_program_whose_rule_has_more_words_among_many(command: str, prefix: str) -> None:
    # The index finds the programs a glob's last part may name by their first character and
    # length: the program's, not the rule's (which may also start with blanks).
    rules = [*MANY[:1_000], Rule(BASH, "deny", prefix, id="rm -rf"), *MANY[1_000:]]
    c = run(command)
    assert scan(c, rules) == "rm -rf"
    d = decide(c, view(rules=rules))
    assert (d.outcome, d.line, d.rule_id) == ("refuse", 2, "rm -rf")


# Every character a program's name may sit beside in a command, written in each place
# a shell (or the deny matcher) reads a program from.
BESIDE = [chr(c) for c in range(1, 128)] + ["\x85", "\xa0", "\u2003", "\u3000", "\u200b", "\ufeff", "ｘ", "é"]
AROUND_RM = [
    "{c}rm -rf /", "x{c}rm -rf /", "rm{c} -rf /", "rm{c}x -rf /", "ls; x{c}rm -rf /", "sudo x{c}rm -rf /",
    "sudo ls x{c}rm{c}x", "bash -c 'x{c}rm -rf /'", "echo $(x{c}rm{c}x)", "x{c}rm$(true) -rf /", "env A{c}rm -rf /",
    "eval 'x{c}rm -rf /'", "x=1{c}rm -rf /", "ls | x{c}rm{c}",
]


@pytest.mark.parametrize("shape", AROUND_RM, ids=repr)
def test_a_program_beside_any_character_is_found_as_a_scan_finds_it(shape: str) -> None:
    """The index walks only from where a word may start and keeps only hits where one may
    end: whatever the neighbouring character, it refuses what a scan of every rule refuses."""
    rules = [*DECOYS, Rule(BASH, "deny", "rm", id="rm"), Rule(BASH, "deny", "/bin/rm -rf", id="bin rm")]
    v = view(rules=rules, developer_mode=True)
    refused = 0
    for c in BESIDE:
        command = shape.format(c=c)
        for family in ("execute", None):
            one = call(family, tool=BASH, args={"command": command})
            expected = scan(one, rules)
            refused += expected is not None
            assert decide(one, v).rule_id == expected, (command, family)
    assert refused > 0


@pytest.mark.parametrize(
    "command", ["terraform apply", "scp a b", "cargo build", "x-rm -rf /", "ls farm.rm", "rm.sh x", "rm-rf x",
                "ls a+rm", "echo rm_x"],
    ids=repr,
)
def test_a_program_inside_another_word_is_not_checked_against_its_rules(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``terraform`` holds ``rm``, ``scp`` holds ``cp``: the deny matcher does not run on their rules."""
    rules = [*MANY[:200], *(Rule(BASH, "deny", f"{p} {i}", id=f"{p}{i}") for p in ("rm", "cp", "go") for i in range(50)),
             Rule(BASH, "deny", "rm", id="rm")]
    v = view(rules=rules, developer_mode=True)
    c = run(command)
    assert scan(c, rules) is None
    asked = prefixes_asked(monkeypatch)
    assert decide(c, v).rule_id is None
    assert not [p for p in asked if p.split()[0] in ("rm", "cp", "go")], asked


def test_a_command_too_long_to_read_matches_every_deny_rule() -> None:
    command = "ls " + "a " * 500_001  # longer than the simple-command check reads
    rules = [Rule(BASH, "deny", "zzz", id="zzz"), Rule(BASH, "allow", "ls")]
    c = run(command)
    assert scan(c, rules) == "zzz"
    expect(decide(c, view(rules=rules, developer_mode=True)), "refuse", 2)
    # Among more rules than are checked one by one, the index checks them all too: the first decides.
    many = [Rule(BASH, "deny", f"zz{i} x", id=f"zz{i}") for i in range(6)] + rules
    d = check(decide(c, view(rules=many, developer_mode=True)))
    assert (d.outcome, d.line, d.rule_id) == ("refuse", 2, "zz0") and scan(c, many) == "zz0"


def test_the_example_in_the_docs_runs_as_written() -> None:
    import pathlib
    import re

    text = (pathlib.Path(__file__).parent.parent / "docs" / "governance.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None
    scope: dict[str, Any] = {}
    exec(block.group(1), scope)
    d = scope["d"]
    assert (d.outcome, d.line, d.answers, d.rule_id) == ("allow", 4, (), None)
    assert f'd.reason    # "{d.reason}"' in block.group(1)


class Sly(str):
    """A string that claims to start with nothing and to equal everything."""

    def startswith(self, *a: Any) -> bool:  # type: ignore[override]
        return False

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__

    def split(self, *a: Any) -> list[str]:  # type: ignore[override]
        return ["ls"]


def test_string_subclasses_are_read_as_their_text() -> None:
    v = view(rules=[Rule("write_file", prefix="secrets/")], consents={("clerk", "write")})
    expect(decide(call("write", tool="write_file", args={"path": Sly("secrets/key")}), v), "refuse", 2)
    dev = view(developer_mode=True, rules=[Rule(BASH, "allow", "ls")])
    expect(decide(run(Sly("rm -rf /")), dev), "ask", 4, ONCE_REFUSE)  # rm writes by argument: no always
    expect(decide(run(Sly("du -sh /")), dev), "ask", 4, ALL)
    assert type(Call(agent=Sly("a"), tool=Sly("t")).agent) is str
    assert type(Rule(tool=Sly("t"), prefix=Sly("p")).prefix) is str
    assert decide(call("write", tool="write_file"), view(rules=[Rule(Sly("other"))])).line == 6


@pytest.mark.parametrize("first", ["clerk", "*"])
def test_the_earlier_of_two_matching_allow_rules_decides(first: str) -> None:
    # One allow rule for the agent and one for every agent both match a simple command: the
    # decision names the earlier rule.
    second = "*" if first == "clerk" else "clerk"
    rules = [Rule(BASH, "allow", "ls", agent=first, id="first"), Rule(BASH, "allow", "ls", agent=second, id="second")]
    d = check(decide(run("ls -la"), view(developer_mode=True, rules=rules)))
    expect(d, "allow", 4)
    assert d.rule_id == "first"
    assert ("(every agent)" in d.reason) is (first == "*")
    assert all(rule_matches(r, run("ls -la")) for r in rules)  # an allow rule does match its command
    assert not rule_matches(rules[0], run("lsof"))


@pytest.mark.parametrize(
    ("prefix", "name", "matches"),
    [
        ("notes/", "notes/../other", False),  # normalised first: the name is other
        ("notes/", "notes/./x", True),
        ("./notes/", "notes/x", True),
        ("notes/../other", "other/x", True),
        ("a//b/", "a/b/c", True),
        ("./", "./x", True),
    ],
)
def test_deny_prefixes_and_names_are_compared_after_normalisation(prefix: str, name: str, matches: bool) -> None:
    assert path_prefix_matches(prefix, name) is matches
    resolved = Call(agent="clerk", tool="read_file", family="read", arguments={"path": "anything/else"},
                    paths=(name,))
    assert (decide(resolved, view(rules=[Rule("read_file", prefix=prefix)])).outcome == "refuse") is matches


URL_FORMS = [
    # (text, its URL form)
    ("HTTPS://API.Example.com:443/x", "https://api.example.com/x"),  # scheme and host folded, default port dropped
    ("http://Example.com:80", "http://example.com"),
    ("https://api.example.com/x", "https://api.example.com/x"),  # already in form: unchanged
    ("http://example.com:443/", "http://example.com:443/"),  # not the scheme's default port: kept
    ("https://u@API.example.com.:443/x", "https://api.example.com/x"),  # user information and final dot dropped
    ("https://example.com.:8443/x", "https://example.com:8443/x"),
    ("https://api.example.com./v1?q#f", "https://api.example.com/v1?q#f"),
    ("https://[::1]:443/x", "https://[::1]/x"),
    ("https://[::1]:8080/", "https://[::1]:8080/"),
    ("http://[::1]:80", "http://[::1]"),
    ("https://EXAMPLE.com:443/X", "https://example.com/X"),  # the path keeps its case
    ("https:///Secrets/K.", "https:///Secrets/K."),  # no host: all of it is path
    ("https://?Q=A.", "https://?Q=A."),
    ("https://a:b.:8080/x", "https://a:b.:8080/x"),  # more than one colon outside brackets: as it is
    ("https://a]:8080/x", "https://a]:8080/x"),
    ("https://[v1.x]./", "https://[v1.x]./"),  # a bracketed host: as it is
    ("ftp://X.com/", "ftp://X.com/"),  # not http(s): as it is
    ("Secrets/K", "Secrets/K"),
]


@pytest.mark.parametrize(("text", "form"), URL_FORMS, ids=[t for t, _ in URL_FORMS])
def test_url_form(text: str, form: str) -> None:
    assert url_form(text) == form
    assert url_form(form) == form


@pytest.mark.parametrize(
    "prefix", ["https://api.example.com:443/", "HTTPS://API.example.com./", "https://u@api.example.com/"], ids=repr
)
def test_a_deny_prefix_on_a_url_is_matched_in_its_url_form(prefix: str) -> None:
    v = view(rules=[Rule("http_request", prefix=prefix)])
    sent = call("send", tool="http_request", args={"url": "https://api.example.com/v1/items"}, grants=("send",))
    other = call("send", tool="http_request", args={"url": "https://api.example.org/v1"}, grants=("send",))
    expect(decide(sent, v), "refuse", 2)
    assert rule_matches(v.rules[0], sent)
    expect(decide(other, v), "allow", 5)
    assert not rule_matches(v.rules[0], other)


def test_a_deny_prefix_is_matched_against_the_aliases_of_the_first_argument() -> None:
    # The tool's own parser says where the call goes: the text alone does not match.
    v = view(rules=[Rule("http_request", prefix="https://api.example.com/")])
    sneaky = Call(agent="clerk", tool="http_request", family="send", run_grants={"send"},
                  arguments={"url": "https://example.org\\@api.example.com/v1"}, aliases=("https://api.example.com/v1",))
    plain = dataclasses.replace(sneaky, aliases=())
    expect(decide(sneaky, v), "refuse", 2)
    assert rule_matches(v.rules[0], sneaky) is True
    expect(decide(plain, v), "allow", 5)
    assert rule_matches(v.rules[0], plain) is False
    unreadable = dataclasses.replace(sneaky, arguments={"url": Unprintable()}, aliases=("https://example.org/",))
    expect(decide(unreadable, v), "refuse", 2)  # no text: every deny rule matches, aliases or not
    assert rule_matches(v.rules[0], unreadable) is True


def test_leaf_texts() -> None:
    assert leaf_texts("secrets/k") == ("secrets/k",)
    assert type(leaf_texts(Sly("secrets/k"))[0]) is str  # type: ignore[index]
    assert leaf_texts(None) == ()
    assert leaf_texts(5) == ("5",)
    assert leaf_texts(b"x") == ("b'x'",)
    assert leaf_texts(["a", {"k": ("b", None, 3)}]) == ("a", "k", "b")  # strings at any depth, keys too
    assert leaf_texts([]) == ()
    assert leaf_texts(Unprintable()) is None


def nested(depth: int, leaf: str = "notes/a") -> Any:
    value: Any = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_leaf_texts_reads_up_to_its_limits_and_no_further() -> None:
    assert leaf_texts(["a"] * 256) == ("a",) * 256
    assert leaf_texts(["a"] * 257) is None
    assert leaf_texts(["a"] * 200 + [1] * 57) is None  # items are counted, strings or not
    assert leaf_texts(["a"] * 200 + [1] * 56) == ("a",) * 200
    assert leaf_texts({str(i): "v" for i in range(128)}) is not None  # keys and values: 256 strings
    assert leaf_texts({str(i): "v" for i in range(128)} | {"x": "y"}) is None
    assert leaf_texts(nested(8)) == ("notes/a",)  # eight lists deep
    assert leaf_texts(nested(9)) is None


@pytest.mark.parametrize(
    ("paths", "refused"),
    [
        (["notes/a"] * 256, False),
        (["notes/a"] * 257, True),  # too many to read: every deny rule of the tool matches
        (nested(8), False),
        (nested(9), True),
    ],
    ids=["256 strings", "257 strings", "8 deep", "9 deep"],
)
def test_a_container_too_large_or_deep_to_read_matches_every_deny_rule(paths: Any, refused: bool) -> None:
    v = view(rules=[Rule("delete_many", prefix="secrets/")])
    c = call("write", tool="delete_many", args={"paths": paths}, grants=("write",))
    d = check(decide(c, v))
    assert (d.outcome, d.line) == (("refuse", 2) if refused else ("allow", 5))
    assert rule_matches(v.rules[0], c) is refused
    assert (leaf_texts(paths) is None) is refused


# --- reasons: the words a user reads when asked, and the journal keeps -----------------------

GIT_PATHS = (".git/hooks/pre-commit", "/ws/.git/hooks/pre-commit")
REASONS = [
    # (id, line, call, view, the decision's reason)
    ("policy: tool", 1, call("write", tool="shell"), view(policy=Policy(refuse_tools={"shell"})),
     "organisation policy refuses the tool 'shell'"),
    ("policy: connection", 1, call("send", connection="crm"), view(policy=Policy(refuse_connections={"crm"})),
     "organisation policy refuses the connection 'crm'"),
    ("policy: family", 1, call("send"), view(policy=Policy(refuse_families={"send"})),
     "organisation policy refuses the family 'send'"),
    ("deny, every agent", 2, call("write"), view(rules=[Rule("tool")]),
     "a deny rule for 'tool' (every agent) matches"),
    ("deny under a prefix, one agent", 2, call("write", args={"path": "secrets/k"}),
     view(rules=[Rule("tool", prefix="secrets/", agent="clerk")]),
     "a deny rule for 'tool' under 'secrets/' (agent 'clerk') matches"),
    ("deny on a path", 2, Call(agent="clerk", tool="read_file", family="read", arguments={"path": "s/k"},
                            paths=("secrets/k", "/ws/secrets/k")),
     view(rules=[Rule("read_file", prefix="secrets/")]),
     "a deny rule for 'read_file' under 'secrets/' (every agent) matches the path 'secrets/k'"),
    ("read", 3, call("read"), view(), "family 'read' only reads or touches nothing outside"),
    ("memory", 3, call("memory"), view(), "family 'memory' only reads or touches nothing outside"),
    ("fail closed", 0, call("write"), view(readable=False), "fail closed: governance cannot be read"),
    ("fail closed, why", 0, call("write"), view(readable=False, unreadable_reason="the policy does not verify"),
     "fail closed: the policy does not verify"),
    ("execute, developer mode off", 4, run("ls"), view(rules=[Rule(BASH, "allow", "ls")]),
     "executes code; developer mode is off"),
    ("execute, not shell text", 4, Call(agent="clerk", tool="python_executor", family="execute",
                                     arguments={"code": "ls"}, shell=False),
     view(developer_mode=True), "executes code that is not a shell command: no rule allows it, asked every time"),
    ("execute, not simple", 4, run("ls; rm x"), view(developer_mode=True),
     "executes code; not a single simple command"),
    ("execute, no command", 4, call("execute", tool=BASH, args={"command": 5}), view(developer_mode=True),
     "executes code; not a single simple command"),
    ("execute, allowed", 4, run("ls -la"), view(developer_mode=True, rules=[Rule(BASH, "allow", "ls", id="r")]),
     "developer mode and an allow rule for 'bash_executor' under 'ls' (every agent) match a single simple command"),
    ("execute, allowed for the agent", 4, run("ls -la"),
     view(developer_mode=True, rules=[Rule(BASH, "allow", "ls", agent="clerk")]),
     "developer mode and an allow rule for 'bash_executor' under 'ls' (agent 'clerk') match a single simple command"),
    ("execute, no always", 4, run("rm x"), view(developer_mode=True),
     "executes code; no allow rule matches this simple command; no always: "
     f"{shellcheck.no_always_reason(('rm', 'x'))}, so a rule for it would allow more than this command"),
    ("execute, ask", 4, run("du -sh ."), view(developer_mode=True),
     "executes code; no allow rule matches this simple command"),
    ("profile", 5, call("profile", grants=("profile",)), view(), "proposes a fact for the profile: asked every time"),
    ("write in .git", 5, Call(agent="clerk", tool="write_file", family="write", arguments={"path": GIT_PATHS[0]},
                           paths=GIT_PATHS, run_grants={"write"}),
     view(), "writes inside a .git directory, whose files make git run programs (hooks, core.fsmonitor,"
     " filters): asked every time"),
    ("consent", 5, call("write"), view(consents={("clerk", "write")}), "standing consent of 'clerk' for family 'write'"),
    ("grant", 5, call("send", grants=("send",)), view(), "the run holds a grant for family 'send'"),
    ("unclassified", 6, call(None), view(consents={("clerk", "write")}), "unclassified tool: asked every time"),
    ("no consent", 6, call("send"), view(consents={("clerk", "write")}), "no consent of 'clerk' for family 'send'"),
]


@pytest.mark.parametrize(("line", "c", "v", "reason"), [r[1:] for r in REASONS], ids=[r[0] for r in REASONS])
def test_every_line_gives_its_reason_in_words(line: int, c: Call, v: GovernanceView, reason: str) -> None:
    d = check(decide(c, v))
    assert (d.line, d.reason) == (line, reason)
