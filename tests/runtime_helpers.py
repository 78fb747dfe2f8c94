"""Helpers for runtime tests: manifests built from scripted turns."""

from __future__ import annotations

import json
from typing import Any


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value)


def manifest(
    name: str = "clerk",
    *,
    planner: list[dict[str, Any]] = (),
    actor: list[dict[str, Any]] = (),
    critic: list[dict[str, Any]] = (),
    required: list[str] | None = None,
    optional: list[str] | None = None,
    max_steps: int | None = None,
    packages: list[str] | None = None,
    workspace: str | None = None,
) -> str:
    lines = [f'name = "{name}"', 'description = "test agent"', 'instructions = "Keep notes tidy."', "",
             "[model]", 'provider = "scripted"']
    for role, entries in (("planner", planner), ("actor", actor), ("critic", critic)):
        for entry in entries:
            lines.append(f"[[model.script.{role}]]")
            for key, value in entry.items():
                lines.append(f"{key} = {_toml_value(value)}")
    if required is not None or optional is not None:
        lines.append("[tools]")
        if required is not None:
            lines.append(f"required = {_toml_value(required)}")
        if optional is not None:
            lines.append(f"optional = {_toml_value(optional)}")
    if packages is not None:
        lines += ["[python]", f"packages = {_toml_value(packages)}"]
    if workspace is not None:
        lines += ["[workspace]", f"root = {_toml_value(workspace)}"]
    if max_steps is not None:
        lines += ["[budget]", f"max_steps = {max_steps}"]
    return "\n".join(lines) + "\n"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


async def assert_alive(rt: Any, name: str = "alive-check") -> None:
    """The runtime still takes work: a new agent registers and finishes a task."""
    if name not in [a.name for a in rt.agents()]:
        await rt.register_agent(manifest(name, actor=[{"text": "fine"}]))
    task = await (await rt.submit(name, "Say fine"))
    assert task.status == "completed", task.error
