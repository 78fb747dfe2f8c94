"""Where a tool call is decided: ``decide(call, view) -> Decision``.

Pure: no I/O, no clock, no globals. The store keeps a ``GovernanceView`` snapshot
current; this module only reads it. The six lines are read in order and
the first that applies decides:

1. organisation policy refuses the tool, its connection or its family → refuse
2. a fine ``deny`` rule matches → refuse
3. family ``read``, ``conversation`` or ``memory`` → allow
4. family ``execute`` → allow only in developer mode, by a matching ``allow``
   rule, for one simple command; otherwise ask (``once``/``refuse``, plus
   ``always`` in developer mode for a simple command whose program cannot make
   a rule with it as prefix allow more: not a wrapper, interpreter, shell
   builtin, program that writes by argument, or file outside the system's
   program folders — see ``shellcheck.no_always_reason``); a call whose
   first argument is not shell text (``Call.shell`` false: Python, SQL) is
   always asked ``once``/``refuse``
5. family ``profile`` → ask (``once``/``refuse``); so does a ``write`` call of a
   file tool whose path is in a ``.git`` directory (git runs programs its files
   name: an allowed ``git status`` would run them), and one whose path lands
   where the process running the tools imports or runs code (``Call.code_places``:
   a module on its import path, a ``.pth`` file, ``__pycache__``, site-packages,
   the IPython and Jupyter folders, ``PATH`` — see ``code_places``); any other
   classified call → allow on a standing consent of the agent for the family,
   or a run grant
6. anything left → ask (``once``/``always``/``refuse``; unclassified:
   ``once``/``refuse``)

Fail closed: an unreadable view (``readable=False``) keeps lines 1–3 and refuses
everything else with line 0. Nothing here turns an error into an allow.

How rules match (``rule_matches`` states it for one rule; ``decide`` gets the same
answer from an index built once per snapshot):

- A ``deny`` rule without a prefix matches every call of its tool. With a prefix it
  matches broadly, because refusing too much is safe and too little is not: the
  first argument starts with the prefix, as text or as a normalised path (a list,
  tuple or mapping: also any string inside it, at any depth); for a file tool,
  whose call carries the names its path resolves to (``Call.paths``), as text or
  as one of those names (``path_prefix_matches``); for
  ``execute`` calls (and unclassified ones, which may run commands too) the
  simple-command check's deny matching decides instead of (unclassified: as well
  as) the text match. A first argument that is not a string is matched as its text;
  one whose text cannot be read matches every deny rule of its tool.
- A deny rule names its tool in any case (``Read_File`` refuses ``read_file``):
  a rule that silently matched nothing would refuse too little. An allow rule
  names its tool exactly.
- An ``allow`` rule acts on line 4 only. It needs a prefix — an allow rule on a
  shell without one would be a blanket allow on everything — and matches a single
  simple command whose words begin with the prefix's words (``git status``
  matches ``git status --short``, not ``git statusx``). Only a string first
  argument is a command.
"""

from __future__ import annotations

import enum
import posixpath
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from apollia_nb.governance import shellcheck
from apollia_nb.governance.code_places import CodePlaces, code_place_reason

__all__ = [
    "Family",
    "Outcome",
    "Answer",
    "Effect",
    "Call",
    "Rule",
    "Policy",
    "GovernanceView",
    "Decision",
    "decide",
    "first_argument",
    "rule_matches",
    "path_prefix_matches",
    "leaf_texts",
    "url_form",
    "READ_ONLY_FAMILIES",
]


class Family(str, enum.Enum):
    """A tool's family of action. Equal to its string; ``None`` means unclassified."""

    READ = "read"
    READ_PERSONAL = "read_personal"
    WRITE = "write"
    SEND = "send"
    EXECUTE = "execute"
    CONVERSATION = "conversation"
    MEMORY = "memory"
    PROFILE = "profile"

    def __str__(self) -> str:
        return self.value


class Outcome(str, enum.Enum):
    ALLOW = "allow"
    REFUSE = "refuse"
    ASK = "ask"

    def __str__(self) -> str:
        return self.value


class Answer(str, enum.Enum):
    ONCE = "once"
    ALWAYS = "always"
    REFUSE = "refuse"

    def __str__(self) -> str:
        return self.value


class Effect(str, enum.Enum):
    ALLOW = "allow"
    DENY = "deny"

    def __str__(self) -> str:
        return self.value


READ_ONLY_FAMILIES = frozenset({Family.READ, Family.CONVERSATION, Family.MEMORY})

# Deny rules on these calls are matched as shell commands (unclassified: as well).
_COMMAND_FAMILIES = frozenset({Family.EXECUTE, None})


def _family(value: Family | str | None) -> Family | None:
    """``None`` stays unclassified; any other value must name a family (ValueError)."""
    if value is None or isinstance(value, Family):
        return value
    return Family(value)


def _text(name: str, value: object) -> str:
    """``value`` as a plain ``str``: a subclass cannot change how it compares or matches."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, not {type(value).__name__}")
    return str.__str__(value)


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call to decide. ``arguments``' first item is the first argument.

    ``family`` is a ``Family``, its string or ``None`` (unclassified); any other
    string raises ``ValueError`` here, before anything is decided.

    ``paths`` is set for a file tool: the names of the file its first argument
    resolves to (workspace-relative and absolute), worked out by the same function
    the tool uses. Deny prefixes are then matched against them as paths; ``None``
    means the call is not a file tool's.

    ``shell`` says whether an ``execute`` call's first argument is shell text, run
    by bash. The simple-command proof is a proof about shell text only: code in
    another language (``python_executor``'s Python, SQL) can read as one simple
    command and still run anything — ``1 or '\\'';import os;…#'`` is bash's ``1``
    with two words and Python's ``import os``. So with ``shell=False`` no allow rule
    allows the call and ``always`` is never offered: it is asked ``once``/``refuse``.

    ``aliases`` are other spellings of the first argument naming what the tool acts
    on, worked out by the tool's own parser: for ``http_request``, the URL as the
    HTTP client reads it (``HTTPS://u@API.example.com.:443/x`` and
    ``https://example.org\\@api.example.com/`` both go to ``https://api.example.com``).
    Deny prefixes are matched against each as text, like the first argument.

    ``code_places`` are where the process that runs the tool imports or runs code
    (worked out at the edge with ``paths``: ``apollia_nb.runtime.paths.code_places``).
    A ``write`` call whose absolute ``paths`` land in one is asked every time
    (line 5); ``None``: not given, nothing is compared.
    """

    agent: str
    tool: str
    family: Family | None = None
    arguments: Mapping[str, Any] = field(default_factory=dict)
    connection: str | None = None
    run_grants: frozenset[Family] = frozenset()
    paths: tuple[str, ...] | None = None
    shell: bool = True
    aliases: tuple[str, ...] = ()
    code_places: CodePlaces | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "agent", _text("agent", self.agent))
        if not isinstance(self.shell, bool):  # "false" must not read as true
            raise TypeError(f"shell must be True or False, not {self.shell!r}")
        object.__setattr__(self, "tool", _text("tool", self.tool))
        object.__setattr__(self, "family", _family(self.family))
        if self.arguments is None:
            object.__setattr__(self, "arguments", {})
        elif not isinstance(self.arguments, Mapping):
            raise TypeError(f"arguments must be a mapping, not {type(self.arguments).__name__}")
        if self.connection is not None:
            object.__setattr__(self, "connection", _text("connection", self.connection))
        grants = frozenset(_family(g) for g in (self.run_grants or ()))
        object.__setattr__(self, "run_grants", grants - {None})
        if self.paths is not None:
            if isinstance(self.paths, str):
                raise TypeError("paths must be a sequence of strings, not a string")
            object.__setattr__(self, "paths", tuple(_text("path", p) for p in self.paths))
        if isinstance(self.aliases, str):
            raise TypeError("aliases must be a sequence of strings, not a string")
        object.__setattr__(self, "aliases", tuple(_text("alias", a) for a in (self.aliases or ())))
        if self.code_places is not None and not isinstance(self.code_places, CodePlaces):
            raise TypeError(f"code_places must be CodePlaces or None, not {type(self.code_places).__name__}")


@dataclass(frozen=True, slots=True)
class Rule:
    """A fine rule: a tool, an optional prefix of its first argument, an effect, a scope.

    ``agent`` is one agent's name or ``"*"`` for every agent. An empty prefix is no prefix.
    """

    tool: str
    effect: Effect = Effect.DENY
    prefix: str | None = None
    agent: str = "*"
    id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool", _text("tool", self.tool))
        object.__setattr__(self, "agent", _text("agent", self.agent))
        object.__setattr__(self, "effect", Effect(self.effect))
        if self.prefix is not None:
            object.__setattr__(self, "prefix", _text("prefix", self.prefix))
        if self.prefix == "":
            object.__setattr__(self, "prefix", None)


@dataclass(frozen=True, slots=True)
class Policy:
    """An accepted organisation policy's refusals, and who must approve which calls."""

    refuse_tools: frozenset[str] = frozenset()
    refuse_connections: frozenset[str] = frozenset()
    refuse_families: frozenset[Family] = frozenset()
    #: Who must approve calls (``governance/approvals.py``): ``(kind, name, four_eyes, approvers)``,
    #: kind ``tool`` or ``family``. Never decides a call; read when a card is answered.
    approvals: tuple[tuple[str, str, bool, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "refuse_tools", frozenset(_text("tool", t) for t in (self.refuse_tools or ())))
        object.__setattr__(
            self, "refuse_connections", frozenset(_text("connection", c) for c in (self.refuse_connections or ()))
        )
        object.__setattr__(
            self, "refuse_families", frozenset(Family(f) for f in (self.refuse_families or ()))
        )


# --- paths ----------------------------------------------------------------------------
#
# A deny prefix on a file tool is matched against the names of the file the call's
# path resolves to. Prefix and names are put in one form first: ``..``, ``.`` and
# repeated slashes folded, a relative one written from ``./`` (so ``secrets``,
# ``./secrets`` and ``secrets//`` agree and the workspace root is ``.``), an absolute
# one from ``/``. A prefix ending in ``/`` (or ``/.``), and ``.`` or ``/`` alone, name a
# directory: it matches that path and everything below it, at a component boundary
# (``secrets/`` matches ``secrets`` and ``secrets/k``, not ``secretsX``). Any other
# prefix matches as text on that form (``secrets`` also matches ``secrets.txt`` and
# ``secretsX/k``; ``notes/draft`` matches ``notes/draft-2.md``).


def _path_form(path: str) -> str:
    normal = posixpath.normpath(path)
    if normal.startswith("//"):  # normpath keeps two leading slashes; the file system does not
        normal = "/" + normal.lstrip("/")
    if normal.startswith("/") or normal == ".":
        return normal
    return "./" + normal


def _path_prefix(prefix: str) -> tuple[str, bool]:
    """The prefix's form and whether it names a directory (matched at a component boundary)."""
    form = _path_form(prefix)
    directory = prefix.endswith(("/", "/.", "/..")) or prefix in (".", "..")  # (the only forms "." and "/" come from)
    if directory and not form.endswith("/"):
        form += "/"
    return form, directory


def _path_hit(form: str, directory: bool, name_form: str) -> bool:
    return (name_form + "/").startswith(form) if directory else name_form.startswith(form)


def url_form(text: str) -> str:
    """An ``http``/``https`` URL with its scheme and host in lower case, a default port,
    user information and a host's final dot dropped; any other text as it is.

    A deny prefix is also matched in this form, and a URL's aliases are written in
    it, so ``HTTPS://API.Example.com:443`` and ``https://api.example.com`` agree.
    """
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        return text
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    host = authority.rpartition("@")[2].lower()
    default = ":443" if scheme == "https" else ":80"
    if host.endswith(default):
        host = host[: -len(default)]
    name, colon, port = host.rpartition(":")  # IPv6: [::1]:8080 keeps a ":" in name, [::1] ends in "1]"
    if colon and port.isdigit() and ":" not in name:
        host = f"{name.rstrip('.')}:{port}"
    elif not colon:
        host = host.rstrip(".") if not host.startswith("[") else host
    return f"{scheme}://{host}{tail}"


def _in_git_directory(path: str) -> bool:
    """Whether a file tool's resolved name is ``.git`` or lies inside one (any case)."""
    return any(part.casefold() == ".git" for part in path.split("/"))


def path_prefix_matches(prefix: str, path: str) -> bool:
    """Whether a deny ``prefix`` matches the resolved ``path`` of a file tool (see above)."""
    form, directory = _path_prefix(prefix)
    return _path_hit(form, directory, _path_form(path))


# --- the rule index -----------------------------------------------------------------
#
# A view may hold thousands of rules, and decide() runs on every tool call. So the
# view arranges its rules once, per (tool, scope), and decide() reads only those that
# can match. Positions are indexes into ``GovernanceView.rules``: when several rules
# match, the first in the view decides, exactly as a plain scan would.
#
# Deny rules on commands are matched by ``shellcheck.deny_prefix_matches``, which
# parses the command. Calling it once per rule is what makes many rules slow, so a
# rule is skipped when it provably cannot match. Only rules whose prefix is made of
# plain word characters and blanks (no quotes, escapes or operators) are keyed, so
# their words are ``prefix.split()``; the others are always checked. A keyed rule
# can match a command in two ways only:
#
# - through its words: each of them (the first possibly as its basename: ``/bin/rm``
#   also refuses ``rm``) is a substring of ``shellcheck.deny_search_text(command)``,
#   every text the matcher reads words from (a simple command's words, command
#   strings after a wrapper, the readings of any other command: quotes removed,
#   expansions taken as empty or as spaces, Unicode folded), and the first word (or
#   its basename) occurs there at a word's edges: not after a character of
#   ``shellcheck.WORD_INSIDE``, not before one of them or ``/``. A first word (or
#   basename) made only of those characters is then one of the text's
#   ``shellcheck.WORD_RUNS``, the runs of them between such edges: a table from
#   those words to their rules finds the rules whose first word occurs there
#   (``terraform`` does not name ``rm``). Rules whose first word holds another
#   character (``user@host``, ``a=b``, ``dir/``) are always checked;
# - through a glob word (``/bin/r?``, ``[r]m``, ``{r,}m``, ``*``) that may expand to
#   its first word. Every string such a word matches ends with the word's literal
#   tail, so only first words that end with the tail (or that the tail ends with)
#   are tried; a word without a tail but with a literal head (``gitx?``, ``${x:-rm}``)
#   names only first words ``w`` where ``w``, ``/w`` or ``x/w`` starts with the head,
#   or (a word with a ``/``: ``/bin/r?``) ``w`` starts with the literal head of the part
#   after the last ``/``; and each way has the lengths it may name
#   (``GlobWord.lengths``, ``last_lengths``: ``/bin/r?`` names a 2-letter ``w`` through
#   its last part), so such first words are also found by first character and length.
#   They are tried in view order, with ``shellcheck.glob_may_name``: the first one
#   named decides, since a named program is a match whatever the other words are.
#
# The matcher also matches whatever the prefix is when it cannot read the command
# (too long, nested too deep, an internal failure: ``deny_search_text`` is None then)
# and when a glob word may name any program (``*``, ``{a/,b}x``). A word that occurs
# in no command (``_ABSENT``) detects the second case: when a glob word may name it,
# or the text holds it, every rule is checked. (Asking the matcher itself about
# ``_ABSENT`` gives the same answer, at the cost of reading the command once more;
# a property test holds the two together.)
# The candidates are then checked with the matcher itself, in view order.
# ``tests/test_decision_properties.py`` compares decide() with a plain scan over
# ``rule_matches`` to hold this.

_WORD_CHARS = string.ascii_letters + string.digits + "_./:@%+,=-"
_PLAIN_PREFIX = frozenset(_WORD_CHARS + " \t")
_ABSENT = "zq0absent0qz"
_SCAN_AT_MOST = 4  # this few rules are checked one by one: searching costs more
_FEW_LENGTHS = 16  # a glob word's part after its last "/" this few lengths apart: programs found by length

# (position, prefix, the prefix's other words)
_KeyedDeny = tuple[int, str, tuple[str, ...]]
# (position of the first rule with this first word, the word, that rule's prefix)
_Program = tuple[int, str, str]


@dataclass(frozen=True, slots=True)
class _Search:
    """A command as the index reads it: its search text, the words it holds at a word's
    edges (``shellcheck.WORD_RUNS``) and its glob words."""

    text: str
    words: frozenset[str]
    globs: tuple[shellcheck.GlobWord, ...]


def _searchable(command: str) -> _Search | None:
    """The command as deny matching reads it, or None when it must check every rule."""
    text = shellcheck.deny_search_text(command)
    if text is None or _ABSENT in text:
        return None
    try:
        globs = shellcheck.glob_words(command)
        if any(word.may_name(_ABSENT) for word in globs):
            return None
    except Exception:  # a glob the matcher cannot read either (nested too deep): it matches
        return None
    return _Search(text, frozenset(shellcheck.WORD_RUNS.findall(text)), globs)


def _prefix_hit(table: Mapping[str, int], lengths: tuple[int, ...], text: str) -> int | None:
    """The first position whose key is a prefix of ``text``."""
    best: int | None = None
    size = len(text)
    for n in lengths:
        if n > size:
            break
        pos = table.get(text[:n])
        if pos is not None and (best is None or pos < best):
            best = pos
    return best


def _earliest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


@dataclass(frozen=True, slots=True)
class _Rules:
    """The rules of one tool and one scope, arranged for matching."""

    deny_all: int | None  # the first deny rule without a prefix
    deny_text: Mapping[str, int]  # prefix -> first position
    deny_text_lengths: tuple[int, ...]
    deny_path: Mapping[str, int]  # normalised prefix -> first position
    deny_path_lengths: tuple[int, ...]
    deny_file_text: Mapping[str, int]  # path form of a prefix matched as text -> first position
    deny_file_text_lengths: tuple[int, ...]
    deny_file_dir: Mapping[str, int]  # path form of a directory prefix (ending in /) -> first position
    deny_file_dir_lengths: tuple[int, ...]
    deny_commands: tuple[tuple[int, str], ...]  # every prefixed deny rule, in view order
    deny_keyed: Mapping[str, list[_KeyedDeny]]  # those with a plain prefix, by first word (its basename)
    deny_unkeyed: tuple[tuple[int, str], ...]  # those without: always checked
    deny_programs: tuple[_Program, ...]  # the keyed rules' first words, in view order
    deny_programs_by_end: Mapping[str, tuple[_Program, ...]]  # the same by their last character
    deny_programs_by_start: Mapping[str, tuple[_Program, ...]]  # and by their first
    deny_programs_by_start_and_length: Mapping[tuple[str, int], tuple[_Program, ...]]  # and by both
    allow: Mapping[str, tuple[tuple[int, tuple[str, ...]], ...]]  # first word -> (pos, words)

    def first_deny(
        self, family: Family | None, texts: tuple[str, ...] | None, searchable: tuple[_Search | None, ...],
        paths: tuple[str, ...] | None = None,
    ) -> int | None:
        best = self.deny_all
        if not self.deny_commands:
            return best
        if texts is None:  # an argument without text: every deny rule matches
            return _earliest(best, self.deny_commands[0][0])
        for text, plain in zip(texts, searchable):
            if family is not Family.EXECUTE:
                best = _earliest(best, _prefix_hit(self.deny_text, self.deny_text_lengths, text))
                if text and paths is None:
                    normal = posixpath.normpath(text)
                    best = _earliest(best, _prefix_hit(self.deny_path, self.deny_path_lengths, normal))
            if family in _COMMAND_FAMILIES:
                best = _earliest(best, self._first_command_deny(text, plain, best))
        if paths is not None and family is not Family.EXECUTE:
            for name in paths:
                form = _path_form(name)
                best = _earliest(best, _prefix_hit(self.deny_file_text, self.deny_file_text_lengths, form))
                best = _earliest(best, _prefix_hit(self.deny_file_dir, self.deny_file_dir_lengths, form + "/"))
        return best

    def _first_command_deny(self, command: str, search: _Search | None, before: int | None) -> int | None:
        if search is None:
            candidates: Iterable[tuple[int, str]] = self.deny_commands
        else:
            text = search.text
            found = list(self.deny_unkeyed)
            keyed = self.deny_keyed
            for word in search.words:
                entries = keyed.get(word)
                if entries is not None:
                    found.extend((pos, prefix) for pos, prefix, rest in entries if all(w in text for w in rest))
            limit = before
            for glob in search.globs:
                named = self._first_named(glob, limit)
                if named is not None:
                    found.append(named)
                    limit = named[0]
            found.sort()
            candidates = found
        for pos, prefix in candidates:
            if before is not None and pos >= before:
                return None
            if shellcheck.deny_prefix_matches(prefix, command):
                return pos
        return None

    def _first_named(self, word: shellcheck.GlobWord, before: int | None) -> tuple[int, str] | None:
        """The first keyed rule (before ``before``) whose first word the glob word may name."""
        tail, head, last = word.tail, word.head, word.last_head
        shortest, longest = word.lengths
        if tail:
            programs = self.deny_programs_by_end.get(tail[-1], ())
        elif head and last != "":
            programs = self._starting(head, last, word.last_lengths)
        else:
            programs = self.deny_programs
        for pos, program, prefix in programs:
            if before is not None and pos >= before:
                return None
            if tail and not (program.endswith(tail) or tail.endswith(program)):
                continue
            size = len(program)
            # Named through the pattern (``w``, ``/w`` or ``x/w`` starts with its head, at a length
            # it fits) or through the part after its last "/" (``w`` starts with that part's head).
            if not (shortest <= size <= longest and (not head or program.startswith(head)
                                                     or ("/" + program).startswith(head)
                                                     or ("x/" + program).startswith(head))):
                if last is None or not program.startswith(last):
                    continue
                low, high = word.last_lengths  # type: ignore[misc]  # set whenever last_head is
                if not low <= size <= high:
                    continue
            if word.may_name(program):
                return pos, prefix
        return None

    def _starting(self, head: str, last: str | None,
                  last_lengths: tuple[int, float] | None) -> tuple[_Program, ...]:
        """The first words ``w`` for which ``w``, ``/w`` or ``x/w`` may start with ``head``, or
        ``w`` with ``last`` (None: no such choice) at a length in ``last_lengths``, in view order."""
        firsts = {head[0]}
        for lead in ("/", "x/"):
            if head.startswith(lead) or lead.startswith(head):
                if len(head) <= len(lead):
                    return self.deny_programs
                firsts.add(head[len(lead)])
        by_start = self.deny_programs_by_start
        found = [p for c in firsts for p in by_start.get(c, ())]
        if last is not None and last[0] not in firsts:
            low, high = last_lengths  # type: ignore[misc]  # set whenever last_head is
            if high - low <= _FEW_LENGTHS:
                by_length = self.deny_programs_by_start_and_length
                found += (p for n in range(low, int(high) + 1) for p in by_length.get((last[0], n), ()))
            else:
                found += by_start.get(last[0], ())
        return tuple(sorted(found))

    def first_allow(self, words: tuple[str, ...]) -> int | None:
        best: int | None = None
        for pos, want in self.allow.get(words[0], ()):
            if (best is None or pos < best) and words[: len(want)] == want:
                best = pos
        return best


def _allow_words(prefix: str | None) -> tuple[str, ...] | None:
    """The words an allow rule's prefix requires, or None when it can allow nothing."""
    if prefix is None:
        return None
    return shellcheck.simple_words(prefix) or None


def _arrange(rules: Iterable[tuple[int, Rule]]) -> _Rules:
    deny_all: int | None = None
    text: dict[str, int] = {}
    path: dict[str, int] = {}
    file_text: dict[str, int] = {}
    file_dir: dict[str, int] = {}
    commands: dict[str, int] = {}
    allow: dict[str, list[tuple[int, tuple[str, ...]]]] = {}
    for pos, rule in rules:
        prefix = rule.prefix
        if rule.effect is Effect.ALLOW:
            want = _allow_words(prefix)
            if want is not None:
                allow.setdefault(want[0], []).append((pos, want))
        elif prefix is None:
            deny_all = pos if deny_all is None else deny_all
        else:
            text.setdefault(prefix, pos)
            text.setdefault(url_form(prefix), pos)
            path.setdefault(posixpath.normpath(prefix), pos)
            form, directory = _path_prefix(prefix)
            (file_dir if directory else file_text).setdefault(form, pos)
            commands.setdefault(prefix, pos)
    keyed: dict[str, list[_KeyedDeny]] = {}
    unkeyed: list[tuple[int, str]] = []
    programs: dict[str, _Program] = {}
    for prefix, pos in commands.items():
        words = prefix.split()
        key = posixpath.basename(words[0]) if words else ""
        if (len(commands) <= _SCAN_AT_MOST or not _PLAIN_PREFIX.issuperset(prefix)
                or not key or not shellcheck.WORD_INSIDE.issuperset(key)):
            unkeyed.append((pos, prefix))
            continue
        if words[0] not in programs or pos < programs[words[0]][0]:
            programs[words[0]] = (pos, words[0], prefix)
        keyed.setdefault(key, []).append((pos, prefix, tuple(words[1:])))
    return _Rules(
        deny_all=deny_all,
        deny_text=text,
        deny_text_lengths=tuple(sorted({len(k) for k in text})),
        deny_path=path,
        deny_path_lengths=tuple(sorted({len(k) for k in path})),
        deny_file_text=file_text,
        deny_file_text_lengths=tuple(sorted({len(k) for k in file_text})),
        deny_file_dir=file_dir,
        deny_file_dir_lengths=tuple(sorted({len(k) for k in file_dir})),
        deny_commands=tuple(sorted((pos, prefix) for prefix, pos in commands.items())),
        deny_keyed=keyed,
        deny_unkeyed=tuple(sorted(unkeyed)),
        deny_programs=tuple(sorted(programs.values())),
        deny_programs_by_end=_by_character(sorted(programs.values()), -1),
        deny_programs_by_start=_by_character(sorted(programs.values()), 0),
        deny_programs_by_start_and_length=_by_start_and_length(sorted(programs.values())),
        allow={k: tuple(v) for k, v in allow.items()},
    )


def _by_start_and_length(programs: list[_Program]) -> dict[tuple[str, int], tuple[_Program, ...]]:
    grouped: dict[tuple[str, int], list[_Program]] = {}
    for entry in programs:
        grouped.setdefault((entry[1][0], len(entry[1])), []).append(entry)
    return {k: tuple(v) for k, v in grouped.items()}


def _by_character(programs: list[_Program], at: int) -> dict[str, tuple[_Program, ...]]:
    grouped: dict[str, list[_Program]] = {}
    for entry in programs:
        grouped.setdefault(entry[1][at], []).append(entry)
    return {k: tuple(v) for k, v in grouped.items()}


@dataclass(frozen=True, slots=True)
class GovernanceView:
    """A snapshot of what governance holds. ``readable=False``: fail closed.

    Built once per snapshot; it arranges its rules for ``decide`` on construction.
    ``consents`` holds ``(agent, family)`` pairs.
    """

    rules: tuple[Rule, ...] = ()
    consents: frozenset[tuple[str, Family]] = frozenset()
    developer_mode: bool = False
    policy: Policy | None = None
    readable: bool = True
    unreadable_reason: str = ""

    _by_tool: Mapping[str, tuple[Rule, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _index: Mapping[tuple[str, str], _Rules] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _spellings: Mapping[str, tuple[str, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        rules = tuple(self.rules or ())
        for rule in rules:
            if not isinstance(rule, Rule):
                raise TypeError(f"rules must be Rule values, not {type(rule).__name__}")
        object.__setattr__(self, "rules", rules)
        object.__setattr__(
            self, "consents", frozenset((_text("agent", a), Family(f)) for a, f in (self.consents or ()))
        )
        for name in ("developer_mode", "readable"):  # "false" must not read as true
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, not {getattr(self, name)!r}")
        _text("unreadable_reason", self.unreadable_reason)
        if self.policy is not None and not isinstance(self.policy, Policy):
            raise TypeError(f"policy must be a Policy or None, not {type(self.policy).__name__}")
        by_tool: dict[str, list[Rule]] = {}
        by_scope: dict[tuple[str, str], list[tuple[int, Rule]]] = {}
        for pos, rule in enumerate(rules):
            by_tool.setdefault(rule.tool, []).append(rule)
            by_scope.setdefault((rule.tool, rule.agent), []).append((pos, rule))
        object.__setattr__(self, "_by_tool", {k: tuple(v) for k, v in by_tool.items()})
        object.__setattr__(self, "_index", {k: _arrange(v) for k, v in by_scope.items()})
        spellings: dict[str, list[str]] = {}
        for tool in by_tool:
            spellings.setdefault(tool.casefold(), []).append(tool)
        object.__setattr__(self, "_spellings", {k: tuple(v) for k, v in spellings.items()})

    def rules_for(self, tool: str) -> tuple[Rule, ...]:
        """The rules naming ``tool``, in view order."""
        return self._by_tool.get(tool, ())

    def _scopes(self, tool: str, agent: str) -> tuple[_Rules, ...]:
        index = self._index
        if not index:
            return ()
        everyone = index.get((tool, "*"))
        own = index.get((tool, agent)) if agent != "*" else None
        if own is None:
            return () if everyone is None else (everyone,)
        return (own,) if everyone is None else (own, everyone)

    def _deny_scopes(self, tool: str, agent: str) -> tuple[_Rules, ...]:
        """The scopes whose deny rules apply: those of every spelling of ``tool`` in any case."""
        names = self._spellings.get(tool.casefold(), ())
        if len(names) == 1:  # one spelling, the usual case: its own scopes
            return self._scopes(names[0], agent)
        return tuple(scope for name in names for scope in self._scopes(name, agent))


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one call: what happens, which line decided, what a person may answer, why."""

    outcome: Outcome
    line: int
    answers: tuple[Answer, ...] = ()
    reason: str = ""
    rule_id: str | None = None

    @property
    def allowed(self) -> bool:
        return self.outcome is Outcome.ALLOW


_ONCE_REFUSE = (Answer.ONCE, Answer.REFUSE)
_ALL_ANSWERS = (Answer.ONCE, Answer.ALWAYS, Answer.REFUSE)


class _Unshowable(Exception):
    """A first argument whose text cannot be read."""


def _show(value: object) -> str:
    if isinstance(value, str):
        return str.__str__(value)
    try:
        return str(value)
    except Exception as exc:
        raise _Unshowable from exc


def first_argument(call: Call) -> str | None:
    """The call's first argument as text, or None when it has none (or no text)."""
    for value in call.arguments.values():
        if value is None:
            return None
        try:
            return _show(value)
        except _Unshowable:
            return None
    return None


def _argument_texts(call: Call) -> tuple[str, ...] | None:
    """The texts a deny prefix is matched against: the first argument, read broadly.

    ``()`` when there is no first argument; None when it cannot be read as text,
    which every deny rule of the tool then matches (refusing too much is safe).
    """
    for value in call.arguments.values():
        if value is None:
            return ()
        if isinstance(value, str):
            return (str.__str__(value),)
        try:
            shown = _show(value)
            if isinstance(value, (list, tuple)):
                joined = " ".join(_show(v) for v in value)
                return tuple(dict.fromkeys((shown, joined, *_leaf_texts(value))))
            if isinstance(value, Mapping):
                return tuple(dict.fromkeys((shown, *_leaf_texts(value))))
            if isinstance(value, (bytes, bytearray)):
                return (shown, bytes(value).decode("utf-8", "replace"))
            return (shown,)
        except _Unshowable:
            return None
    return ()


_LEAVES_AT_MOST = 256  # a container with more strings than this (or nested deeper) matches every deny rule
_DEPTH_AT_MOST = 8


def leaf_texts(value: object) -> tuple[str, ...] | None:
    """Every string inside a value at any depth (a string: itself; a scalar: its text),
    or None when there are too many or they lie too deep to read."""
    if isinstance(value, str):
        return (str.__str__(value),)
    if value is None:
        return ()
    try:
        if isinstance(value, (list, tuple, Mapping)):
            return tuple(_leaf_texts(value))
        return (_show(value),)
    except _Unshowable:
        return None


def _leaf_texts(value: object) -> list[str]:
    """Every string inside a list, tuple or mapping (keys and values), at any depth.

    A tool may act on any item of a container (``delete_many(paths=["a", "secrets/k"])``),
    so each is matched like a first argument of its own. Too many or too deep is
    ``_Unshowable``: every deny rule then matches.
    """
    found: list[str] = []
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            found.append(str.__str__(item))
        elif isinstance(item, (list, tuple, Mapping)):
            if depth >= _DEPTH_AT_MOST:
                raise _Unshowable
            items = [*item.keys(), *item.values()] if isinstance(item, Mapping) else list(item)
            pending.extend((v, depth + 1) for v in reversed(items))
        if len(found) + len(pending) > _LEAVES_AT_MOST:
            raise _Unshowable
    return found


def _command(call: Call) -> str | None:
    """The first argument when it is a string: only a string is a command."""
    for value in call.arguments.values():
        return str.__str__(value) if isinstance(value, str) else None
    return None


def _deny_matches(prefix: str, family: Family | None, text: str, resolved: bool) -> bool:
    if family in _COMMAND_FAMILIES and shellcheck.deny_prefix_matches(prefix, text):
        return True
    if family is Family.EXECUTE:
        return False
    if text.startswith(prefix) or text.startswith(url_form(prefix)):
        return True
    if resolved:  # a file tool's call: its resolved names are matched instead (path_prefix_matches)
        return False
    # Paths: "./secrets/x" and "notes/../secrets/x" are "secrets/x".
    return bool(text) and posixpath.normpath(text).startswith(posixpath.normpath(prefix))


def rule_matches(rule: Rule, call: Call) -> bool:
    """Whether ``rule`` applies to ``call`` (tool, scope, prefix per its effect).

    The plain statement of matching; ``decide`` gets the same answers from its index.
    """
    if not (rule.agent == "*" or rule.agent == call.agent):
        return False
    if rule.tool != call.tool and (rule.effect is Effect.ALLOW or rule.tool.casefold() != call.tool.casefold()):
        return False  # a deny rule names its tool in any case; an allow rule exactly
    if rule.effect is Effect.ALLOW:
        # Only a string first argument of shell text is a command. allow_prefix_matches is false
        # unless the prefix and the command are both one simple command (a word at least).
        command = _command(call) if call.shell else None
        return command is not None and rule.prefix is not None and shellcheck.allow_prefix_matches(rule.prefix, command)
    if rule.prefix is None:
        return True
    texts = _argument_texts(call)
    if texts is None:
        return True
    texts = (*texts, *call.aliases)
    paths = call.paths
    if any(_deny_matches(rule.prefix, call.family, text, paths is not None) for text in texts):
        return True
    if paths is None or call.family is Family.EXECUTE:
        return False
    return any(path_prefix_matches(rule.prefix, name) for name in paths)


def _scope_words(rule: Rule) -> str:
    return "every agent" if rule.agent == "*" else f"agent {rule.agent!r}"


def decide(call: Call, view: GovernanceView) -> Decision:
    """Answer one call from a snapshot. The first of the six lines that applies decides."""
    family = call.family
    policy = view.policy

    # Line 1: organisation policy.
    if policy is not None:
        if call.tool in policy.refuse_tools:
            return Decision(Outcome.REFUSE, 1, reason=f"organisation policy refuses the tool {call.tool!r}")
        if call.connection is not None and call.connection in policy.refuse_connections:
            return Decision(
                Outcome.REFUSE, 1, reason=f"organisation policy refuses the connection {call.connection!r}"
            )
        if family is not None and family in policy.refuse_families:
            return Decision(Outcome.REFUSE, 1, reason=f"organisation policy refuses the family {family.value!r}")

    # Line 2: a fine deny rule (read even from a fail-closed view: refusing more is safe).
    scopes = view._scopes(call.tool, call.agent)
    denying = view._deny_scopes(call.tool, call.agent)
    if denying:
        texts = _argument_texts(call)
        if texts is not None and call.aliases:
            texts = (*texts, *call.aliases)
        plain: tuple[_Search | None, ...] = ()
        if texts and family in _COMMAND_FAMILIES and any(r.deny_keyed for r in denying):
            plain = tuple(_searchable(t) for t in texts)
        elif texts:
            plain = (None,) * len(texts)
        first: int | None = None
        for rules in denying:
            first = _earliest(first, rules.first_deny(family, texts, plain, call.paths))
        if first is not None:
            rule = view.rules[first]
            what = f" under {rule.prefix!r}" if rule.prefix is not None else ""
            where = f" the path {call.paths[0]!r}" if call.paths else ""
            return Decision(
                Outcome.REFUSE, 2,
                reason=f"a deny rule for {rule.tool!r}{what} ({_scope_words(rule)}) matches{where}",
                rule_id=rule.id,
            )

    # Line 3: reading, the conversation and the agent's own memory.
    if family in READ_ONLY_FAMILIES:
        return Decision(Outcome.ALLOW, 3, reason=f"family {family.value!r} only reads or touches nothing outside")  # type: ignore[union-attr]

    # Fail closed: nothing sensitive passes an unreadable view.
    if not view.readable:
        why = view.unreadable_reason or "governance cannot be read"
        return Decision(Outcome.REFUSE, 0, reason=f"fail closed: {why}")

    # Line 4: executing code.
    if family is Family.EXECUTE:
        if not view.developer_mode:
            return Decision(Outcome.ASK, 4, _ONCE_REFUSE, reason="executes code; developer mode is off")
        if not call.shell:
            return Decision(
                Outcome.ASK, 4, _ONCE_REFUSE,
                reason="executes code that is not a shell command: no rule allows it, asked every time",
            )
        command = _command(call)
        words = shellcheck.simple_words(command) if command is not None else None
        if not words:
            builtin = shellcheck.evaluating_builtin(command) if command is not None else None
            why = f" (the shell builtin {builtin!r} may evaluate its arguments as code)" if builtin else ""
            return Decision(Outcome.ASK, 4, _ONCE_REFUSE, reason=f"executes code; not a single simple command{why}")
        first = None
        for rules in scopes:
            first = _earliest(first, rules.first_allow(words))
        if first is not None:
            rule = view.rules[first]
            return Decision(
                Outcome.ALLOW, 4,
                reason=f"developer mode and an allow rule for {call.tool!r} under {rule.prefix!r}"
                f" ({_scope_words(rule)}) match a single simple command",
                rule_id=rule.id,
            )
        wider = shellcheck.no_always_reason(words)
        if wider is not None:
            return Decision(
                Outcome.ASK, 4, _ONCE_REFUSE,
                reason=f"executes code; no allow rule matches this simple command; no always: {wider},"
                " so a rule for it would allow more than this command",
            )
        return Decision(
            Outcome.ASK, 4, _ALL_ANSWERS, reason="executes code; no allow rule matches this simple command"
        )

    # Line 5: the profile asks every time; consents and run grants allow the rest.
    if family is Family.PROFILE:
        return Decision(Outcome.ASK, 5, _ONCE_REFUSE, reason="proposes a fact for the profile: asked every time")
    if family is Family.WRITE and call.paths and any(_in_git_directory(p) for p in call.paths):
        return Decision(
            Outcome.ASK, 5, _ONCE_REFUSE,
            reason="writes inside a .git directory, whose files make git run programs (hooks, core.fsmonitor,"
            " filters): asked every time",
        )
    if family is Family.WRITE and call.paths and call.code_places is not None:
        code = code_place_reason(call.paths, call.code_places)
        if code is not None:
            return Decision(Outcome.ASK, 5, _ONCE_REFUSE, reason=code)
    if family is not None:
        if (call.agent, family) in view.consents:
            return Decision(
                Outcome.ALLOW, 5, reason=f"standing consent of {call.agent!r} for family {family.value!r}"
            )
        if family in call.run_grants:
            return Decision(Outcome.ALLOW, 5, reason=f"the run holds a grant for family {family.value!r}")

    # Line 6: ask.
    if family is None:
        return Decision(Outcome.ASK, 6, _ONCE_REFUSE, reason="unclassified tool: asked every time")
    return Decision(
        Outcome.ASK, 6, _ALL_ANSWERS, reason=f"no consent of {call.agent!r} for family {family.value!r}"
    )
