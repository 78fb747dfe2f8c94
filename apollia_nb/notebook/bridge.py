"""The kernel's runtime: one ``Runtime`` on its own event loop, driven from the kernel's thread.

A magic is a synchronous function, and the runtime's operations that matter to
a cell (opening the home, registering an agent) are coroutines. Run on the
kernel's own loop, a magic could only schedule them and return before they
happened, so every cell's result would arrive later than the cell and a
notebook run headless would race. So the kernel process owns the home through
a ``Runtime`` that lives on a private asyncio loop in a daemon thread of the
kernel: a magic waits for short operations (never for a person), runs go on
while the kernel is busy with other cells, and ``await handle`` in a cell
waits on the kernel's loop for a future resolved on the runtime's loop.

Everything that touches runtime objects goes through ``KernelRuntime.call``
(run on the runtime's thread, wait for the result). Runtime notifications
(``rt.subscribe``) arrive on the runtime's thread; ``KernelRuntime`` turns each
into a plain snapshot there and hands it to the views on the kernel's loop when
there is one (``ui_loop``), so widgets change only on the kernel's thread.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import copy
import inspect
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from apollia_nb.errors import ApolliaError
from apollia_nb.notebook.home import kernel_home

__all__ = ["KernelRuntime", "LoopThread", "snapshot", "login_name", "shown_in_one_line"]

def shown_in_one_line(exc: ApolliaError) -> ApolliaError:
    """The same error (same class for ``except``, same code and message), marked so that IPython shows it
    as the one line ``CODE: message`` instead of a traceback: what a handle's refusal looks like in a
    notebook. (IPython asks the exception itself for ``_render_traceback_``.)"""
    line = f"{exc.code}: {exc.message}"
    exc._render_traceback_ = lambda: [line]  # type: ignore[attr-defined]
    return exc

T = TypeVar("T")
Watcher = Callable[[str, dict[str, Any]], None]


class LoopThread:
    """An asyncio event loop running in a daemon thread; ``call`` waits for a result from another thread.

    A daemon thread is not joined when the interpreter exits, so an ``atexit``
    handler can still close what runs on it (a thread pool's worker would be
    joined first and hang the exit).
    """

    def __init__(self, name: str = "apollia-runtime") -> None:
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        self._started.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    @property
    def on_thread(self) -> bool:
        return threading.get_ident() == self.thread.ident

    @property
    def running(self) -> bool:
        return self.thread.is_alive() and not self.loop.is_closed()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args, **kwargs)`` (awaited when it returns a coroutine) as a task on the loop.

        Only coroutines are awaited: a handle that is merely awaitable (a task handle,
        a chat exchange) is returned as it is — awaiting it here would block the cell
        until a person answers, which is exactly what must never happen.
        """

        async def run() -> Any:
            result = fn(*args, **kwargs)
            if inspect.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """Run ``fn`` on the loop and wait for its result (its exception is raised here)."""
        if self.on_thread:
            result = fn(*args, **kwargs)
            if inspect.iscoroutine(result):
                result.close()
                raise RuntimeError("an asynchronous call cannot be waited for on the runtime's own thread")
            return result
        future = self.submit(fn, *args, **kwargs)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()  # interrupted or timed out: the waiting stops, not what it waited for
            raise

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            if not self.on_thread:
                self.thread.join()


def snapshot(kind: str, obj: Any) -> dict[str, Any]:
    """A plain, deep-copied view of what changed, taken on the runtime's thread."""
    if kind == "task":
        from apollia_nb.runtime.tasks import task_json

        record = obj.r
        snap = task_json(record)
        snap["awaiting"] = record.awaiting
        snap["watched"] = record.watched
        return copy.deepcopy(snap)
    if kind == "card":
        return copy.deepcopy(obj.to_dict())
    if kind == "session":
        data = obj.to_dict()
        data.pop("history", None)
        return copy.deepcopy(data)
    if kind == "agent":
        return copy.deepcopy(obj.to_dict())
    return {"message": str(obj)}


class KernelRuntime:
    """The ``Runtime`` of one home, opened on a ``LoopThread`` and driven from the kernel.

    ``ui_loop`` is the kernel's event loop (None outside a kernel): views are
    updated there. ``runtime_options`` go to ``Runtime.open`` (``clock``,
    ``chat_card_timeout``, ``suspend_unattended``).
    """

    def __init__(
        self,
        home: str | Path | None = None,
        *,
        ui_loop: asyncio.AbstractEventLoop | None = None,
        user: str | None = None,
        show_widgets: bool = True,
        **runtime_options: Any,
    ) -> None:
        from apollia_nb.runtime import Runtime
        from apollia_nb.runtime.cards import CHAT_CARD_TIMEOUT_SECS

        self.ui_loop = ui_loop
        self.user = user or login_name()
        self.show_widgets = show_widgets
        self._watchers: list[Watcher] = []
        self._watch_lock = threading.Lock()
        self._owned: set[concurrent.futures.Future[Any]] = set()
        self._closed = False
        #: The side panel's state for this runtime (``notebook/panel.py``, ``PanelHome.of``), closed first.
        self.panel_home: Any = None
        self.loop = LoopThread()
        try:
            self.rt = self.loop.call(Runtime.open, home, **{"tool_sources": _tool_sources, **runtime_options})
        except BaseException:
            self.loop.stop()
            raise
        self._unsubscribe = self.loop.call(self.rt.subscribe, self._dispatch)
        self._home: Any = None
        self._home_lock = threading.Lock()
        self.chat_card_timeout: float = self.rt.chat_card_timeout or CHAT_CARD_TIMEOUT_SECS
        atexit.register(self.close)

    @property
    def home(self) -> Any:
        """The home as this kernel sees it (``notebook/home.py``: its own runtime, and the server's share
        when it joined `apollia-os serve`), chosen on first use: what the magics, widgets and panel ask."""
        with self._home_lock:
            if self._home is None:
                self._check_open()
                self._home = kernel_home(self)
            return self._home

    # ------------------------------------------------------------------ calling into the runtime
    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the runtime's thread (awaited if it is a coroutine function)."""
        self._check_open()
        try:
            return self.loop.call(fn, *args, timeout=timeout, **kwargs)
        except ApolliaError as exc:
            raise shown_in_one_line(exc) from None

    def start(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> concurrent.futures.Future[Any]:
        """Start ``fn(*args)`` on the runtime's loop; owned here, cancelled at close."""
        self._check_open()
        future = self.loop.submit(fn, *args)
        self._owned.add(future)
        future.add_done_callback(self._owned.discard)
        return future

    async def wait_for(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Await ``fn(*args)`` run on the runtime's loop, from any other asyncio loop (a cell's)."""
        return await asyncio.wrap_future(self.start(fn, *args))

    def block(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None) -> T:
        """Wait in this thread for ``fn(*args)`` run on the runtime's loop."""
        return self.call(fn, *args, timeout=timeout)

    def _check_open(self) -> None:
        if self._closed:
            from apollia_nb.errors import Conflict

            raise Conflict("the home was closed in this kernel; load the extension again to reopen it")

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ notifications
    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher(kind, snapshot)`` on every change (on the kernel's loop when there is one)."""
        with self._watch_lock:
            self._watchers.append(watcher)

        def unwatch() -> None:
            with self._watch_lock:
                if watcher in self._watchers:
                    self._watchers.remove(watcher)

        return unwatch

    def _dispatch(self, kind: str, obj: Any) -> None:  # on the runtime's thread
        with self._watch_lock:
            watchers = list(self._watchers)
        if not watchers:
            return
        snap = snapshot(kind, obj)
        for watcher in watchers:
            self.deliver(watcher, kind, snap)

    def deliver(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` where views live: on the kernel's loop if any, else here and now."""
        loop = self.ui_loop
        if loop is not None and not loop.is_closed():
            try:
                # An empty context: the runtime's tasks carry the context of the cell that started them,
                # and what a view publishes belongs to the kernel's current cell, not to that one.
                loop.call_soon_threadsafe(_quietly, fn, *args, context=contextvars.Context())
                return
            except RuntimeError:  # the kernel's loop is shutting down
                pass
        _quietly(fn, *args)

    def every(self, seconds: float, fn: Callable[[], None]) -> Callable[[], None]:
        """Deliver ``fn()`` every ``seconds`` (a countdown's tick) until the returned function is called."""

        async def tick() -> None:
            while True:
                await asyncio.sleep(seconds)
                self.deliver(fn)

        future = self.start(tick)

        def stop() -> None:
            future.cancel()

        return stop

    # ------------------------------------------------------------------ reading, cheaply
    def status(self) -> dict[str, Any]:
        """What the status line shows: home, journal head, developer mode, policy state."""

        def read() -> dict[str, Any]:
            seq, digest = self.rt.journal.head()
            policy = self.rt.governance.policy_state()
            view = self.rt.governance.view()
            return {
                "home": str(self.rt.home.path),
                "mode": self.rt.mode,
                "journal_seq": seq,
                "journal_head": bytes(digest).hex(),
                "developer_mode": self.rt.governance.developer_mode(),
                "policy": policy.status,
                "policy_reason": policy.reason,
                "governance": "readable" if view.readable else "fail closed",
                "governance_reason": view.unreadable_reason,
                "agents": len(self.rt.agents()),
                "pending": len(self.rt.pending),
                "witnesses": self.rt.witness_status(),
            }

        return self.call(read)

    def decisions(self, run_id: str) -> list[dict[str, Any]]:
        """One run's rows of the journal's ``decisions`` view (committed entries), oldest first."""
        columns = ("seq", "tool", "family", "outcome", "line", "answer", "answered_by")
        rows = self.rt.journal.sql(
            f"SELECT {', '.join(columns)} FROM decisions WHERE run_id = ? ORDER BY seq", [run_id])
        return [dict(zip(columns, row)) for row in rows]

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Cancel what this kernel started, close the runtime (suspended runs stay recorded), stop the thread."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for future in list(self._owned):
            future.cancel()
        panel_home, self.panel_home = self.panel_home, None
        if panel_home is not None:
            panel_home.close()  # the side panel's pushes stop before the runtime does
        home, self._home = self._home, None
        if home is not None:
            home.close()
        try:
            if self.loop.running:
                self.loop.call(self._unsubscribe)
                self.loop.call(self.rt.aclose)
        finally:
            self.loop.stop()


def _tool_sources(rt: Any) -> list[Any]:
    """The federated tool sources the home's apollia.toml names, opened for the kernel's runtime."""
    from apollia_nb.federation import open_sources  # lazy: %load_ext imports no federation (test_load_ext_lazy)

    return open_sources(rt)


def login_name() -> str:
    """Who answers from this kernel, as the CLI names them (the JupyterHub user in a hub's kernel)."""
    from apollia_nb.governance.people import login_name as named

    return named("user")


def _quietly(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # a broken view must not break the runtime's notifications
        import logging

        logging.getLogger("apollia_nb.notebook").exception("a notebook view failed to update")
