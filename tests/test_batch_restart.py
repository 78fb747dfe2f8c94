"""A batch survives its owner: killed (SIGKILL) mid-batch, the next process loses nothing acknowledged."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import anyio
import pytest
from runtime_helpers import manifest

from apollia_nb.runtime import Runtime

pytestmark = pytest.mark.anyio

ITEMS = [{"n": i} for i in range(30)]


def _first_process(home, *, kill_after: int | None, fault: str | None = None) -> tuple[str, int]:
    """Another process starts a batch of ITEMS and is killed: by a fault point, or by itself once
    ``kill_after`` items completed. Returns the batch id it printed and its exit code."""
    home.path.mkdir(parents=True, exist_ok=True)
    script = textwrap.dedent(
        f"""
        import anyio, os, signal
        from apollia_nb.runtime import Runtime
        async def main():
            async with Runtime({str(home.path)!r}) as rt:
                await rt.register_agent({manifest()!r})
                def watch(kind, obj):
                    if kind == "batch" and {kill_after!r} is not None and obj.counts()["completed"] >= {kill_after!r}:
                        rt.records.flush()  # what the process was told is on disk; then it dies
                        os.kill(os.getpid(), signal.SIGKILL)
                rt.subscribe(watch)
                batch = await rt.batch("clerk", {ITEMS!r}, goal="Count to {{n}}", concurrency=4)
                os.write(1, batch.id.encode() + b"\\n")
                await batch
        anyio.run(main)
        """
    )
    env = {**os.environ, "APOLLIA_FAULT": fault or ""}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, env=env)
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "", out.returncode


async def _finish_and_check(home, batch_id: str) -> list[dict]:
    async with Runtime(home) as rt:
        batch = rt.get_batch(batch_id)
        with anyio.fail_after(60):
            await batch
        rows = batch.rows()
        assert batch.status == "completed"
        assert [r["goal"] for r in rows] == [f"Count to {i}" for i in range(30)]
        tasks = rt.records.tasks()
        assert sorted(t["id"] for t in tasks) == sorted(r["task_id"] for r in rows)  # one task per item, no more
        for row in rows:
            assert row["status"] == "completed" or (row["status"], row["error_code"]) == ("failed", "INTERRUPTED")
        assert rt.verify().ok
    return rows


async def test_killed_once_the_batch_and_its_first_task_are_recorded_every_item_runs_after_the_restart(home):
    batch_id, code = _first_process(home, kill_after=None, fault="submit.after_commit:kill")
    assert code == -9 and batch_id.startswith("batch-")  # told of the batch; killed at its first item
    rows = await _finish_and_check(home, batch_id)
    assert [r["status"] for r in rows] == ["completed"] * 30  # nothing was running: nothing is interrupted
    assert rows[0]["result"] == "Done."


async def test_killed_mid_batch_finished_items_keep_their_results_and_the_rest_run_once(home):
    from apollia_nb.runtime.records import RuntimeRecords

    batch_id, code = _first_process(home, kill_after=10)
    assert code == -9 and batch_id.startswith("batch-")
    records = RuntimeRecords(home.runtime_db)  # what the killed process left, read without a runtime
    try:
        left = {t["id"]: (t["status"], t["run_id"]) for t in records.tasks()}
        assert records.batch(batch_id)["status"] == "running" and len(records.batch_items(batch_id)) == 30
    finally:
        records.close()
    done_before = {tid: run for tid, (status, run) in left.items() if status == "completed"}
    assert len(done_before) >= 10 and len(left) < 30  # killed in the middle
    rows = await _finish_and_check(home, batch_id)
    by_task = {r["task_id"]: r for r in rows}
    for task_id, run_id in done_before.items():  # acknowledged results are kept, not run again
        assert by_task[task_id]["status"] == "completed" and by_task[task_id]["run_id"] == run_id
    never_started = [r for r in rows if r["task_id"] not in left]
    assert never_started and all(r["status"] == "completed" for r in never_started)
