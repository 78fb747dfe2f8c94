"""``apollia-os hook install|uninstall TOOL [--project DIR]``: the tool's hooks file, merged, never clobbered.

| tool | with ``--project DIR`` | without |
|---|---|---|
| ``claude-code`` | ``DIR/.claude/settings.json`` | ``~/.claude/settings.json`` |
| ``codex`` | ``DIR/.codex/hooks.json`` | ``~/.codex/hooks.json`` |
| ``cursor`` | ``DIR/.cursor/hooks.json`` | ``~/.cursor/hooks.json`` |

``install`` adds one command hook per event (the command is this Python running
``-m apollia_nb hook TOOL --home HOME``, timeout ``INSTALLED_TIMEOUT_SECS``) to what the file
holds, keeping every other key and hook; installing twice adds nothing. A file that is not a
JSON object is ``BAD_INPUT`` and is left as it is. ``uninstall`` removes exactly the entries that
name ``apollia_nb hook TOOL`` (and the lists and tables left empty by that alone); a file that held
nothing else is removed. The file is written back with the indentation it had.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from apollia_nb.errors import BadInput
from apollia_nb.hooks.mapping import INSTALLED_TIMEOUT_SECS, TOOLS

__all__ = ["settings_path", "install", "uninstall", "hook_command", "EVENTS"]

#: The events each tool's hook is installed for.
EVENTS = {
    "claude-code": ("PreToolUse", "PermissionRequest", "PostToolUse", "PostToolUseFailure"),
    "codex": ("PreToolUse", "PermissionRequest", "PostToolUse"),
    "cursor": ("beforeShellExecution", "beforeMCPExecution", "beforeReadFile", "afterShellExecution",
               "afterMCPExecution", "afterFileEdit"),
}
_FILES = {"claude-code": (".claude", "settings.json"), "codex": (".codex", "hooks.json"),
          "cursor": (".cursor", "hooks.json")}


def settings_path(tool: str, project: str | os.PathLike[str] | None) -> Path:
    """The file ``install`` writes for ``tool``: in ``project``, else in the user's home folder."""
    folder, name = _FILES[tool]
    base = Path(project) if project is not None else Path.home()
    return base.expanduser().resolve() / folder / name


def hook_command(tool: str, home: str) -> str:
    """The command each hook entry runs."""
    return f"{shlex.quote(sys.executable)} -m apollia_nb hook {tool} --home {shlex.quote(home)}"


def _marker(tool: str) -> str:
    return f"apollia_nb hook {tool} "


def _read(path: Path) -> tuple[dict[str, Any], str | None]:
    """The file's JSON object and its indentation (None: the file does not exist)."""
    if not path.exists():
        return {}, None
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if text.strip() else {}
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path} does not read as JSON ({exc}); it was left as it is") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path} holds {type(data).__name__}, not a JSON object; it was left as it is")
    indent = "  "
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and stripped != line:
            indent = line[: len(line) - len(stripped)]
            break
    return data, indent + ("\n" if text.endswith("\n") else "")


def _write(path: Path, data: dict[str, Any], style: str | None) -> None:
    indent = (style or "  \n").rstrip("\n")
    newline = "\n" if style is None or style.endswith("\n") else ""
    text = json.dumps(data, indent=indent if indent else None, ensure_ascii=False) + newline
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".apollia-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _entry(tool: str, command: str) -> dict[str, Any]:
    if tool == "cursor":  # failClosed: a hook that fails or times out blocks the call instead of letting it go
        return {"command": command, "timeout": INSTALLED_TIMEOUT_SECS, "failClosed": True}
    return {"hooks": [{"type": "command", "command": command, "timeout": INSTALLED_TIMEOUT_SECS}]}


def _ours(tool: str, item: Any) -> bool:
    """``item`` is a hook (or a hook's command) of ours for ``tool``."""
    command = item.get("command") if isinstance(item, dict) else None
    return isinstance(command, str) and _marker(tool) in command + " "


def install(tool: str, *, home: str, project: str | None = None) -> Path:
    """Add the hooks of ``tool`` to its settings file (see the module docstring); returns the file."""
    if tool not in TOOLS:
        raise BadInput(f"no hook for {tool!r}: one of {', '.join(TOOLS)}")
    path = settings_path(tool, project)
    data, style = _read(path)
    hooks = data.setdefault("hooks", {})
    if not isinstance(hooks, dict):
        raise BadInput(f"{path}: its \"hooks\" is not a JSON object; it was left as it is")
    if tool == "cursor":
        data.setdefault("version", 1)
    command = hook_command(tool, home)
    for event in EVENTS[tool]:
        groups = hooks.setdefault(event, [])
        if not isinstance(groups, list):
            raise BadInput(f"{path}: hooks.{event} is not a list; it was left as it is")
        present = any(_ours(tool, g) for g in groups) if tool == "cursor" else any(
            _ours(tool, h) for g in groups if isinstance(g, dict) for h in g.get("hooks", []) or [])
        if not present:
            groups.append(_entry(tool, command))
    _write(path, data, style)
    return path


def uninstall(tool: str, *, project: str | None = None) -> Path | None:
    """Remove exactly the hooks ``install`` wrote for ``tool``; returns the file, or None when there was none."""
    if tool not in TOOLS:
        raise BadInput(f"no hook for {tool!r}: one of {', '.join(TOOLS)}")
    path = settings_path(tool, project)
    data, style = _read(path)
    if style is None:
        return None
    hooks = data.get("hooks")
    if not isinstance(hooks, dict):
        return path
    for event in list(hooks):
        groups = hooks[event]
        if not isinstance(groups, list):
            continue
        kept: list[Any] = []
        for group in groups:
            if tool == "cursor":
                if not _ours(tool, group):
                    kept.append(group)
                continue
            inner = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(inner, list) or not any(_ours(tool, h) for h in inner):
                kept.append(group)
                continue
            rest = [h for h in inner if not _ours(tool, h)]
            if rest:
                kept.append({**group, "hooks": rest})
        if kept != groups:
            if kept:
                hooks[event] = kept
            else:
                del hooks[event]
    if not hooks:
        del data["hooks"]
    if tool == "cursor" and list(data) == ["version"] and data["version"] == 1:
        data = {}
    if not data:
        path.unlink()
        return path
    _write(path, data, style)
    return path
