"""Agents and their registry, which enforces the process state machine.

Registration: ``initializing`` → resolve tools and install ``[python] packages``
→ ``active``, or ``degraded`` when optional tools did not resolve or the
packages failed to install (the installer's error kept in the warnings). A
missing required tool or an unusable model is a startup failure and goes
``initializing → stopping → stopped``. The runtime never moves ``degraded →
active`` on its own. Stopping drains in-flight work for ``drain_timeout_secs``
and then cancels it; restart goes ``stopped → initializing``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apollia_nb.errors import AgentUnavailable, ApolliaError
from apollia_nb.runtime.states import PROCESS, ProcessState, StateCell

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.manifest import Manifest
    from apollia_nb.runtime.tools import ToolDef, ToolRegistry

__all__ = ["Agent", "custom_tools", "install_packages"]

_ROLE_PROMPTS = {
    "planner": "Plan the goal as a short list of concrete steps and submit it with submit_plan.",
    "actor": "Carry out the current step using the tools you are given. Reply with text when the step is done.",
    "critic": "Judge whether the goal was achieved and submit your verdict with submit_verdict.",
}


@dataclass(eq=False)
class Agent:
    manifest: "Manifest"
    model: Any
    tools: "ToolRegistry"
    workspace: Path
    offered: tuple[str, ...]
    state: StateCell
    warnings: list[str] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    inflight: set[Any] = field(default_factory=set)
    custom_model: bool = False  # given from Python (kept on restart) rather than built from the manifest

    @property
    def name(self) -> str:
        return self.manifest.name

    def system_prompt(self, role: str) -> str:
        base = self.manifest.instructions.strip()
        return f"{base}\n\n{_ROLE_PROMPTS[role]}".strip()

    def tool_specs(self) -> list[Any]:
        """The tools offered to the model (built once per agent incarnation)."""
        cached = self.__dict__.get("_specs")
        if cached is not None:
            return cached
        from apollia_nb.runtime.models.base import ToolSpec

        out = []
        for name in self.offered:
            spec = self.tools.get(name).spec()
            out.append(ToolSpec(name=spec["name"], description=spec["description"], parameters=spec["parameters"]))
        self.__dict__["_specs"] = out
        return out

    def check_accepts_work(self) -> list[str]:
        """Raise ``AgentUnavailable`` unless active or degraded; warnings for degraded."""
        state = self.state.state
        if state == ProcessState.ACTIVE:
            return []
        if state == ProcessState.DEGRADED:
            return [f"agent {self.name!r} is degraded: " + "; ".join(self.warnings or ["see its warnings"])]
        raise AgentUnavailable(f"agent {self.name!r} is {state.value} and cannot take work")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.manifest.description,
            "state": self.state.state.value,
            "warnings": list(self.warnings),
            "tools": list(self.offered),
            "model": self.manifest.model.get("provider"),
            "workspace": str(self.workspace),
            "max_steps": self.manifest.max_steps,
            "inflight": len(self.inflight),
        }


#: The package index an agent's packages come from; set it to use a mirror. Nothing else configures pip.
PIP_INDEX_ENV = "APOLLIA_PIP_INDEX_URL"


def pip_command(venv: Path, packages: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """The pip command line and environment for an agent's packages: options the project chooses.

    ``--isolated`` and ``PIP_CONFIG_FILE=/dev/null`` with every other ``PIP_*`` variable removed:
    no user or site configuration adds an index, a target or a log file. The index is PyPI, or
    ``$APOLLIA_PIP_INDEX_URL``. ``--`` ends the options: every package is a requirement.
    """
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    index = os.environ.get(PIP_INDEX_ENV, "").strip() or "https://pypi.org/simple"
    command = [sys.executable, "-m", "pip", "--isolated", "--python", str(venv / "bin" / "python"), "install",
               "--disable-pip-version-check", "--no-input", "--quiet", "--retries", "0",
               "--index-url", index, "--", *packages]
    return command, env


def install_packages(venv: Path, packages: tuple[str, ...], timeout: float = 600.0) -> str | None:
    """Install ``packages`` (requirement specifiers, checked by the manifest) into the agent's own
    virtual environment. None on success, else the error."""
    if not packages:
        return None
    command, env = pip_command(venv, packages)
    try:
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                           check=True, capture_output=True, text=True, timeout=timeout)
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"installing {', '.join(packages)} failed: {exc}"
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return f"installing {', '.join(packages)} failed: {tail}"
    return None


def new_state() -> StateCell:
    return StateCell(PROCESS, ProcessState.INITIALIZING)


def startup_failure(cell: StateCell, exc: ApolliaError) -> ApolliaError:
    """A startup failure goes through ``stopping`` to ``stopped``."""
    cell.move(ProcessState.STOPPING)
    cell.move(ProcessState.STOPPED)
    return exc


def custom_tools(agent: Agent) -> list[Any]:
    """The agent's own tools (those that are not built in), as registered: to register it again."""
    from apollia_nb.runtime.builtins import BUILTIN_FAMILIES

    return [agent.tools.get(n) for n in agent.tools.names() if n not in BUILTIN_FAMILIES]
