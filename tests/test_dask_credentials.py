"""A Dask batch's items carry a worker credential, never the server's token: against a real ``apollia-os serve``
it opens only what one item of its batch needs, for its agent and tasks, and ends with the batch. An item that
cannot be sent to the cluster fails alone; the driver's runtime goes on."""

from __future__ import annotations

import json
import threading
from typing import Any

import anyio
import httpx
import pytest
from batch_helpers import AGENT, GOAL, expected_result, item_frame, item_model
from test_batch_dask import cluster, served  # noqa: F401 - the fixtures

from apollia_nb.runtime import Runtime
from apollia_nb.runtime.tools import ToolDef

distributed = pytest.importorskip("distributed")
pytestmark = pytest.mark.anyio

BATCH = "batch-0123456789ab"


def server_of(home: Any) -> tuple[str, str]:
    info = json.loads((home.path / "server.json").read_text())
    return info["url"] + "/api/v1", info["token"]


def entry(kind: str, run_id: str | None, author: str, /, **payload: Any) -> dict[str, Any]:
    return {"kind": kind, "run_id": run_id, "agent": author, "payload": payload}


def pending(run_id: str, task_id: str, agent: str) -> dict[str, Any]:
    return {"run_id": run_id, "task_id": task_id, "agent": agent, "tool": "write_file", "family": "write",
            "arguments": {"path": "x.txt", "content": "x"}, "answers": ["once", "always", "refuse"],
            "reason": "asks", "line": 6, "call_id": "call-1"}


def refused(response: httpx.Response) -> bool:
    return response.status_code == 401 and response.json()["code"] == "UNAUTHORIZED"


def test_a_worker_credential_opens_only_what_an_item_of_its_batch_needs(served):  # noqa: F811
    url, token = server_of(served)
    owner = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    pinned = {"tools": ["*"], "model": {"provider": "scripted"}}
    issued = owner.post("/internal/worker-tokens", json={"agent": "summariser", "batch_id": BATCH, "tasks": 2,
                                                          "identity": pinned})
    assert issued.status_code == 201, issued.text
    credential = issued.json()["token"]
    assert credential != token
    worker = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {credential}"}, timeout=30)

    # another process's run and its waiting decision, which the worker must neither read nor extend
    other = owner.post("/internal/journal/entries", json={"entries": [
        entry("run_open", "run-other", "clerk", run_kind="task", goal="secret goal", task_id="task-other")]})
    assert other.status_code == 201, other.text
    theirs = owner.post("/internal/pending-decisions", json=pending("run-other", "task-other", "clerk")).json()

    # what an item needs works
    assert worker.get("/internal/journal/head").status_code == 200
    assert worker.get("/internal/governance/snapshot").status_code == 200
    mine = f"task-{BATCH.removeprefix('batch-')}-1"
    opened = worker.post("/internal/journal/entries", json={"entries": [
        entry("run_open", "run-mine", "summariser", run_kind="task", goal="g", task_id=mine),
        entry("task_status", "run-mine", "summariser", task_id=mine, status="running")]})
    assert opened.status_code == 201, opened.text
    assert worker.post("/internal/journal/entries", json={"entries": [
        entry("model_response", "run-mine", "summariser", role="actor", turn=1, text="hi", tool_calls=[])]}
    ).status_code == 201
    page = worker.get("/internal/journal/entries", params={"run_id": "run-mine"})
    assert page.status_code == 200 and len(page.json()["entries"]) == 3
    asked = worker.post("/internal/pending-decisions", json=pending("run-mine", mine, "summariser"))
    assert asked.status_code == 201, asked.text
    decision = asked.json()["id"]
    assert worker.get(f"/internal/pending-decisions/{decision}").status_code == 200
    listed = worker.get("/internal/pending-decisions", params={"status": "all"})
    assert [d["id"] for d in listed.json()] == [decision]  # only its batch's, never the others'
    assert worker.get("/internal/answers", params={"ids": [decision], "timeout": 0}).json() == []
    assert worker.post("/internal/journal/checkpoint").status_code == 200
    review = worker.post("/internal/agents/identity", json={"agent": "summariser", "identity": {
        **pinned, "workspace": "/tmp/worker-0/workspace"}, "keep_consents": True})  # its own workspace
    assert review.status_code == 200, review.text

    # what it does not need is refused, and changes nothing
    forbidden = [
        worker.get("/internal/journal/entries", params={"run_id": "run-other"}),  # another run
        worker.get("/internal/journal/entries", params={"since_seq": 0}),  # the whole journal
        worker.get(f"/internal/pending-decisions/{theirs['id']}"),
        worker.get("/internal/answers", params={"ids": [theirs["id"]], "timeout": 0}),
        worker.post("/internal/pending-decisions", json=pending("run-other", "task-other", "clerk")),
        worker.post("/internal/pending-decisions", json=pending("run-mine", "task-other", "summariser")),
        worker.post("/internal/journal/entries", json={"entries": [  # joining another run
            entry("tool_result", "run-other", "summariser", call_id="c", tool="t", status="ok")]}),
        worker.post("/internal/journal/entries", json={"entries": [  # taking another run's id
            entry("run_open", "run-other", "summariser", run_kind="task", goal="g", task_id=mine)]}),
        worker.post("/internal/journal/entries", json={"entries": [  # a task outside the batch
            entry("run_open", "run-x", "summariser", run_kind="task", goal="g", task_id=f"{mine[:-1]}2")]}),
        worker.post("/internal/journal/entries", json={"entries": [  # another agent
            entry("run_open", "run-y", "clerk", run_kind="task", goal="g", task_id=mine)]}),
        worker.post("/internal/journal/entries", json={"entries": [  # a governance entry
            entry("consent_granted", None, "summariser", agent="summariser", family="write", by="me")]}),
        worker.post("/internal/journal/entries", json={"entries": [  # an answer of its own
            entry("answer", "run-mine", "summariser", decision_id=decision, answer="once", answered_by="me")]}),
        worker.post("/internal/governance/consents", json={"agent": "summariser", "family": "write", "by": "w"}),
        worker.post("/internal/governance/consents/revoke", json={"agent": "clerk", "family": "write", "by": "w"}),
        worker.post("/internal/governance/rules/remove", json={"id": "rule-1", "by": "w"}),
        worker.post("/internal/worker-tokens", json={"agent": "clerk", "batch_id": BATCH, "tasks": 9}),
        worker.post("/internal/journal/verify", json={}),
        worker.get("/internal/journal/checkpoints"),
        worker.post("/pending-decisions/decide", json={"id": decision, "answer": "always", "by": "w"}),
        worker.post("/governance/rules", json={"tool": "write_file", "effect": "allow", "agent": "*"}),
        worker.put("/governance/developer-mode", json={"enabled": True, "by": "w"}),
        worker.post("/agents", json={"manifest": AGENT}),
        worker.post("/tasks", json={"agent": "summariser", "goal": "g"}),
        worker.get("/tasks"),
        worker.get("/pending-decisions"),
        worker.get("/audit/entries"),
    ]
    for agent, identity in (("clerk", pinned),  # another agent
                            ("summariser", {**pinned, "tools": ["bash_executor"]}),  # other tools
                            ("summariser", {**pinned, "model": {"provider": "openai"}})):  # another model
        forbidden.append(worker.post("/internal/agents/identity", json={"agent": agent, "identity": {
            **identity, "workspace": "/tmp"}, "keep_consents": True}))
    assert [r.status_code for r in forbidden if not refused(r)] == []
    assert owner.get(f"/internal/pending-decisions/{decision}").json()["status"] == "pending"
    assert owner.get("/governance/consents").json() == [] and owner.get("/governance/rules").json() == []
    assert owner.get("/governance/developer-mode").json()["enabled"] is False

    # every public route of the document refuses it
    document = httpx.get(url + "/openapi.json").json()
    public = [(m.upper(), p) for p, ops in document["paths"].items() for m in ops
              if not p.startswith("/api/v1/internal") and p != "/api/v1/health"]
    assert len(public) > 30
    for method, path in public:
        r = worker.request(method, path.removeprefix("/api/v1").replace("{", "x").replace("}", ""))
        assert refused(r), (method, path, r.status_code, r.text)

    # revoked, it opens nothing; the server's token is untouched
    assert owner.post("/internal/worker-tokens/revoke", json={"token": credential}).status_code == 204
    assert refused(worker.get("/internal/journal/head"))
    assert refused(worker.get("/internal/journal/entries", params={"run_id": "run-mine"}))
    assert owner.get("/internal/journal/head").status_code == 200
    owner.close()
    worker.close()


def _tokens_on_workers() -> list[str]:
    from apollia_nb.runtime import dask_engine

    return [key[2] for key in dask_engine._WORKERS]


async def test_the_items_of_a_batch_carry_its_credential_which_ends_with_the_batch(served, cluster):  # noqa: F811
    url, token = server_of(served)
    async with Runtime(served) as rt:
        await rt.register_agent(AGENT, model=item_model())
        frame = item_frame(6, every=3)  # two items write a file: they wait, answered over REST
        batch = await rt.batch("summariser", frame, goal=GOAL, concurrency=6, engine="dask", scheduler=cluster)
        credential = batch._batch.spec.token
        assert credential != token
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as api:
            with anyio.fail_after(60):
                while len(waiting := (await api.get("/pending-decisions")).json()) < 2:
                    await anyio.sleep(0.05)
            carried = {t for ts in cluster.run(_tokens_on_workers).values() for t in ts}
            assert credential in carried and token not in carried
            for decision in waiting:
                r = await api.post("/pending-decisions/decide", json={"id": decision["id"], "answer": "once"})
                assert r.status_code == 200, r.text
            with anyio.fail_after(60):
                await batch
            assert [r["result"] for r in batch.rows()] == [expected_result(n, t)
                                                           for n, t in zip(frame["n"], frame["topic"])]
            with anyio.fail_after(30):  # revoked as the batch ended
                while (await api.get("/internal/journal/head",
                                     headers={"Authorization": f"Bearer {credential}"})).status_code != 401:
                    await anyio.sleep(0.05)


# -- what cannot be pickled
class Locked:
    """A tool holding a lock, which no pickler can send; ``SEND`` lets it be sent (as a fresh one) while set."""

    __name__ = "note"
    SEND = threading.Event()

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, text: str) -> str:
        """Note a text."""
        return text

    def __reduce__(self) -> Any:
        if self.SEND.is_set():
            return (Locked, ())
        return super().__reduce__()


async def test_an_item_that_cannot_be_sent_fails_alone_and_the_driver_goes_on(served, cluster):  # noqa: F811
    async with Runtime(served) as rt:
        await rt.register_agent(AGENT, model=item_model(), tools=[ToolDef.from_function(Locked(), family="read")])
        Locked.SEND.set()
        phase = ["sending"]

        watched: list[str] = []

        def toggle(kind: str, obj: Any) -> None:  # the second item is sent while the lock cannot be pickled
            if kind != "batch" or obj.id not in watched:
                return
            c = obj.counts()
            if phase[0] == "sending" and c["running"] >= 1:
                Locked.SEND.clear()
                phase[0] = "refusing"
            elif phase[0] == "refusing" and c["failed"] >= 1:
                Locked.SEND.set()
                phase[0] = "sending again"

        rt.subscribe(toggle)
        # the runner starts sending once this coroutine gives the loop back, after the id is watched
        batch = await rt.batch("summariser", item_frame(3, every=100), goal=GOAL, concurrency=3, engine="dask",
                               scheduler=cluster)
        watched.append(batch.id)
        with anyio.fail_after(60):
            await batch
        rows = batch.rows()
        assert [r["status"] for r in rows] == ["completed", "failed", "completed"], rows
        assert rows[1]["error_code"] == "BAD_INPUT"
        assert [r["result"] for r in (rows[0], rows[2])] == [expected_result(0, "alpha"), expected_result(2, "gamma")]

        Locked.SEND.clear()  # nothing can be sent: every item fails with the code, the batch ends
        every = await rt.batch("summariser", item_frame(2, every=100), goal=GOAL, engine="dask", scheduler=cluster)
        with anyio.fail_after(60):
            await every
        assert [(r["status"], r["error_code"]) for r in every.rows()] == [("failed", "BAD_INPUT")] * 2
        message = every._batch.items[0]["error"]["message"]
        assert "cannot be sent" in message and "lock" in message

        await rt.stop_agent("summariser")  # the driver's runtime is open: it registers and runs work
        await rt.register_agent(AGENT, model=item_model())
        task = await rt.submit("summariser", GOAL.format(n=7, topic="beta", file="no"))
        with anyio.fail_after(30):
            assert (await task).status == "completed"
        Locked.SEND.set()
