"""An ACP tool call as the call governance decides, and a decision as the agent's permission option.

Pure: values in, values out. The Agent Client Protocol (schema v1.19.0, protocol version 1) names
what a tool call does by its ``kind``; each kind is decided as the built-in tool that does the same,
so the rules, consents and policy written for our own tools guard the agent's too:

    kind                      decided as        family        first argument
    read, search              read_file         read          the path
    edit                      write_file        write         the path
    delete                    delete_file       write         the path
    move                      write_file        write         the source (the destination too)
    execute                   bash_executor     execute       the command (the simple-command check)
    fetch                     http_request      send          the URL
    think, switch_mode,
    other, none               acp:<kind>        unclassified  the raw input as sent

The kind is the agent's own word, so it never lowers what a call is decided as: a call of any
kind (``other`` and unknown kinds too) whose raw input carries a command (``command``, ``cmd``) is
decided as ``execute``, and a ``read`` or ``search`` whose raw input carries text to write
(``content``, ``new_string``, ``edits``, ``patch``…) or whose content holds a diff as ``edit``.

A path is resolved the way our file tools resolve theirs (``paths.resolve_tool_path``, against the
agent's workspace, never into the home): a path that escapes the workspace or reaches into the
home refuses the call. A file call whose path cannot be found in its raw input or locations, and
an ``execute`` call whose command is not one string, is decided unclassified: asked every time,
never with ``always`` (what cannot be read is never allowed by a consent or a rule).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apollia_nb.errors import ApolliaError
from apollia_nb.governance.decision import Call, Decision, Family, Outcome

__all__ = ["KIND_TOOLS", "PATH_KEYS", "AcpCall", "acp_call", "agent_name", "permission_outcome"]

#: ACP tool kind: (the tool it is decided as, its family).
KIND_TOOLS: dict[str, tuple[str, Family]] = {
    "read": ("read_file", Family.READ),
    "search": ("read_file", Family.READ),
    "edit": ("write_file", Family.WRITE),
    "delete": ("delete_file", Family.WRITE),
    "move": ("write_file", Family.WRITE),
    "execute": ("bash_executor", Family.EXECUTE),
    "fetch": ("http_request", Family.SEND),
}
#: Keys of a raw input that name a file, in the order they are read.
PATH_KEYS = ("path", "file_path", "filePath", "abs_path", "absPath", "notebook_path", "filename", "file",
             "source", "from", "old_path", "oldPath", "destination", "to", "new_path", "newPath")
_COMMAND_KEYS = ("command", "cmd")
_URL_KEYS = ("url", "uri")
#: Keys of a raw input that carry text to write (an edit, whatever kind the agent calls it).
_WRITE_KEYS = ("content", "new_string", "newString", "old_string", "oldString", "new_text", "newText", "edits",
               "patch", "diff")


def _has_diff(tool_call: Mapping[str, Any]) -> bool:
    content = tool_call.get("content")
    return isinstance(content, list) and any(isinstance(c, Mapping) and c.get("type") == "diff" for c in content)


@dataclass(frozen=True)
class AcpCall:
    """What governance decides for one ACP tool call. ``problem``: why it is refused before deciding
    (a path outside the workspace or into the home), or None."""

    tool: str
    family: Family | None
    arguments: dict[str, Any]
    call: Call | None
    problem: str | None = None


#: Commands that run the agent named by their next argument (``npx @zed-industries/claude-code-acp``).
_RUNNERS = ("python", "node", "npx", "bunx", "bun", "deno", "uv", "uvx", "pipx", "pnpm", "yarn", "env")
_RUNNER_WORDS = ("run", "dlx", "exec", "x", "tool")


def agent_name(command: Sequence[str], project: str) -> str:
    """The home's agent for an ACP agent command run for a project: ``acp-<agent>--<project>``, in
    the letters a manifest's name allows (lowercase letters, digits, ``_`` and ``-``). The agent is
    the command's name, or the script, module or package a runner (``python``, ``node``, ``npx``,
    ``uvx``…) is given."""
    def slug(text: str) -> str:
        out = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "-" for c in text.lower())
        return "-".join(part for part in out.split("-") if part) or "agent"

    def base(word: str) -> str:
        word = word.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        word = word.split("@", 1)[0] if not word.startswith("@") else word
        for suffix in (".exe", ".cmd", ".js", ".mjs", ".py"):
            word = word.removesuffix(suffix)
        return word

    words = list(command) or ["agent"]
    name = base(words[0])
    if name.startswith(_RUNNERS):
        rest = words[1:]
        while rest:
            word = rest.pop(0)
            if word == "-m" and rest:
                name = rest[0]
                break
            if word.startswith("-") or word in _RUNNER_WORDS or "=" in word:
                continue
            name = base(word.split("/")[-1] if word.startswith("@") else word)
            break
    return f"acp-{slug(name)}--{slug(project)}"


def _raw(tool_call: Mapping[str, Any]) -> dict[str, Any]:
    raw = tool_call.get("rawInput")
    if isinstance(raw, Mapping):
        return {str(k): v for k, v in raw.items()}
    return {} if raw is None else {"input": raw}


def _paths(raw: Mapping[str, Any], tool_call: Mapping[str, Any]) -> list[str]:
    found = [raw[k] for k in PATH_KEYS if isinstance(raw.get(k), str) and raw[k]]
    locations = tool_call.get("locations")
    if isinstance(locations, list):
        found += [loc["path"] for loc in locations
                  if isinstance(loc, Mapping) and isinstance(loc.get("path"), str) and loc["path"]]
    return list(dict.fromkeys(found))


def _command(raw: Mapping[str, Any]) -> str | None:
    for key in _COMMAND_KEYS:
        value = raw.get(key)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            value = shlex.join(value)
        if isinstance(value, str) and value.strip():
            args = raw.get("args")
            if isinstance(args, list) and args:
                if not all(isinstance(a, str) for a in args):
                    return None
                value = " ".join([value, shlex.join(args)])
            return value
    return None


def acp_call(agent: str, tool_call: Mapping[str, Any], *, workspace: str, home: str,
             connection: str | None = None, code_places: Any = None) -> AcpCall:
    """The call ``decide()`` judges for an ACP tool call (``session/request_permission``'s ``toolCall``)."""
    from apollia_nb.runtime.paths import resolve_tool_path

    kind = tool_call.get("kind")
    kind = kind if isinstance(kind, str) and kind else "other"
    raw = _raw(tool_call)
    if any(key in raw for key in _COMMAND_KEYS):  # the command it runs decides, whatever the kind says
        kind = "execute"
    mapped = KIND_TOOLS.get(kind)
    if mapped is None:
        name = f"acp:{kind}" if kind.replace("_", "").isalnum() else "acp:other"
        return AcpCall(name, None, raw, Call(agent=agent, tool=name, family=None, arguments=raw,
                                             connection=connection))
    tool, family = mapped
    # The kind is the agent's own word: a call whose input carries a command is decided as the
    # command it runs, and a reading call whose input carries new text or a diff as a write.
    if family is Family.READ and (any(key in raw for key in _WRITE_KEYS) or _has_diff(tool_call)):
        tool, family = KIND_TOOLS["edit"]
    if family is Family.EXECUTE:
        command = _command(raw)
        if command is None:  # not one command line: nothing a rule or the simple-command check can read
            arguments = {"command": raw.get("command"), **{k: v for k, v in raw.items() if k != "command"}}
            return AcpCall(tool, None, arguments, Call(agent=agent, tool=tool, family=None, arguments=arguments,
                                                       connection=connection, shell=False))
        arguments = {"command": command, **{k: v for k, v in raw.items() if k not in (*_COMMAND_KEYS, "args")}}
        return AcpCall(tool, family, arguments, Call(agent=agent, tool=tool, family=family, arguments=arguments,
                                                     connection=connection, shell=True))
    if family is Family.SEND:
        url = next((raw[k] for k in _URL_KEYS if isinstance(raw.get(k), str) and raw[k]), None)
        arguments = {"url": url, **{k: v for k, v in raw.items() if k not in _URL_KEYS}}
        from apollia_nb.runtime.builtins import url_aliases

        fam = family if url is not None else None
        aliases = url_aliases(url) if url is not None else ()  # the URL as the HTTP client reads it, as ours
        return AcpCall(tool, fam, arguments, Call(agent=agent, tool=tool, family=fam, arguments=arguments,
                                                  connection=connection, aliases=tuple(aliases)))
    paths = _paths(raw, tool_call)
    arguments = {"path": paths[0] if paths else None,
                 **{k: v for k, v in raw.items() if k not in ("path",)}}
    if not paths:  # which file is not said: asked every time
        return AcpCall(tool, None, arguments, Call(agent=agent, tool=tool, family=None, arguments=arguments,
                                                   connection=connection))
    names: list[str] = []
    for path in paths:
        try:
            names.extend(resolve_tool_path(workspace, path, home=home).names)
        except ApolliaError as exc:
            return AcpCall(tool, family, arguments, None, problem=f"{exc.code}: {exc.message}")
    return AcpCall(tool, family, arguments, Call(
        agent=agent, tool=tool, family=family, arguments=arguments, connection=connection,
        paths=tuple(dict.fromkeys(names)), code_places=code_places if family is Family.WRITE else None))


def _option(options: list[Mapping[str, Any]], *kinds: str) -> str | None:
    for kind in kinds:
        for option in options:
            if option.get("kind") == kind and isinstance(option.get("optionId"), str):
                return str(option["optionId"])
    return None


def permission_outcome(options: Any, decision: Decision, answer: str | None) -> tuple[dict[str, Any], str]:
    """The ``RequestPermissionResponse.outcome`` for a decision carried out, and what was chosen.

    Allowed: the agent's ``allow_once``; its ``allow_always`` only when a person answered ``always``
    to a decision whose line 6 offered it (a standing consent of the agent for the family was
    recorded). Refused: ``reject_once``, else ``reject_always``. An option the agent does not offer
    is never made up: an allowed call with no one-time allow is rejected, a refusal with no reject
    option is answered ``cancelled``."""
    offered = [o for o in options if isinstance(o, Mapping)] if isinstance(options, list) else []
    if decision.outcome is Outcome.ALLOW:
        standing = answer == "always" and decision.line == 6
        chosen = _option(offered, "allow_always", "allow_once") if standing else _option(offered, "allow_once")
        if chosen is not None:
            return {"outcome": "selected", "optionId": chosen}, "allow"
    chosen = _option(offered, "reject_once", "reject_always")
    if chosen is not None:
        return {"outcome": "selected", "optionId": chosen}, "reject"
    return {"outcome": "cancelled"}, "reject"
