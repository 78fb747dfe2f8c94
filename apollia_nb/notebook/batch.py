"""``%%apollia batch AGENT --over VAR``: a batch in the notebook, with a live progress widget.

The cell is the goal template, filled from each item of ``VAR`` (a DataFrame,
a list of dicts). The handle shows a progress bar (done / waiting / failed /
running) and the waiting cards grouped by the question they ask (agent, tool,
family, line, the answers on offer and the arguments, shown in full), each
group with its answers: one click answers the cards of the group as the row
showed them (``always`` answers the first card ``always`` and the others
``once``); when the group changed meanwhile, nothing is answered and the row
is drawn again. ``await batch`` waits for the end; ``batch.results()`` is a
DataFrame.
"""

from __future__ import annotations

import argparse
import html
from typing import TYPE_CHECKING, Any

from apollia_nb.errors import BadInput
from apollia_nb.notebook.arguments import magic_parser
from apollia_nb.notebook.handles import Displayable

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.notebook.bridge import KernelRuntime

__all__ = ["BatchView", "NotebookBatch", "batch_magic"]

#: How often the widget reads the batch while it runs (seconds).
REFRESH_SECS = 0.25


def batch_magic(magics: Any, args: list[str], cell: str | None) -> NotebookBatch:
    """``%%apollia batch AGENT --over VAR [--concurrency N] [--max-steps N] [--key FIELD]``."""
    parser = magic_parser("%%apollia batch")
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
    ``.answer_group(group, answer)``, ``.cancel()``."""

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
        """The waiting cards by question: ``{"key", "digest", "agent", "tool", "family", "line", "answers",
        "calls", "count", "ids"}`` (``runtime/batch.py``, ``group_cards``; ``calls``: every card's ``{"id",
        "arguments", "path"}``)."""
        def read() -> list[dict[str, Any]]:
            return [{**{k: v for k, v in g.items() if k != "cards"}, "count": len(g["cards"]),
                     "ids": [c.id for c in g["cards"]]} for g in self._handle.pending_groups()]

        return self._bridge.call(read)

    def answer_group(self, group: dict[str, Any] | str, answer: str) -> list[str]:
        """Answer the cards of a group as :meth:`pending_groups` showed it (or its ``digest``), as this
        kernel's user: ``CONFLICT`` and nothing answered when the group changed since."""
        digest = group.get("digest") if isinstance(group, dict) else group
        try:
            return self._bridge.call(self._handle.answer_group, digest, answer, by=self._bridge.user)
        finally:
            if self._view is not None:
                self._view.refresh()

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
        lines += [f"  waiting: {g['tool']} ({g['family'] or 'no family'}) × {g['count']} {_arguments_text(g)}"
                  for g in groups]
        return "\n".join(lines)

    def _html(self) -> str:
        data, groups = self._summary()
        rows = "".join(f"<li><code>{html.escape(g['tool'])}</code> ({html.escape(g['family'] or 'no family')}) "
                       f"× {g['count']} {html.escape(_arguments_text(g))}</li>" for g in groups)
        return (f"<div><b>Batch {html.escape(self.id)}</b> ({html.escape(data['agent'])}): "
                f"{html.escape(data['status'])} · {html.escape(_progress_words(data['counts'], data['total']))}"
                + (f"<ul>{rows}</ul>" if rows else "") + "</div>")


def _arguments_text(group: dict[str, Any]) -> str:
    """A group's calls' arguments in one line of text (in full: the answer applies to exactly these)."""
    import json

    return "; ".join(json.dumps(c["arguments"], ensure_ascii=False, sort_keys=True, default=str)
                     for c in group["calls"])


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
        self.message = w.HTML()  # why the last click answered nothing
        self.box = w.VBox([w.HTML(f"<b>Batch {html.escape(batch.id)}</b>"), self.bar, self.counts, self.groups,
                           self.message])
        self._shown_groups: list[str] = []  # the digests of the groups drawn
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
        shown = [g["digest"] for g in groups]
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
        """One group: who asks for what, its arguments in full, and one button per answer on offer; a click
        answers the cards of the group as drawn here (its digest), or nothing when the group changed."""
        from apollia_nb.errors import ApolliaError
        from apollia_nb.notebook.render import arguments_html

        w = self._w
        label = w.HTML(f"<b>{html.escape(group['agent'])}</b> · <code>{html.escape(group['tool'])}</code> "
                       f"({html.escape(group['family'] or 'no family')}) · {group['count']} waiting")
        # Every call the answer applies to, in full (scrolls when there are many): the answer is to these.
        calls = "".join(
            "<div>" + arguments_html(c["arguments"] or {})
            + (f"<div>resolves to <code>{html.escape(c['path'])}</code></div>" if c.get("path") else "") + "</div>"
            for c in group["calls"])
        arguments = w.HTML(f"<div style='max-height:16em;overflow:auto'>{calls}</div>")
        buttons = []
        for answer in group["answers"]:
            button = w.Button(description=f"{answer} × {group['count']}" if answer != "always" else "always",
                              button_style="danger" if answer == "refuse" else "")

            def click(_b: Any, a: str = answer) -> None:
                self.message.value = ""
                try:
                    self.batch.answer_group(group["digest"], a)
                except ApolliaError as exc:  # the group changed since it was drawn: nothing was answered
                    self.message.value = (f"<span style='color:#cf222e'>{html.escape(exc.code)}: "
                                          f"{html.escape(exc.message)}</span>")

            button.on_click(click)
            buttons.append(button)
        return w.VBox([w.HBox([label, *buttons]), arguments])
