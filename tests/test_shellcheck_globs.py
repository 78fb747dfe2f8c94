"""How a glob word's regex is read: the literal head of the part after its last "/"
(``GlobWord.last_head``, which the rule index in ``decision.py`` relies on) and the bracket
expressions, compared with what bash's own pattern matching does. A deny rule must still
catch every program a glob may expand to, whichever spelling an agent picks."""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings

import pytest

from apollia_nb.governance import Call, GovernanceView, Rule, decide
from apollia_nb.governance.shellcheck import (
    GlobWord,
    deny_prefix_matches,
    glob_may_name,
    glob_words,
)

PROGRAMS = ("rm", "r", "a.b", "a-b", ".b", "xa", "ab", "ac", "abc", "cd", "]m", "Xm", "am", "bm", "-m", ".m")


def _named(glob: GlobWord) -> tuple[str, ...]:
    return tuple(p for p in PROGRAMS if glob_may_name(glob, p))


# --------------------------------------------------------------------------- last_head through glob words


@pytest.mark.parametrize(
    ("word", "pattern", "head", "last_head", "names"),
    [
        ("/bin/a.?", r"/bin/a\..", "/bin/a.", "a.", ("a.b",)),  # an escaped "." is certain
        ("/b?n/.b", r"/b.n/\.b", "/b", ".b", (".b",)),  # first, then a plain one
        ("/bin/a-?", r"/bin/a\-.", "/bin/a-", "a-", ("a-b",)),  # "-" is escaped too
        ("/bin/a.b-*", r"/bin/a\.b\-.*", "/bin/a.b-", "a.b-", ()),
        ("/b*/ab", "/b.*/ab", "/b", "ab", ("ab",)),  # no glob after the "/": all of it
        ("/bin/r{m,}", "/bin/r(?:m|)", "/bin/r", "", ("rm", "r")),  # an alternative: it cannot tell
        ("/bin/x{a,b}", "/bin/x(?:a|b)", "/bin/x", "", ("xa",)),
        ("/bin/{a,x}a", "/bin/(?:a|x)a", "/bin/", "", ("xa",)),
        ("/bin/?b", "/bin/.b", "/bin/", "", (".b", "ab")),  # nothing plain first
    ],
    ids=repr,
)
def test_the_head_after_the_last_slash_is_read_exactly(
    word: str, pattern: str, head: str, last_head: str, names: tuple[str, ...]
) -> None:
    [glob] = glob_words(f"ls {word}")
    assert (glob.pattern.pattern, glob.head, glob.last_head) == (pattern, head, last_head)
    assert _named(glob) == names
    assert all(p.startswith(last_head) for p in names)


# --------------------------------------------------------------------------- last_head of any regex


@pytest.mark.parametrize(
    ("regex", "last_head", "named", "not_named"),
    [
        (r"x/a\\b", "a\\b", ("a\\b",), ("ab",)),  # an escaped backslash is one certain character
        (r"x/a\.b\-c", "a.b-c", ("a.b-c",), ("axb-c",)),
        (r"x/\.", ".", (".",), ("x",)),  # an escape last
        (r"x/a\d", "a", ("a1",), ("ad",)),  # an escaped letter is a class, not a character
        ("x/ab*c", "a", ("ac", "abbc"), ("bc",)),  # a quantified character is not certain
        ("x/ab+c", "a", ("abc",), ("ac",)),
        ("x/ab?c", "a", ("ac", "abc"), ("bc",)),
        ("x/ab{2}c", "a", ("abbc",), ("abc",)),
        (r"x/a\.*b", "a", ("ab", "a..b"), ("b",)),  # an escaped one neither
        (r"x/\.+", "", (".", ".."), ("",)),
        ("x/a*", "", ("", "aa"), ("b",)),
        ("x/ab|cd", "", ("cd", "ab"), ("abcd",)),  # an alternative anywhere: nothing is certain
        ("x/(?:ab|cd)e", "", ("abe", "cde"), ("ab",)),
        ("a|x/bc", "bc", ("bc",), ("c",)),  # only the part after the last "/" counts
        ("x/[a]b", "", ("ab",), ("b",)),
        ("x/abc", "abc", ("abc",), ("ab",)),
    ],
    ids=repr,
)
def test_last_head_is_what_every_program_the_last_part_matches_starts_with(
    regex: str, last_head: str, named: tuple[str, ...], not_named: tuple[str, ...]
) -> None:
    glob = GlobWord(re.compile(regex, re.DOTALL), "")
    assert glob.last_head == last_head
    for program in named:
        assert glob.may_name(program) and program.startswith(last_head), program
    assert not any(glob.may_name(p) for p in not_named)


@pytest.mark.parametrize("word", ["{a/}x", "{a/}rm", "x{a/}b", "{a/,b/}c"], ids=repr)
def test_a_brace_that_closes_after_a_slash_names_every_program_and_claims_no_tail(word: str) -> None:
    # The part after the last "/" (")x") cannot be read alone: the word may name any
    # program, so it may claim no literal tail or head that the index would filter on.
    (glob,) = glob_words(f"{word} -rf /")
    assert (glob.tail, glob.head) == ("", "")
    assert glob.may_name("rm") and glob.may_name("zq0absent0qz")


def test_a_regex_without_a_slash_has_no_last_part() -> None:
    glob = GlobWord(re.compile("ab|cd"), "", "")
    assert glob.last_head is None
    assert glob.may_name("cd") and glob.may_name("ab") and not glob.may_name("abcd")


# --------------------------------------------------------------------------- the index never misses


DENIED = ["cat", "cp", "mv", "dd", "ls", "rm", "a.b", "a-b", ".b", "xa", "ab", "x"]


def _first_deny(command: str) -> str | None:
    view = GovernanceView(rules=[Rule("bash_executor", "deny", p, id=p) for p in DENIED])
    call = Call(agent="clerk", tool="bash_executor", family="execute", arguments={"command": command})
    return decide(call, view).rule_id


@pytest.mark.parametrize(
    ("command", "rule"),
    [
        ("/bin/r{m,} -rf /", "rm"),  # the head /bin/r does not start rm, /rm nor x/rm: the last part does
        ("/usr/bin/a.? y", "a.b"),
        ("/usr/bin/a-? y", "a-b"),
        ("/b?n/.b y", ".b"),
        ("/opt/x{a,y} y", "xa"),
        ("/opt/{x,y}a y", "xa"),
        ("/opt/a{b,c} y", "ab"),
        ("/bin/[a]b y", "ab"),
        ("/bin/[!a]m y", "rm"),
        ("/b[i]n/r[[:alpha:]] y", "rm"),
        ("/bin/[X]m y", None),
        ("/bin/q{m,} y", None),
    ],
    ids=repr,
)
def test_decide_with_many_deny_rules_never_misses_a_program_a_glob_may_name(command: str, rule: str | None) -> None:
    assert _first_deny(command) == rule
    assert rule == next((p for p in DENIED if deny_prefix_matches(p, command)), None)  # the plain scan


# --------------------------------------------------------------------------- bracket expressions


@pytest.mark.parametrize(
    ("word", "pattern", "names"),
    [
        ("[X]m", "[X]m", ("Xm",)),  # an "X" first is a member like any other
        ("[-a]m", r"[\-a]m", ("am", "-m")),  # a "-" first or last is a member
        ("[a-]m", r"[a\-]m", ("am", "-m")),
        ("[!-]m", r"[^\-]m", ("rm", "]m", "Xm", "am", "bm", ".m")),
        ("[a-c]m", "[a-c]m", ("am", "bm")),  # in the middle it is a range
        ("[a.b]m", r"[a\.b]m", ("am", "bm", ".m")),  # every other character literally
        ("[!]a]m", r"[^\]a]m", ("rm", "Xm", "bm", "-m", ".m")),
        ("[^]a]m", r"[^\]a]m", ("rm", "Xm", "bm", "-m", ".m")),
        ("[[=a=]]m", ".m", ("rm", "]m", "Xm", "am", "bm", "-m", ".m")),  # an equivalence class: any character
        ("[[.-.]]m", ".m", ("rm", "]m", "Xm", "am", "bm", "-m", ".m")),
        ("[[:alpha:]]", ".", ("r",)),
        ("[][:a]m", ".m", ("rm", "]m", "Xm", "am", "bm", "-m", ".m")),  # "[:" never closed: "]" ends the class
        ("[[:]a]m", r".a\]m", ()),
        ("[[::]a]m", ".m", ("rm", "]m", "Xm", "am", "bm", "-m", ".m")),  # "[::]": its "]" does not close
        ("[a[", r"\[a\[", ()),  # never closed, a "[" last
        ("[a[:", r"\[a\[:", ()),
        ("[[:", r"\[\[:", ()),
        ("[a[XaX]b]m", r"[a\[XaX]b\]m", ()),  # "[X" is no class: the first "]" closes
        ("[a-c-e]m", r"[a-c\-e]m", ("am", "bm", "-m")),  # after a range a "-" is a member
        ("[--.]m", r"[\--\.]m", ("-m", ".m")),  # a range from "-"
        ("[a-b--.]m", r"[a-b\--\.]m", ("am", "bm", "-m", ".m")),  # a range, then a range from "-"
        ("[a-b--]m", r"[a-b\-\-]m", ("am", "bm", "-m")),
    ],
    ids=repr,
)
def test_a_bracket_expression_is_read_exactly(word: str, pattern: str, names: tuple[str, ...]) -> None:
    [glob] = glob_words(f"ls {word}")
    assert glob.pattern.pattern == pattern
    assert _named(glob) == names


_BASH_WORDS = ["[X]m", "[-a]m", "[a-]m", "[!-]m", "[a-c]m", "[a.b]m", "[!]a]m", "[^]a]m", "[[=a=]]m", "[[.a.]]m",
               "[[:alpha:]]m", "[][:a]m", "[[:]a]m", "[[::]a]m", "[a[", "[a[:", "[a[XaX]b]m", "[a-b--c]m",
               "[a-c-e]m", "[--.]m", "[a-b--.]m", "[a-b--]m", "[--a]m"]
_BASH_STRINGS = ["Xm", "]m", "am", "bm", "cm", "rm", "-m", ".m", "[m", ":m", "=m", "[a[", "[a[:", "a]m", ":a]m",
                 "X]m", "ab]m", "m", "aam"]


def _bash_matches(words: list[str], strings: list[str]) -> dict[str, set[str]]:
    """For each pattern word, the strings bash's ``[[ s == $p ]]`` matches."""
    script = 'for p in "$@"; do for s in ' + " ".join(f"'{s}'" for s in strings) + \
        '; do [[ $s == $p ]] && printf "%s\\t%s\\n" "$p" "$s"; done; done; exit 0'
    out = subprocess.run(["bash", "-c", script, "bash", *words], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    found: dict[str, set[str]] = {w: set() for w in words}
    for line in out.splitlines():
        p, s = line.split("\t")
        found[p].add(s)
    return found


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_every_string_bash_matches_the_reading_matches_too() -> None:
    """Never less than bash: exactly bash's set where the regex can spell the class."""
    by_bash = _bash_matches(_BASH_WORDS, _BASH_STRINGS)
    assert by_bash["[a-c]m"] == {"am", "bm", "cm"}  # the referee works
    for word in _BASH_WORDS:
        [glob] = glob_words(f"ls {word}")
        ours = {s for s in _BASH_STRINGS if glob.pattern.fullmatch(s)}
        assert by_bash[word] <= ours, word
        if "[:" not in word and "[=" not in word and "[." not in word:
            assert ours == by_bash[word], word


def test_a_range_from_a_dash_compiles_without_a_warning_and_names_what_bash_names() -> None:
    """``[a-b--c]`` is ``a-b`` then ``--c``: no ``--`` that a regex warns about as a set difference
    (with warnings as errors the reading failed and every deny rule matched)."""
    re.purge()
    glob_words.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [glob] = glob_words("ls [a-b--c]m")
        assert glob.pattern.pattern == r"[a-b\--c]m"
        assert _first_deny("/bin/[a-b--c]m y") is None and not deny_prefix_matches("rm", "/bin/[a-b--c]m y")
        assert _first_deny("/bin/[x-y--s]m y") == "rm"  # "r" is in "-".."s"
