"""Exact answers of the deny matcher's parts: the nesting limit, the text the rule index
searches, and how a glob word is read (pattern, literal head and tail, the programs it
may name). The corpus in ``test_shellcheck.py`` checks decisions; these pin the values
``decision.py``'s index relies on, so that a change in any of them shows."""

from __future__ import annotations

import string

import pytest

from apollia_nb.governance import Call, GovernanceView, Rule, decide, shellcheck
from apollia_nb.governance.shellcheck import (
    _MAX_DEPTH,
    _NOT_IN_DOUBLE_QUOTES,
    _UNQUOTED,
    MAX_SIMPLE_LENGTH,
    allow_prefix_matches,
    deny_prefix_matches,
    deny_search_text,
    evaluating_builtin,
    glob_may_name,
    glob_words,
    simple_words,
)


def _shortest_word(text: str) -> str:
    """The shortest word the simple-command check reads back as ``text``: bare runs of
    ``_UNQUOTED`` characters, ``'single-quoted'`` runs without ``'`` and ``"double-quoted"``
    runs without ``"`` or the characters double quotes refuse, concatenated (a shortest path
    over positions; ``=`` is taken as bare anywhere, which can only make the word shorter)."""
    n = len(text)
    inf = 10**9
    best = [0] * (n + 1)
    step: list[tuple[str, int]] = [("", n)] * (n + 1)
    runs = {"bare": (inf, n), "single": (inf, n), "double": (inf, n)}  # min over k of (k + best[k], k)
    allowed = {
        "bare": lambda c: c in _UNQUOTED,
        "single": lambda c: c != "'",
        "double": lambda c: c != '"' and c not in _NOT_IN_DOUBLE_QUOTES,
    }
    overhead = {"bare": 0, "single": 2, "double": 2}
    for i in range(n - 1, -1, -1):
        for kind in runs:
            if allowed[kind](text[i]):
                runs[kind] = min(runs[kind], (i + 1 + best[i + 1], i + 1))
            else:
                runs[kind] = (inf, n)
        kind = min(runs, key=lambda k: overhead[k] + runs[k][0])
        best[i] = overhead[kind] + runs[kind][0] - i
        step[i] = (kind, runs[kind][1])
    out, i = [], 0
    while i < n:
        kind, k = step[i]
        out.append({"bare": "{}", "single": "'{}'", "double": '"{}"'}[kind].format(text[i:k]))
        i = k
    return "".join(out)


def _nested(inner: str, depth: int, wrapper: str = "sh -c") -> str:
    """``inner`` as the command string of ``wrapper``, ``depth`` times over, quoted as briefly as it can be."""
    for _ in range(depth):
        inner = f"{wrapper} {_shortest_word(inner)}"
    return inner


def test_the_shortest_quoting_reads_back_exactly() -> None:
    for text in ["ls x", "a'b\"c", "sh -c 'ls x'", _nested("rm -rf x", 3)]:
        assert simple_words(f"echo {_shortest_word(text)}") == ("echo", text)


def test_a_command_string_nested_exactly_at_the_depth_limit_is_read_through() -> None:
    harmful, harmless = _nested("rm -rf x", _MAX_DEPTH), _nested("ls x", _MAX_DEPTH)
    assert simple_words(harmless) is not None and simple_words(harmful) is not None
    assert deny_prefix_matches("rm -rf", harmful)  # found eight strings down
    assert not deny_prefix_matches("rm", harmless)  # read to the bottom: nothing there runs rm
    assert not deny_prefix_matches("rm", _nested("ls x", _MAX_DEPTH, wrapper="sudo bash -c"))
    texts = deny_search_text(harmless).split("\n")
    assert len(texts) == _MAX_DEPTH + 1 and texts[-1] == "ls x"  # one text per level, the last one's words
    assert texts[0] == " ".join(simple_words(harmless))


def test_no_simple_command_nests_deeper_than_the_limit() -> None:
    """So the check's ``depth > _MAX_DEPTH`` answers are never reached (see dev/mutation-equivalent.txt):
    one level deeper than the limit, even the briefest construction (a two-letter wrapper, one
    character at the bottom) is longer than a simple command may be."""
    briefest = min(len(_nested(c, _MAX_DEPTH + 1, wrapper="sh")) for c in string.punctuation + " "
                   if c not in _UNQUOTED)
    assert briefest > MAX_SIMPLE_LENGTH
    assert len(_nested(" ", _MAX_DEPTH, wrapper="sh")) <= MAX_SIMPLE_LENGTH  # while the limit itself is reachable


@pytest.mark.parametrize(
    ("command", "text"),
    [
        ("git status", "git status"),
        ("'git' \"status\"", "git status"),  # the words, quotes removed
        ("echo 'rm -rf x'", "echo rm -rf x"),  # not a wrapper: its arguments are not command strings
        ("sudo sh -c 'rm -rf x'", "sudo sh -c rm -rf x\nrm -rf x"),  # a wrapper: each command string too
        ("sh -c \"sh -c 'ls x'\"", "sh -c sh -c 'ls x'\nsh -c ls x\nls x"),
        ("ls | rm $(x)", "ls | rm $(x)\nls | rm \nls   rm  "),  # not simple: its readings
        ("x=${a:-rm} y", "x=${a:-rm} y\nx= y\nx=  y\nx= rm  y"),  # the words an expansion may give
        ("ｒｍ -rf / ;", "ｒｍ -rf / ;\nｒｍ -rf /  \nrm -rf / ;\nrm -rf /  "),  # fullwidth folded too
    ],
    ids=repr,
)
def test_deny_search_text_is_every_reading_the_matcher_has(command: str, text: str) -> None:
    assert deny_search_text(command) == text


@pytest.mark.parametrize("bad", [None, 7, b"rm", "x" * 1_000_001])
def test_deny_search_text_is_none_when_the_matcher_reads_no_words(bad: object) -> None:
    assert deny_search_text(bad) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("word", "pattern", "tail", "head", "last_head", "names"),
    [
        ("/bin/r?", "/bin/r.", "", "/bin/r", "r", ("rm",)),
        ("r*", "r.*", "", "r", None, ("rm",)),
        ("ab*cd", "ab.*cd", "cd", "ab", None, ("abcd",)),
        ("/usr/{bin,sbin}/r?", "/usr/(?:bin|sbin)/r.", "", "/usr/", "r", ("rm",)),
        ("a/r*", "a/r.*", "", "a/r", "r", ("rm",)),
        ("/bin/[!a]m", "/bin/[^a]m", "m", "/bin/", "", ("rm", "sm")),
        ("/b[i]n/rm", "/b[i]n/rm", "n/rm", "/b", "rm", ("rm",)),
        ("*/rm", ".*/rm", "/rm", "", "rm", ("rm",)),
        ("x{", "x(?:)", "", "x", None, ()),  # an unclosed brace: no tail
        # A "/" inside braces: the part after it does not compile alone, so it may name anything.
        ("{r,/s}m", "(?:r|/s)m", "", "", "", ("abcd", "ls", "rm", "sm")),
        ("[z-a]m", ".*", "", "", None, ("abcd", "ls", "rm", "sm")),  # unreadable: names everything
        ("x[ab", r"x\[ab", "x[ab", "x[ab", None, ()),  # a "[" never closed is a literal character
        ("{r,s}m", "(?:r|s)m", "m", "", None, ("rm", "sm")),  # what follows a closed brace is the tail
        ("{a/}b", "(?:a/)b", "", "", "", ("abcd", "ls", "rm", "sm")),  # after the "/": ")b", unreadable alone
        ("/+r?", r"/\+r.", "", "/+r", "+r", ()),  # after the "/": an escaped "+", read as one
    ],
    ids=repr,
)
def test_a_glob_word_is_read_exactly(word: str, pattern: str, tail: str, head: str, last_head: str | None,
                                     names: tuple[str, ...]) -> None:
    [glob] = glob_words(f"ls {word}")
    assert (glob.pattern.pattern, glob.tail, glob.head, glob.last_head) == (pattern, tail, head, last_head)
    assert tuple(p for p in ("abcd", "ls", "rm", "sm") if glob_may_name(glob, p)) == names
    for program in names:  # what the index relies on: the tail and the head agree with every name
        assert program.endswith(tail) or tail.endswith(program) or tail.endswith("/" + program) or not tail


def test_glob_words_reads_only_the_words_with_glob_characters() -> None:
    assert glob_words("ls -la x") == ()
    assert [g.pattern.pattern for g in glob_words("cp a* 'b?' \"c\" [x] && r{m,n}")] == ["a.*", "b.", r"[x]", "r(?:m|n)"]


def test_a_brace_word_names_each_alternative_and_nothing_else() -> None:
    rules = GovernanceView(rules=[Rule("bash_executor", "deny", "rm", id="rm")])

    def denied(command: str) -> bool:
        call = Call(agent="clerk", tool="bash_executor", family="execute", arguments={"command": command})
        return decide(call, rules).rule_id == "rm"

    assert denied("/bin/{ls,rm} -rf /") and deny_prefix_matches("rm", "/bin/{ls,rm} -rf /")
    assert not denied("/bin/{ls,cat} x") and not deny_prefix_matches("rm", "/bin/{ls,cat} x")


@pytest.mark.parametrize(
    ("word", "pattern", "names"),
    [
        ("[]a]m", r"[\]a]m", ("]m", "am")),  # a first "]" is a member
        ("[!]a]m", r"[^\]a]m", ("bm", "rm")),  # after "!" too
        ("[^]]m", r"[^\]]m", ("am", "bm", "rm")),
        ("a[]b]c", r"a[\]b]c", ("a]c", "abc")),
        ("[!a]m", "[^a]m", ("]m", "bm", "rm")),
        ("[a-c]m", "[a-c]m", ("am", "bm")),
        ("[[:alpha:]]m", ".m", ("]m", "am", "bm", "rm")),  # a class the regex cannot spell: any character
        ("r[[.a.]]", "r.", ("rm",)),
        ("[ab", r"\[ab", ()),  # never closed: "[" is literal
    ],
    ids=repr,
)
def test_a_bracket_expression_is_read_as_the_shell_reads_it(word: str, pattern: str, names: tuple[str, ...]) -> None:
    [glob] = glob_words(f"ls {word}")
    assert glob.pattern.pattern == pattern
    programs = ("]m", "a]c", "abc", "am", "bm", "ls", "rm")
    assert tuple(p for p in programs if glob_may_name(glob, p)) == names


def test_a_command_whose_expansions_nest_too_deep_to_read_matches_every_deny() -> None:
    deep = "echo " + "$(" * 40 + "x" + ")" * 40  # more passes than the reader makes: it cannot tell
    assert simple_words(deep) is None and deny_search_text(deep) is None
    assert deny_prefix_matches("rm", deep)
    call = Call(agent="clerk", tool="bash_executor", family="execute", arguments={"command": deep})
    assert decide(call, GovernanceView(rules=[Rule("bash_executor", "deny", "rm", id="rm")])).rule_id == "rm"
    assert not deny_prefix_matches("rm", "echo " + "$(" * 20 + "x" + ")" * 20)  # read: nothing there runs rm


def _run(command: str) -> Call:
    return Call(agent="clerk", tool="bash_executor", family="execute", arguments={"command": command})


# More deny rules than decide() checks one by one: it finds candidates through the rule index,
# which reads deny_search_text and glob_words.
_MANY_DENIES = GovernanceView(
    rules=[*(Rule("bash_executor", "deny", f"tool{i} sub{i}", id=f"decoy{i}") for i in range(8)),
           Rule("bash_executor", "deny", "rm", id="rm")],
)


def test_evaluating_builtin_reads_only_what_a_simple_command_could_be() -> None:
    at_limit = "eval " + "x" * (MAX_SIMPLE_LENGTH - 5)
    assert len(at_limit) == MAX_SIMPLE_LENGTH and evaluating_builtin(at_limit) == "eval"
    unread = [at_limit + "x", "eval 'x\ny'", "eval 'ｘ'"]  # too long; a newline, a non-ASCII letter in quotes
    assert [evaluating_builtin(c) for c in unread] == [None, None, None]
    view = GovernanceView(developer_mode=True)
    assert decide(_run(at_limit), view).reason == (
        "executes code; not a single simple command (the shell builtin 'eval' may evaluate its arguments as code)"
    )
    assert {decide(_run(c), view).reason for c in unread} == {"executes code; not a single simple command"}


def test_after_a_wrapper_the_prefix_words_must_follow_its_program() -> None:
    assert deny_prefix_matches("rm -rf", "sudo rm -rf x") and deny_prefix_matches("rm -rf", "sudo rm x -rf")
    assert not deny_prefix_matches("rm -rf", "sudo rm x")  # the program without the prefix's other word
    assert not deny_prefix_matches("rm -rf", "sudo -rf rm x")  # a word before the program does not count


def test_double_quotes_inside_a_word_are_removed_when_a_command_is_read_as_text() -> None:
    assert deny_prefix_matches("rm -rf", 'ls; r"m" -rf /') and deny_prefix_matches("rm -rf", "ls; r'm' -rf /")
    assert not deny_prefix_matches("rm -rf", 'ls; r"m"x -rf /')  # "rmx" is another word
    assert decide(_run('ls; r"m" -rf /'), _MANY_DENIES).rule_id == "rm"


def test_a_wrappers_first_argument_is_read_as_a_command_string() -> None:
    command = "watch 'ls; r\"m\" -rf /'"  # watch runs its argument with sh -c
    assert deny_search_text(command) == 'watch ls; r"m" -rf /\nls; rm -rf /\nls  rm -rf /'
    assert deny_prefix_matches("rm", command) and decide(_run(command), _MANY_DENIES).rule_id == "rm"


def test_a_command_string_whose_expansions_nest_too_deep_to_read_matches_every_deny() -> None:
    deep = "watch 'echo " + "$(" * 40 + "x" + ")" * 40 + "'"
    assert simple_words(deep) is not None and deny_search_text(deep) is None
    assert deny_prefix_matches("rm", deep) and decide(_run(deep), _MANY_DENIES).rule_id == "decoy0"  # the first


def test_a_brace_word_nested_deeper_than_patterns_can_be_read_matches_every_deny() -> None:
    deep = "ls " + "{" * 5000 + "a" + "}" * 5000  # the regex parser gives up (RecursionError)
    assert deny_prefix_matches("rm", deep) is True
    assert decide(_run(deep), _MANY_DENIES).rule_id == "decoy0"  # the first deny rule in view order


def test_an_internal_failure_reads_as_no_allow_match_and_every_deny_match(monkeypatch: pytest.MonkeyPatch) -> None:
    assert allow_prefix_matches("git", "git status") is True and deny_prefix_matches("rm", "git status") is False

    def failing(command: str) -> tuple[str, ...] | None:
        raise RuntimeError("internal failure")

    monkeypatch.setattr(shellcheck, "simple_words", failing)
    assert allow_prefix_matches("git", "git status") is False
    assert deny_prefix_matches("rm", "git status") is True


@pytest.mark.parametrize("folder", ["/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin",
                                    "/opt/homebrew/bin"])
def test_always_is_offered_for_a_program_named_by_its_path_in_each_system_folder(folder: str) -> None:
    assert shellcheck.no_always_reason((f"{folder}/mytool", "x")) is None
    assert shellcheck.no_always_reason((f"{folder}x/mytool", "x")) == (
        f"'{folder}x/mytool' is a file outside the system's program folders: what it runs may change")


@pytest.mark.parametrize(
    ("words", "reason"),
    [
        (("./build.sh",), "'./build.sh' is a file outside the system's program folders: what it runs may change"),
        (("/usr/bin/../x",), "'/usr/bin/../x' is a file outside the system's program folders: what it runs may change"),
        (("/usr/bin/env", "x"), "'env' runs other programs, commands or program text"),  # by its basename
        (("pip3", "x"), "'pip3' runs other programs, commands or program text"),  # with its version dropped
        (("rm", "-rf"), "'rm' writes, deletes or sends where its arguments say"),
        (("python.",), "'python.' runs other programs, commands or program text"),  # an interpreter's odd version
        (("python..3",), "'python..3' runs other programs, commands or program text"),
        ((None,), "the command cannot be read"),  # never None: a failure gives a reason
        ((7,), "the command cannot be read"),
        ((), "the command cannot be read"),
    ],
    ids=repr,
)
def test_the_reason_always_is_not_offered_is_exact(words: tuple, reason: str) -> None:
    assert shellcheck.no_always_reason(words) == reason


def test_evaluating_builtin_reads_no_command_with_a_control_character() -> None:
    assert evaluating_builtin("eval x") == "eval" and evaluating_builtin("eval ' x'") == "eval"  # a space is text
    assert evaluating_builtin("eval '\x7f'") is None  # DEL is not
    assert evaluating_builtin("eval '\x1f'") is None
