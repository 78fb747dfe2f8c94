"""The simple-command check: the adversarial corpus, properties, and bash/dash as referees."""

from __future__ import annotations

import os
import shlex
import shutil
import string
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from shell_corpus import (  # noqa: E402
    ALLOW_CASES,
    ALWAYS_CASES,
    DENY_CASES,
    EVALUATED_BY_BASH,
    MARKER,
    flat,
    flat_always,
)

from apollia_nb.governance import Call, GovernanceView, Rule, decide
from apollia_nb.governance.shellcheck import (
    MAX_SIMPLE_LENGTH,
    NO_ALWAYS,
    PLAIN_BUILTINS,
    RESERVED_WORDS,
    RUNS_PROGRAMS,
    SHELL_BUILTINS,
    WRAPPERS,
    WRITES_BY_ARGUMENT,
    allow_prefix_matches,
    deny_prefix_matches,
    evaluating_builtin,
    is_simple,
    no_always_reason,
    simple_words,
)

ALLOW = flat(ALLOW_CASES)
DENY = flat(DENY_CASES)
ALWAYS = flat_always()


def _case_id(case: tuple[str, str, str, bool]) -> str:
    category, command, prefix, want = case
    shown = ascii(command[:60] + ("…" if len(command) > 60 else ""))
    return f"{category}:{shown}~{ascii(prefix)}->{'yes' if want else 'no'}"


def _execute(command: str) -> Call:
    return Call(agent="clerk", tool="bash_executor", family="execute", arguments={"command": command})


# --------------------------------------------------------------------------- corpus


def test_corpus_is_large_and_covers_every_category() -> None:
    assert len(ALLOW) >= 150
    assert all(rows for rows in ALLOW_CASES.values())
    assert all(rows for rows in DENY_CASES.values())
    assert sum(1 for *_, want in ALLOW if want) >= 30
    assert sum(1 for *_, want in DENY if not want) >= 10


@pytest.mark.parametrize("case", ALLOW, ids=[_case_id(c) for c in ALLOW])
def test_allow_corpus(case: tuple[str, str, str, bool]) -> None:
    _, command, prefix, want = case
    assert allow_prefix_matches(prefix, command) is want
    if want:
        assert is_simple(command) and is_simple(prefix)


@pytest.mark.parametrize("case", ALLOW, ids=[_case_id(c) for c in ALLOW])
def test_allow_corpus_through_decide(case: tuple[str, str, str, bool]) -> None:
    _, command, prefix, want = case
    view = GovernanceView(
        rules=[Rule(tool="bash_executor", prefix=prefix, effect="allow")], developer_mode=True
    )
    decision = decide(_execute(command), view)
    assert decision.allowed is want
    assert decision.line == 4
    # Without developer mode nothing executes unasked.
    assert not decide(_execute(command), GovernanceView(rules=view.rules)).allowed


def test_the_evaluated_argument_and_always_families_are_large() -> None:
    evaluated = ALLOW_CASES["evaluating-builtins"] + ALLOW_CASES["plain-builtins-and-external-programs"]
    assert len(evaluated) + len(DENY_CASES["evaluating-builtins"]) + len(ALWAYS) >= 250
    assert sum(1 for *_, want in ALWAYS if not want) >= 100
    assert len({cat for cat, *_ in ALWAYS}) == len(ALWAYS_CASES)


@pytest.mark.parametrize("case", ALWAYS, ids=[f"{c[0]}:{c[1]!r}->{'yes' if c[2] else 'no'}" for c in ALWAYS])
def test_always_corpus_through_decide(case: tuple[str, str, bool]) -> None:
    """``always`` writes a rule with the command as prefix: only where that allows nothing more."""
    _, command, want = case
    words = simple_words(command)
    assert words is not None, "every always case is a simple command"
    assert (no_always_reason(words) is None) is want
    d = decide(_execute(command), GovernanceView(developer_mode=True))
    assert (d.outcome, d.line) == ("ask", 4)
    assert d.answers == (("once", "always", "refuse") if want else ("once", "refuse"))
    if not want:
        assert "no always:" in d.reason and "would allow more than this command" in d.reason


@pytest.mark.parametrize("program", sorted(NO_ALWAYS))
def test_no_program_in_the_list_is_offered_always_in_any_spelling(program: str) -> None:
    for spelled in (program, f"/usr/bin/{program}", f"/opt/x/bin/{program}"):
        words = simple_words(f"{spelled} x")
        if words is None:  # a builtin that evaluates: never simple, so never asked with always
            assert program in RESERVED_WORDS or program in SHELL_BUILTINS - PLAIN_BUILTINS
            continue
        assert no_always_reason(words) is not None, spelled
        d = decide(_execute(f"{spelled} x"), GovernanceView(developer_mode=True))
        assert "always" not in d.answers


@pytest.mark.parametrize("builtin", sorted(SHELL_BUILTINS - PLAIN_BUILTINS))
def test_a_builtin_that_may_evaluate_is_never_simple(builtin: str) -> None:
    for command in (builtin, f"{builtin} x", f"'{builtin}' x", f'"{builtin}" -v \'{MARKER}\''):
        assert not is_simple(command), command
        assert evaluating_builtin(command) == builtin
        view = GovernanceView(rules=[Rule(tool="bash_executor", prefix=builtin, effect="allow")], developer_mode=True)
        d = decide(_execute(command), view)
        assert (d.outcome, d.line, d.answers) == ("ask", 4, ("once", "refuse"))
        assert f"the shell builtin {builtin!r} may evaluate its arguments as code" in d.reason
    assert evaluating_builtin(f"/usr/bin/{builtin} x") is None  # a program on disk is not the builtin


@pytest.mark.parametrize("case", DENY, ids=[_case_id(c) for c in DENY])
def test_deny_corpus(case: tuple[str, str, str, bool]) -> None:
    _, command, prefix, want = case
    assert deny_prefix_matches(prefix, command) is want


@pytest.mark.parametrize("case", DENY, ids=[_case_id(c) for c in DENY])
def test_deny_corpus_through_decide_beats_a_blanket_allow(case: tuple[str, str, str, bool]) -> None:
    _, command, prefix, want = case
    view = GovernanceView(
        rules=[
            Rule(tool="bash_executor", prefix=prefix, effect="deny"),
            Rule(tool="bash_executor", effect="allow"),
        ],
        developer_mode=True,
    )
    decision = decide(_execute(command), view)
    assert (decision.line == 2 and decision.outcome == "refuse") is want


# --------------------------------------------------------------------------- words


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("git status", ("git", "status")),
        ("  git   status  ", ("git", "status")),
        ("'git' \"status\"", ("git", "status")),
        ("git st\"atus\"", ("git", "status")),
        ("git status -- 'file name.txt'", ("git", "status", "--", "file name.txt")),
        ("git commit -m ''", ("git", "commit", "-m", "")),
        ("echo 'a\"b' \"c'd\"", ("echo", 'a"b', "c'd")),
        ("echo a'b c'd", ("echo", "ab cd")),
        ("echo '$(x)' \"a;b\"", ("echo", "$(x)", "a;b")),
        ("git log --format=%H@%an:%s", ("git", "log", "--format=%H@%an:%s")),
    ],
)
def test_simple_words_removes_quotes_like_the_shell(command: str, words: tuple[str, ...]) -> None:
    assert simple_words(command) == words
    assert is_simple(command)


@pytest.mark.parametrize("word", sorted(RESERVED_WORDS))
def test_no_reserved_word_starts_a_simple_command(word: str) -> None:
    assert not is_simple(f"{word} x")
    assert not is_simple(shlex.quote(word) + " x")


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_wrapper_never_matches_a_rule_for_the_wrapped_command(wrapper: str) -> None:
    command = f"{wrapper} git status"
    assert not allow_prefix_matches("git status", command)
    assert not allow_prefix_matches("git", command)
    assert deny_prefix_matches("git status", command)
    assert deny_prefix_matches("rm", f"{wrapper} -x 1 rm -rf /")
    if is_simple(command):
        assert allow_prefix_matches(wrapper, command)  # only when the rule names the wrapper


@pytest.mark.parametrize("bad", [None, 42, b"git status", ["git", "status"], object()])
def test_non_text_never_raises(bad: object) -> None:
    assert simple_words(bad) is None  # type: ignore[arg-type]
    assert is_simple(bad) is False  # type: ignore[arg-type]
    assert allow_prefix_matches(bad, "git status") is False  # type: ignore[arg-type]
    assert allow_prefix_matches("git", bad) is False  # type: ignore[arg-type]
    assert deny_prefix_matches(bad, "git status") is True  # type: ignore[arg-type]
    assert deny_prefix_matches("git", bad) is True  # type: ignore[arg-type]


def test_an_empty_allow_prefix_matches_nothing_here() -> None:
    # decide() treats a rule with an empty prefix as having none; this function never
    # widens an empty prefix into "everything".
    assert not allow_prefix_matches("", "git status")
    assert not allow_prefix_matches("   ", "git status")


def test_a_blank_deny_prefix_matches_everything() -> None:
    assert deny_prefix_matches("  ", "git status")
    assert deny_prefix_matches("''", "ls")


def test_very_long_inputs_are_decided_quickly() -> None:
    huge = "git status " + "a " * 400_000
    assert not is_simple(huge)
    assert deny_prefix_matches("rm", huge + "; rm -rf /")
    assert not deny_prefix_matches("rm", huge + "; ls")
    assert deny_prefix_matches("rm", "x" * 1_000_001)  # beyond the deny limit: caught
    nested = "bash -c " + "'bash -c " * 30 + "rm" + "'" * 30
    assert deny_prefix_matches("rm", nested)


# --------------------------------------------------------------------------- properties

_REJECTED_OUTSIDE_QUOTES = list(";&|<>()$`{}[]*?~#!\\^")
_ASCII_PRINTABLE = [chr(c) for c in range(0x20, 0x7F)]
_plain = st.text(alphabet=sorted(set(string.ascii_letters + string.digits + "_-./:@%+,= ")), max_size=8)
_single = st.text(alphabet=[c for c in _ASCII_PRINTABLE if c != "'"], max_size=8).map(lambda s: f"'{s}'")
_double = st.text(
    alphabet=[c for c in _ASCII_PRINTABLE if c not in '"$`\\!'], max_size=8
).map(lambda s: f'"{s}"')
_pieces = st.lists(st.one_of(_plain, _single, _double), max_size=5).map("".join)
_FAST = settings(max_examples=300, deadline=None)


@_FAST
@given(_pieces, st.sampled_from(_REJECTED_OUTSIDE_QUOTES), _pieces)
def test_a_metacharacter_outside_quotes_is_never_simple(before: str, meta: str, after: str) -> None:
    assert not is_simple("git " + before + meta + after)
    assert not is_simple(before + meta + after)


@_FAST
@given(_pieces, st.text(alphabet=[c for c in _ASCII_PRINTABLE if c != '"'], max_size=6),
       st.sampled_from(list("$`\\!")), _pieces)
def test_expansion_characters_inside_double_quotes_are_never_simple(
    before: str, inside: str, meta: str, after: str
) -> None:
    assert not is_simple(f'git {before}"{inside}{meta}"{after}')


@_FAST
@given(_pieces, st.characters(exclude_categories=()).filter(lambda c: not " " <= c <= "~"), _pieces)
def test_a_control_or_non_ascii_character_anywhere_is_never_simple(before: str, odd: str, after: str) -> None:
    assert not is_simple(f"git {before}{odd}{after}")
    assert not is_simple(f"git '{before}{odd}'")


@_FAST
@given(st.text(max_size=40), st.text(max_size=40))
def test_nothing_raises_and_allow_implies_simple_and_denied(prefix: str, command: str) -> None:
    allowed = allow_prefix_matches(prefix, command)
    denied = deny_prefix_matches(prefix, command)
    assert isinstance(allowed, bool) and isinstance(denied, bool)
    if allowed:
        assert is_simple(command) and is_simple(prefix)
        assert denied  # a deny rule with the same prefix always wins


_program = st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=6).filter(
    lambda w: w not in RESERVED_WORDS and (w not in SHELL_BUILTINS or w in PLAIN_BUILTINS)
)
_args = st.lists(st.text(alphabet=_ASCII_PRINTABLE, max_size=8), max_size=4)


def _always_quoted(word: str) -> str:
    return "'" + word.replace("'", "'\"'\"'") + "'"


@_FAST
@given(_program, _args)
def test_quoted_words_round_trip(program: str, args: list[str]) -> None:
    command = " ".join([shlex.quote(program), *map(_always_quoted, args)])
    assert simple_words(command) == (program, *args)
    assert allow_prefix_matches(program, command)
    assert allow_prefix_matches(command, command)


@_FAST
@given(_program, _args, st.sampled_from(["", "/bin/", "./"]))
def test_a_deny_rule_sees_through_wrapping(program: str, args: list[str], path: str) -> None:
    command = " ".join(shlex.quote(w) for w in [path + program, *args])
    for wrapped in [
        command,
        f"sudo -u root {command}",
        f"env A=1 {command}",
        f"timeout 5 {command}",
        f"echo x; {command}",
        f"true && {command}",
        f"$({command})",
        f"bash -c {shlex.quote(command)}",
        f"X=1 {command}",
        f"{command} &",
    ]:
        assert deny_prefix_matches(program, wrapped), wrapped


# --------------------------------------------------------------------------- shells as referees

_SHELLS = [s for s in ("bash", "dash") if shutil.which(s)]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose files a glob would match, so a missed expansion shows."""
    root = tmp_path_factory.mktemp("shell")
    for name in ("a", "ab", "b", "x.py", "[ab]", "~"):
        (root / name).write_text("")
    return root


def _argv_by_shell(shell: str, command: str, cwd: Path) -> list[str] | None:
    """The words the shell passes to printf for ``printf '<%s>\\n' COMMAND``."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "IFS": " "}
    proc = subprocess.run(
        [shell, "-c", "printf '<%s>\\n' " + command],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=10,
    )
    if proc.returncode != 0:
        return None
    return [line[1:-1] for line in proc.stdout.split("\n")[:-1]]


def _expected_printf(words: tuple[str, ...]) -> list[str]:
    return list(words) if words else [""]


@pytest.mark.skipif(not _SHELLS, reason="no POSIX shell to compare with")
@pytest.mark.parametrize("shell", _SHELLS)
def test_shells_agree_with_every_simple_corpus_command(shell: str, sandbox: Path) -> None:
    commands = {cmd for _, cmd, _, _ in ALLOW + DENY if is_simple(cmd) and len(cmd) < 200}
    assert len(commands) > 40
    for command in sorted(commands):
        words = simple_words(command)
        assert words is not None
        assert _argv_by_shell(shell, command, sandbox) == _expected_printf(words), command


_noisy = st.lists(
    st.one_of(_plain, _single, _double, st.sampled_from(_REJECTED_OUTSIDE_QUOTES + ["'", '"', "\t"])),
    max_size=6,
).map("".join)


@pytest.mark.skipif(not _SHELLS, reason="no POSIX shell to compare with")
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_noisy)
def test_whatever_is_simple_is_read_the_same_by_the_shells(sandbox: Path, tail: str) -> None:
    words = simple_words("x " + tail)
    if words is None:
        return
    for shell in _SHELLS:
        assert _argv_by_shell(shell, tail, sandbox) == _expected_printf(words[1:]), (shell, tail)


# The evaluated-argument family: bash and dash run each accepted command with the
# payload, and nothing may be evaluated.

_PAYLOAD_TEMPLATES = [
    "{b} -v 'a[$(touch MARKER)]' x",
    "{b} 'a[$(touch MARKER)]'",
    "{b} -p 'a[$(touch MARKER)]'",
    "{b} 'touch MARKER' EXIT",
    "{b} -C 'touch MARKER' x",
    "{b} -W '$(touch MARKER)' x",
    "{b} -x 'touch MARKER'",
    "{b} touch MARKER",
    "{b} -i 'x=a[$(touch MARKER)]'",
    "{b} -n x -o -v 'a[$(touch MARKER)]'",
]


def _evaluated_by(shell: str, command: str, root: Path) -> bool:
    """Whether ``shell -c command``, run as ``bash_executor`` runs it, creates the marker."""
    scratch = Path(tempfile.mkdtemp(dir=root))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(scratch)}
    subprocess.run([shell, "-c", command], check=False, cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=10)
    return (scratch / MARKER).exists()


def _payload_commands() -> list[str]:
    corpus = {cmd for _, cmd, _, _ in ALLOW + DENY if MARKER in cmd}
    programs = SHELL_BUILTINS | {"ls", "cat", "wc", "/usr/bin/printf", "/usr/bin/test", "env printf", "nice printf"}
    swept = {t.format(b=b) for t in _PAYLOAD_TEMPLATES for b in sorted(programs)}
    return sorted(corpus | swept)


@pytest.mark.skipif(not _SHELLS, reason="no POSIX shell to compare with")
@pytest.mark.parametrize("shell", _SHELLS)
def test_shells_evaluate_nothing_in_an_accepted_command(shell: str, tmp_path: Path) -> None:
    commands = _payload_commands()
    accepted = [c for c in commands if is_simple(c) and not _runs_anything(simple_words(c))]
    assert len(accepted) >= 30
    assert not [c for c in accepted if _evaluated_by(shell, c, tmp_path)]


def _runs_anything(words: tuple[str, ...] | None) -> bool:
    """A wrapper given ``touch MARKER`` as its command runs it by design: not evaluation."""
    return words is not None and _basename(words[0]) in WRAPPERS and "touch" in words


def _basename(word: str) -> str:
    return word.rsplit("/", 1)[-1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_runs_the_payload_of_every_command_the_check_rejects_for_it(tmp_path: Path) -> None:
    """The referee works: bash does evaluate these words, and none of them is simple."""
    for command in EVALUATED_BY_BASH:
        assert not is_simple(command), command
        assert deny_prefix_matches("touch", command), command
        assert _evaluated_by("bash", command, tmp_path), command


def test_shellcheck_compiles_no_ambiguous_pattern() -> None:
    """No ``FutureWarning: Possible nested set`` (``[[`` in a class) on import or on glob words."""
    code = (
        "import warnings\n"
        "from apollia_nb.governance import shellcheck as s\n"  # import under -W error
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    for c in ['ls [[a]', 'ls [[:alpha:]]m', 'x [[.r.]] [[=a=]]', '/bin/r[[]', 'r[!]]m', 'a[b&&c]']:\n"
        "        s.deny_prefix_matches('rm', c)\n"
        "print([str(w.message) for w in seen])\n"
    )
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], check=False, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_simple_length_limit_is_exact() -> None:
    at_limit = "git " + "x" * (MAX_SIMPLE_LENGTH - 4)
    assert is_simple(at_limit)
    assert not is_simple(at_limit + "x")


_deny_word = st.sampled_from(["rm", "-rf", "/", "git", "push", "sudo", "x", "/bin/rm", "'rm'", "r''m"])
_deny_glue = st.sampled_from([" ", "  ", "; ", " && ", " | ", "\n", " $(", ")", "'", '"', "\\", "\t"])
_deny_text = st.lists(st.one_of(_deny_word, _deny_glue), max_size=8).map("".join)


@_FAST
@given(_deny_text, _deny_text)
def test_decide_refuses_exactly_when_the_deny_rule_matches(prefix: str, command: str) -> None:
    view = GovernanceView(rules=[Rule(tool="bash_executor", prefix=prefix, effect="deny")], developer_mode=True)
    refused = decide(_execute(command), view).line == 2
    assert refused is (prefix == "" or deny_prefix_matches(prefix, command))


# --------------------------------------------------------------------------- docs

_DOC = Path(__file__).parent.parent / "docs" / "simple-commands.md"


def _listed_after(marker: str) -> set[str]:
    text = _DOC.read_text(encoding="utf-8")
    block = text.split(f"<!-- {marker} -->", 1)[1].split("```", 2)[1]
    return set(block.split())


def test_docs_list_exactly_the_wrappers() -> None:
    assert _listed_after("wrappers") == WRAPPERS


def test_docs_list_exactly_the_reserved_words() -> None:
    assert _listed_after("reserved-words") == RESERVED_WORDS


def test_docs_list_exactly_the_builtins_and_the_programs_never_offered_always() -> None:
    assert _listed_after("builtins") == SHELL_BUILTINS
    assert _listed_after("plain-builtins") == PLAIN_BUILTINS
    assert _listed_after("runs-programs") == RUNS_PROGRAMS
    assert _listed_after("writes-by-argument") == WRITES_BY_ARGUMENT
    assert NO_ALWAYS == WRAPPERS | RUNS_PROGRAMS | WRITES_BY_ARGUMENT | SHELL_BUILTINS


class _Sly(str):
    """A string that shows one text to iteration and str() and holds another."""

    def __iter__(self):  # type: ignore[override]
        return iter("git status")

    def __str__(self) -> str:
        return "git status"


def test_a_str_subclass_is_read_by_its_real_text() -> None:
    sly = _Sly("git status; rm -rf /")
    assert simple_words(sly) is None
    assert not allow_prefix_matches("git status", sly)
    assert deny_prefix_matches("rm", sly)


def test_deny_length_limit_is_exact() -> None:
    from apollia_nb.governance.shellcheck import MAX_DENY_LENGTH, deny_search_text

    at_limit = "ls " + "x" * (MAX_DENY_LENGTH - 3)
    assert len(at_limit) == MAX_DENY_LENGTH
    assert not deny_prefix_matches("rm", at_limit)  # read, and it runs no rm
    assert deny_search_text(at_limit) is not None
    assert deny_prefix_matches("rm", at_limit + "x")  # too long to read: a deny matches
    assert deny_search_text(at_limit + "x") is None


@pytest.mark.parametrize(
    ("command", "want"),
    [
        ("/bin/[z-a]m -rf /", True),  # a glob that cannot be read names every program
        ("[z-a]s x", True),
        ("./r? -rf /", True),
        ("a/r* x", True),
        ("/bin/r? -rf /", True),
        ("/bin/l? x", False),  # no program l? names is rm
        ("/bin/[!r]m x", False),
        ("./l* x", False),
    ],
    ids=repr,
)
def test_a_glob_program_matches_a_deny_exactly_when_it_may_name_it(command: str, want: bool) -> None:
    assert deny_prefix_matches("rm", command) is want
    d = decide(Call(agent="clerk", tool="bash_executor", family="execute", arguments={"command": command}),
               GovernanceView(rules=[Rule("bash_executor", "deny", "rm", id="rm")]))
    assert (d.rule_id == "rm") is want
