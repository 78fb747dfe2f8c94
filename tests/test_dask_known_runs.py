"""A worker credential opens a run only under an id the journal has never seen, and the server knows that from
its own state: no run it opens has the journal's newest entries copied into ``journal.db`` first. Every run
the journal holds is refused however it got there: before the server started, before the first question,
committed a moment ago and not copied, sealed, without a ``run_open``, while no credential was live, past
the runs the server keeps in memory between two questions."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from served_helpers import serve_on_loop

from apollia_nb.runtime import Runtime

pytestmark = pytest.mark.anyio
TOKEN = "known-runs-token"
BATCH = "batch-00aa11bb22cc"
AGENT = "summariser"


@pytest.fixture(autouse=True)
def no_idle_copies(monkeypatch):
    """The journal copies into journal.db only when somebody waits for a copy (never because it is idle)."""
    from apollia_nb.journal import store

    monkeypatch.setattr(store, "IMPORT_IDLE_SECS", 3600.0)


async def _serve(rt: Any, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """The REST API over ``rt`` on 127.0.0.1 (a real uvicorn on this loop); started with its URL and app."""
    from apollia_nb.api.app import create_app

    app = create_app(rt, token=TOKEN)
    await serve_on_loop(app, task_status, path="/api/v1", carry=(app,))


def task(n: int) -> str:
    return f"task-{BATCH.removeprefix('batch-')}-{n}"


def opening(run_id: str, n: int) -> dict[str, Any]:
    """The entries that open an item's run, as a worker's client runtime appends them."""
    return {"entries": [
        {"kind": "run_open", "run_id": run_id, "agent": AGENT,
         "payload": {"run_kind": "task", "goal": "g", "task_id": task(n)}},
        {"kind": "task_status", "run_id": run_id, "agent": AGENT,
         "payload": {"task_id": task(n), "status": "running"}}]}


def refused(response: httpx.Response) -> bool:
    return response.status_code == 401 and response.json()["code"] == "UNAUTHORIZED" \
        and "exists already" in response.json()["message"]


async def credential(api: httpx.AsyncClient, tasks: int = 50) -> httpx.AsyncClient:
    issued = await api.post("/internal/worker-tokens", json={"agent": AGENT, "batch_id": BATCH, "tasks": tasks})
    assert issued.status_code == 201, issued.text
    return httpx.AsyncClient(base_url=str(api.base_url), timeout=30,
                             headers={"Authorization": f"Bearer {issued.json()['token']}"})


def copies(rt: Any) -> int:
    return rt.journal.stats["imports"]


async def test_a_worker_opens_each_new_run_without_a_copy_into_journal_db(home):
    async with Runtime(home) as rt, anyio.create_task_group() as tg:
        url, server, _ = await tg.start(_serve, rt)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
            worker = await credential(api)
            before = copies(rt)
            for n in range(12):
                r = await worker.post("/internal/journal/entries", json=opening(f"run-item-{n}", n))
                assert r.status_code == 201, r.text
            # the first question made what the server knows (one copy, once); none of the twelve waited for one
            assert copies(rt) - before <= 1
            # a retried open of a run it opened is its own; another batch item under that id is not new
            again = await worker.post("/internal/journal/entries", json=opening("run-item-0", 0))
            assert again.status_code == 201, again.text
            await worker.aclose()
        server.should_exit = True


async def test_every_run_the_journal_holds_is_refused_without_a_copy_for_each_question(home, monkeypatch):
    async with Runtime(home) as rt:  # a run from before the server's process
        rt.journal.append("run_open", {"run_kind": "task", "goal": "g", "task_id": "task-old"}, run_id="run-old",
                          agent="clerk")
    async with Runtime(home) as rt, anyio.create_task_group() as tg:
        url, server, app = await tg.start(_serve, rt)
        rt.journal.append("run_open", {"run_kind": "task", "goal": "g", "task_id": "task-b"}, run_id="run-before",
                          agent="clerk")
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
            worker = await credential(api)
            first = await worker.post("/internal/journal/entries", json=opening("run-first", 0))
            assert first.status_code == 201, first.text
            asked = copies(rt)
            # committed since the first question, none copied into journal.db
            rt.journal.append("run_open", {"run_kind": "task", "goal": "g", "task_id": "task-a"},
                              run_id="run-after", agent="clerk")
            await rt.journal.seal_async("run-after", "clerk", [("task_status", {"task_id": "task-a",
                                                                                "status": "completed"})],
                                        {"status": "completed"})
            rt.journal.append("task_status", {"task_id": "task-c", "status": "running"}, run_id="run-no-open",
                              agent="clerk")
            for n, run_id in enumerate(["run-old", "run-before", "run-after", "run-no-open"], 1):
                r = await worker.post("/internal/journal/entries", json=opening(run_id, n))
                assert refused(r), (run_id, r.status_code, r.text)
            assert copies(rt) == asked  # refused from what the server knows, not from a copy per question
            known = app.state.worker_tokens._known
            assert set(known.recent) >= {"run-after", "run-no-open"}

            # once journal.db holds them, the server forgets them (it keeps only what is not copied yet)
            assert rt.journal.entries(run_id="run-after")  # a reader's wait: a copy
            r = await worker.post("/internal/journal/entries", json=opening("run-after", 6))
            assert refused(r), r.text
            assert "run-after" not in known.recent and "run-no-open" not in known.recent

            # more runs between two questions than it keeps: given up, made again, still refused
            from apollia_nb.api.worker_tokens import KnownRuns

            monkeypatch.setattr(KnownRuns, "RECENT_MOST", 3)
            for i in range(5):
                rt.journal.append("run_open", {"run_kind": "task", "goal": "g", "task_id": f"task-m{i}"},
                                  run_id=f"run-many-{i}", agent="clerk")
            assert known.stale
            for i in (0, 4):
                r = await worker.post("/internal/journal/entries", json=opening(f"run-many-{i}", 7 + i))
                assert refused(r), r.text
            assert app.state.worker_tokens._known is not known
            ok = await worker.post("/internal/journal/entries", json=opening("run-new", 12))
            assert ok.status_code == 201, ok.text

            # no credential live: nothing watched; a run committed meanwhile is refused to the next one
            token = worker.headers["Authorization"].removeprefix("Bearer ")
            assert (await api.post("/internal/worker-tokens/revoke", json={"token": token})).status_code == 204
            assert app.state.worker_tokens._known is None
            rt.journal.append("run_open", {"run_kind": "task", "goal": "g", "task_id": "task-g"}, run_id="run-gap",
                              agent="clerk")
            await worker.aclose()
            worker = await credential(api)
            r = await worker.post("/internal/journal/entries", json=opening("run-gap", 13))
            assert refused(r), r.text
            ok = await worker.post("/internal/journal/entries", json=opening("run-newer", 14))
            assert ok.status_code == 201, ok.text
            await worker.aclose()
        server.should_exit = True
    async with Runtime(home) as rt:
        assert rt.verify().ok
        opened = [e.run_id for e in rt.journal.entries(kinds=["run_open"]) if e.agent == AGENT]
        assert opened == ["run-first", "run-new", "run-newer"]
