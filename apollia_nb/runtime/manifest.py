"""An agent's TOML manifest, parsed strictly into a frozen ``Manifest``.

Strict because a manifest is a statement of what an agent may be given: a
misspelt key (``tools.requird``) silently ignored would leave a tool missing
and nobody told. So every unknown key is an error, outside the ``[model]``
table (whose keys belong to the model provider and are checked by
``build_model``) and the ``arguments`` tables of scripted tool calls (the
tool's own arguments).

A manifest has no key for approval. Governance decides each tool call from
the user's rules and consents (docs/governance.md); a key such as
``auto_approve`` or ``allowed_tools`` is refused with a message saying so,
anywhere in the manifest, ``[tools]`` and ``[model]`` included.

Every error names the key and its line (``clerk.toml:12: unknown key
"tools.requird" (did you mean required?)``), the ``[model]`` table's too: it is
checked here by building its provider (``build_model``, with every key variable
taken as set), and the provider's error is given the line of the key it names.
A provider name that is an OpenAI-compatible server (``ollama``, ``vllm``…) and a
key written in the manifest (``api_key``) are answered with what to write instead.
``tomllib`` reports no positions for what it parsed, so
``_locate`` scans the text once and maps each key path to the line that
defined it: table and array-of-table headers, dotted keys, inline tables and
arrays of inline tables. TOML syntax errors reuse tomllib's line and column.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apollia_nb.errors import ManifestInvalid

__all__ = ["Manifest", "parse_manifest", "load_manifest", "agent_identity", "check_script_tools", "APPROVAL_KEYS",
           "DEFAULT_MAX_STEPS"]

DEFAULT_MAX_STEPS = 20
DEFAULT_MODEL: dict[str, Any] = {"provider": "scripted"}
#: The model providers a manifest may name (`apollia_nb.runtime.models.build_model` builds each).
PROVIDERS: tuple[str, ...] = ("scripted", "openai", "anthropic")

_NAME = re.compile(r"[a-z0-9_-]+")

# Keys that would mean "approve in advance". None of them exists; each is refused
# with a message that points at governance, wherever it appears.
APPROVAL_KEYS = frozenset(
    {
        "approval", "approvals", "approve", "approved", "approver", "approvers",
        "auto_approve", "autoapprove", "auto_approval", "auto_approved",
        "require_approval", "requires_approval", "approval_mode", "approval_policy",
        "allowed_tools", "allow_tools", "allowlist", "allow_list", "always_allow", "auto_allow",
        "permission", "permissions", "consent", "consents", "grant", "grants",
        "trust", "trusted", "trusted_tools", "yolo", "skip_approval", "no_confirm",
        "dangerously_skip_permissions",
    }
)
_APPROVAL_STEMS = ("approv", "consent", "permission", "yolo")

_TOP_KEYS = frozenset(
    {"name", "description", "instructions", "model", "tools", "python", "workspace", "budget", "runtime"}
)
_TABLE_KEYS: dict[str, frozenset[str]] = {
    "tools": frozenset({"required", "optional"}),
    "python": frozenset({"packages"}),
    "workspace": frozenset({"root"}),
    "budget": frozenset({"max_steps", "max_tokens"}),
    "runtime": frozenset({"drain_timeout_secs"}),
}

KeyPath = tuple[str | int, ...]

#: Servers that speak OpenAI's API, named as if they were providers: what to write instead.
_OPENAI_COMPATIBLE = {
    "ollama": "http://localhost:11434/v1",
    "vllm": "http://localhost:8000/v1",
    "llamacpp": "http://localhost:8080/v1",
    "llama.cpp": "http://localhost:8080/v1",
    "llama-cpp": "http://localhost:8080/v1",
    "lmstudio": "http://localhost:1234/v1",
    "lm-studio": "http://localhost:1234/v1",
    "openrouter": "https://openrouter.ai/api/v1",
}
_PROVIDER_ALIASES = {"claude": "anthropic", "gpt": "openai", "chatgpt": "openai", "azure": "openai",
                     "mock": "scripted", "fake": "scripted", "script": "scripted"}
#: Keys that would hold a secret: a manifest names the environment variable instead.
_SECRET_KEYS = frozenset({"api_key", "apikey", "api-key", "key", "token", "api_token", "access_token",
                          "secret", "secret_key", "password", "authorization", "bearer", "openai_api_key",
                          "anthropic_api_key"})


def _close(word: str, choices: Any) -> str | None:
    """The one choice closest to ``word`` (difflib), or None when none is close."""
    import difflib  # only for a mistake's suggestion: about 0.6 ms of CPU each opening of a home would pay

    found = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return found[0] if found else None


def _secret_hint(provider: Any = None) -> str:
    variable = "ANTHROPIC_API_KEY" if provider == "anthropic" else "OPENAI_API_KEY"
    return ("; a key is never written in a manifest (it is stored with the agent and shown to whoever reads "
            f'it): put it in an environment variable and name that variable, api_key_env = "{variable}" '
            "under [model]")


def _provider_hint(provider: str) -> str:
    norm = provider.strip().lower()
    if norm in _OPENAI_COMPATIBLE:
        return (f'; {provider} speaks OpenAI\'s API: write provider = "openai" with '
                f'base_url = "{_OPENAI_COMPATIBLE[norm]}" and model = "<its model name>"')
    alias = _PROVIDER_ALIASES.get(norm) or _close(norm, PROVIDERS)
    return f' (did you mean provider = "{alias}"?)' if alias else ""


@dataclass(frozen=True)
class Manifest:
    """A validated agent manifest. ``model`` is the raw ``[model]`` table."""

    name: str
    description: str = ""
    instructions: str = ""
    model: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_MODEL), hash=False)
    tools_required: tuple[str, ...] = ()
    tools_optional: tuple[str, ...] = ()
    python_packages: tuple[str, ...] = ()
    workspace_root: str = "."
    max_steps: int = DEFAULT_MAX_STEPS
    max_tokens: int | None = None  # [budget] max_tokens: a run's input + output tokens, None for no limit
    drain_timeout_secs: float | None = None
    source_text: str = field(default="", repr=False, compare=False)
    source: str = field(default="<manifest>", compare=False)

    def workspace_path(self, cwd: Path | None = None, *, resolve: bool = True) -> Path:
        """The workspace root as an absolute path, relative to ``cwd`` (default: the current directory).

        Resolved (``resolve``, the default): ``..`` and every symbolic link followed, so one folder has
        one spelling. The runtime resolves it once, when the agent is registered, and keeps that path
        (``agent_identity``); ``resolve=False`` gives the path as written, made absolute."""
        base = Path.cwd() if cwd is None else Path(cwd)
        written = Path(os.path.abspath(base / self.workspace_root))
        return Path(os.path.realpath(written)) if resolve else written


def load_manifest(path: Path) -> Manifest:
    """Read and parse a manifest file; errors name the file by its path as given."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ManifestInvalid(f"{path}:1: the manifest is not UTF-8 text") from None
    except OSError as exc:
        raise ManifestInvalid(f"{path}: cannot read the manifest: {exc.strerror or exc}") from None
    return parse_manifest(text, source=str(path))


def parse_manifest(text: str | bytes, *, source: str = "<manifest>") -> Manifest:
    """Parse and validate a manifest. Raises ``ManifestInvalid`` naming key and line."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ManifestInvalid(f"{source}:1: the manifest is not UTF-8 text") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestInvalid(_syntax_message(str(exc), text, source)) from None
    if not doc:
        raise ManifestInvalid(f'{source}:1: the manifest is empty (it needs at least name = "...")')
    checker = _Checker(source, text)
    manifest = checker.check(doc, text)
    if checker.problems:
        ordered = sorted(checker.problems, key=lambda p: p[0])
        raise ManifestInvalid("\n".join(message for _, message in ordered))
    assert manifest is not None
    return manifest


# --- validation -----------------------------------------------------------------


def _is_approval_key(key: str) -> bool:
    norm = key.strip().lower().replace("-", "_")
    return norm in APPROVAL_KEYS or any(stem in norm for stem in _APPROVAL_STEMS)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    return "datetime"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"' if len(value) <= 40 else f'"{value[:37]}..."'
    if isinstance(value, (dict, list)):
        return _type_name(value)
    return f"{value!r} ({_type_name(value)})"


def agent_identity(manifest: "Manifest", workspace: str | os.PathLike[str],
                   custom_tools: Any = ()) -> dict[str, Any]:
    """What standing consents of an agent are given for: its tools, its workspace and its model.

    ``tools``: the names it is offered, sorted (their order is not its identity), with the Python
    functions given at registration (``custom_tools``); ``["*"]`` when the manifest names none (every
    tool the runtime has). ``workspace``: the resolved absolute folder (``Manifest.workspace_path``).
    ``model``: the ``[model]`` table without its script (a scripted model's turns are not its identity).
    Compared by ``apollia_nb.governance.store.identity_difference``."""
    declared = [*manifest.tools_required, *manifest.tools_optional]
    tools = sorted({*declared, *custom_tools}) if declared else ["*"]
    model = {key: value for key, value in manifest.model.items() if key != "script"}
    return {"tools": tools, "workspace": os.fspath(workspace), "model": model}


def requirement_problem(entry: str) -> str | None:
    """Why ``entry`` is not a plain requirement specifier (PEP 508 name, extras, versions,
    markers; no URL, path, file or installer option), or None when it is one."""
    from packaging.requirements import InvalidRequirement, Requirement

    text = entry.strip()
    if text.startswith("-"):
        return "is an installer option, not a requirement (only names with versions and extras are accepted)"
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        return "is not a requirement specifier (a package name, optionally with [extras] and versions)"
    if requirement.url is not None:
        return "names a URL or a path (only names from the package index are accepted)"
    return None


def _dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            piece = part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else f"'{part}'"
            out += f".{piece}" if out else piece
    return out


class _Checker:
    """Collects (line, message) problems while building the Manifest."""

    def __init__(self, source: str, text: str) -> None:
        self.source = source
        self.text = text
        self._lines: dict[KeyPath, int] | None = None
        self.problems: list[tuple[int, str]] = []
        self.refused: list[KeyPath] = []  # approval keys, each reported once (not again as unknown)

    @property
    def lines(self) -> dict[KeyPath, int]:
        """Key path → line, located on the first problem (a manifest without one never needs it)."""
        if self._lines is None:
            self._lines = _locate(self.text)
        return self._lines

    def line(self, path: KeyPath) -> int:
        for end in range(len(path), 0, -1):
            found = self.lines.get(path[:end])
            if found is not None:
                return found
        return 1

    def problem(self, path: KeyPath, message: str) -> None:
        self.problems.append((self.line(path), f"{self.source}:{self.line(path)}: {message}"))

    def wrong(self, path: KeyPath, expected: str, value: Any) -> None:
        self.problem(path, f'"{_dotted(path)}" must be {expected}, got {_show(value)}')

    # -- the walk over every key, for approval keys --------------------------------

    def refuse_approval_keys(self, node: Any, path: KeyPath) -> None:
        if isinstance(node, dict):
            if len(path) >= 3 and path[-1] == "arguments" and isinstance(path[-2], int) and path[-3] == "tool_calls":
                return  # a scripted tool call's own arguments: data for the tool
            for key, value in node.items():
                child = (*path, key)
                if _is_approval_key(key):
                    self.refused.append(child)
                    self.problem(
                        child,
                        f'"{_dotted(child)}" is refused: a manifest has no key for approval; '
                        "governance decides each tool call from your rules and consents "
                        "(see docs/governance.md)",
                    )
                else:
                    self.refuse_approval_keys(value, child)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                self.refuse_approval_keys(item, (*path, index))

    # -- typed getters ---------------------------------------------------------------

    def string(self, table: dict[str, Any], path: KeyPath, default: str) -> str:
        value = table.get(path[-1], default)  # type: ignore[arg-type]  # a table's key is a str
        if not isinstance(value, str):
            self.wrong(path, "a string", value)
            return default
        if "\x00" in value:
            self.problem(path, f'"{_dotted(path)}" must not contain a NUL character')
            return default
        return value

    def string_list(self, table: dict[str, Any], path: KeyPath) -> tuple[str, ...]:
        value = table.get(path[-1], [])  # type: ignore[arg-type]  # a table's key is a str
        if not isinstance(value, list):
            self.wrong(path, "an array of strings", value)
            return ()
        out: list[str] = []
        for index, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                self.wrong((*path, index), "a non-empty string", item)
            elif item in out:
                self.problem(path, f'"{_dotted(path)}" lists "{item}" twice')
            else:
                out.append(item)
        return tuple(out)

    def known_keys(self, table: dict[str, Any], path: KeyPath, allowed: frozenset[str]) -> None:
        for key in table:
            if key not in allowed and not _is_approval_key(key):
                self.problem((*path, key), f'unknown key "{_dotted((*path, key))}"' + _unknown_hint(key, allowed))

    def section(self, doc: dict[str, Any], name: str) -> dict[str, Any]:
        value = doc.get(name, {})
        if not isinstance(value, dict):
            self.wrong((name,), "a table", value)
            return {}
        self.known_keys(value, (name,), _TABLE_KEYS[name])
        return value

    # -- the manifest ------------------------------------------------------------------

    def check(self, doc: dict[str, Any], text: str) -> Manifest | None:
        self.refuse_approval_keys(doc, ())
        self.known_keys(doc, (), _TOP_KEYS)

        name = doc.get("name")
        if name is None:
            self.problems.append((1, f'{self.source}:1: missing required key "name"'))
            name = ""
        elif not isinstance(name, str):
            self.wrong(("name",), "a string matching [a-z0-9_-]+", name)
            name = ""
        elif not _NAME.fullmatch(name):
            self.problem(("name",), f'"name" must match [a-z0-9_-]+ (lowercase letters, digits, _ and -), got {_show(name)}')

        description = self.string(doc, ("description",), "")
        instructions = self.string(doc, ("instructions",), "")
        model = self.model(doc)

        tools = self.section(doc, "tools")
        required = self.string_list(tools, ("tools", "required"))
        optional = self.string_list(tools, ("tools", "optional"))
        for tool_name in optional:
            if tool_name in required:
                self.problem(("tools", "optional"), f'"{tool_name}" is in both "tools.required" and "tools.optional"')

        packages = self.string_list(self.section(doc, "python"), ("python", "packages"))
        for index, entry in enumerate(packages):
            why = requirement_problem(entry)
            if why is not None:
                self.problem(("python", "packages", index), f'"python.packages[{index}]" {entry!r} {why}')
        root = self.string(self.section(doc, "workspace"), ("workspace", "root"), ".")
        if not root.strip():
            self.problem(("workspace", "root"), '"workspace.root" must not be empty (use "." for the current directory)')

        budget = self.section(doc, "budget")
        limits: dict[str, int | None] = {"max_steps": DEFAULT_MAX_STEPS, "max_tokens": None}
        for key, expected in (("max_steps", "a positive integer"), ("max_tokens", "a positive integer (tokens)")):
            if key in budget:
                value = budget[key]
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    self.wrong(("budget", key), expected, value)
                else:
                    limits[key] = value
        max_steps, max_tokens = limits["max_steps"] or DEFAULT_MAX_STEPS, limits["max_tokens"]

        drain: float | None = None
        runtime = self.section(doc, "runtime")
        if "drain_timeout_secs" in runtime:
            value = runtime["drain_timeout_secs"]
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                self.wrong(("runtime", "drain_timeout_secs"), "a positive number of seconds", value)
            else:
                drain = float(value)

        if self.problems:
            return None
        return Manifest(
            name=name,
            description=description,
            instructions=instructions,
            model=model,
            tools_required=required,
            tools_optional=optional,
            python_packages=packages,
            workspace_root=root,
            max_steps=max_steps,
            max_tokens=max_tokens,
            drain_timeout_secs=drain,
            source_text=text,
            source=self.source,
        )

    def model(self, doc: dict[str, Any]) -> dict[str, Any]:
        if "model" not in doc:
            return dict(DEFAULT_MODEL)
        model = doc["model"]
        if not isinstance(model, dict):
            self.wrong(("model",), "a table", model)
            return {}
        provider = model.get("provider")
        defaulted = provider is None
        if defaulted:  # the default, as for a manifest without [model]
            model = {**DEFAULT_MODEL, **model}
        elif not isinstance(provider, str) or not provider.strip():
            self.wrong(("model", "provider"), "a provider name string", provider)
            return model
        elif provider not in PROVIDERS:
            self.problem(("model", "provider"), f'unknown provider {provider!r} for "model.provider" '
                                                f"(expected {', '.join(PROVIDERS[:-1])} or {PROVIDERS[-1]})"
                                                + _provider_hint(provider))
            return model
        if not any(path[:1] == ("model",) for path in self.refused):
            self.provider_table(model, defaulted=defaulted)
        return model

    def provider_table(self, model: dict[str, Any], *, defaulted: bool) -> None:
        """The provider's own check of its table (keys, types, the script), its error given a line."""
        from apollia_nb.runtime.models import build_model

        try:
            build_model(model, env=_EveryVariable())
        except ManifestInvalid as exc:
            path, rest = _provider_error(exc.message)
            if path is None:
                self.problem(("model",), exc.message)
                return
            key = path[-1]
            if rest.startswith("unknown key") and isinstance(key, str):
                allowed = re.search(r"expected one of ([^)]*)\)", rest)
                choices = [c.strip() for c in allowed.group(1).split(",")] if allowed else []
                hint = _unknown_hint(key, choices, model.get("provider"))
                if defaulted and len(path) == 2 and not hint:
                    hint = (' (provider is not set, so it is "scripted", which takes only provider and script: '
                            'set provider = "openai" or "anthropic" for a model served over HTTP)')
                elif not hint and choices:
                    hint = f" (expected one of {', '.join(choices)})"
                self.problem(path, f'unknown key "{_dotted(path)}"' + hint)
            else:
                self.problem(path, f'"{_dotted(path)}": {rest}')


def _syntax_message(message: str, text: str, source: str) -> str:
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match:
        return f"{source}:{match.group(1)}: TOML syntax error at column {match.group(2)}: {message[: match.start()]}"
    match = re.search(r"\s*\(at end of document\)$", message)
    if match:
        last = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
        return f"{source}:{last}: TOML syntax error at the end of the document: {message[: match.start()]}"
    return f"{source}:1: TOML syntax error: {message}"


def _unknown_hint(key: str, allowed: Any, provider: Any = None) -> str:
    """What an unknown key was probably meant to be: a secret's variable, or the closest allowed key."""
    if key.strip().lower() in _SECRET_KEYS:
        return _secret_hint(provider)
    close = _close(key, sorted(allowed))
    return f" (did you mean {close}?)" if close else ""


class _EveryVariable(dict[str, str]):
    """An environment where every variable is set: the manifest is checked, not the environment
    (a missing key variable is ``MODEL_KEY_MISSING`` when the agent is registered)."""

    def get(self, key: str, default: Any = None) -> str:  # type: ignore[override]
        return "set"

    def __getitem__(self, key: str) -> str:
        return "set"

    def __contains__(self, key: object) -> bool:
        return True


_PROVIDER_PATH = re.compile(r"model(?:\.[A-Za-z0-9_-]+|\[\d+\])*")
_PATH_PART = re.compile(r"([A-Za-z0-9_-]+)|\[(\d+)\]")


def _provider_error(message: str) -> tuple[KeyPath | None, str]:
    """A provider's ``model.script.actor[0].text: must be ...`` as (the key path, what it says)."""
    head, sep, rest = message.partition(": ")
    if not sep or not _PROVIDER_PATH.fullmatch(head):
        return None, message
    return tuple(m.group(1) if m.group(1) is not None else int(m.group(2))
                 for m in _PATH_PART.finditer(head)), rest


def check_script_tools(manifest: Manifest, tools: Any) -> None:
    """A scripted model's tool calls name tools of the agent (``tools``: the names it is offered).

    Names of federated tools (``mcp:``, ``rest:``) are left alone: they resolve when the agent starts,
    and a call to one that did not is refused then. Raises ``MANIFEST_INVALID`` naming the step, its
    line and the closest tool name."""
    if manifest.model.get("provider", "scripted") != "scripted":
        return
    script = manifest.model.get("script")
    if not isinstance(script, dict):
        return
    names = set(tools)
    problems: list[tuple[int, str]] = []
    lines: dict[KeyPath, int] | None = None
    for role, entries in script.items():
        for index, entry in enumerate(entries if isinstance(entries, list) else []):
            calls = entry.get("tool_calls") if isinstance(entry, dict) else None
            for position, tool_call in enumerate(calls if isinstance(calls, list) else []):
                name = tool_call.get("name") if isinstance(tool_call, dict) else None
                if not isinstance(name, str) or name in names or name.startswith(("mcp:", "rest:")):
                    continue
                if lines is None:
                    lines = _locate(manifest.source_text) if manifest.source_text else {}
                path: KeyPath = ("model", "script", role, index, "tool_calls", position, "name")
                line = next((lines[path[:end]] for end in range(len(path), 0, -1) if path[:end] in lines), 1)
                close = _close(name, sorted(names))
                problems.append((line, (
                    f"{manifest.source}:{line}: {_dotted(path[:4])} (the {role}'s turn {index + 1}) calls "
                    f'"{name}", which is not a tool of agent {manifest.name!r}'
                    + (f" (did you mean {close}?)" if close else "")
                    + f"; its tools: {', '.join(sorted(names)) or 'none'}")))
    if problems:
        raise ManifestInvalid("\n".join(message for _, message in sorted(problems)))


# --- where each key is defined ------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class _Locator:
    """Maps key paths to the line that defines them. Expects text tomllib accepted."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1
        self.lines: dict[KeyPath, int] = {}
        self.arrays_of_tables: dict[KeyPath, int] = {}

    # low-level movement
    def peek(self, offset: int = 0) -> str:
        index = self.pos + offset
        return self.text[index] if index < len(self.text) else ""

    def advance(self, count: int = 1) -> None:
        chunk = self.text[self.pos : self.pos + count]
        self.line += chunk.count("\n")
        self.pos += count

    def skip_space(self, newlines: bool) -> None:
        while self.pos < len(self.text):
            char = self.peek()
            if char in " \t\r" or (newlines and char == "\n"):
                self.advance()
            elif char == "#":
                end = self.text.find("\n", self.pos)
                self.advance((len(self.text) if end < 0 else end) - self.pos)
            else:
                return

    def record(self, path: KeyPath, line: int) -> None:
        self.lines.setdefault(path, line)

    # keys
    def simple_key(self) -> str:
        char = self.peek()
        if char in "\"'":
            start = self.pos
            self.skip_string()
            raw = self.text[start : self.pos]
            try:
                return str(tomllib.loads(f"k = {raw}")["k"])
            except tomllib.TOMLDecodeError:  # pragma: no cover - tomllib accepted it already
                return raw.strip("\"'")
        match = _BARE_KEY.match(self.text, self.pos)
        if not match:  # pragma: no cover - tomllib accepted the text
            self.advance()
            return ""
        self.advance(match.end() - self.pos)
        return match.group(0)

    def dotted_key(self) -> list[str]:
        parts = [self.simple_key()]
        while True:
            self.skip_space(newlines=False)
            if self.peek() != ".":
                return parts
            self.advance()
            self.skip_space(newlines=False)
            parts.append(self.simple_key())

    # strings and values
    def skip_string(self) -> None:
        quote = self.peek()
        if self.text.startswith(quote * 3, self.pos):
            self.advance(3)
            while self.pos < len(self.text):
                if quote == '"' and self.peek() == "\\":
                    self.advance(2)
                elif self.text.startswith(quote * 3, self.pos):
                    self.advance(3)
                    extra = 0
                    while self.peek() == quote and extra < 2:
                        self.advance()
                        extra += 1
                    return
                else:
                    self.advance()
            return
        self.advance()
        while self.pos < len(self.text) and self.peek() != quote:
            if quote == '"' and self.peek() == "\\":
                self.advance()
            self.advance()
        self.advance()

    def value(self, path: KeyPath) -> None:
        char = self.peek()
        if char in "\"'":
            self.skip_string()
        elif char == "[":
            self.advance()
            index = 0
            while self.pos < len(self.text):
                start = self.pos
                self.skip_space(newlines=True)
                if self.peek() == "]":
                    self.advance()
                    return
                self.record((*path, index), self.line)
                self.value((*path, index))
                index += 1
                self.skip_space(newlines=True)
                if self.peek() == ",":
                    self.advance()
                if self.pos == start:  # pragma: no cover - never stall on unexpected text
                    self.advance()
        elif char == "{":
            self.advance()
            while self.pos < len(self.text):
                start = self.pos
                self.skip_space(newlines=True)
                if self.peek() == "}":
                    self.advance()
                    return
                if self.peek() == ",":
                    self.advance()
                    continue
                self.key_value(path)
                if self.pos == start:  # pragma: no cover - never stall on unexpected text
                    self.advance()
        else:
            while self.pos < len(self.text) and self.peek() not in ",]}\n#":
                self.advance()

    def key_value(self, table: KeyPath) -> None:
        line = self.line
        parts = self.dotted_key()
        path = table
        for part in parts:
            path = (*path, part)
            self.record(path, line)
        self.skip_space(newlines=False)
        if self.peek() == "=":
            self.advance()
        self.skip_space(newlines=False)
        self.value(path)

    def header(self) -> KeyPath:
        line = self.line
        is_array = self.text.startswith("[[", self.pos)
        self.advance(2 if is_array else 1)
        self.skip_space(newlines=False)
        parts = self.dotted_key()
        self.skip_space(newlines=False)
        self.advance(2 if is_array else 1)
        path: KeyPath = ()
        for index, part in enumerate(parts):
            path = (*path, part)
            self.record(path, line)
            last = index == len(parts) - 1
            if last and is_array:
                position = self.arrays_of_tables.get(path, -1) + 1
                self.arrays_of_tables[path] = position
                path = (*path, position)
                self.record(path, line)
            elif path in self.arrays_of_tables:
                path = (*path, self.arrays_of_tables[path])
        return path

    def run(self) -> dict[KeyPath, int]:
        table: KeyPath = ()
        while True:
            self.skip_space(newlines=True)
            if self.pos >= len(self.text):
                return self.lines
            if self.peek() == "[":
                table = self.header()
            else:
                self.key_value(table)


def _locate(text: str) -> dict[KeyPath, int]:
    """Key path → line number of its definition (1-based)."""
    return _Locator(text).run()
