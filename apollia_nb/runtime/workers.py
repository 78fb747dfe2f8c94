"""Threads that run tools' synchronous bodies: one hand-off each way, a timer for the timeout.

A governed call runs a synchronous tool body in a worker thread so the event
loop never blocks. ``anyio.to_thread.run_sync`` under ``anyio.fail_after`` does
that with a capacity limiter, a cancel scope and a ``queue.Queue`` per hand-off;
on the asyncio loop the runtime uses, ``run_sync`` does the same with less: the
body goes to an idle worker through a ``SimpleQueue``, comes back with
``call_soon_threadsafe``, and the timeout is one timer handle on the loop.

``run_after(before, body)`` runs ``before`` (the journal's commit of the call)
in the same worker just before the body: the body starts once the commit
returned, without a hand-off back to the loop in between, and its timeout counts
from its own start.

What stays the same: at most ``MAX_WORKERS`` bodies run at once (more wait
their turn); the body runs in a copy of the caller's context variables; on the
timeout, or when the awaiting task is cancelled, the call returns at once and
the body's late result is dropped (a thread cannot be interrupted); the timeout
raises ``TimeoutError``. The workers are daemon threads owned by this module's
pool: an abandoned body never keeps the process from exiting. Outside an
asyncio loop (trio), ``run_sync`` is anyio's.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio

__all__ = ["run_sync", "run_after", "BeforeFailed", "MAX_WORKERS"]

#: Bodies running at once, as anyio's default thread limiter allows.
MAX_WORKERS = 40

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]


class _Pool:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one release per worker waiting for a job
        self._lock = threading.Lock()
        self._threads = 0

    def submit(self, job: _Job) -> None:
        self._jobs.put(job)
        if self._idle.acquire(blocking=False):
            return  # a waiting worker takes it
        with self._lock:
            if self._threads < self._limit:
                self._threads += 1
                threading.Thread(target=self._work, name=f"apollia-tool-{self._threads}", daemon=True).start()

    def _work(self) -> None:
        while True:
            loop, future, body = self._jobs.get()
            if future.done():  # the caller stopped waiting before the body started: it never runs
                del loop, future, body
                self._idle.release()
                continue
            setter: Callable[..., None]
            try:
                result = body()
            except BaseException as exc:  # handed to the caller, never lost (unless it stopped waiting)
                setter, value = _set_exception, exc
            else:
                setter, value = _set_result, result
            # Waiting for a job again before the caller hears back: its next call finds this thread
            # idle, rather than starting a thread (a millisecond) each time it is the quicker of the two.
            self._idle.release()
            _hand_back(loop, setter, future, value)
            del loop, future, body, setter, value


def _hand_back(loop: asyncio.AbstractEventLoop, setter: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(setter, *args)
    except RuntimeError:
        pass  # the loop closed while the body ran: nobody waits for it any more


def _set_result(future: "asyncio.Future[Any]", result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: "asyncio.Future[Any]", exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


_pool = _Pool(MAX_WORKERS)


class BeforeFailed(Exception):
    """``run_after``'s ``before`` raised ``error``: the body never ran."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


async def run_sync(fn: Callable[..., Any], /, *args: Any, timeout: float, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a worker thread; ``TimeoutError`` after ``timeout`` seconds."""
    result, _ = await run_after(None, functools.partial(fn, *args, **kwargs), timeout=timeout)
    return result


async def run_after(before: Callable[[], Any] | None, body: Callable[[], Any], *,
                    timeout: float) -> tuple[Any, float]:
    """``before()`` then ``body()`` in one worker thread; ``(body's result, perf_counter() as it started)``.

    ``before`` is what must be done before the body may start (the journal's commit of
    the call): in the body's own thread, the body starts as soon as it is done, without
    a hand-off back to the event loop in between. Its failure is ``BeforeFailed`` (the
    body never runs); ``timeout`` counts from the body's start, so a slow ``before`` takes
    none of the body's time. Once ``before`` started it runs to its end, like the body;
    when the caller stopped waiting by then, the body does not start.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:  # pragma: no cover - another event loop (trio)
        if before is not None:
            try:
                await anyio.to_thread.run_sync(before)
            except BaseException as exc:
                raise BeforeFailed(exc) from exc
        started = time.perf_counter()
        with anyio.fail_after(timeout):
            return await anyio.to_thread.run_sync(body, abandon_on_cancel=True), started
    future: asyncio.Future[Any] = loop.create_future()
    expired = False
    begun: list[float] = []  # the body's start: (monotonic, perf_counter), set by the worker
    claim = threading.Lock()
    taken: list[str] = []  # who took the call first: "worker" (it runs) or "timer" (it timed out waiting)

    def job() -> Any:
        with claim:
            if taken:  # it timed out while waiting for a thread; the caller made ``before`` itself
                return None
            taken.append("worker")
        if before is not None:
            try:
                before()
            except BaseException as exc:
                raise BeforeFailed(exc) from exc
            if future.done():  # the caller stopped waiting while ``before`` ran: the body never starts
                return None
        begun.extend((time.monotonic(), time.perf_counter()))
        return body()

    timer: asyncio.TimerHandle

    def expire() -> None:
        nonlocal expired, timer
        if future.done():
            return
        if not begun:
            with claim:
                if not taken:
                    taken.append("timer")
            if taken[0] == "worker":  # ``before`` runs: the body's time has not started
                timer = loop.call_later(timeout, expire)
                return
        else:
            left = begun[0] + timeout - time.monotonic()
            if left > 0:
                timer = loop.call_later(left, expire)
                return
        expired = True
        future.cancel()

    if before is None:
        begun.extend((time.monotonic(), time.perf_counter()))  # counted from the hand-off, as always
    timer = loop.call_later(timeout, expire)
    _pool.submit((loop, future, functools.partial(contextvars.copy_context().run, job)))
    try:
        return await future, begun[1]
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if expired and (task is None or not task.cancelling()):
            if before is not None and taken[0] == "timer":
                # No thread was free before the timeout: the body never runs, but what had to
                # come before it is still done (the journal's record of the call), then the timeout.
                try:
                    await anyio.to_thread.run_sync(before)
                except BaseException as exc:
                    raise BeforeFailed(exc) from exc
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()
