"""Which of our tools another agent's tool call is decided as: a table, overridable in ``apollia.toml``.

Pure: names and values in, values out. Each external tool (``claude-code``, ``codex``,
``cursor``) names its own tools (``Bash``, ``Write``, ``apply_patch``, ``mcp__notes__search``);
``map_call`` turns one of its calls into the calls ``decide()`` judges — our tool name, the
family, the arguments with the first argument first, whether the first argument is shell
text, the file it names (resolved later, at the edge) and the connection. A call that names
several files (Codex's ``apply_patch``) becomes one call per file; the strictest decision wins.

``[hooks.<tool>.map]`` in ``apollia.toml`` overrides a row: the value is one of our built-in
tools (``"read_file"``, ``"write_file"``, ``"bash_executor"``, ``"http_request"``, …) or a
family (``"family:read"``, ``"family:send"``, …: the call keeps its own name and is decided by
that family). ``[hooks.<tool>] ask_timeout_secs`` is how long an asked call waits on the inbox.
Anything else in ``[hooks]`` is ``BAD_INPUT`` naming the key: a hook that cannot read its
settings denies (fail closed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apollia_nb.errors import BadInput

__all__ = ["TOOLS", "TARGETS", "Mapped", "HookSettings", "hook_settings", "map_call", "mcp_name",
           "DEFAULT_ASK_TIMEOUT_SECS", "TOOL_TIMEOUT_SECS", "patch_paths"]

#: The external tools a hook speaks for (``apollia-os hook TOOL``).
TOOLS = ("claude-code", "codex", "cursor")

#: How long each tool lets a command hook run before it gives up on it, in seconds: Claude Code's
#: and Codex's documented default (600 s); Cursor's entries get the ``timeout`` ``hook install``
#: writes. ``hook install`` writes ``INSTALLED_TIMEOUT_SECS`` for all three.
TOOL_TIMEOUT_SECS = {"claude-code": 600.0, "codex": 600.0, "cursor": 600.0}
#: The ``timeout`` ``hook install`` writes into each hook entry.
INSTALLED_TIMEOUT_SECS = 120
#: How long an asked call waits for a person by default: well under the installed timeout, so
#: the hook answers (deny) before the tool gives up on it (which some tools take as "no opinion").
DEFAULT_ASK_TIMEOUT_SECS = 90.0

#: Our tools an external call may be decided as: ``{name: (family, first argument, shell text)}``.
TARGETS: dict[str, tuple[str | None, str, bool]] = {
    "bash_executor": ("execute", "command", True),
    "python_executor": ("execute", "code", False),
    "read_file": ("read", "path", False),
    "list_dir": ("read", "path", False),
    "write_file": ("write", "path", False),
    "delete_file": ("write", "path", False),
    "http_request": ("send", "url", False),
}
FILE_TARGETS = frozenset({"read_file", "list_dir", "write_file", "delete_file"})
FAMILIES = ("read", "read_personal", "write", "send", "execute", "conversation", "memory", "profile")

#: Each tool's own tools, as ``{its name: (our target, the input key of the first argument)}``; a
#: target ``family:X`` keeps the call's own name, decided by family X. Defaults to the documented table.
_DEFAULT_MAPS: dict[str, dict[str, tuple[str, str | None]]] = {
    "claude-code": {
        "Bash": ("bash_executor", "command"),
        "Write": ("write_file", "file_path"),
        "Edit": ("write_file", "file_path"),
        "MultiEdit": ("write_file", "file_path"),
        "NotebookEdit": ("write_file", "notebook_path"),
        "Read": ("read_file", "file_path"),
        "Grep": ("read_file", "path"),
        "Glob": ("read_file", "path"),
        "LS": ("list_dir", "path"),
        "WebFetch": ("http_request", "url"),
        "WebSearch": ("family:send", "query"),
        "TodoWrite": ("family:conversation", None),
        "Task": ("family:conversation", "prompt"),
        "ExitPlanMode": ("family:conversation", None),
        "AskUserQuestion": ("family:conversation", None),
    },
    "codex": {
        "Bash": ("bash_executor", "command"),
        "shell": ("bash_executor", "command"),
        "exec_command": ("bash_executor", "command"),
        "apply_patch": ("write_file", "command"),
        "NetworkAccess": ("http_request", "command"),
    },
    "cursor": {
        "beforeShellExecution": ("bash_executor", "command"),
        "beforeReadFile": ("read_file", "file_path"),
    },
}

_MCP = re.compile(r"mcp__(?P<server>[A-Za-z0-9_.-]+?)__(?P<tool>.+)")
_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class HookSettings:
    """``[hooks.<tool>]`` of ``apollia.toml``, validated: the map's overrides and the ask timeout."""

    tool: str
    overrides: Mapping[str, str] = field(default_factory=dict)
    ask_timeout_secs: float = DEFAULT_ASK_TIMEOUT_SECS

    def target(self, native: str) -> tuple[str, str | None] | None:
        """Our target for the tool's own ``native`` name and its first argument's key, or None (unmapped)."""
        row = _DEFAULT_MAPS[self.tool].get(native)
        given = self.overrides.get(native)
        if given is None:
            return row
        key = row[1] if row is not None else None
        if key is None and given in TARGETS:
            key = TARGETS[given][1]
        return given, key


def hook_settings(raw: Mapping[str, Any], tool: str) -> HookSettings:
    """``[hooks.<tool>]`` from ``apollia.toml``'s parsed text; ``BAD_INPUT`` naming the key otherwise."""
    hooks = raw.get("hooks", {})
    if not isinstance(hooks, Mapping):
        raise BadInput("apollia.toml: [hooks] must be a table of [hooks.<tool>] tables")
    for name in hooks:
        if name not in TOOLS:
            raise BadInput(f"apollia.toml: [hooks.{name}] names no tool a hook speaks for (one of {', '.join(TOOLS)})")
    own = hooks.get(tool, {})
    if not isinstance(own, Mapping):
        raise BadInput(f"apollia.toml: [hooks.{tool}] must be a table")
    for key in own:
        if key not in ("map", "ask_timeout_secs"):
            raise BadInput(f"apollia.toml: [hooks.{tool}] has the unknown key {key!r} (known: map, ask_timeout_secs)")
    timeout = own.get("ask_timeout_secs", DEFAULT_ASK_TIMEOUT_SECS)
    limit = INSTALLED_TIMEOUT_SECS - 5
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= limit:
        raise BadInput(f"apollia.toml: [hooks.{tool}] ask_timeout_secs must be a number of seconds from 0 to "
                       f"{limit} (under the {INSTALLED_TIMEOUT_SECS} s the hook is installed with), got {timeout!r}")
    given = own.get("map", {})
    if not isinstance(given, Mapping):
        raise BadInput(f"apollia.toml: [hooks.{tool}.map] must be a table of tool names to targets")
    overrides: dict[str, str] = {}
    for native, target in given.items():
        if not isinstance(target, str) or not (
                target in TARGETS or (target.startswith("family:") and target[7:] in FAMILIES)):
            raise BadInput(f"apollia.toml: [hooks.{tool}.map] {native} = {target!r}: a target is one of "
                           f"{', '.join(TARGETS)} or family:<family> ({', '.join(FAMILIES)})")
        overrides[str(native)] = target
    return HookSettings(tool=tool, overrides=overrides, ask_timeout_secs=float(timeout))


@dataclass(frozen=True)
class Mapped:
    """One call for ``decide()``: our ``tool``, its ``family`` (None: unclassified), ``arguments``
    (first argument first), ``shell`` (the first argument is shell text), ``path`` (a file tool's
    path, to resolve against the project), ``connection`` (an MCP server) and the tool's own name."""

    tool: str
    family: str | None
    arguments: dict[str, Any]
    native: str
    shell: bool = False
    path: str | None = None
    connection: str | None = None


def mcp_name(server: str, tool: str) -> str:
    """Our name for an MCP server's tool: ``mcp:<server>/<tool>``."""
    return f"mcp:{server}/{tool}"


def _slug(text: str) -> str:
    return _SLUG.sub("-", text).strip("-") or "unknown"


def map_call(settings: HookSettings, native: str, tool_input: Mapping[str, Any], *,
             mcp_families: Mapping[str, Mapping[str, Any]] | None = None,
             mcp_server: str | None = None) -> list[Mapped]:
    """The calls ``native(tool_input)`` is decided as (one, or one per file a patch names).

    ``mcp_families``: ``[mcp.servers.<name>] families`` from ``apollia.toml`` (an MCP tool's family;
    unclassified otherwise). ``mcp_server``: the server of an MCP call whose name does not carry it
    (Cursor's ``beforeMCPExecution``)."""
    families = mcp_families or {}
    rest = {k: v for k, v in tool_input.items()}
    override = settings.overrides.get(native)
    m = _MCP.fullmatch(native)
    if override is None and (m is not None or mcp_server is not None):
        server, tool = (m.group("server"), m.group("tool")) if m is not None else (_slug(mcp_server or ""), native)
        declared = (families.get(server) or {}).get("families") or {}
        family = declared.get(tool) if isinstance(declared, Mapping) else None
        if family not in FAMILIES:
            family = None
        return [Mapped(tool=mcp_name(server, tool), family=family, arguments=rest, native=native,
                       connection=server)]
    target = settings.target(native)
    if target is None:  # a tool the table does not know: unclassified, asked every time
        return [Mapped(tool=native, family=None, arguments=rest, native=native)]
    name, key = target
    if name.startswith("family:"):
        first = {key: rest.pop(key)} if key is not None and key in rest else {}
        return [Mapped(tool=native, family=name[7:], arguments={**first, **rest}, native=native)]
    family, first_key, shell = TARGETS[name]
    value = rest.pop(key, None) if key is not None else None
    if settings.tool == "codex" and native == "apply_patch" and name in FILE_TARGETS:
        paths = patch_paths(value if isinstance(value, str) else "")
        if not paths:  # a patch that names no file: decided on its text, asked (never a guess)
            return [Mapped(tool=native, family=None, arguments={"patch": value, **rest}, native=native)]
        return [Mapped(tool=name, family=family, arguments={first_key: p, "patch": value, **rest}, native=native,
                       path=p) for p in paths]
    if name == "http_request" and native == "NetworkAccess" and isinstance(value, str):
        value = value.removeprefix("network-access ").strip()
    if name in FILE_TARGETS:
        path = value if value is not None else "."  # Grep and Glob without a path search the project
        return [Mapped(tool=name, family=family, arguments={first_key: path, **rest}, native=native,
                       path=path if isinstance(path, str) else json.dumps(path))]
    return [Mapped(tool=name, family=family, arguments={first_key: value, **rest}, native=native, shell=shell)]


_PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File: (.+?)\s*$|^\*\*\* Move to: (.+?)\s*$", re.M)


def patch_paths(patch: str) -> list[str]:
    """The files an ``apply_patch`` text adds, updates, deletes or moves to, in order, once each."""
    found = [a or b for a, b in _PATCH_FILE.findall(patch)]
    return list(dict.fromkeys(p for p in found if p))
