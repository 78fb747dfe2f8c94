"""The shell check's limits and tables as literal behaviour.

Other tests build their inputs from the module's own constants (``"x" * (MAX_SIMPLE_LENGTH - 4)``),
so they move with them. These write the numbers, names and messages out, as
``docs/simple-commands.md`` states them, and check that the docs and the code say the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from apollia_nb.governance import shellcheck
from apollia_nb.governance.shellcheck import (
    deny_prefix_matches,
    deny_search_text,
    evaluating_builtin,
    is_simple,
    no_always_reason,
    simple_words,
)

DOC = (Path(__file__).resolve().parent.parent / "docs" / "simple-commands.md").read_text()


def _doc_number(pattern: str) -> int:
    found = re.search(pattern, " ".join(DOC.split()))
    assert found, pattern
    return int(found.group(1).replace(",", ""))


def test_docs_state_the_limits_the_code_has() -> None:
    assert _doc_number(r"At most (\d+) characters \(`MAX_SIMPLE_LENGTH`\)") == shellcheck.MAX_SIMPLE_LENGTH == 4096
    assert _doc_number(r"longer than ([\d,]+) characters \(`MAX_DENY_LENGTH`\)") == shellcheck.MAX_DENY_LENGTH
    assert shellcheck.MAX_DENY_LENGTH == 1_000_000
    assert _doc_number(r"expansions nested (\d+) deep or more") == shellcheck._MAX_EXPANSION_PASSES == 32
    assert _doc_number(r"command strings nested more than (\d+) deep") == shellcheck._MAX_DEPTH == 8


def test_a_command_of_4096_characters_is_simple_and_one_of_4097_is_not() -> None:
    at_limit = "git " + "x" * 4092
    assert len(at_limit) == 4096
    assert simple_words(at_limit) == ("git", "x" * 4092)
    assert not is_simple(at_limit + "x")
    assert not is_simple("git " + "x" * 4093 + " ")  # trailing blanks count too
    assert evaluating_builtin("eval " + "x" * 4091) == "eval"
    assert evaluating_builtin("eval " + "x" * 4092) is None  # too long to read: not simple anyway


def test_a_deny_rule_reads_a_command_of_a_million_characters_and_matches_a_longer_one() -> None:
    at_limit = "ls " + "x" * 999_997
    assert len(at_limit) == 1_000_000
    assert not deny_prefix_matches("rm", at_limit)  # read: nothing in it runs rm
    assert deny_search_text(at_limit) is not None
    assert deny_prefix_matches("rm", at_limit + "x")  # too long to read: every deny rule with a prefix matches
    assert deny_search_text(at_limit + "x") is None


def _nested_substitutions(depth: int) -> str:
    return "echo " + "$(" * depth + "x" + ")" * depth


def test_expansions_nested_31_deep_are_read_and_32_deep_match_every_deny_rule() -> None:
    assert not deny_prefix_matches("rm", _nested_substitutions(31))
    assert deny_search_text(_nested_substitutions(31)) is not None
    assert deny_prefix_matches("rm", _nested_substitutions(32))  # too deep to unpick: refused
    assert deny_search_text(_nested_substitutions(32)) is None


@pytest.mark.parametrize("builtin", ["echo", "false", "pwd", "true", "which"])
def test_the_plain_builtins_start_simple_commands(builtin: str) -> None:
    assert simple_words(f"{builtin} x") == (builtin, "x")
    assert evaluating_builtin(f"{builtin} x") is None
    assert no_always_reason((builtin, "x")) == f"{builtin!r} is a shell builtin"


@pytest.mark.parametrize("builtin", ["printf", "test", "read", "eval", "command", "cd", "print", "kill", "type"])
def test_other_builtins_do_not(builtin: str) -> None:
    assert simple_words(f"{builtin} x") is None
    assert evaluating_builtin(f"{builtin} x") == builtin


def test_double_quotes_hold_every_printable_character_but_five() -> None:
    refused = {c for c in map(chr, range(0x20, 0x7F)) if simple_words(f'echo "a{c}b"') is None}
    assert refused == {'"', "$", "`", "\\", "!"}
    assert simple_words('echo "X"') == ("echo", "X")
    assert simple_words('echo "XX"') == ("echo", "XX")


@pytest.mark.parametrize(
    ("words", "reason"),
    [
        (("git", "status"), "'git' runs other programs, commands or program text"),
        (("make", "test"), "'make' runs other programs, commands or program text"),
        (("env",), "'env' runs other programs, commands or program text"),
        (("python3.11", "x.py"), "'python3.11' runs other programs, commands or program text"),
        (("rm", "x"), "'rm' writes, deletes or sends where its arguments say"),
        (("echo", "x"), "'echo' is a shell builtin"),
        # A version suffix is dropped: pip3.12 is pip, gcc-12 is gcc, g++-12 is g++.
        (("pip3.12", "install", "x"), "'pip3.12' runs other programs, commands or program text"),
        (("gcc-12", "x.c"), "'gcc-12' writes, deletes or sends where its arguments say"),
        (("/usr/bin/g++-12", "x.cc"), "'g++-12' writes, deletes or sends where its arguments say"),
        (("ls", "-la"), None),
        (("cat", "README.md"), None),
    ],
    ids=repr,
)
def test_why_always_is_not_offered_in_words(words: tuple[str, ...], reason: str | None) -> None:
    assert no_always_reason(words) == reason


def test_a_versioned_interpreter_is_a_wrapper_a_deny_rule_looks_through() -> None:
    assert deny_prefix_matches("pip install", "python3.11 -m pip install x")
    assert deny_prefix_matches("rm", "perl5.36 -e 1 /bin/rm")
    assert not deny_prefix_matches("pip install", "ls -m pip install x")  # not a wrapper: arguments are data


@pytest.mark.parametrize(
    "command",
    [
        "true && rm -rf /",  # a word between blanks
        "(rm -rf /)",  # between punctuation
        "ls|rm",  # at the end of the text
        "r`true`m -rf /",  # a backquoted substitution read as empty
        "r$1m -rf /",  # a positional parameter read as empty
        "${X:-rm} -rf /",  # the word a parameter expansion may give
        "${X:=/bin/rm}",
        "/bin/r? -rf /tmp/x",  # a glob word among others
        "ls; /usr/bin/[r]m -rf /tmp/x",
    ],
)
def test_a_deny_rule_for_rm_catches(command: str) -> None:
    assert simple_words(command) is None
    assert deny_prefix_matches("rm", command)


@pytest.mark.parametrize(
    "command",
    [
        "true && rmdir x",  # a longer name
        "true && x-rm y",
        "true && rm.x y",
        "true && rm/ y",
        "ls X/rm",  # a simple command: its arguments are data, not programs
        "ls Xrm",
        "cat XX",
    ],
)
def test_a_deny_rule_for_rm_lets_through(command: str) -> None:
    assert not deny_prefix_matches("rm", command)


def test_punctuation_is_read_as_blanks() -> None:
    assert deny_search_text("a|b;c&d") == "a|b;c&d\na b c d"
    assert deny_search_text("{a,b}<c>(d)") == "{a,b}<c>(d)\n a b  c  d "


def test_the_letter_x_is_a_plain_word_character() -> None:
    assert simple_words("X Xx X.X X:X X=X") == ("X", "Xx", "X.X", "X:X", "X=X")
    assert simple_words("/opt/X11/bin/Xvfb :1") == ("/opt/X11/bin/Xvfb", ":1")
    assert shellcheck.glob_words("ls X") == ()
    assert not deny_prefix_matches("Xvfb", "echo Xvfb")
    assert deny_prefix_matches("Xvfb", "/opt/X11/bin/Xvfb :1")
