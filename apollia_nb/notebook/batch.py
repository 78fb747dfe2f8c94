"""``%%apollia batch AGENT --over VAR``: a batch in the notebook, with a live progress widget.

The cell is the goal template, filled from each item of ``VAR`` (a DataFrame,
a list of dicts). The handle shows a progress bar (done / waiting / failed /
running) and the waiting cards grouped by tool and family, each group with
the answers on offer: one click answers the whole group (``always`` answers
the first card ``always`` and the others ``once``). ``await batch`` waits for
the end; ``batch.results()`` is a DataFrame.
"""

from __future__ import annotations

import argparse
import html
from typing import TYPE_CHECKING, Any

from apollia_nb.errors import BadInput
from apollia_nb.notebook.handles import Displayable

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.notebook.bridge import KernelRuntime

__all__ = ["BatchView", "NotebookBatch", "batch_magic"]

#: How often the widget reads the batch while it runs (seconds).
REFRESH_SECS = 0.25


def batch_magic(magics: Any, args: list[str], cell: str | None) -> NotebookBatch:
    """``%%apollia batch AGENT --over VAR [--concurrency N] [--max-steps N] [--key FIELD]``."""
    from apollia_nb.notebook.magics import _parser

    parser = _parser("%%apollia batch")
    parser.add_argument("agent")
    parser.add_argument("--over", required=True, help="the variable holding the items (a DataFrame, a list)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--key", default=None, help="the field that keys each item")
    ns: argparse.Namespace = parser.parse_args(args)
    goal = magics._cell("batch", cell).strip()
    namespace = magics.shell.user_ns
    if ns.over not in namespace:
        raise BadInput(f"no variable {ns.over!r} in this kernel to take the items from")
    runtime = magics._rt()
    handle = runtime.call(runtime.rt.batch, ns.agent, namespace[ns.over], goal=goal, concurrency=ns.concurrency,
                          max_steps=ns.max_steps, key=ns.key)
    return NotebookBatch(runtime, handle)


class NotebookBatch(Displayable):
    """A batch in this kernel: ``await batch``, ``.counts()``, ``.results()``, ``.pending_groups()``,
    ``.answer_group(tool, family, answer)``, ``.cancel()``."""

    def __init__(self, bridge: KernelRuntime, handle: Any) -> None:
        self._bridge = bridge
        self._handle = handle
        self.id: str = handle.id

    @property
    def status(self) -> str:
        return self._bridge.call(lambda: self._handle.status)

    def counts(self) -> dict[str, int]:
        return self._bridge.call(self._handle.counts)

    def to_dict(self) -> dict[str, Any]:
        return self._bridge.call(self._handle.to_dict)

    def results(self) -> Any:
        """One row per item (a pandas DataFrame): key, status, result, error_code, run_id, steps_used, task_id, goal."""
        return self._bridge.call(self._handle.results)

    def pending_groups(self) -> list[dict[str, Any]]:
        """The waiting cards by tool and family: ``{"tool", "family", "count", "answers", "ids"}``."""
        def read() -> list[dict[str, Any]]:
            return [{"tool": g["tool"], "family": g["family"], "count": len(g["cards"]),
                     "answers": list(g["cards"][0].answers), "ids": [c.id for c in g["cards"]]}
                    for g in self._handle.pending_groups()]

        return self._bridge.call(read)

    def answer_group(self, tool: str, family: str | None, answer: str) -> list[str]:
        """Answer every waiting card of the group (as this kernel's user)."""
        ids = self._bridge.call(self._handle.answer_group, tool, family, answer, by=self._bridge.user)
        if self._view is not None:
            self._view.refresh()
        return ids

    def _refresh(self) -> None:
        if self._view is not None:
            self._view.refresh()
        self.refresh_display()

    def cancel(self) -> NotebookBatch:
        self._bridge.block(self._handle.cancel)
        self._refresh()
        return self

    async def wait(self) -> NotebookBatch:
        """Until the batch is completed or cancelled."""
        await self._bridge.wait_for(self._handle.wait)
        self._refresh()
        return self

    def __await__(self):  # type: ignore[no-untyped-def]
        return self.wait().__await__()

    def join(self, timeout: float | None = None) -> NotebookBatch:
        self._bridge.block(self._handle.wait, timeout=timeout)
        self._refresh()
        return self

    def _make_widget(self) -> Any:
        return BatchView(self)

    def _summary(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return self.to_dict(), self.pending_groups()

    def _text(self) -> str:
        data, groups = self._summary()
        c = data["counts"]
        lines = [f"Batch {self.id} ({data['agent']}): {data['status']} · {_progress_words(c, data['total'])}"]
        lines += [f"  waiting: {g['tool']} ({g['family'] or 'no family'}) × {g['count']}" for g in groups]
        return "\n".join(lines)

    def _html(self) -> str:
        data, groups = self._summary()
        rows = "".join(f"<li><code>{html.escape(g['tool'])}</code> ({html.escape(g['family'] or 'no family')}) "
                       f"× {g['count']}</li>" for g in groups)
        return (f"<div><b>Batch {html.escape(self.id)}</b> ({html.escape(data['agent'])}): "
                f"{html.escape(data['status'])} · {html.escape(_progress_words(data['counts'], data['total']))}"
                + (f"<ul>{rows}</ul>" if rows else "") + "</div>")


def _progress_words(c: dict[str, int], total: int) -> str:
    return (f"done {c['completed']} / {total} · waiting {c['waiting']} · failed {c['failed']} · "
            f"running {c['running'] + c['pending']}" + (f" · cancelled {c['cancelled']}" if c["cancelled"] else ""))


class BatchView:
    """The live widget: a progress bar, the counts, and one row per group of waiting cards."""

    def __init__(self, batch: NotebookBatch) -> None:
        import ipywidgets as w

        self._w = w
        self.batch = batch
        self.on_final: Any = None
        self.bar = w.IntProgress(value=0, min=0, max=1, description="done", bar_style="info")
        self.counts = w.HTML()
        self.groups = w.VBox()
        self.box = w.VBox([w.HTML(f"<b>Batch {html.escape(batch.id)}</b>"), self.bar, self.counts, self.groups])
        self._shown_groups: list[tuple[str, str | None, int, tuple[str, ...]]] = []
        self._stop = None
        self.refresh()
        if self._running and batch._bridge.ui_loop is not None:  # in a kernel: redrawn on its loop
            self._stop = batch._bridge.every(REFRESH_SECS, self.refresh)

    def refresh(self) -> None:
        data, groups = self.batch._summary()
        c = data["counts"]
        finished = c["completed"] + c["failed"] + c["cancelled"]
        self.bar.max = max(1, data["total"])
        self.bar.value = finished
        self.bar.bar_style = ("success" if data["status"] == "completed" and not c["failed"] else
                              "warning" if c["waiting"] or c["failed"] else "info")
        self.counts.value = html.escape(_progress_words(c, data["total"]))
        shown = [(g["tool"], g["family"], g["count"], tuple(g["answers"])) for g in groups]
        if shown != self._shown_groups:
            self._shown_groups = shown
            self.groups.children = tuple(self._group_row(g) for g in groups)
        self._running = data["status"] == "running"
        if not self._running and self._stop is not None:
            self._stop()
            self._stop = None
            if self.on_final is not None:
                self.on_final()

    def _group_row(self, group: dict[str, Any]) -> Any:
        w = self._w
        label = w.HTML(f"<code>{html.escape(group['tool'])}</code> ({html.escape(group['family'] or 'no family')})"
                       f" · {group['count']} waiting")
        buttons = []
        for answer in group["answers"]:
            button = w.Button(description=f"{answer} × {group['count']}" if answer != "always" else "always",
                              button_style="danger" if answer == "refuse" else "")
            button.on_click(lambda _b, a=answer: self.batch.answer_group(group["tool"], group["family"], a))
            buttons.append(button)
        return w.HBox([label, *buttons])
