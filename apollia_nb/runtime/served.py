"""The home's agents, tasks and waiting decisions as JSON, on an owned home or through `apollia-os serve`.

``HomeRuntime`` is what a surface asks of a home's runtime without holding it:
agents, tasks, waiting decisions, plans, runs and batches, each as the JSON
``to_dict()`` gives in the owner process. ``ServedRuntime`` answers it over the
REST API of the server that owns the home (a task submitted there runs there);
the CLI (``cli/backend.py``, ``open_home``) and a kernel that joined the server
(``notebook/bridge.py``) both use it, so a served home is spoken to one way.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from apollia_nb.errors import ApolliaError

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.runtime.remote import ServerApi

__all__ = ["HomeRuntime", "ServedRuntime", "Progress", "WAIT_SECS", "absolute_workspace", "settled_counts"]

#: How long one wait for a served task asks the server to hold the request.
WAIT_SECS = 25.0

Progress = Callable[[dict[str, int], int], None]


class HomeRuntime(Protocol):
    """The home's agents, tasks, waiting decisions, runs and batches, as JSON (``to_dict()`` shapes)."""

    #: A task left without an answer at the terminal goes on after the command ends (in the server).
    outlives_command: bool

    def agents(self) -> list[dict[str, Any]]: ...
    def register_agent(self, file: Path, manifest: Any, keep: bool | None) -> dict[str, Any]: ...
    def stop_agent(self, name: str) -> dict[str, Any]: ...
    def submit(self, agent: str, goal: str, *, watched: bool, max_steps: int | None,
               approve_plan: bool) -> dict[str, Any]: ...
    def settle(self, task_id: str) -> dict[str, Any]: ...
    def task(self, task_id: str) -> dict[str, Any]: ...
    def pending(self) -> list[dict[str, Any]]: ...
    def decide(self, decision_id: str, answer: str, *, reason: str | None, by: str,
               values: dict[str, Any] | None = None, lasting: str | None = None,
               terms: dict[str, Any] | None = None) -> dict[str, Any]: ...
    def approve_plan(self, task_id: str) -> None: ...
    def reject_plan(self, task_id: str, reason: str) -> None: ...
    def leave(self, task_id: str) -> dict[str, Any]: ...
    def goals(self, task_ids: set[str]) -> dict[str, str]: ...
    def runs(self) -> list[dict[str, Any]]: ...
    def batch(self, agent: str, items: list[dict[str, Any]], *, goal: str, concurrency: int,
              max_steps: int | None, key: str | None,
              progress: Progress) -> tuple[list[dict[str, Any]], dict[str, Any]]: ...


def settled_counts(counts: dict[str, int]) -> bool:
    """A batch's counts with no item pending or running."""
    return counts["pending"] == 0 and counts["running"] == 0


class ServedRuntime:
    """The server's agents, tasks and decisions, over its REST API: a task runs in the server.

    ``journal``: the home's journal as its client reads it (``RemoteHome.journal``), for ``runs``."""

    outlives_command = True

    def __init__(self, api: "ServerApi", journal: Callable[[], Any] | None = None) -> None:
        self.api = api
        self.url = api.url
        self._journal = journal

    def agents(self) -> list[dict[str, Any]]:
        return list(self.api("agents"))

    def register_agent(self, file: Path, manifest: Any, keep: bool | None) -> dict[str, Any]:
        text, warning = absolute_workspace(file.read_text(encoding="utf-8"), manifest, Path.cwd())
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        return dict(self.api("register_agent", text, keep))

    def stop_agent(self, name: str) -> dict[str, Any]:
        return dict(self.api("stop_agent", name))

    def submit(self, agent: str, goal: str, *, watched: bool, max_steps: int | None,
               approve_plan: bool) -> dict[str, Any]:
        return dict(self.api("submit", agent, goal, watched, max_steps, (), approve_plan))

    def wait(self, task_id: str, until: str, secs: float = WAIT_SECS) -> dict[str, Any]:
        """The task once it is ``finished`` (or ``settled``: finished or waiting on a person), or as it is
        after ``secs`` seconds (the server holds the request that long at most)."""
        return dict(self.api("wait", task_id, until, secs))

    def settle(self, task_id: str) -> dict[str, Any]:
        while True:
            task = self.wait(task_id, "settled")
            if task["status"] != "running":
                return task

    def task(self, task_id: str) -> dict[str, Any]:
        return dict(self.api("task", task_id))

    def tasks(self) -> list[dict[str, Any]]:
        return list(self.api("tasks", None, None))

    def cancel(self, task_id: str) -> dict[str, Any]:
        return dict(self.api("cancel", task_id))

    def pending(self) -> list[dict[str, Any]]:
        return list(self.api("pending"))

    def me(self) -> dict[str, Any]:
        """Who the server says this client's token is: ``{name, roles, auth}`` (``GET /people/me``)."""
        return dict(self.api("me"))

    def decide(self, decision_id: str, answer: str, *, reason: str | None, by: str,
               values: dict[str, Any] | None = None, lasting: str | None = None,
               terms: dict[str, Any] | None = None) -> dict[str, Any]:
        """``terms``: what binds the answer (``digest``, ``expires_in``, ``expires_at``), when given."""
        return dict(self.api("decide", decision_id, answer, reason, by, values, lasting, terms))

    def approve_plan(self, task_id: str, steps: list[str] | None = None) -> None:
        self.api("approve_plan", task_id, steps)

    def reject_plan(self, task_id: str, reason: str) -> None:
        self.api("reject_plan", task_id, reason)

    def leave(self, task_id: str) -> dict[str, Any]:
        return self.task(task_id)  # the run waits in the server, its decision pending there

    def goals(self, task_ids: set[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for task_id in sorted(task_ids):
            try:
                record = self.api("task", task_id)
            except ApolliaError:  # a task the server no longer knows: the line shows its id alone
                continue
            if isinstance(record.get("goal"), str):
                found[task_id] = record["goal"]
        return found

    def runs(self) -> list[dict[str, Any]]:
        from apollia_nb.journal.views import list_runs  # lazy: the CLI imports this module for every command

        if self._journal is None:
            raise ApolliaError("this client reads no journal")
        return list_runs(self._journal())

    def verify(self) -> dict[str, Any]:
        """The server's verification of the journal where it is stored (and its witnesses' state)."""
        return dict(self.api("verify"))

    def batch(self, agent: str, items: list[dict[str, Any]], *, goal: str, concurrency: int,
              max_steps: int | None, key: str | None,
              progress: Progress) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        from apollia_nb.wire.batches import Routes, batch_request  # lazy: pydantic, for a batch only

        session = self.api.sdk
        batch = session.request(batch_request(agent, items, goal, concurrency, max_steps, key))
        for event in session.stream(Routes.events(batch.id)):
            data = event.data
            progress(data["counts"], data["total"])
            if settled_counts(data["counts"]):
                break
        rows = [r.model_dump() for r in session.request(Routes.results(batch.id))]
        return rows, session.request(Routes.batch(batch.id)).model_dump()

    def close(self) -> None:
        self.api.close()


def absolute_workspace(text: str, manifest: Any, cwd: Path) -> tuple[str, str | None]:
    """The manifest text with a relative workspace root made absolute against ``cwd`` (as the CLI
    resolves it without a server), and a warning when that could not be done."""
    import json

    from apollia_nb.runtime.manifest import parse_manifest

    root = Path(manifest.workspace_root)
    if root.is_absolute():
        return text, None
    target = str((cwd / root).resolve())
    table = re.compile(r"^\s*\[workspace\]\s*(#.*)?$", re.M)
    if table.search(text) is None:
        candidate = text.rstrip("\n") + f"\n\n[workspace]\nroot = {json.dumps(target)}\n"
    else:
        candidate = re.sub(r"(^\s*\[workspace\][^\[]*?^\s*root\s*=\s*)(\"[^\"\n]*\"|'[^'\n]*')",
                           lambda m: m.group(1) + json.dumps(target), text, count=1, flags=re.M | re.S)
    try:
        if parse_manifest(candidate).workspace_root == target:
            return candidate, None
    except ApolliaError:
        pass
    return text, (f"the workspace root {manifest.workspace_root!r} is relative: the server resolves it "
                  "against its own working directory")
