"""The per-call path of a governed call: the commit before a tool's body, in the body's own thread.

``invoke(..., before=...)`` runs what must be durable before the body (the journal's commit of
``tool_call``) in the worker thread that then runs the body; ``run_approved_call`` uses it for
synchronous bodies. These tests pin what that must keep: the body starts only once the commit
returned, a refused commit runs nothing and is raised as it is, the tool's timeout is the
body's own, a cancelled call never starts its body; and the canonical JSON the journal hashes.
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
import threading
import time
from typing import Any

import pytest

from apollia_nb.dbutil import FAULT_ENV
from apollia_nb.errors import BadInput, StorageFull
from apollia_nb.journal.entry import canonical_json as journal_json
from apollia_nb.runtime import Runtime, workers
from apollia_nb.runtime.breaker import BreakerState, Breakers
from apollia_nb.runtime.governed import current_call
from apollia_nb.runtime.tools import ToolDef, canonical_json, invoke, output_digest
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio


# --- invoke(before=...) ---------------------------------------------------------------------------


async def test_a_sync_tool_with_a_timeout_parameter_is_given_its_own_argument() -> None:
    def wait(seconds: float, timeout: float = 1.0) -> str:
        """Wait."""
        return f"{seconds} within {timeout}"

    outcome = await invoke(ToolDef.from_function(wait, family="read"), {"seconds": 1, "timeout": 2},
                           breakers=Breakers())
    assert (outcome.status, outcome.output) == ("ok", "1 within 2"), outcome.error


async def test_before_runs_in_the_bodys_thread_and_the_body_starts_once_it_returned() -> None:
    events: list[tuple[str, int]] = []

    def before() -> None:
        time.sleep(0.05)
        events.append(("before done", threading.get_ident()))

    def body(key: str) -> str:
        """Body."""
        events.append(("body", threading.get_ident()))
        return key

    outcome = await invoke(ToolDef.from_function(body, family="read"), {"key": "k"}, breakers=Breakers(),
                           before=before)
    assert outcome.ok and outcome.output == "k"
    assert [what for what, _ in events] == ["before done", "body"]
    assert events[0][1] == events[1][1] != threading.get_ident()
    assert outcome.duration_ms < 45  # the body's own time, not the commit's


async def test_a_refused_before_is_raised_as_it_is_and_neither_body_nor_breaker_hear_of_it() -> None:
    ran: list[str] = []
    refusal = StorageFull("the journal could not record 1 request(s): no space left")

    def before() -> None:
        raise refusal

    def body(key: str) -> str:
        """Body."""
        ran.append(key)
        return key

    breakers = Breakers()
    with pytest.raises(StorageFull) as caught:
        await invoke(ToolDef.from_function(body, family="read"), {"key": "k"}, breakers=breakers, before=before)
    assert caught.value is refusal and ran == []
    status = breakers.get("body").status()
    assert (status.state, status.consecutive_failures) == (BreakerState.CLOSED, 0)


async def test_the_timeout_counts_from_the_bodys_start_not_from_before() -> None:
    def before() -> None:
        time.sleep(0.3)

    def quick(key: str) -> str:
        """Quick."""
        time.sleep(0.02)
        return key

    def slow(key: str) -> str:
        """Slow."""
        time.sleep(0.6)
        return key

    breakers = Breakers()
    fast = await invoke(ToolDef.from_function(quick, family="read"), {"key": "k"}, breakers=breakers,
                        timeout_secs=0.2, before=before)
    assert fast.ok, fast.error
    t0 = time.monotonic()
    late = await invoke(ToolDef.from_function(slow, family="read"), {"key": "k"}, breakers=breakers,
                        timeout_secs=0.2, before=before)
    assert late.error_code == "TOOL_TIMEOUT"
    assert 0.45 <= time.monotonic() - t0 < 0.58  # the commit's 0.3 s, then the body's 0.2 s


async def test_a_call_cancelled_while_before_runs_finishes_before_and_never_starts_the_body() -> None:
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    ran: list[str] = []

    def before() -> None:
        entered.set()
        release.wait(5)
        finished.set()

    def body(key: str) -> str:
        """Body."""
        ran.append(key)
        return key

    task = asyncio.ensure_future(invoke(ToolDef.from_function(body, family="read"), {"key": "k"},
                                        breakers=Breakers(), before=before))
    for _ in range(500):
        if entered.is_set():
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    for _ in range(500):
        if finished.is_set():
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert finished.is_set() and ran == []  # what was being committed is committed; the tool never ran


async def test_bad_arguments_and_an_open_circuit_still_run_before_and_not_the_body() -> None:
    done: list[str] = []
    ran: list[str] = []

    def body(key: str) -> str:
        """Body."""
        ran.append(key)
        raise ConnectionError("down")

    tool = ToolDef.from_function(body, family="read")
    breakers = Breakers()
    outcome = await invoke(tool, {"nope": 1}, breakers=breakers, before=lambda: done.append("bad"))
    assert outcome.error_code == "BAD_ARGUMENT" and done == ["bad"] and ran == []
    for i in range(10):
        if breakers.get("body").state is BreakerState.OPEN:
            break
        await invoke(tool, {"key": str(i)}, breakers=breakers)
    assert breakers.get("body").state is BreakerState.OPEN
    ran.clear()
    outcome = await invoke(tool, {"key": "x"}, breakers=breakers, before=lambda: done.append("open"))
    assert outcome.error_code == "CIRCUIT_OPEN" and done == ["bad", "open"] and ran == []


async def test_a_call_that_finds_no_free_thread_before_its_timeout_is_still_journaled_then_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers, "_pool", workers._Pool(1))
    release = threading.Event()
    blocker = asyncio.ensure_future(workers.run_sync(release.wait, 5, timeout=30))
    await asyncio.sleep(0.05)  # the only worker is busy
    committed: list[str] = []
    ran: list[str] = []

    def body(key: str) -> str:
        """Body."""
        ran.append(key)
        return key

    outcome = await invoke(ToolDef.from_function(body, family="read"), {"key": "k"}, breakers=Breakers(),
                           timeout_secs=0.1, before=lambda: committed.append("tool_call"))
    assert outcome.error_code == "TOOL_TIMEOUT" and committed == ["tool_call"]
    release.set()
    assert await blocker is True
    assert await workers.run_sync(lambda: "free again", timeout=5) == "free again"
    assert ran == []  # the queued body never ran once its call had timed out


# --- through the runtime --------------------------------------------------------------------------


async def test_a_sync_tool_body_starts_only_once_its_tool_call_is_committed(home) -> None:
    seen: list[tuple[int, int, str]] = []

    def read_note(key: str) -> str:
        """Read a note."""
        scope = current_call.get()
        assert scope is not None
        seen.append((scope.rt.journal.head()[0], threading.get_ident(), scope.call_id))
        return f"note {key}"

    async with Runtime(home) as rt:
        tool = ToolDef.from_function(read_note, family="read")
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("read_note", key="a")]},
                                                {"tool_calls": [call("read_note", key="b")]},
                                                {"text": "read"}]), tools=[tool])
        task = await (await rt.submit("clerk", "Read two notes"))
        assert task.status == "completed", task.error
        entries = rt.journal.entries(run_id=task.run_id)
    assert len(seen) == 2 and threading.get_ident() not in [thread for _, thread, _ in seen]
    for head, _, call_id in seen:
        [tool_call] = [e for e in entries if e.kind == "tool_call" and json.loads(e.payload)["call_id"] == call_id]
        [result] = [e for e in entries if e.kind == "tool_result" and json.loads(e.payload)["call_id"] == call_id]
        assert tool_call.seq <= head < result.seq  # durable before the body started; the result after it
        shown = json.loads(result.payload)
        assert shown["output_digest"] == output_digest(shown["output"])  # the digest of what was journaled
        kinds = [e.kind for e in entries if e.seq <= tool_call.seq][-3:]
        assert kinds == ["model_response", "decision", "tool_call"]  # one commit, in this order


async def test_a_journal_that_refuses_the_commit_before_a_call_stops_the_run_and_the_tool_never_runs(
    home, monkeypatch
) -> None:
    ran: list[str] = []

    def refuse_from_now(first: Any) -> tuple[str, ...]:
        # Asked while the call is being decided: the commit that follows is the first one refused.
        monkeypatch.setenv(FAULT_ENV, "journal.log:EIO")
        return ()

    def read_note(key: str) -> str:
        """Read a note."""
        ran.append(key)
        return key

    async with Runtime(home) as rt:
        tool = ToolDef.from_function(read_note, family="read", aliases=refuse_from_now)
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("read_note", key="a")]},
                                                {"text": "read"}]), tools=[tool])
        task = await (await rt.submit("clerk", "Read a note"))
        monkeypatch.delenv(FAULT_ENV)
        assert task.status == "failed" and task.error["code"] == "STORAGE_ERROR", task.error
        assert ran == []
        kinds = [e.kind for e in rt.journal.entries(run_id=task.run_id)]
        assert "tool_call" not in kinds and "decision" not in kinds
        assert rt.verify().ok


# --- canonical JSON -------------------------------------------------------------------------------


class Level(enum.IntEnum):
    HIGH = 3


class Word(str):
    pass


@pytest.mark.parametrize("value", [
    {"b": 1, "a": "é – ü\u2028\x00", "c": [1.5, None, True, -0.0, 1e300, 2**70], "n": {"z": 0, "y": "\n"}},
    {"level": Level.HIGH, "word": Word("x"), "pair": (1, 2), "f": 0.1 + 0.2},
    {},
])
def test_the_journals_canonical_json_is_json_dumps_with_its_options(value: Any) -> None:
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert journal_json(value) == expected.encode("utf-8")


@pytest.mark.parametrize(("value", "words"), [
    ({"a": [{"b": {2: 3}}]}, "payload key 2 at $.a[0].b is not a string"),
    ({"a": [1, {"b": {1, 2}}]}, "payload value at $.a[1].b is a set, not JSON"),
    ({"x": math.nan}, "not canonical JSON"),
    ({"x": "\ud800"}, "not canonical JSON"),
])
def test_the_journals_canonical_json_refuses_what_it_cannot_carry_and_says_where(value: Any, words: str) -> None:
    with pytest.raises(BadInput) as caught:
        journal_json(value)
    assert words in caught.value.message


def test_a_cycle_is_refused_not_encoded() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(BadInput):
        journal_json(loop)


def test_a_tools_canonical_json_is_json_dumps_with_its_options() -> None:
    import datetime

    for value in ["note", {"b": [1, {"a": datetime.date(2020, 1, 1)}], "é": None}, 3, None, [math.nan]]:
        assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"),
                                                   ensure_ascii=False, default=str)
