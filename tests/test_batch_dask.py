"""Batches on a dask.distributed LocalCluster (2 worker processes) against a real ``apollia-os serve``:
one chain that verifies, waiting items answered over REST, a worker killed mid-item loses nothing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from typing import Any

import anyio
import httpx
import pytest
from batch_helpers import AGENT, GOAL, expected_result, item_frame, item_model

from apollia_nb.errors import BadInput
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.models.scripted import ScriptedModel
from apollia_nb.runtime.tools import ToolDef

distributed = pytest.importorskip("distributed")
pytestmark = pytest.mark.anyio
APOLLIA = [sys.executable, "-m", "apollia_nb"]


@pytest.fixture(scope="module")
def cluster():
    """One LocalCluster with two worker processes for the module; a client of it."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as lc, distributed.Client(lc) as client:
        yield client


@pytest.fixture
def served(home, monkeypatch):
    """``apollia-os serve`` on the home, as a subprocess; stopped (cleanly) after the test."""
    monkeypatch.delenv("APOLLIA_TOKEN", raising=False)
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home.path), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=home.path.parent)
    assert proc.stdout.readline(), proc.stderr.read()  # one line once it listens
    yield home
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    proc.stdout.close()
    proc.stderr.close()


def verify(home) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APOLLIA, "audit", "verify", "--home", str(home.path)], check=False, capture_output=True, text=True,
                          timeout=120)


async def test_a_batch_on_two_worker_processes_ends_with_one_chain_that_verifies(served, cluster):
    frame = item_frame(24, every=12)  # items 11 and 23 write a file: they wait on a person, on their worker
    async with Runtime(served) as rt:
        assert rt.mode == "client"
        await rt.register_agent(AGENT, model=item_model())
        batch = await rt.batch("summariser", frame, goal=GOAL, concurrency=8, engine="dask", scheduler=cluster)
        url, token = rt.server.url, rt.server.token
        async with httpx.AsyncClient(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}) as api:
            with anyio.fail_after(60):  # the two decisions reach the home's one inbox
                while len(waiting := (await api.get("/pending-decisions")).json()) < 2:
                    await anyio.sleep(0.05)
            assert sorted(d["tool"] for d in waiting) == ["write_file", "write_file"]
            for decision in waiting:
                r = await api.post("/pending-decisions/decide",
                                   json={"id": decision["id"], "answer": "once", "by": "alice@rest"})
                assert r.status_code == 200, r.text
        with anyio.fail_after(60):
            await batch
        assert batch.status == "completed"
        assert batch.counts() == {"pending": 0, "running": 0, "waiting": 0, "completed": 24, "failed": 0,
                                  "cancelled": 0}
        rows = batch.rows()
        assert [r["key"] for r in rows] == [f"row-{i}" for i in range(24)]
        assert [r["result"] for r in rows] == [expected_result(n, t) for n, t in zip(frame["n"], frame["topic"])]
        run_ids = {r["run_id"] for r in rows}
        assert len(run_ids) == 24 and None not in run_ids
        journaled = {e.run_id for e in rt.journal.entries() if e.run_id}
        assert run_ids <= journaled  # every item's run is in the server's one chain
        entries = rt.journal.entries()
        asked = [e for e in entries if e.kind == "decision" and json.loads(e.payload).get("tool") == "write_file"]
        assert len(asked) == 2 and {e.run_id for e in asked} <= run_ids
        assert sum(1 for e in entries if e.kind == "answer") == 2
    result = verify(served)
    assert result.returncode == 0, result.stdout + result.stderr


# -- a worker killed at an exact point: when the marker tool of one item runs, the first time
_KILL = re.compile(r"Process item (\d+) \(marker: (.*)\)")


def crash_once(path: str) -> str:
    """Kill this worker process the first time it runs (the marker file says whether it ran)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return "ran before"
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def _kill_actor(role: str, messages: Any, tools: Any) -> Any:
    if role != "actor":
        return None
    found = _KILL.search(" ".join(m.content for m in messages if m.content))
    if found is None:
        return {"text": "no item"}
    n, marker = found.groups()
    if marker != "-" and not any(m.role == "tool" for m in messages):
        return {"tool_calls": [{"name": "crash_once", "arguments": {"path": marker}}]}
    return {"text": f"item {n} done"}


async def test_a_worker_killed_mid_item_loses_nothing_and_every_item_is_accounted_for(served, cluster, tmp_path):
    marker = tmp_path / "killed.pid"
    items = [{"n": n, "marker": str(marker) if n == 5 else "-"} for n in range(16)]
    pids = set(cluster.run(os.getpid).values())
    async with Runtime(served) as rt:
        await rt.register_agent(AGENT, model=ScriptedModel.from_function(_kill_actor),
                                tools=[ToolDef.from_function(crash_once, family="read")])
        batch = await rt.batch("summariser", items, goal="Process item {n} (marker: {marker})", concurrency=6,
                               engine="dask", scheduler=cluster)
        with anyio.fail_after(120):
            await batch
        killed = int(marker.read_text())
        assert killed in pids  # a worker process of the cluster died running item 5's tool
        assert batch.status == "completed"
        assert batch.counts()["completed"] == 16, batch.rows()
        assert [r["result"] for r in batch.rows()] == [f"item {n} done" for n in range(16)]
        calls = [e for e in rt.journal.entries() if e.kind == "decision" and json.loads(e.payload).get("tool") == "crash_once"]
        assert len(calls) == 2 and len({e.run_id for e in calls}) == 2  # the killed run's decision is kept
    result = verify(served)
    assert result.returncode == 0, result.stdout + result.stderr


async def test_each_batch_runs_its_own_agent_on_the_workers(served, cluster):
    """A second batch of an agent of the same name, with another model, runs that model on the workers."""
    async with Runtime(served) as rt:
        await rt.register_agent(AGENT, model=item_model())
        first = await rt.batch("summariser", item_frame(4, every=100), goal=GOAL, engine="dask", scheduler=cluster)
        with anyio.fail_after(60):
            await first
        await rt.stop_agent("summariser")
        await rt.register_agent(AGENT, model=ScriptedModel.from_function(_kill_actor))
        second = await rt.batch("summariser", [{"n": n, "marker": "-"} for n in range(4)],
                                goal="Process item {n} (marker: {marker})", engine="dask", scheduler=cluster)
        with anyio.fail_after(60):
            await second
        assert [r["result"] for r in first.rows()] == [expected_result(n, t) for n, t in
                                                       zip(range(4), ("alpha", "beta", "gamma", "alpha"))]
        assert [r["result"] for r in second.rows()] == [f"item {n} done" for n in range(4)]


async def test_the_dask_engine_needs_a_served_home_and_a_scheduler(home):
    async with Runtime(home) as rt:
        await rt.register_agent(AGENT, model=item_model())
        with pytest.raises(BadInput, match="apollia-os serve"):
            await rt.batch("summariser", [{"n": 1, "topic": "a", "file": "no"}], goal=GOAL, engine="dask",
                           scheduler="tcp://127.0.0.1:1")
        with pytest.raises(BadInput, match="engine must be"):
            await rt.batch("summariser", [{"n": 1, "topic": "a", "file": "no"}], goal=GOAL, engine="ray")
        assert rt.batches() == []  # nothing recorded


def test_the_cli_runs_a_batch_on_the_cluster_and_writes_its_results(served, cluster, tmp_path):
    from runtime_helpers import manifest

    agent = tmp_path / "clerk.toml"
    agent.write_text(manifest("clerk", actor=[{"text": "noted"}]))
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": f"t-{n}", "goal": f"note ticket {n}"}) + "\n" for n in range(6)))
    out = tmp_path / "out.csv"
    r = subprocess.run([*APOLLIA, "batch", str(agent), str(items), "--key", "id", "--engine", "dask",
                        "--scheduler", cluster.scheduler.address, "--out", str(out), "--home", str(served.path)],
                       check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "6 completed, 0 failed" in r.stdout
    import csv

    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert [(row["key"], row["status"], row["result"]) for row in rows] == [(f"t-{n}", "completed", "noted")
                                                                            for n in range(6)]
    assert verify(served).returncode == 0

    missing = subprocess.run([*APOLLIA, "batch", str(agent), str(items), "--engine", "dask", "--home",
                              str(served.path)], check=False, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 3 and "BAD_INPUT" in missing.stderr and "--scheduler" in missing.stderr
