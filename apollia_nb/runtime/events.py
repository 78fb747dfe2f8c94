"""What happens in a runtime, told to whoever listens, and who waits for a task to change.

``Runtime.events`` is the one ``Events`` of a runtime: runs, cards, sessions and
batches tell it what changed (``emit``, ``notify``); surfaces listen
(``Runtime.subscribe``); whoever waits for a task to settle waits on its change
event (``changed``), which the task's run sets (``wake``). A listener that raises
never breaks the run that told it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

__all__ = ["Events"]


class Events:
    """The listeners of one runtime and the change events of its tasks (on the runtime's loop)."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[str, Any], None]] = []
        self._changes: dict[str, anyio.Event] = {}

    def subscribe(self, listener: Callable[[str, Any], None]) -> Callable[[], None]:
        """Call ``listener(kind, obj)`` on every change told here. Returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def emit(self, kind: str, obj: Any) -> None:
        """Tell every listener; one that raises is skipped (a broken view must not break a run)."""
        for listener in list(self._listeners):
            try:
                listener(kind, obj)
            except Exception:
                pass

    def changed(self, task_id: str) -> anyio.Event:
        """The event set at the task's next change (one for every waiter of that change)."""
        event = self._changes.get(task_id)
        if event is None:
            event = self._changes[task_id] = anyio.Event()
        return event

    def wake(self, task_id: str) -> None:
        """Wake whoever waits for a change of the task, without telling the listeners."""
        event = self._changes.pop(task_id, None)
        if event is not None:
            event.set()

    def notify(self, run: Any) -> None:
        """A task's run changed: wake its waiters, then tell the listeners (``"task"``)."""
        self.wake(run.id)
        self.emit("task", run)

    def forget(self, task_id: str) -> None:
        """The task left this runtime's memory: nobody is left to wait for it here."""
        self._changes.pop(task_id, None)

    def watched(self) -> set[str]:
        """The tasks somebody waits on a change of."""
        return set(self._changes)
