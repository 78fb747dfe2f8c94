"""What one item of a Dask batch asks of the served home: its run ends in three requests — the count of its
entries, one append of what it handed over, its last entries and its seal, a checkpoint — and the seal
counts every entry of the run (replay finds it right, the chain verifies)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from typing import Any

import anyio
import pytest
from runtime_helpers import manifest
from served_helpers import serve_on_loop
from test_batch_dask import cluster, served  # noqa: F401 - the fixtures

from apollia_nb.journal.keys import PUB_FILE
from apollia_nb.runtime import Runtime, dask_engine
from apollia_nb.runtime.manifest import parse_manifest
from apollia_nb.runtime.models.scripted import ScriptedModel
from apollia_nb.runtime.remote import ServerAddress
from apollia_nb.runtime.tools import ToolDef

pytestmark = pytest.mark.anyio
TOKEN = "item-requests-token"
BATCH = "batch-0c0ffee00123"


def read_note(name: str) -> str:
    """Read a note."""
    return f"the note {name}"


def _actor(role: str, messages: Any, tools: Any) -> Any:
    if role != "actor":
        return None
    done = sum(1 for m in messages if m.role == "tool")
    if done < 3:
        return {"tool_calls": [{"name": "read_note", "arguments": {"name": f"n{done}"}}]}
    return {"text": "read three notes"}


async def _serve(rt: Any, seen: list[tuple[str, str, list[str]]],
                 task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """The REST API over ``rt`` on 127.0.0.1 (a real uvicorn on this loop), noting every request it answers:
    method, path and, for an append, the kinds of its entries."""
    from apollia_nb.api.app import create_app

    app = create_app(rt, token=TOKEN)

    async def noting(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        chunks: list[bytes] = []

        async def replay() -> Any:
            message = await receive()
            chunks.append(message.get("body", b""))
            return message

        try:
            await app(scope, replay, send)
        finally:
            kinds: list[str] = []
            if scope["method"] == "POST" and scope["path"].endswith("/internal/journal/entries"):
                kinds = [e["kind"] for e in json.loads(b"".join(chunks))["entries"]]
            seen.append((scope["method"], scope["path"].removeprefix("/api/v1"), kinds))

    await serve_on_loop(noting, task_status)


async def test_an_items_run_ends_in_three_requests_and_its_seal_counts_every_entry(home, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the item's worker home, outside a Dask worker
    seen: list[tuple[str, str, list[str]]] = []
    tool = ToolDef.from_function(read_note, family="read")
    async with Runtime(home) as rt, anyio.create_task_group() as tg:
        url, server = await tg.start(_serve, rt, seen)
        # what a driver's spec carries (the agent is registered on the workers, reviewed by the server)
        spec = dask_engine.WorkerSpec(url=url, token=TOKEN, public_key=(rt.home.keys_dir / PUB_FILE).read_bytes(),
                                      manifest=parse_manifest(manifest("summariser")), tools=(tool,),
                                      model=ScriptedModel.from_function(_actor), batch_id=BATCH, opener=Runtime.open)
        credential = await anyio.to_thread.run_sync(dask_engine.issue_credential,
                                                    ServerAddress(url=url, token=TOKEN, pid=0), spec, 2)
        spec = dataclasses.replace(spec, token=credential)
        try:
            summary = await anyio.to_thread.run_sync(dask_engine.run_item, spec, dask_engine.item_task_id(BATCH, 0),
                                                     "Read three notes")
            answered = len(seen)  # what the item asked (its worker's runtime closes below)
        finally:
            worker = dask_engine._WORKERS.pop((spec.url, spec.public_key, spec.token), None)
            if worker is not None:
                await anyio.to_thread.run_sync(worker.close)
        assert summary["status"] == "completed", summary
        run_id = summary["run_id"]

        calls = [i for i, (method, path, _) in enumerate(seen) if path == "/internal/calls"]
        assert len(calls) == 3
        after = [(m, p, k) for m, p, k in seen[calls[-1] + 1:answered]
                 if p.startswith("/internal/journal") and k != ["tool_result"]]  # a result handed over, sent alone
        assert [(m, p) for m, p, _ in after] == [("GET", "/internal/journal/run-size"),
                                                 ("POST", "/internal/journal/entries"),
                                                 ("POST", "/internal/journal/checkpoint")], seen
        assert after[1][2][-2:] == ["task_status", "run_seal"]  # the last entries and the seal, one append

        entries = rt.journal.entries(run_id=run_id)
        assert [e.kind for e in entries].count("tool_result") == 3
        assert entries[-1].kind == "run_seal" and entries[-1].data()["entries"] == len(entries) - 1
        assert not [m for m in rt.replay(run_id).missing if "seal" in m]
        assert rt.verify().ok
        server.should_exit = True


async def test_a_finished_items_dask_task_is_released_at_once(served, cluster):  # noqa: F811
    """The driver keeps an item's summary, not its Dask future: once a batch has finished, the cluster holds
    none of its tasks (a long batch keeps only its running items' tasks there)."""
    from batch_helpers import AGENT, GOAL, item_frame, item_model

    async with Runtime(served) as rt:
        await rt.register_agent(AGENT, model=item_model())
        batch = await rt.batch("summariser", item_frame(6, every=100), goal=GOAL, concurrency=2, engine="dask",
                               scheduler=cluster)
        with anyio.fail_after(120):
            await batch
        assert batch.counts()["completed"] == 6

        def held(dask_scheduler: Any) -> list[str]:
            return [str(key) for key in dask_scheduler.tasks]

        with anyio.fail_after(30):  # the releases reach the scheduler
            while [k for k in cluster.run_on_scheduler(held) if "apollia-item-" in k]:
                await anyio.sleep(0.05)
