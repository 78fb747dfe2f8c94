"""decide(): properties that hold for every call and every view hypothesis can build.

The oracle ``reference`` states the six lines as a plain scan over ``rule_matches``;
``decide`` answers from an index built once per view, and must agree with it.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apollia_nb.governance import Call, Family, GovernanceView, Policy, Rule, decide, shellcheck
from apollia_nb.governance import decision
from apollia_nb.governance.decision import READ_ONLY_FAMILIES, rule_matches

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

BASH = "bash_executor"
TOOLS = [BASH, "write_file", "send_mail", "mystery"]
RULE_TOOLS = [*TOOLS, "Write_File", "BASH_executor"]  # deny rules name a tool in any case
AGENTS = ["clerk", "scout", "*"]
CONNECTIONS = ["github", "crm.example.com"]
WORDS = [
    "rm", "-rf", "/", "git", "status", "push", "--short", "/bin/rm", "/usr/bin/git", "sudo",
    "bash", "-c", "ls", "curl", "x", "rmdir", "farm", "env", "FOO=1", "secrets/k", "a,b", "..",
    "./secrets", "zq0absent0qz",
]
SEPARATORS = [" ", " ", " ", " ", "; ", " && ", " || ", " | ", "\n", " > ", " & ", " # ", "\t"]

families = st.one_of(st.none(), st.sampled_from(list(Family)), st.sampled_from([f.value for f in Family]))


# How a word may be written so that a shell still reads it (or may read it) as itself.
STYLES = {
    "plain": lambda w: w,
    "single": lambda w: f"'{w}'",
    "double": lambda w: f'"{w}"',
    "split": lambda w: f"{w[0]}'{w[1:]}'",
    "empty quotes": lambda w: f'{w[0]}""{w[1:]}',
    "backslash": lambda w: "\\" + w,
    "inner backslash": lambda w: f"{w[0]}\\{w[1:]}",
    "escaped newline": lambda w: f"{w[0]}\\\n{w[1:]}",
    "substitution": lambda w: f"$({w})",
    "backquotes": lambda w: f"`{w}`",
    "empty expansion": lambda w: f"{w[0]}$(){w[1:]}",
    "empty variable": lambda w: f"{w[0]}${{x}}{w[1:]}",
    "glob": lambda w: f"{w[0]}*",
    "glob one": lambda w: f"{w[0]}?{w[2:]}",
    "glob class": lambda w: f"[{w[0]}]{w[1:]}",
    "brace": lambda w: f"{{{w[0]},}}{w[1:]}",
    "tilde": lambda w: f"~/{w}",
    "fullwidth": lambda w: "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in w),
}


@st.composite
def words(draw: st.DrawFn) -> str:
    w = draw(st.sampled_from(WORDS))
    style = draw(st.sampled_from(["plain"] * 6 + list(STYLES)))
    return STYLES[style](w)


@st.composite
def plain_commands(draw: st.DrawFn) -> str:
    parts = draw(st.lists(words(), min_size=1, max_size=6))
    seps = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(parts), max_size=len(parts)))
    return "".join(p + s for p, s in zip(parts, seps))[: -len(seps[-1]) or None]


commands = st.recursive(
    st.one_of(
        plain_commands(),
        st.text(alphabet="rmgitsl -/;|&'\"\\\n$()x#", max_size=30),
        st.text(max_size=12),
    ),
    lambda inner: st.builds(lambda w, c: f"{w} -c {shlex.quote(c)}", st.sampled_from(["bash", "sh", "sudo bash"]), inner),
    max_leaves=4,
)

# A file tool's call carries the names of the file its path resolves to (Call.paths).
PATH_NAMES = [".", "secrets", "secrets/k", "secretsX/k", "secrets.txt", "notes/draft-2.md", "/ws/secrets/k",
              "/ws", "/", "../x", "a b/c", "alias/k"]
PATH_PREFIXES = ["secrets/", "./secrets", "secrets", "secrets//", "/ws/secrets/", "/ws/secrets", ".", "./", "/",
                 "notes/draft", "secrets/.", "..", "//ws/secrets", "alias/"]

prefixes = st.one_of(
    st.none(),
    st.just(""),
    st.just("   "),
    st.sampled_from(PATH_PREFIXES),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join),
    st.lists(words(), min_size=1, max_size=2).map(" ".join),
    st.text(alphabet="rmgit -/'\"x.", max_size=8),
)

json_like = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=6,
)
argument_values = st.one_of(commands, commands, prefixes.filter(lambda p: p is not None), json_like, st.binary(max_size=8))
arguments = st.one_of(
    st.builds(lambda v: {"command": v}, argument_values),
    st.dictionaries(st.sampled_from(["path", "command", "to", "n"]), argument_values, max_size=3),
)


@st.composite
def calls(draw: st.DrawFn) -> Call:
    return Call(
        agent=draw(st.sampled_from(AGENTS)),
        tool=draw(st.sampled_from(TOOLS)),
        family=draw(families),
        arguments=draw(arguments),
        connection=draw(st.one_of(st.none(), st.sampled_from(CONNECTIONS))),
        run_grants=draw(st.sets(st.sampled_from(list(Family)))),
        paths=draw(st.one_of(st.none(), st.lists(st.sampled_from(PATH_NAMES), max_size=3).map(tuple))),
    )


# Mostly words: a rule without a prefix matches every call and hides the rules after it.
word_prefixes = st.integers(0, 29).flatmap(
    lambda k: st.sampled_from([None, "   "]) if k == 0
    else st.lists(words(), min_size=1, max_size=2).map(" ".join) if k < 8
    else st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)
)


@st.composite
def rule_lists(
    draw: st.DrawFn,
    max_size: int = 12,
    tools: list[str] = RULE_TOOLS,
    prefixes: st.SearchStrategy[str | None] = prefixes,
    agents: list[str] = AGENTS,
) -> list[Rule]:
    n = draw(st.integers(0, max_size))
    return [
        Rule(
            tool=draw(st.sampled_from(tools)),
            effect=draw(st.sampled_from(["allow", "deny"])),
            prefix=draw(prefixes),
            agent=draw(st.sampled_from(agents)),
            id=f"r{i}",
        )
        for i in range(n)
    ]


policies = st.one_of(
    st.none(),
    st.builds(
        Policy,
        refuse_tools=st.sets(st.sampled_from(TOOLS), max_size=2),
        refuse_connections=st.sets(st.sampled_from(CONNECTIONS), max_size=1),
        refuse_families=st.sets(st.sampled_from(list(Family)), max_size=2),
    ),
)
consent_sets = st.one_of(
    st.sets(st.tuples(st.sampled_from(AGENTS), st.sampled_from(list(Family))), max_size=6),
    st.just({(a, f) for a in AGENTS for f in Family}),  # everything consented
)


@st.composite
def views(draw: st.DrawFn, rules: st.SearchStrategy[list[Rule]] = rule_lists()) -> GovernanceView:
    return GovernanceView(
        rules=draw(rules),
        consents=draw(consent_sets),
        developer_mode=draw(st.booleans()),
        policy=draw(policies),
        readable=draw(st.booleans()),
        unreadable_reason=draw(st.sampled_from(["", "governance.db cannot be opened"])),
    )


def command_of(call: Call) -> Any:
    return next(iter(call.arguments.values()), None)


def policy_refuses(call: Call, view: GovernanceView) -> bool:
    p = view.policy
    return p is not None and (
        call.tool in p.refuse_tools
        or (call.connection is not None and call.connection in p.refuse_connections)
        or (call.family is not None and call.family in p.refuse_families)
    )


def reference(call: Call, view: GovernanceView) -> tuple[str, int, tuple[str, ...], str | None]:
    """The six lines, worded as the docs word them, scanning every rule."""
    once_refuse, everything = ("once", "refuse"), ("once", "always", "refuse")
    if policy_refuses(call, view):
        return ("refuse", 1, (), None)
    for rule in view.rules:
        if rule.effect == "deny" and rule_matches(rule, call):
            return ("refuse", 2, (), rule.id)
    if call.family in READ_ONLY_FAMILIES:
        return ("allow", 3, (), None)
    if not view.readable:
        return ("refuse", 0, (), None)
    if call.family == "execute":
        command = command_of(call)
        if view.developer_mode and isinstance(command, str) and shellcheck.is_simple(command):
            for rule in view.rules:
                if rule.effect == "allow" and rule_matches(rule, call):
                    return ("allow", 4, (), rule.id)
            widens = shellcheck.no_always_reason(shellcheck.simple_words(command)) is not None
            return ("ask", 4, once_refuse if widens else everything, None)
        return ("ask", 4, once_refuse, None)
    if call.family == "profile":
        return ("ask", 5, once_refuse, None)
    if call.family is not None and ((call.agent, call.family) in view.consents or call.family in call.run_grants):
        return ("allow", 5, (), None)
    return ("ask", 6, once_refuse if call.family is None else everything, None)


# Each property is a function of one call and one view; one test draws the pair and
# checks them all (drawing is what costs, not deciding).


def execute_is_allowed_only_by_an_allow_rule_on_a_simple_command_in_developer_mode(
    call: Call, view: GovernanceView
) -> None:
    """(1)"""
    d = decide(call, view)
    if d.outcome == "allow" and call.family == "execute":
        command = command_of(call)
        assert d.line == 4 and view.developer_mode and view.readable
        assert isinstance(command, str) and shellcheck.is_simple(command)
        assert any(r.effect == "allow" and r.prefix and rule_matches(r, call) for r in view.rules)


def a_matching_deny_rule_is_never_overridden(call: Call, view: GovernanceView) -> None:
    """(2) even with a consent and a grant for every family."""
    call = Call(call.agent, call.tool, call.family, call.arguments, call.connection, run_grants=set(Family))
    view = GovernanceView(
        rules=view.rules, consents={(call.agent, f) for f in Family}, developer_mode=view.developer_mode,
        policy=view.policy, readable=view.readable,
    )
    d = decide(call, view)
    if any(r.effect == "deny" and rule_matches(r, call) for r in view.rules):
        assert d.outcome == "refuse" and d.line in (1, 2)


def unclassified_never_offers_always(call: Call, view: GovernanceView) -> None:
    """(3)"""
    call = Call(call.agent, call.tool, None, call.arguments, call.connection, call.run_grants)
    d = decide(call, view)
    assert "always" not in d.answers
    assert d.outcome != "allow"


def an_unreadable_view_allows_only_reading(call: Call, view: GovernanceView) -> None:
    """(4)"""
    view = GovernanceView(rules=view.rules, consents=view.consents, developer_mode=view.developer_mode,
                          policy=view.policy, readable=False)
    d = decide(call, view)
    if d.outcome == "allow":
        assert call.family in READ_ONLY_FAMILIES and d.line == 3
    elif call.family not in READ_ONLY_FAMILIES:
        assert d.outcome == "refuse" and d.line in (0, 1, 2)


def a_policy_refusal_always_wins(call: Call, view: GovernanceView) -> None:
    """(5)"""
    d = decide(call, view)
    assert (d.line == 1) is policy_refuses(call, view)
    if d.line == 1:
        assert d.outcome == "refuse"


def decide_is_deterministic_and_agrees_with_a_plain_scan(call: Call, view: GovernanceView) -> None:
    """(6) and never raises."""
    d = decide(call, view)
    assert decide(call, view) == d
    rebuilt = GovernanceView(rules=list(view.rules), consents=set(view.consents), developer_mode=view.developer_mode,
                             policy=view.policy, readable=view.readable, unreadable_reason=view.unreadable_reason)
    assert decide(call, rebuilt) == d
    assert (d.outcome, d.line, d.answers, d.rule_id) == reference(call, view)
    assert any(c.isalpha() for c in d.reason)
    assert (d.outcome == "ask") == bool(d.answers)


PROPERTIES = [
    execute_is_allowed_only_by_an_allow_rule_on_a_simple_command_in_developer_mode,
    a_matching_deny_rule_is_never_overridden,
    unclassified_never_offers_always,
    an_unreadable_view_allows_only_reading,
    a_policy_refusal_always_wins,
    decide_is_deterministic_and_agrees_with_a_plain_scan,
]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls(), views())
def test_properties_of_decide(call: Call, view: GovernanceView) -> None:
    for check in PROPERTIES:
        check(call, view)


# The index skips deny rules that cannot match a command: many rules, all on one shell,
# and commands written from the rules' own words, quoted, split, escaped or wrapped.
# Styles that put something inside a word: the index must still find the word.
QUOTING = ["split", "empty quotes", "inner backslash", "escaped newline", "escaped newline", "empty expansion",
           "empty variable", "glob one", "brace", "backslash"]


@st.composite
def shell_cases(draw: st.DrawFn) -> tuple[list[Rule], Any]:
    # Mostly rules for every agent: the index keeps one table per tool and scope.
    agents = ["*", "*", "*", "clerk"]
    rules = draw(rule_lists(max_size=draw(st.sampled_from([3, 12, 40])), tools=[BASH], prefixes=word_prefixes, agents=agents))
    # A target deny rule, often first, whose words the command writes in some odd way:
    # if the index wrongly skipped it, another rule (or none) would answer.
    target = Rule(BASH, "deny", " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=2))),
                  draw(st.sampled_from(agents)), id="target")
    rules.insert(draw(st.sampled_from([0, 0, 0, len(rules) // 2, len(rules)])), target)
    sources = [r.prefix.split() for r in rules if r.prefix and r.prefix.split()]
    segments = []
    for i in range(draw(st.integers(1, 3))):
        picked = target.prefix.split() if i == 0 else draw(st.sampled_from(sources))
        styles = draw(st.sampled_from([["plain"], QUOTING, QUOTING, QUOTING, list(STYLES)]))
        written = [STYLES[draw(st.sampled_from(styles))](w) for w in picked]
        if draw(st.booleans()):
            written.insert(draw(st.integers(0, len(written))), draw(st.sampled_from(WORDS)))
        segments.append(" ".join(written))
    command = draw(st.sampled_from(SEPARATORS)).join(segments)
    wrap = draw(st.sampled_from(["", "", "sudo ", "bash -c ", "sh -c ", "env FOO=1 "]))
    if wrap.endswith("-c "):
        command = wrap + shlex.quote(command)
    else:
        command = wrap + command
    shape = draw(st.sampled_from(["text"] * 5 + ["list", "int", "other"]))
    if shape == "list":
        return rules, command.split(" ")
    if shape == "int":
        return rules, draw(st.integers())
    if shape == "other":
        return rules, draw(commands)
    return rules, command


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(AGENTS), st.sampled_from([Family.EXECUTE, None, Family.WRITE]), shell_cases(), st.booleans())
def test_many_rules_on_one_shell_agree_with_a_plain_scan(
    agent: str, family: Family | None, case: tuple[list[Rule], Any], dev: bool
) -> None:
    rules, command = case
    call = Call(agent=agent, tool=BASH, family=family, arguments={"command": command})
    view = GovernanceView(rules=rules, developer_mode=dev)
    d = decide(call, view)
    assert (d.outcome, d.line, d.answers, d.rule_id) == reference(call, view)


# What the index relies on from the simple-command check.
@SETTINGS
@given(st.one_of(commands, prefixes.filter(lambda p: p is not None)))
def test_simple_words_and_is_simple_agree(command: str) -> None:
    words = shellcheck.simple_words(command)
    assert shellcheck.is_simple(command) is (words is not None)
    assert words is None or (len(words) > 0 and all(isinstance(w, str) for w in words))


# Commands with glob words, expansions, quotes, ./ and ..: the index reads the words a
# glob may expand to and the texts an expansion leaves, and must still answer as a scan.
PROGRAM_WORDS = ["rm", "/bin/rm", "./rm", "../bin/rm", "rmdir", "git", "/usr/bin/git", "ls", "x", "r", "m",
                 "sudo", "bash", "a.b", "run.sh", "./run.sh", "..", "-rf", "/", "push"]
GLOB_STYLES = {
    "one": lambda w: w[:-1] + "?",
    "star": lambda w: w[:1] + "*",
    "star tail": lambda w: "*" + w[-1:],
    "class": lambda w: f"[{w[0]}]{w[1:]}",
    "negated class": lambda w: f"[!x]{w[1:]}",
    "range": lambda w: f"{w[:-1]}[a-z]",
    "posix class": lambda w: f"[[:alpha:]]{w[1:]}",
    "brace": lambda w: f"{{{w[0]},}}{w[1:]}",
    "brace tail": lambda w: f"{w[:-1]}{{{w[-1]},q}}",
    "path one": lambda w: f"/bin/{w[:-1]}?",
    "path class": lambda w: f"/usr/bin/[{w[0]}]{w[1:]}",
    "glob folder": lambda w: f"/b?n/{w}",
    "star folder": lambda w: f"*/{w}",
    "dot slash": lambda w: f"./{w}",
    "dot dot": lambda w: f"../{w}",
    "variable": lambda w: f"$HOME/{w}",
    "default": lambda w: f"${{X:-{w}}}",
    "inner variable": lambda w: f"{w[0]}${{X}}{w[1:]}",
    "substitution": lambda w: f"$(echo {w})",
    "quoted": lambda w: f"'{w}'",
    "double quoted": lambda w: f'"{w}"',
    "plain": lambda w: w,
    "head": lambda w: f"{w}x?",
    "head brace": lambda w: f"{w[:1]}{{{w[1:]},}}",
    "slash head": lambda w: f"/{w}*",
    "x head": lambda w: f"x/{w[:-1]}[{w[-1]}]",
}
BAD_GLOBS = ["[", "[]", "[!]", "{", "}", "{a/,b}x", "{a,b", "[[:alpha:]", "x[", "*/", "?/*", "[/]x", "{/,}rm",
             "[a-]", "[z-a]m", "\\*", "'*'", "${", "$(", "`"]


@st.composite
def glob_cases(draw: st.DrawFn) -> tuple[list[Rule], str]:
    agents = ["*", "*", "clerk", "scout"]
    n = draw(st.sampled_from([6, 20, 60]))
    rules = [
        Rule(BASH, draw(st.sampled_from(["deny", "deny", "deny", "allow"])),
             " ".join(draw(st.lists(st.sampled_from(PROGRAM_WORDS), min_size=1, max_size=2))),
             draw(st.sampled_from(agents)), id=f"g{i}")
        for i in range(n)
    ]
    pieces = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 5))
        if kind == 0:
            pieces.append(draw(st.sampled_from(BAD_GLOBS)))
        else:
            word = draw(st.sampled_from(PROGRAM_WORDS))
            pieces.append(GLOB_STYLES[draw(st.sampled_from(list(GLOB_STYLES)))](word))
    seps = draw(st.lists(st.sampled_from([" ", " ", "; ", " | ", " && ", "\n"]), min_size=len(pieces), max_size=len(pieces)))
    command = "".join(p + s for p, s in zip(pieces, seps)).rstrip()
    wrap = draw(st.sampled_from(["", "", "", "sudo ", "bash -c "]))
    return rules, (wrap + shlex.quote(command) if wrap == "bash -c " else wrap + command)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["clerk", "scout", "other"]), st.sampled_from([Family.EXECUTE, None]), glob_cases(), st.booleans())
def test_commands_with_globs_and_expansions_agree_with_a_plain_scan(
    agent: str, family: Family | None, case: tuple[list[Rule], str], dev: bool
) -> None:
    rules, command = case
    call = Call(agent=agent, tool=BASH, family=family, arguments={"command": command})
    view = GovernanceView(rules=rules, developer_mode=dev)
    d = decide(call, view)
    assert (d.outcome, d.line, d.answers, d.rule_id) == reference(call, view)


# What the index relies on from the glob reading: every program a glob word may name
# ends with the word's literal tail, or the tail ends with the program; and it, or it
# after "/" or "x/", starts with the word's literal head.
@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(alphabet="rmx/*?[]{},!^:.-a", min_size=1, max_size=10),
        st.sampled_from(BAD_GLOBS),
        st.builds(lambda s, w: GLOB_STYLES[s](w), st.sampled_from(list(GLOB_STYLES)), st.sampled_from(PROGRAM_WORDS)),
    ),
    st.sampled_from(PROGRAM_WORDS + ["/", "mr", "x/rm", "[", "]", "}", ",", "xrm", "x", "/x"]),
)
def test_a_glob_word_names_only_programs_that_fit_its_literal_tail_and_head(word: str, program: str) -> None:
    for glob in shellcheck.glob_words(word):
        if shellcheck.glob_may_name(glob, program):
            assert program.endswith(glob.tail) or glob.tail.endswith(program), (word, glob.tail, program)
            assert any(s.startswith(glob.head) for s in (program, "/" + program, "x/" + program)) or (
                glob.last_head is not None and program.startswith(glob.last_head)), (word, glob.head, glob.last_head)


# And the length: a program named through the pattern (``w``, ``/w`` or ``x/w`` matches it)
# has a length in ``lengths``; one named through the part after the last "/" a length in
# ``last_lengths`` (the index skips the others without asking the regex). Programs drawn
# from the word's own regex, so that most of them are named.
def lengths_hold(glob: shellcheck.GlobWord, program: str) -> bool:
    size = len(program)
    if any(glob.pattern.fullmatch(s) for s in (program, "/" + program, "x/" + program)):
        low, high = glob.lengths
        if not low <= size <= high:
            return False
    last = glob.last_part
    if last is True or (last is not None and last.fullmatch(program)):
        assert glob.last_lengths is not None
        low, high = glob.last_lengths
        if not low <= size <= high:
            return False
    return True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(
    st.one_of(
        st.text(alphabet="rmx/*?[]{},!^:.-a", min_size=1, max_size=10),
        st.sampled_from(BAD_GLOBS),
        st.builds(lambda s, w: GLOB_STYLES[s](w), st.sampled_from(list(GLOB_STYLES)), st.sampled_from(PROGRAM_WORDS)),
    ),
    st.data(),
)
def test_a_glob_word_names_only_programs_whose_length_it_fits(word: str, data: st.DataObject) -> None:
    for glob in shellcheck.glob_words(word):
        drawn = data.draw(st.one_of(st.from_regex(glob.pattern, fullmatch=True), st.text(alphabet="rmxa/.-", max_size=12)))
        for program in {drawn, drawn[1:], drawn[2:], drawn.rpartition("/")[2], drawn + "x", drawn[:-1]}:
            assert lengths_hold(glob, program), (word, program, glob.lengths, glob.last_lengths)


@pytest.mark.parametrize("word", ["??rm", "[!a]?rm", "?/rm", "/bin/r?", "x{a/}rm", "*", "{a,}rm", "/b?n/rm"], ids=repr)
def test_a_glob_word_fits_rm_when_it_names_it_as_x_slash_rm_or_slash_rm_or_itself(word: str) -> None:
    (glob,) = shellcheck.glob_words(word)
    assert glob.may_name("rm") and lengths_hold(glob, "rm")


# The index checks every rule when the matcher may match whatever the prefix is. It tells
# that from the search text and the glob words; asking the matcher about a word that
# occurs in no command must give the same answer.
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(commands, glob_cases().map(lambda case: case[1]), st.sampled_from(BAD_GLOBS),
                 st.lists(st.sampled_from(BAD_GLOBS + PROGRAM_WORDS), min_size=1, max_size=4).map(" ".join),
                 st.just("ls " + "{" * 5000 + "a" + "}" * 5000)))  # too deep for the regex parser
def test_the_index_checks_every_rule_exactly_when_the_matcher_may_match_any_prefix(command: str) -> None:
    absent = decision._ABSENT
    text = shellcheck.deny_search_text(command)
    anything = text is None or absent in text or shellcheck.deny_prefix_matches(absent, command)
    assert (decision._searchable(command) is None) is anything
