"""The worker threads that run tools' synchronous bodies (``runtime/workers.py``)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from apollia_nb.runtime import workers

pytestmark = pytest.mark.anyio

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


async def test_a_body_runs_in_another_thread_with_the_callers_context() -> None:
    WHO.set("clerk")
    loop_thread = threading.get_ident()
    seen = await workers.run_sync(lambda x, y=0: (threading.get_ident(), WHO.get(), x + y), 1, y=2, timeout=5)
    assert seen[0] != loop_thread and seen[1:] == ("clerk", 3)


async def test_an_error_of_the_body_is_raised_to_the_caller() -> None:
    def broken() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        await workers.run_sync(broken, timeout=5)


async def test_the_timeout_returns_at_once_and_drops_the_late_result() -> None:
    release = threading.Event()
    done: list[str] = []

    def slow() -> str:
        release.wait(5)
        done.append("late")
        return "late"

    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await workers.run_sync(slow, timeout=0.05)
    assert time.monotonic() - t0 < 2 and done == []
    release.set()
    for _ in range(200):
        if done:
            break
        await asyncio.sleep(0.01)
    assert done == ["late"]  # it ran to its end in its thread; nobody got its result


async def test_cancelling_the_caller_is_a_cancellation_not_a_timeout() -> None:
    release = threading.Event()
    task = asyncio.ensure_future(workers.run_sync(release.wait, 5, timeout=30))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()


async def test_a_body_whose_caller_stopped_waiting_before_it_started_never_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool = workers._Pool(1)
    monkeypatch.setattr(workers, "_pool", pool)
    release = threading.Event()
    ran: list[str] = []
    blocker = asyncio.ensure_future(workers.run_sync(release.wait, 5, timeout=30))
    await asyncio.sleep(0.05)  # the only worker is busy
    with pytest.raises(TimeoutError):
        await workers.run_sync(ran.append, "queued body", timeout=0.05)
    release.set()
    assert await blocker is True
    assert await workers.run_sync(ran.append, "next", timeout=5) is None
    assert ran == ["next"]


async def test_no_more_than_the_limit_run_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "_pool", workers._Pool(3))
    lock = threading.Lock()
    running = [0, 0]  # now, most

    def body() -> None:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1

    await asyncio.gather(*(workers.run_sync(body, timeout=10) for _ in range(12)))
    assert running[1] == 3


async def test_the_workers_never_keep_the_process_from_exiting() -> None:
    await workers.run_sync(lambda: None, timeout=5)
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("apollia-tool-"))


async def test_calls_one_after_another_reuse_one_thread(monkeypatch) -> None:
    """A worker waits for its next job before its caller hears back: the caller's next call finds it
    idle instead of starting another thread (which costs about a millisecond on the call's path)."""
    pool = workers._Pool(workers.MAX_WORKERS)
    monkeypatch.setattr(workers, "_pool", pool)
    seen: set[str] = set()
    for _ in range(500):
        await workers.run_sync(lambda: seen.add(threading.current_thread().name), timeout=5)
    assert pool._threads == 1 and len(seen) == 1
