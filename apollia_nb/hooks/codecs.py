"""Each tool's hook wire format: its JSON in (``parse``), our verdict out (``reply``). Pure.

Followed as documented (see ``docs/other-agents.md`` for the revisions):

* Claude Code — ``PreToolUse`` answers ``hookSpecificOutput.permissionDecision`` (``allow``/
  ``deny``) with ``permissionDecisionReason``; ``PermissionRequest`` answers
  ``hookSpecificOutput.decision.behavior`` (``allow``/``deny``, ``message``), an allow given as a
  standing consent carrying ``updatedPermissions``; ``PostToolUse`` and the rest answer nothing.
* Codex — ``PreToolUse`` can only deny (``permissionDecision: deny`` with a reason; an ``allow``
  without ``updatedInput`` or an ``ask`` is invalid output there, which Codex ignores): an allow
  is answered with no opinion, ``{}``, and Codex's own approval goes on; ``PermissionRequest``
  answers ``decision.behavior`` ``allow``/``deny`` (``updatedPermissions`` is refused there).
* Cursor — ``beforeShellExecution``, ``beforeMCPExecution`` answer ``permission``
  (``allow``/``deny``) with ``user_message`` and ``agent_message``; ``beforeReadFile`` answers
  ``permission``; the ``after…`` events answer ``{}``.

Input that is not what the tool documents (not JSON, not an object, a field of the wrong type,
an event the tool does not send) is ``MalformedHook``: the command answers with exit status 2
and the reason on stderr — each of the three tools documents 2 as "block" — and the deny JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from apollia_nb.errors import BadInput

__all__ = ["HookEvent", "Verdict", "Reply", "MalformedHook", "parse", "reply", "malformed_reply",
           "BEFORE_EVENTS", "AFTER_EVENTS", "EXIT_BLOCK"]

#: The exit status each of the three tools documents as "block this call" (the reason on stderr).
EXIT_BLOCK = 2

#: The events that ask before a call, per tool; ``AFTER_EVENTS`` report one that ran.
BEFORE_EVENTS = {
    "claude-code": ("PreToolUse", "PermissionRequest"),
    "codex": ("PreToolUse", "PermissionRequest"),
    "cursor": ("beforeShellExecution", "beforeMCPExecution", "beforeReadFile"),
}
AFTER_EVENTS = {
    "claude-code": ("PostToolUse", "PostToolUseFailure"),
    "codex": ("PostToolUse",),
    "cursor": ("afterShellExecution", "afterMCPExecution", "afterFileEdit"),
}

#: Largest stdin a hook reads (a tool's input and, after a call, its output).
MAX_INPUT = 8 * 1024 * 1024


class MalformedHook(BadInput):
    """The hook's input is not what the tool documents: denied, with this reason."""


@dataclass(frozen=True)
class HookEvent:
    """One hook call, as the tool sent it: ``phase`` ``before`` (decide) or ``after`` (journal a
    result) or ``other`` (an event the hook has nothing to say about)."""

    tool: str
    event: str
    phase: Literal["before", "after", "other"]
    session: str
    project: str
    native: str
    tool_input: dict[str, Any]
    call_id: str | None = None
    response: Any = None
    failed: bool = False
    mcp_server: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """What to answer: ``allow``, ``deny`` or ``none`` (no opinion: the tool's own flow goes on);
    ``standing``: allowed by a standing consent or an ``always`` answer (Claude Code's
    ``PermissionRequest`` may then carry it as ``updatedPermissions``)."""

    outcome: Literal["allow", "deny", "none"]
    reason: str = ""
    standing: bool = False
    rule: dict[str, Any] | None = None


@dataclass(frozen=True)
class Reply:
    """What the command prints (``body`` as JSON on stdout, ``stderr``) and its exit status; the
    HTTP form answers ``body`` with 200."""

    body: dict[str, Any]
    exit_code: int = 0
    stderr: str = ""


def _text(data: Mapping[str, Any], key: str, *, required: bool = True, default: str = "") -> str:
    value = data.get(key, None)
    if value is None:
        if required:
            raise MalformedHook(f"the hook input has no {key!r}")
        return default
    if not isinstance(value, str):
        raise MalformedHook(f"the hook input's {key!r} must be a string, got {type(value).__name__}")
    return value


def _object(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if isinstance(value, str):  # Cursor sends an MCP call's input as JSON text
        try:
            value = json.loads(value)
        except ValueError:
            raise MalformedHook(f"the hook input's {key!r} is text that is not JSON") from None
    if not isinstance(value, dict):
        raise MalformedHook(f"the hook input's {key!r} must be an object, got {type(value).__name__}")
    return value


def load(raw: bytes | str) -> dict[str, Any]:
    """The hook input as a JSON object, or ``MalformedHook``."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_INPUT:
            raise MalformedHook(f"the hook input is larger than {MAX_INPUT} bytes")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedHook("the hook input is not UTF-8") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise MalformedHook(f"the hook input is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise MalformedHook(f"the hook input must be a JSON object, got {type(data).__name__}")
    return data


def parse(tool: str, raw: bytes | str | dict[str, Any]) -> HookEvent:
    """The tool's hook input as a ``HookEvent``; ``MalformedHook`` when it is not what the tool documents."""
    data = raw if isinstance(raw, dict) else load(raw)
    event = _text(data, "hook_event_name")
    phase: Literal["before", "after", "other"] = (
        "before" if event in BEFORE_EVENTS[tool] else "after" if event in AFTER_EVENTS[tool] else "other")
    if tool == "cursor":
        roots = data.get("workspace_roots")
        if roots is not None and (not isinstance(roots, list) or not all(isinstance(r, str) for r in roots)):
            raise MalformedHook("the hook input's 'workspace_roots' must be a list of strings")
        cwd = _text(data, "cwd", required=False)
        project = roots[0] if roots else cwd
        if not project and phase != "other":
            raise MalformedHook("the hook input names no project ('workspace_roots' or 'cwd')")
        session = _text(data, "conversation_id", required=False, default="cursor")
        common = dict(tool=tool, event=event, phase=phase, session=session, project=project,
                      call_id=_text(data, "generation_id", required=False) or None)
        if event in ("beforeShellExecution", "afterShellExecution"):
            command = _text(data, "command")
            return HookEvent(native="beforeShellExecution", tool_input={"command": command},
                             response=data.get("output"), **common)  # type: ignore[arg-type]
        if event in ("beforeMCPExecution", "afterMCPExecution"):
            server = data.get("url") or data.get("command") or data.get("server") or "unknown"
            if not isinstance(server, str):
                raise MalformedHook("the hook input's MCP server ('url' or 'command') must be a string")
            native = _text(data, "tool_name")
            named = native.split(":", 2) if native.startswith("MCP:") else []
            if len(named) == 3 and named[1] and named[2]:  # Cursor's "MCP:<server>:<tool>"
                server_name, native = named[1], named[2]
            else:
                server_name = _server_name(server)
            return HookEvent(native=native, tool_input=_object(data, "tool_input"),
                             response=data.get("result_json"), mcp_server=server_name,
                             **common)  # type: ignore[arg-type]
        if event in ("beforeReadFile", "afterFileEdit"):
            native = "beforeReadFile" if event == "beforeReadFile" else "afterFileEdit"
            return HookEvent(native=native, tool_input={"file_path": _text(data, "file_path")},
                             response=data.get("edits"), **common)  # type: ignore[arg-type]
        return HookEvent(native=event, tool_input={}, **common)  # type: ignore[arg-type]
    session = _text(data, "session_id")
    project = _text(data, "cwd")
    if phase == "other":
        return HookEvent(tool=tool, event=event, phase=phase, session=session, project=project, native="",
                         tool_input={})
    native = _text(data, "tool_name")
    if phase == "after" and not isinstance(data.get("tool_input"), (dict, str)):
        tool_input = {"input": data.get("tool_input")}  # a call that ran: journaled whatever its input's shape
    else:
        tool_input = _object(data, "tool_input")
    call_id = _text(data, "tool_use_id", required=False) or None
    response = data.get("tool_response", data.get("error"))
    return HookEvent(tool=tool, event=event, phase=phase, session=session, project=project, native=native,
                     tool_input=tool_input, call_id=call_id, response=response,
                     failed=event == "PostToolUseFailure",
                     extra={"permission_mode": data.get("permission_mode")})


def _server_name(text: str) -> str:
    """A name for the MCP server Cursor names by its URL or command: the URL's host, or the command's program."""
    from urllib.parse import urlsplit

    if "://" in text:
        host = urlsplit(text).hostname
        return host or "unknown"
    first = text.strip().split()[0] if text.strip() else "unknown"
    return first.rsplit("/", 1)[-1] or "unknown"


def reply(event: HookEvent, verdict: Verdict) -> Reply:
    """The tool's answer for ``verdict`` on ``event``."""
    tool, name = event.tool, event.event
    if event.phase != "before" or verdict.outcome == "none":
        return Reply({})
    allow = verdict.outcome == "allow"
    reason = verdict.reason or ("allowed by apollia" if allow else "denied by apollia")
    if tool == "cursor":
        body: dict[str, Any] = {"permission": "allow" if allow else "deny"}
        if name != "beforeReadFile":
            body["user_message"] = reason
            body["agent_message"] = reason
        return Reply(body)
    if name == "PreToolUse":
        if tool == "codex" and allow:
            return Reply({})  # Codex takes no plain allow here: no opinion, its own approval goes on
        return Reply({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                             "permissionDecision": "allow" if allow else "deny",
                                             "permissionDecisionReason": reason}})
    # PermissionRequest
    decision: dict[str, Any] = {"behavior": "allow" if allow else "deny"}
    if not allow:
        decision["message"] = reason
    elif tool == "claude-code" and verdict.standing and verdict.rule is not None:
        decision["updatedPermissions"] = [{"type": "addRules", "rules": [verdict.rule], "behavior": "allow",
                                           "destination": "session"}]
    return Reply({"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}})


def malformed_reply(tool: str, reason: str, data: Any = None) -> Reply:
    """Deny for input that could not be read (or a hook that could not decide): exit 2, the reason on
    stderr, and the deny JSON of the event when the input names one."""
    event = data.get("hook_event_name") if isinstance(data, dict) else None
    if tool == "cursor":
        body: dict[str, Any] = {"permission": "deny", "user_message": reason, "agent_message": reason}
    elif event == "PermissionRequest":
        body = {"hookSpecificOutput": {"hookEventName": "PermissionRequest",
                                       "decision": {"behavior": "deny", "message": reason}}}
    else:
        body = {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                       "permissionDecisionReason": reason}}
    return Reply(body, exit_code=EXIT_BLOCK, stderr=reason)
