"""The simple-command check: which shell commands a fine rule may let through.

Line 4 of ``decide()`` allows code execution only for *one simple command* that an
``allow`` rule's prefix matches, because a blanket allow on a shell is a blanket
allow on everything: once chaining, pipes, redirection or substitution are in
play, the first words of a command say nothing about what it does.

So the check is a small tokenizer that *proves* a command simple or rejects it.
It accepts a deliberately narrow subset of POSIX shell syntax, one that ``sh``
(dash), ``bash`` and ``zsh`` all read the same way and in which no expansion can
happen, whose first word is not a shell builtin that may evaluate its words
(``printf -v 'a[$(x)]'``, ``trap``, ``eval``); anything else is "not simple" and
is asked. Rejecting is always safe.

``always`` writes an allow rule with the command as its prefix, so it is offered
only where such a rule allows nothing the question did not show: never for a
program in :data:`NO_ALWAYS` (wrappers, interpreters, programs that run other
programs or write where their arguments say, builtins) or a file outside the
system's program folders.

- :func:`simple_words` — the argv of one provably simple command, else ``None``
- :func:`is_simple`
- :func:`evaluating_builtin` — the shell builtin that makes a command not simple
- :func:`no_always_reason` — why ``always`` must not write a rule for a simple command
- :func:`allow_prefix_matches` — allow rules: whole words of two simple commands
- :func:`deny_prefix_matches` — deny rules: broad, defence in depth

None of them raises: an internal failure reads as "not simple", "no allow
match" and "deny matches". ``docs/simple-commands.md`` states the exact rules.
"""

from __future__ import annotations

import functools
import math
import posixpath
import re
import string
import unicodedata
from collections.abc import Iterable

__all__ = [
    "simple_words",
    "is_simple",
    "allow_prefix_matches",
    "deny_prefix_matches",
    "deny_search_text",
    "glob_words",
    "GlobWord",
    "glob_may_name",
    "MAX_SIMPLE_LENGTH",
    "MAX_DENY_LENGTH",
    "RESERVED_WORDS",
    "SHELL_BUILTINS",
    "PLAIN_BUILTINS",
    "WRAPPERS",
    "RUNS_PROGRAMS",
    "WRITES_BY_ARGUMENT",
    "NO_ALWAYS",
    "evaluating_builtin",
    "no_always_reason",
]

#: A longer command is never simple (it is asked instead).
MAX_SIMPLE_LENGTH = 4096
#: A longer command matches every deny rule that has a prefix.
MAX_DENY_LENGTH = 1_000_000
#: How deep deny matching follows command strings nested in wrappers' arguments.
_MAX_DEPTH = 8

_PRINTABLE = frozenset(chr(c) for c in range(0x20, 0x7F))  # ASCII, no control chars
_UNQUOTED = frozenset(string.ascii_letters + string.digits + "_-./:@%+,=")
_PROGRAM = frozenset(string.ascii_letters + string.digits + "_-./+")
_NOT_IN_DOUBLE_QUOTES = frozenset("$`\\!")

#: Words a shell may read as syntax in command position (sh, bash, ksh, zsh).
RESERVED_WORDS = frozenset(
    {
        "!", "{", "}", "[[", "]]", "case", "coproc", "do", "done", "elif", "else",
        "esac", "fi", "for", "function", "if", "in", "select", "then", "time",
        "until", "while", "repeat", "foreach", "end", "nocorrect", "noglob",
        "declare", "export", "float", "integer", "local", "readonly", "typeset",
    }
)

#: Builtins of bash, dash, zsh and ksh. The shell runs them itself, and many read
#: their arguments as code: array subscripts and arithmetic in variable names
#: (``printf -v 'a[$(x)]'``, ``test -v``, ``read``, ``let``, ``declare -i``, ``unset``,
#: ``wait -p``, ``getopts``), command strings (``eval``, ``trap``, ``compgen -C/-W``,
#: ``complete -C``, ``bind -x``, ``mapfile -C``, ``fc``, ``zpty``), programs or files
#: to run (``command``, ``builtin``, ``exec``, ``source``, ``.``, ``enable -f``,
#: ``hash -p``, ``jobs -x``), or shell state (``set``, ``shopt``, ``alias``,
#: ``ulimit``, ``cd``). A command whose first word is one of them is never simple,
#: except for :data:`PLAIN_BUILTINS`.
SHELL_BUILTINS = frozenset(
    {
        # bash
        ".", "alias", "bg", "bind", "break", "builtin", "caller", "cd", "command",
        "compgen", "complete", "compopt", "continue", "declare", "dirs", "disown", "echo",
        "enable", "eval", "exec", "exit", "export", "false", "fc", "fg", "getopts", "hash",
        "help", "history", "jobs", "kill", "let", "local", "logout", "mapfile", "popd",
        "printf", "pushd", "pwd", "read", "readarray", "readonly", "return", "set", "shift",
        "shopt", "source", "suspend", "test", "times", "trap", "true", "type", "typeset",
        "ulimit", "umask", "unalias", "unset", "wait",
        # dash
        "chdir",
        # zsh (with the modules it loads on demand)
        "autoload", "bindkey", "bye", "cap", "clone", "comparguments", "compcall", "compctl",
        "compdescribe", "compfiles", "compgroups", "compquote", "comptags", "comptry",
        "compvalues", "disable", "echotc", "echoti", "emulate", "float", "functions",
        "getcap", "getln", "integer", "limit", "log", "noglob", "print", "private",
        "pushln", "r", "rehash", "sched", "setcap", "setopt", "strftime", "syserror",
        "sysopen", "sysread", "sysseek", "syswrite", "ttyctl", "unfunction", "unhash",
        "unlimit", "unsetopt", "vared", "whence", "where", "which", "zcompile", "zcurses",
        "zformat", "zftp", "zle", "zmodload", "zparseopts", "zprof", "zpty", "zregexparse",
        "zselect", "zsocket", "zstat", "zstyle", "zsystem", "ztcp",
        # ksh93 and mksh
        "alarm", "compound", "enum", "global", "hist", "nameref", "namespace", "redirect",
        "stop",
    }
)

#: Builtins that read no argument as code or as a name to assign in any of those
#: shells; a command may start with one and still be simple.
PLAIN_BUILTINS = frozenset({"echo", "false", "pwd", "true", "which"})

_EVALUATING_BUILTINS = SHELL_BUILTINS - PLAIN_BUILTINS

#: Programs that run another command, a command string or a program text given in
#: their arguments. A deny rule looks through them; an allow rule never does (a
#: command starting with one matches only a prefix starting with the same word).
WRAPPERS = frozenset(
    {
        # shells and builtins that run a command or a string
        "sh", "bash", "dash", "zsh", "ksh", "mksh", "pdksh", "oksh", "yash", "ash",
        "rbash", "fish", "csh", "tcsh", "busybox", "toybox",
        "eval", "exec", "command", "builtin", "source", ".", "time", "coproc",
        "nohup", "noglob", "nocorrect",
        # privilege and identity
        "sudo", "doas", "su", "pkexec", "runuser", "sg", "newgrp", "setpriv",
        # process attributes, sandboxes, limits
        "env", "nice", "renice", "ionice", "taskset", "chrt", "numactl", "stdbuf",
        "timeout", "timelimit", "setsid", "unshare", "nsenter", "chroot", "flock",
        "cgexec", "systemd-run", "runcon", "sandbox-exec", "firejail", "bwrap",
        "fakeroot", "faketime", "proot", "torsocks", "proxychains", "proxychains4",
        "unbuffer", "expect", "script", "caffeinate", "arch", "xvfb-run",
        "dbus-launch", "dbus-run-session", "catchsegv", "tmux", "screen",
        # tracers and profilers
        "strace", "ltrace", "gdb", "valgrind", "perf",
        # repeaters and schedulers
        "xargs", "parallel", "watch", "find", "entr", "at", "batch",
        # remote shells
        "ssh", "rsh", "mosh",
        # interpreters of program text
        "python", "python2", "python3", "pypy", "pypy3", "perl", "ruby", "node",
        "nodejs", "deno", "bun", "php", "lua", "luajit", "tclsh", "wish", "awk",
        "gawk", "mawk", "nawk", "osascript", "pwsh", "powershell", "Rscript",
        # package runners and containers
        "npx", "uvx", "uv", "pipx", "poetry", "pipenv", "conda", "npm", "pnpm",
        "yarn", "docker", "podman",
        # programs whose arguments carry program text
        "rename", "prename", "perl-rename", "file-rename",
        # more programs that run the command in their arguments
        "setarch", "linux32", "linux64", "chronic", "ifne", "sem", "daemonize",
        "start-stop-daemon", "eatmydata", "ccache", "distcc", "hyperfine", "watchexec",
        "nodemon", "direnv", "lldb", "rr", "bpftrace", "xterm", "mamba", "micromamba",
        "pixi", "hatch", "pdm", "rye",
    }
)
_VERSIONED_INTERPRETER = re.compile(r"(python|pypy|perl|ruby|node|php|lua|tclsh|wish)[0-9.]+")

#: Programs beyond :data:`WRAPPERS` that run other programs, commands or program
#: text their arguments or configuration name (``git -c alias.x='!…'``, ``make``,
#: ``sed`` ``e``, ``tar --to-command``, ``rsync -e``, ``vim``/``less`` shell escapes,
#: package scripts), or change the system.
RUNS_PROGRAMS = frozenset(
    {
        "git", "make", "gmake", "bmake", "cmake", "ninja", "meson", "scons", "bazel",
        "bazelisk", "buck", "just", "task", "invoke", "tox", "nox", "pytest", "py.test",
        "ipython", "jupyter", "pip", "pip3", "cargo", "rustup", "go", "gem",
        "bundle", "bundler", "rake", "mvn", "gradle", "gradlew", "ant", "sbt", "lein",
        "dotnet", "composer", "java", "jshell", "kotlin", "scala", "groovy", "julia",
        "R", "r", "octave", "matlab", "swift", "erl", "elixir", "mix", "iex", "ghci",
        "runghc", "stack", "cabal", "ctest", "guile", "racket", "sbcl", "clisp", "emacs",
        "vim", "vi", "nvim", "view", "vimdiff", "ex", "ed", "red", "nano", "pico", "joe",
        "less", "more", "most", "pg", "man", "info", "sed", "gsed", "tar", "gtar",
        "bsdtar", "zip", "rsync", "scp", "sftp", "ftp", "lftp", "rclone", "sqlite3",
        "psql", "mysql", "mariadb", "mongo", "mongosh", "redis-cli", "gpg", "gpg2",
        "openssl", "ssh-agent", "ssh-keygen", "crontab", "systemctl", "service",
        "launchctl", "kubectl", "helm", "terraform", "ansible", "ansible-playbook",
        "vagrant", "apt", "apt-get", "aptitude", "dpkg", "rpm", "yum", "dnf", "zypper",
        "pacman", "apk", "brew", "port", "snap", "flatpak", "nix", "nix-shell",
        "pandoc", "latex", "pdflatex", "xelatex", "lualatex", "tex", "convert",
        "magick", "mogrify", "gs", "ghostscript", "socat", "nc", "ncat", "netcat",
        "telnet", "xdg-open", "open", "start", "run-parts", "dtach", "nq", "tsp",
        "inotifywait", "fswatch", "ip", "iptables", "nft", "mount", "umount",
        "losetup", "modprobe", "insmod", "rmmod", "sysctl",
        # linters, formatters, bundlers and test runners that load code from the workspace
        "mypy", "pylint", "flake8", "eslint", "prettier", "webpack", "vite", "rollup",
        "jest", "mocha", "vitest", "rspec", "phpunit", "black", "ruff", "isort",
        "autopep8", "yapf", "pre-commit",
        # calculators, macro processors and query tools with a shell escape or program text
        "dc", "bc", "m4", "gnuplot", "ghc", "runhaskell", "xsltproc", "duckdb",
        # version control and cloud clients run aliases, hooks and configured programs
        "hg", "svn", "gh", "aws", "gcloud", "az",
    }
)

#: Programs that write, delete or send where their arguments say (``cp a b``,
#: ``sort -o``, ``curl -o``, ``gcc -o``, ``tee``), or change the system by them.
WRITES_BY_ARGUMENT = frozenset(
    {
        "cp", "mv", "rm", "rmdir", "ln", "link", "unlink", "install", "dd", "tee",
        "touch", "mkdir", "mkfifo", "mknod", "chmod", "chown", "chgrp", "chattr",
        "setfacl", "truncate", "shred", "fallocate", "sort", "split", "csplit", "uniq",
        "patch", "gzip", "gunzip", "bzip2", "bunzip2", "xz", "unxz", "zstd",
        "unzstd", "lz4", "7z", "7za", "unzip", "cpio", "ar", "curl", "wget", "aria2c",
        "http", "xh", "gcc", "cc", "c++", "g++", "clang", "clang++", "ld", "as",
        "rustc", "javac", "tsc", "esbuild", "ffmpeg", "sponge", "kill", "pkill",
        "killall", "date", "hostname", "timedatectl", "hwclock", "passwd", "chpasswd",
        "useradd", "userdel", "usermod", "groupadd", "visudo", "mkfs", "fdisk",
        "parted", "wipefs", "shutdown", "reboot", "poweroff", "halt", "nmcli",
        "xxd", "tree", "shuf", "iconv", "yq", "gofmt", "rustfmt", "clang-format",
        "objcopy", "strip", "msgfmt",
    }
)

#: Programs for which ``always`` is never offered, by why. ``always`` writes an allow
#: rule whose prefix is the whole command, and a prefix matches every command that
#: adds words after it: for these programs, added words run other programs or
#: program text, change the system, or write and delete where they say.
NO_ALWAYS_GROUPS: dict[str, frozenset[str]] = {
    "runs other programs, commands or program text": WRAPPERS | RUNS_PROGRAMS,
    "writes, deletes or sends where its arguments say": WRITES_BY_ARGUMENT,
    "is a shell builtin": SHELL_BUILTINS,
}
#: Every program for which ``always`` is never offered (the union of the groups).
NO_ALWAYS = frozenset().union(*NO_ALWAYS_GROUPS.values())
#: Folders whose programs a path may name and still be offered ``always``. Any other
#: path (``./build.sh``, ``bin/tool``, ``/home/me/project/run``, ``/usr/bin/../x``)
#: may be a file the agent can change.
_SYSTEM_PROGRAM_DIRS = frozenset(
    {"/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/opt/homebrew/bin"}
)
_VERSION_SUFFIX = re.compile(r"[-.]?[0-9][0-9.]*$")  # python3.11, pip3, g++-12, lua5.4


# --------------------------------------------------------------------------- simple


def _exact_text(value: object) -> str | None:
    """``value`` as a plain ``str`` (a subclass cannot override what is read), else None."""
    return str.__str__(value) if isinstance(value, str) else None



def _tokenize(command: str) -> tuple[str, ...] | None:
    """Split one line of the accepted subset into words, removing quotes.

    Accepted: words of ``_UNQUOTED`` characters, ``'single-quoted'`` text without
    ``'``, ``"double-quoted"`` text without ``$ ` \\ !``, all concatenated into words
    and separated by spaces. Anything else, anywhere, rejects the whole command.
    """
    words: list[str] = []
    current: list[str] = []
    in_word = False
    i, n = 0, len(command)
    while i < n:
        ch = command[i]
        if ch == " ":
            if in_word:
                words.append("".join(current))
                current, in_word = [], False
            i += 1
        elif ch == "'":
            end = command.find("'", i + 1)
            if end < 0:
                return None
            current.append(command[i + 1 : end])
            in_word, i = True, end + 1
        elif ch == '"':
            end = command.find('"', i + 1)
            if end < 0:
                return None
            body = command[i + 1 : end]
            if not _NOT_IN_DOUBLE_QUOTES.isdisjoint(body):
                return None
            current.append(body)
            in_word, i = True, end + 1
        elif ch in _UNQUOTED:
            if ch == "=" and not any(current):
                return None  # zsh expands a word starting with "=" to a program path
            current.append(ch)
            in_word, i = True, i + 1
        else:
            return None
    if in_word:
        words.append("".join(current))
    return tuple(words)


def _program_ok(word: str) -> bool:
    """A first word names a program plainly: no assignment, option, job or keyword."""
    return (
        bool(word)
        and _PROGRAM.issuperset(word)
        and not word.startswith("-")
        and word not in RESERVED_WORDS
    )


def simple_words(command: object) -> tuple[str, ...] | None:
    """The argv of ``command`` if it is provably one simple command, else ``None``.

    Quotes are removed: ``'git' "status"`` gives ``("git", "status")``.
    """
    try:
        command = _exact_text(command)
        if command is None or len(command) > MAX_SIMPLE_LENGTH:
            return None
        return _simple_words(command)
    except Exception:
        return None


@functools.lru_cache(maxsize=4096)  # decide() reads the same command, and the same rules' prefixes, often
def _simple_words(command: str) -> tuple[str, ...] | None:
    if not _PRINTABLE.issuperset(command):
        return None  # control characters (newline, CR, tab, NUL…) and non-ASCII
    words = _tokenize(command)
    if not words or not _program_ok(words[0]) or words[0] in _EVALUATING_BUILTINS:
        return None
    return words


def evaluating_builtin(command: object) -> str | None:
    """The shell builtin (not in :data:`PLAIN_BUILTINS`) that ``command`` starts with, if any.

    Only reads commands made of the accepted subset; for any other, None.
    """
    try:
        command = _exact_text(command)
        if command is None or len(command) > MAX_SIMPLE_LENGTH or not _PRINTABLE.issuperset(command):
            return None
        words = _tokenize(command)
        return words[0] if words and words[0] in _EVALUATING_BUILTINS else None
    except Exception:
        return None


def is_simple(command: str) -> bool:
    """Whether ``command`` is provably one simple command."""
    return simple_words(command) is not None


# --------------------------------------------------------------------------- allow


def allow_prefix_matches(prefix: str, command: str) -> bool:
    """Allow rules: both simple, and the command's words start with the prefix's words.

    Whole words only, compared after quote removal. Because the first word of a
    simple command is a plain program name, a command with leading assignments is
    never simple, a wrapper (``sudo git status``) only matches a prefix that starts
    with the wrapper, and ``/usr/bin/git`` only matches a prefix that starts with
    ``/usr/bin/git``.
    """
    try:
        want = simple_words(prefix)
        words = simple_words(command)
        return want is not None and words is not None and words[: len(want)] == want
    except Exception:
        return False


def no_always_reason(words: tuple[str, ...]) -> str | None:
    """Why ``always`` may not write a rule with this simple command as its prefix, else None.

    The program is read by its basename (``/usr/bin/env`` is ``env``) and with a
    version suffix dropped (``python3.11``, ``pip3``, ``g++-12``). A program named by
    a path outside the system's program folders (``./build.sh``, ``bin/tool``,
    ``/home/me/project/run``) may be a file the agent can change: what it runs can
    change after the rule is written. Any failure gives a reason.
    """
    try:
        program = _exact_text(words[0])
        if program is None:
            return "the command cannot be read"
        if "/" in program and posixpath.dirname(program) not in _SYSTEM_PROGRAM_DIRS:
            return f"{program!r} is a file outside the system's program folders: what it runs may change"
        name = _basename(program)
        for candidate in dict.fromkeys((name, _VERSION_SUFFIX.sub("", name))):
            for why, names in NO_ALWAYS_GROUPS.items():
                if candidate in names:
                    return f"{name!r} {why}"
        if _VERSIONED_INTERPRETER.fullmatch(name):
            return f"{name!r} {next(iter(NO_ALWAYS_GROUPS))}"
        return None
    except Exception:
        return "the command cannot be read"


# --------------------------------------------------------------------------- deny


def _basename(word: str) -> str:
    return posixpath.basename(word)


def _is_wrapper(word: str) -> bool:
    name = _basename(word)
    return name in WRAPPERS or _VERSIONED_INTERPRETER.fullmatch(name) is not None


def _prefix_forms(prefix: str) -> set[tuple[str, ...]]:
    """The prefix's words: its argv when simple, else its de-quoted text split on blanks.

    A prefix is taken as written: ``/bin/rm`` is not shortened to ``rm``, so every
    word of a prefix occurs in any command it matches once quoting is removed (the
    rule index in ``decision.py`` relies on that).
    """
    words = simple_words(prefix)
    if words is None:
        words = tuple(_dequote(prefix).split())
    return {words} if words else set()


def _in_order(needles: tuple[str, ...], hay: Iterable[str]) -> bool:
    """Whether ``needles`` occur in ``hay`` in this order (other words may come between)."""
    rest = iter(hay)
    return all(any(word == needle for word in rest) for needle in needles)


def _names(word: str, program: str) -> bool:
    return word == program or _basename(word) == program


def _starts_with(words: tuple[str, ...], forms: set[tuple[str, ...]]) -> bool:
    """The first word names the prefix's program; its other words follow in order."""
    return bool(words) and any(
        _names(words[0], form[0]) and _in_order(form[1:], words[1:]) for form in forms
    )


def _found_after_wrapper(flat: list[str], forms: set[tuple[str, ...]]) -> bool:
    """Some word names the prefix's program and its other words follow in order."""
    for form in forms:
        for i, word in enumerate(flat):
            if _names(word, form[0]):
                # The earliest start leaves the most words to follow: it decides.
                if _in_order(form[1:], flat[i + 1 :]):
                    return True
                break
    return False


def _words_match(forms: set[tuple[str, ...]], words: tuple[str, ...], depth: int) -> bool:
    """A simple command: its start, and for a wrapper every later position and string."""
    if _starts_with(words, forms):
        return True
    if not _is_wrapper(words[0]):
        return False
    rest = words[1:]
    for word in rest:  # a command string: ``bash -c 'echo; rm -rf /'``
        if not _UNQUOTED.issuperset(word) and _command_matches(forms, word, depth + 1):
            return True
    flat = [piece for word in rest for piece in word.split()]  # eval 'rm' '-rf /'
    return _found_after_wrapper(flat, forms)


def _dequote(text: str) -> str:
    """Delete quoting that a shell removes: ``\\``-newline, empty ``$''``, quotes, backslashes."""
    text = text.replace("\\\n", "")
    text = re.sub(r"\$(?:''|\"\")", "", text)
    return text.replace("'", "").replace('"', "").replace("\\", "")


_EXPANSION = re.compile(
    r"`[^`]*`"                      # `...`
    r"|\$\([^()]*\)"                # $(...) and $((...)) innermost first
    r"|\$\{[^{}]*\}"                # ${...}
    r"|\$[A-Za-z_][A-Za-z0-9_]*"    # $name
    r"|\$[0-9@*#?$!-]"              # $1 $@ $* ...
)
_PUNCTUATION = re.compile(r"[{},;|&()<>`]")
# The start of a parameter expansion up to its operator: ``${x:-``, ``${#x``, ``${a[1]/``.
_OPENER = re.compile(
    r"\$\{[#!]?(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])?(?:\[[^\]]*\])?"
    r"(?::?[-=+?]|##?|%%?|//?|/[#%]|\^\^?|,,?|:|@)?"
)


#: Expansions nested this many deep, or deeper, are not unpicked: the deny rule matches.
_MAX_EXPANSION_PASSES = 32


def _strip_expansions(text: str, replacement: str) -> str | None:
    """``text`` with every expansion replaced, innermost first; None if nested too deep."""
    for _ in range(_MAX_EXPANSION_PASSES):
        reduced = _EXPANSION.sub(replacement, text)
        if reduced == text:
            return text
        text = reduced
    return None


def _folded(text: str) -> str:
    """Compatibility forms folded (fullwidth ``ｒｍ`` → ``rm``), invisible format characters dropped."""
    normal = unicodedata.normalize("NFKC", text)
    return "".join(c for c in normal if unicodedata.category(c) != "Cf")


@functools.lru_cache(maxsize=8)  # decide() asks once per deny rule about the same text
def _text_variants(text: str) -> tuple[str, ...] | None:
    """The text as seen through quote removal, with expansions taken as empty or as a
    space and punctuation as a space; None when expansions nest too deep to read."""
    plain = _dequote(text)
    stripped: str | None
    spaced: str | None
    if "$" not in plain and "`" not in plain:
        stripped = spaced = plain
    else:
        stripped = _strip_expansions(plain, "")
        if stripped is None:
            return None
        spaced = _strip_expansions(plain, " ")
        if spaced is None:
            return None
    variants = [plain, stripped, _PUNCTUATION.sub(" ", spaced)]
    if "${" in plain:  # ${x:-rm}, ${x:=rm}, ${x/a/rm}: the words a parameter expansion may give
        variants.append(_PUNCTUATION.sub(" ", _OPENER.sub(" ", plain)))
    variants += [_folded(v) for v in variants if not v.isascii()]
    return tuple(dict.fromkeys(variants))


#: A word is mentioned in a text only where the character before it is not one of
#: these, and the character after it not one of these or ``/``.
WORD_INSIDE = frozenset(string.ascii_letters + string.digits + "_.+-")
_LEFT_EDGE = r"(?<![A-Za-z0-9_.+-])"
_RIGHT_EDGE = r"(?![A-Za-z0-9_.+/-])"
#: The words made only of :data:`WORD_INSIDE` characters that a text holds at a word's edges.
WORD_RUNS = re.compile(_LEFT_EDGE + "[A-Za-z0-9_.+-]+" + _RIGHT_EDGE)


@functools.lru_cache(maxsize=1024)
def _mention(word: str) -> re.Pattern[str]:
    return re.compile(_LEFT_EDGE + re.escape(word) + _RIGHT_EDGE)


def _mentions_in_order(form: tuple[str, ...], text: str) -> bool:
    """Each word of ``form`` occurs as a whole word, in order (earliest match first)."""
    at = 0
    for word in form:
        found = _mention(word).search(text, at)
        if found is None:
            return False
        at = found.end()
    return True


def _text_mentions(forms: set[tuple[str, ...]], text: str) -> bool:
    variants = _text_variants(text)
    if variants is None:
        return True
    return any(_mentions_in_order(f, v) for v in variants for f in forms)


def _command_matches(forms: set[tuple[str, ...]], command: str, depth: int) -> bool:
    if depth > _MAX_DEPTH:
        return True
    words = simple_words(command)
    if words is None:
        return _text_mentions(forms, command)
    return _words_match(forms, words, depth)


def deny_prefix_matches(prefix: object, command: object) -> bool:
    """Deny rules: broad. Whether ``command`` may run what the prefix names.

    A simple command matches when its program (or the program's basename) is the
    prefix's first word and the prefix's other words follow in order; after a
    wrapper (``sudo``, ``env``, ``timeout 5``, ``bash -c``…) the program may be any
    later word, and every argument that is itself a command string is checked the
    same way. Any other command matches when the prefix's words occur in order,
    as whole words, anywhere in its text read with quotes and backslashes removed
    and expansions taken as empty. A blank prefix matches everything.
    """
    try:
        prefix, command = _exact_text(prefix), _exact_text(command)
        if prefix is None or command is None or len(command) > MAX_DENY_LENGTH:
            return True
        forms = _prefix_forms(prefix)
        if not forms:
            return True
        return _command_matches(forms, command, 0) or _pattern_may_name(forms, command)
    except Exception:
        return True


def deny_search_text(command: object) -> str | None:
    """Every text deny matching reads words from, joined by newlines; None when it may
    match without reading words (too long, nested too deep, an internal failure).

    For a prefix whose words hold no blanks or quotes, :func:`deny_prefix_matches` can
    match through its words only if each of them — the first one possibly as its
    basename — is a substring of this text: the words of a simple command (after a
    wrapper, also of each command string, recursively), and the readings of any other
    command. The first word (or its basename) occurs at a word's edges, too: the
    character before it, if any, is not in :data:`WORD_INSIDE`, and the one after it,
    if any, is neither in it nor ``/``. A program word starts a line or follows a
    blank or ``/`` and ends before a blank or the line's end; a mention has those
    edges by definition. The rule index in ``decision.py`` relies on that; a glob
    word's match is found with :func:`glob_words` instead.
    """
    try:
        command = _exact_text(command)
        if command is None or len(command) > MAX_DENY_LENGTH:
            return None
        texts: list[str] = []
        if not _collect_texts(command, 0, texts):
            return None
        return "\n".join(texts)
    except Exception:
        return None


def _collect_texts(command: str, depth: int, out: list[str]) -> bool:
    """``_command_matches``'s reading of ``command``, as texts (False: it reads no words)."""
    if depth > _MAX_DEPTH:
        return False
    words = simple_words(command)
    if words is None:
        variants = _text_variants(command)
        if variants is None:
            return False
        out.extend(variants)
        return True
    out.append(" ".join(words))
    if _is_wrapper(words[0]):
        for word in words[1:]:
            if not _UNQUOTED.issuperset(word) and not _collect_texts(word, depth + 1, out):
                return False
    return True


_GLOB_CHARS = frozenset("*?[{")
_TOKEN_SPLIT = re.compile(r"[\s;&|()<>`]+|\$\(")


def _glob_parts(word: str) -> "tuple[re.Pattern[str], str, str]":
    """The word's regex, its literal tail and its literal head: the characters every
    string it matches ends with, and starts with.

    The tail is what follows the last glob, bracket or brace element outside braces
    ("" when the word ends in one, inside an unclosed brace, or cannot be read); the
    head is what comes before the first ("" when the word starts with one).
    """
    out: list[str] = []
    tail: list[str] = []
    head: list[str] = []
    heading = True
    depth = 0
    i = 0
    while i < len(word):
        c = word[i]
        literal = False
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            end = _bracket_end(word, i)
            if end == -1:
                out.append(re.escape(c))
                literal = True
            else:
                out.append(_bracket_regex(word[i + 1:end]))
                i = end
        elif c == "{":
            depth += 1
            out.append("(?:")
        elif c == "," and depth:
            out.append("|")
        elif c == "}" and depth:
            depth -= 1
            out.append(")")
        else:
            out.append(re.escape(c))
            literal = True
        if literal and not depth:
            tail.append(c)
            if heading:
                head.append(c)
        else:
            tail.clear()
            heading = False
        i += 1
    out.append(")" * depth)
    text = "".join(out)
    try:
        pattern = re.compile(text, re.DOTALL)
    except re.error:
        return re.compile(".*", re.DOTALL), "", ""  # an unreadable pattern may name anything
    # The part after the last "/" read alone (with no "/", the whole text, which compiled above):
    cut = text.rfind("/")
    if cut != -1 and not _compiles(text[cut + 1:]):
        return pattern, "", ""  # GlobWord.may_name names every program then
    return pattern, "" if depth else "".join(tail), "".join(head)


def _widths(regex: str) -> tuple[int, float]:
    """The lengths of the shortest and longest strings ``regex`` (which compiled) matches, as
    the regex parser measures them (for ``*``, a longest beyond any program's length)."""
    shortest, longest = re._parser.parse(regex, re.DOTALL).getwidth()  # type: ignore[attr-defined]
    return int(shortest), float(longest)


def _compiles(text: str) -> bool:
    try:
        re.compile(text, re.DOTALL)
    except re.error:
        return False
    return True


_PLAIN_IN_REGEX = frozenset(string.ascii_letters + string.digits + "_/!\"%',:;<=>@`")


def _literal_head(regex: str) -> str:
    """The characters every match of ``regex`` (a glob word's, cut after a "/"; it compiles)
    starts with, read from its text: the plain and escaped characters before anything else
    ("" when it cannot tell: an alternative anywhere, or nothing plain first)."""
    if "|" in regex:
        return ""
    out: list[str] = []
    i = 0
    while i < len(regex):
        c = regex[i]
        if c in _PLAIN_IN_REGEX:
            step = 1
        elif c == "\\" and not regex[i + 1].isalnum():  # it compiles: no escape is cut off
            c, step = regex[i + 1], 2
        else:
            break
        if regex[i + step: i + step + 1] in ("*", "+", "?", "{"):
            break  # quantified: not certain
        out.append(c)
        i += step
    return "".join(out)


class GlobWord:
    """A word with ``* ? [ {`` as deny matching reads it: what it may expand to, compiled once."""

    __slots__ = ("pattern", "tail", "head", "last_head", "lengths", "last_lengths", "last_part")

    def __init__(self, pattern: "re.Pattern[str]", tail: str, head: str = "") -> None:
        self.pattern = pattern
        self.tail = tail  # every string the pattern matches ends with it (see ``_glob_parts``)
        text = pattern.pattern
        cut = text.rfind("/")
        last: "re.Pattern[str] | bool | None" = None  # None: no "/"; True: unreadable, names anything
        if cut != -1:
            try:
                last = re.compile(text[cut + 1:], re.DOTALL)
            except re.error:
                last = True
        self.last_part = last
        # Every string the pattern matches starts with ``head``. With a "/" in the pattern a
        # program may also match the part after it alone: such a program starts with
        # ``last_head`` (None: no such part; "": it may start with anything).
        self.head = head
        self.last_head = None if last is None else "" if last is True else _literal_head(text[cut + 1:])
        # The lengths of the programs it may name: through the pattern (``program``, ``/program``
        # or ``x/program`` matches it), and through the part after the last "/" (None: no such part).
        shortest, longest = _widths(text)
        self.lengths = (shortest - 2, longest)
        self.last_lengths = None if last is None else (0, math.inf) if last is True else _widths(text[cut + 1:])

    def may_name(self, program: str) -> bool:
        """Whether the word may expand to ``program`` or a path ending in it (``/usr/bin/r?``)."""
        last = self.last_part
        return bool(
            self.pattern.fullmatch(program) or self.pattern.fullmatch("/" + program)
            or self.pattern.fullmatch("x/" + program)
            or (last is True or (last is not None and last.fullmatch(program) is not None))  # type: ignore[union-attr]
        )


@functools.lru_cache(maxsize=8)  # decide() asks once per deny rule about the same text
def glob_words(command: str) -> "tuple[GlobWord, ...]":
    """The words of ``command`` with ``* ? [ {`` that deny matching reads as patterns,
    each with its literal tail (see ``_glob_parts``). The rule index in ``decision.py``
    finds the programs they may name with :func:`glob_may_name`."""
    if not _GLOB_CHARS.intersection(command):
        return ()
    return tuple(
        _glob_word(token)
        for token in _TOKEN_SPLIT.split(_dequote(command))
        if token and _GLOB_CHARS.intersection(token)
    )


@functools.lru_cache(maxsize=1024)  # the same words (``*.py``, ``/bin/r?``) come back in many commands
def _glob_word(token: str) -> GlobWord:
    return GlobWord(*_glob_parts(token))


def glob_may_name(word: GlobWord, program: str) -> bool:
    """Whether a glob word may expand to ``program`` or a path ending in it.

    A string it matches ends with its literal tail, so a program it may name ends
    with the tail or the tail ends with the program; and ``program``, ``/program``
    or ``x/program`` starts with its head. ``decision.py`` relies on both.
    """
    return word.may_name(program)


def _bracket_end(word: str, start: int) -> int:
    """Where the bracket expression opened at ``start`` closes, or -1 (then ``[`` is literal).

    As a shell reads it: a ``!``/``^`` and a first ``]`` are members, and ``[:…:]``,
    ``[=…=]``, ``[.….]`` inside are classes whose ``]`` does not close it.
    """
    i = start + 1
    if i < len(word) and word[i] in "!^":
        i += 1
    if i < len(word) and word[i] == "]":
        i += 1
    while i < len(word):
        c = word[i]
        if c == "]":
            return i
        if word.startswith(("[:", "[=", "[."), i):
            close = word.find(word[i + 1] + "]", i + 2)
            if close != -1:
                i = close + 2
                continue
        i += 1
    return -1


def _bracket_regex(body: str) -> str:
    """A glob bracket expression as a regex class; a POSIX class (``[:alpha:]``) is any character.

    Every character is taken literally except a range's ``-`` and a leading ``!``/``^``,
    so the class never nests (``[[ab]`` is ``[`` ``a`` ``b``). Read from the left as bash
    reads it, a ``c-d`` is a range and any other ``-`` a member, escaped (``[a-b--c]``:
    ``a-b`` and ``--c``; no ``--`` a regex might take for a set difference).
    """
    negate = body.startswith(("!", "^"))
    if negate:
        body = body[1:]
    if "[:" in body or "[=" in body or "[." in body:
        return "."  # a class the regex cannot spell: it may be any character (deny over-matches)
    members = "".join(
        re.escape(m[0]) if m[3] else f"{re.escape(m[1])}-{re.escape(m[2])}"
        for m in re.finditer("(.)-(.)|(.)", body, re.DOTALL)
    )
    return f"[{'^' if negate else ''}{members}]"


def _pattern_may_name(forms: set[tuple[str, ...]], command: str) -> bool:
    """A glob or brace word the shell may expand into the prefix's program (``/bin/r?``, ``{r,}m``).

    Deny rules only: any word with ``* ? [ {`` that could expand to the program's name
    (or a path ending in it) counts as naming it. Refusing too much is safe here; such
    commands are never simple, so no allow rule is ever at stake.
    """
    patterns = glob_words(command)
    if not patterns:
        return False
    programs = {form[0] for form in forms if form}
    return any(word.may_name(program) for word in patterns for program in programs)
