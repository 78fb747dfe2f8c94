"""A client of a served home pays one request per governed call: the server decides the call on its own
snapshot and journals it (``POST /internal/calls``); the previous call's result rides on the next request.

Against a real server (uvicorn on 127.0.0.1, the home's journal and governance) and real client runtimes:
the requests a call costs are counted on the client's connection; a retried request (its answer dropped
on the way back) journals once; the client cannot decide for itself (a stale snapshot, a built-in tool
claimed to be of another family); a worker credential still reaches only its batch.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any

import anyio
import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.runtime import Runtime
from apollia_nb.sdk import Client
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio

TOKEN = "served-calls-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CALLS = "/api/v1/internal/calls"


def lister(name: str = "reader", n: int = 4) -> str:
    return manifest(name, actor=[{"tool_calls": [call("list_dir", path=".") for _ in range(n)]}, {"text": "ok"}],
                    max_steps=4 * n + 10)


@pytest.fixture
def server(home):
    with ServerThread(home, token=TOKEN) as srv:
        yield srv


@pytest.fixture
def api(server):
    with Client(server.url, TOKEN) as client:
        yield client


def count_requests(rt: Runtime) -> collections.Counter:
    counts: collections.Counter = collections.Counter()

    def seen(request: httpx.Request) -> None:
        counts[(request.method, request.url.path.removeprefix("/api/v1"))] += 1

    rt._remote.http.event_hooks["request"].append(seen)
    posts = rt._remote.posts  # a call's request: on the standard library's HTTP
    post = posts.post

    def counted(path: str, body: Any) -> Any:
        counts[("POST", path.removeprefix("/api/v1"))] += 1
        return post(path, body)

    posts.post = counted
    loop_posts = rt._remote.loop_posts  # ... and on the event loop
    loop_post = loop_posts.post

    async def counted_on_loop(path: str, body: Any) -> Any:
        counts[("POST", path.removeprefix("/api/v1"))] += 1
        return await loop_post(path, body)

    loop_posts.post = counted_on_loop
    return counts


def payload(row: dict[str, Any]) -> dict[str, Any]:
    return row["payload"] if isinstance(row["payload"], dict) else json.loads(row["payload"])


def kinds(api: Client, run_id: str) -> list[tuple[str, Any]]:
    rows = api.entries(run_id=run_id, limit=1000).model_dump()["entries"]
    return [(r["kind"], payload(r).get("call_id")) for r in rows]


async def run_task(rt: Runtime, agent: str) -> Any:
    handle = await rt.submit(agent, "list the folder")
    with anyio.fail_after(60):
        await handle
    return handle


@pytest.fixture
def no_lone_results(monkeypatch):
    """A handed-over result waits for the next request of its run however slow the machine (it is sent
    alone after ``SOON_SECS`` otherwise): what a call costs is then counted without timing."""
    from apollia_nb.runtime import remote

    monkeypatch.setattr(remote, "SOON_SECS", 60.0)


async def test_a_governed_call_from_a_client_costs_one_request(home, server, api, no_lone_results):
    async with Runtime(home) as rt:
        assert rt.mode == "client"
        await rt.register_agent(lister("few", 2))
        await rt.register_agent(lister("many", 10))
        await run_task(rt, "few")  # the snapshot is held from here on
        counts = count_requests(rt)
        few = await run_task(rt, "few")
        at_few = sum(counts.values())
        counts.clear()
        many = await run_task(rt, "many")
        at_many = sum(counts.values())
        assert (few.status, many.status) == ("completed", "completed")
        # eight more calls, eight more requests: each one a call request, nothing else per call
        assert at_many - at_few == 8, counts
        assert counts[("POST", "/internal/calls")] == 10
        assert counts[("GET", "/internal/governance/snapshot")] == 0
        # every call journaled in order: decision, tool_call, then its result before anything later of the run
        trail = [k for k in kinds(api, many.run_id) if k[0] in ("decision", "tool_call", "tool_result")]
        assert len(trail) == 30
        for i in range(0, 30, 3):
            (d, c1), (t, c2), (r, c3) = trail[i:i + 3]
            assert (d, t, r) == ("decision", "tool_call", "tool_result") and c1 == c2 == c3
    assert api.verify().ok


async def test_a_refused_call_costs_one_request_and_its_result_is_journaled_by_the_server(home, server, api,
                                                                                          no_lone_results):
    api.add_rule("list_dir", "deny", agent="*")
    async with Runtime(home) as rt:
        await rt.register_agent(lister("reader", 1))
        await run_task(rt, "reader")
        counts = count_requests(rt)
        appended: list[str] = []
        rt._remote.http.event_hooks["request"].append(
            lambda r: appended.extend(e["kind"] for e in json.loads(r.read())["entries"])
            if r.url.path.endswith("/internal/journal/entries") and r.method == "POST" else None)
        handle = await run_task(rt, "reader")
        assert counts[("POST", "/internal/calls")] == 1 and counts[("GET", "/internal/governance/snapshot")] == 0
        assert not {"decision", "tool_call", "tool_result"} & set(appended)  # all of the call in its one request
        rows = [payload(r) | {"kind": r["kind"]}
                for r in api.entries(run_id=handle.run_id, limit=1000).model_dump()["entries"]]
        decided = [r for r in rows if r["kind"] == "decision"]
        assert [(d["outcome"], d["line"]) for d in decided] == [("refuse", 2)]
        results = [r for r in rows if r["kind"] == "tool_result"]
        assert [r["status"] for r in results] == ["refused"]
        assert not [r for r in rows if r["kind"] == "tool_call"]


async def test_the_server_decides_on_its_own_snapshot_not_the_one_the_client_holds(home, server, api):
    async with Runtime(home) as rt:
        await rt.register_agent(lister("reader", 1))
        first = await run_task(rt, "reader")
        held = rt.governance.generation()
        api.add_rule("list_dir", "deny", agent="reader")  # after the client took its snapshot
        assert rt.governance.generation() == held  # nothing asked since: the client still holds the old one
        second = await run_task(rt, "reader")
        decided = [payload(r) for r in api.entries(run_id=second.run_id, limit=100).model_dump()[
            "entries"] if r["kind"] == "decision"]
        assert [(d["outcome"], d["line"]) for d in decided] == [("refuse", 2)]
        assert rt.governance.generation() != held  # the call's answer brought the new snapshot
        assert first.status == "completed"


def call_body(run_id: str, call_id: str = "call-1", **changes: Any) -> dict[str, Any]:
    body = {"call_id": call_id, "run_id": run_id, "agent": "clerk", "tool": "write_file", "family": "write",
            "arguments": {"path": "x.txt", "content": "x"}, "paths": ["x.txt", "/tmp/w/x.txt"], "shell": False,
            "decision": {"call_id": call_id, "tool": "write_file", "family": "write",
                         "arguments": {"path": "x.txt", "content": "x"}, "connection": None, "path": "x.txt"},
            "before": [{"kind": "model_response", "run_id": run_id, "agent": "clerk",
                        "payload": {"role": "actor", "turn": 1, "text": "", "tool_calls": []}}]}
    return {**body, **changes}


async def test_a_retried_call_request_is_answered_as_the_first_and_journals_once(home, server, api):
    http = httpx.Client(base_url=server.url, headers=AUTH, timeout=30)
    first = http.post(CALLS, json=call_body("run-retry"))
    assert first.status_code == 200, first.text
    again = http.post(CALLS, json=call_body("run-retry"))
    assert again.status_code == 200 and again.json()["entries"] == first.json()["entries"]
    other = http.post(CALLS, json=call_body("run-retry", arguments={"path": "y.txt", "content": "y"}))
    assert other.status_code == 409 and other.json()["code"] == "CONFLICT"
    journaled = [k for k in kinds(api, "run-retry")]
    assert journaled == [("model_response", None), ("decision", "call-1")]  # asked: nothing more, once
    assert first.json()["decision"]["outcome"] == "ask"


class DropFirstAnswer:
    """Sends each call request (from a worker thread or on the event loop); the answer of the first is lost
    on the way back (the connection reset)."""

    def __init__(self, posts: Any, loop_posts: Any) -> None:
        self.post, self.loop_post = posts.post, loop_posts.post
        self.dropped = 0
        posts.post, loop_posts.post = self.send, self.send_on_loop

    def lost(self, path: str) -> None:
        if path.endswith("/internal/calls") and not self.dropped:
            self.dropped += 1
            raise ConnectionResetError("connection reset before the answer was read")

    def send(self, path: str, body: Any) -> Any:
        answer = self.post(path, body)
        self.lost(path)
        return answer

    async def send_on_loop(self, path: str, body: Any) -> Any:
        answer = await self.loop_post(path, body)
        self.lost(path)
        return answer


async def test_a_clients_call_requests_are_sent_from_its_event_loop_without_a_thread(home, server, api,
                                                                                    no_lone_results):
    """A run's call request goes out on the runtime's own event loop (no hand-off to a worker thread and
    back) while no other request of the run is under way; each is answered, decided and journaled once."""
    async with Runtime(home) as rt:
        await rt.register_agent(lister("reader", 6))
        loop_thread = threading.get_ident()
        threads: list[int] = []
        loop_posts = rt._remote.loop_posts
        post = loop_posts.post

        async def seen(path: str, body: Any) -> Any:
            threads.append(threading.get_ident())
            return await post(path, body)

        loop_posts.post = seen
        handle = await run_task(rt, "reader")
        assert handle.status == "completed"
        assert threads == [loop_thread] * 6
        trail = [k for k in kinds(api, handle.run_id) if k[0] in ("decision", "tool_call", "tool_result")]
        assert len(trail) == 18 and len({c for _, c in trail}) == 6
    assert api.verify().ok


async def test_a_call_request_under_way_on_the_loop_is_read_to_its_answer_when_its_task_is_cancelled(
        home, server, api, no_lone_results):
    """Cancelled while its call request is on the wire, the task ends cancelled after the request's answer
    is read: the call the server journaled is the run's, in order, and the journal verifies."""
    async with Runtime(home) as rt:
        await rt.register_agent(lister("reader", 3))
        loop_posts = rt._remote.loop_posts
        post = loop_posts.post
        sent, go, answered = anyio.Event(), anyio.Event(), []

        async def held(path: str, body: Any) -> Any:
            sent.set()
            with anyio.fail_after(60):
                await go.wait()  # the task is cancelled meanwhile
            answer = await post(path, body)
            answered.append(answer[0])
            return answer

        loop_posts.post = held
        handle = await rt.submit("reader", "list the folder")
        with anyio.fail_after(60):
            await sent.wait()
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.cancel, handle.id)  # it waits for the task to end
            with anyio.fail_after(60):
                while not handle._run.scope.cancel_called:  # the cancel has reached the task's scope
                    await anyio.sleep(0)
            go.set()
        with anyio.fail_after(60):
            await handle
        assert handle.status == "cancelled" and answered == [200]
        trail = [k for k in kinds(api, handle.run_id) if k[0] in ("decision", "tool_call", "tool_result")]
        assert trail[:2] == [("decision", trail[0][1]), ("tool_call", trail[0][1])]
    assert api.verify().ok


def _switches(native_id: int) -> int:
    """How many times a thread of this process gave up its core to wait (``/proc``)."""
    status = open(f"/proc/self/task/{native_id}/status").read()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


async def test_a_handed_over_result_does_not_wake_the_flusher_on_every_call(home, server, no_lone_results):
    """Each call's result is handed over to ride on the run's next request; the thread that would send it
    alone after ``SOON_SECS`` is woken when it waits for a first entry, not again for every one."""
    async with Runtime(home) as rt:
        await rt.register_agent(lister("reader", 12))
        await run_task(rt, "reader")  # the flusher is started and waits out its SOON_SECS
        flusher = rt.journal._flusher
        assert flusher is not None and flusher.native_id is not None
        before = _switches(flusher.native_id)
        handle = await run_task(rt, "reader")
        woke = _switches(flusher.native_id) - before
        assert handle.status == "completed"
        assert woke <= 2, woke  # twelve results handed over


async def test_a_call_whose_answer_was_lost_is_sent_again_and_journaled_once(home, server, api):
    async with Runtime(home) as rt:
        transport = DropFirstAnswer(rt._remote.posts, rt._remote.loop_posts)
        await rt.register_agent(lister("reader", 3))
        handle = await run_task(rt, "reader")
        assert handle.status == "completed" and transport.dropped == 1
        trail = [k for k in kinds(api, handle.run_id) if k[0] in ("decision", "tool_call", "tool_result")]
        assert len(trail) == 9 and len({c for _, c in trail}) == 3  # three calls, each journaled once
    assert api.verify().ok


async def test_a_client_cannot_call_a_built_in_tool_by_another_family_or_as_shell_text(home, server):
    http = httpx.Client(base_url=server.url, headers=AUTH, timeout=30)
    lying = [call_body("run-lie", tool="write_file", family="read"),
             call_body("run-lie", tool="python_executor", family="execute", shell=True,
                       arguments={"code": "git status"}),
             call_body("run-lie", tool="bash_executor", family="execute", shell=False,
                       arguments={"command": "ls"})]
    for body in lying:
        answer = http.post(CALLS, json=body)
        assert answer.status_code == 422 and answer.json()["code"] == "BAD_INPUT", answer.text
    head = http.get("/api/v1/internal/journal/entries", params={"run_id": "run-lie"}).json()
    assert head["entries"] == []


async def test_a_worker_credential_has_only_its_batchs_calls_decided(home, server):
    owner = httpx.Client(base_url=server.url + "/api/v1", headers=AUTH, timeout=30)
    batch = "batch-00aa11bb22cc"
    issued = owner.post("/internal/worker-tokens", json={"agent": "clerk", "batch_id": batch, "tasks": 1})
    worker = httpx.Client(base_url=server.url + "/api/v1",
                          headers={"Authorization": f"Bearer {issued.json()['token']}"}, timeout=30)
    mine = f"task-{batch.removeprefix('batch-')}-0"
    opened = worker.post("/internal/journal/entries", json={"entries": [
        {"kind": "run_open", "run_id": "run-w", "agent": "clerk",
         "payload": {"run_kind": "task", "goal": "g", "task_id": mine}}]})
    assert opened.status_code == 201, opened.text
    assert owner.post("/internal/journal/entries", json={"entries": [
        {"kind": "run_open", "run_id": "run-other", "agent": "clerk",
         "payload": {"run_kind": "task", "goal": "g", "task_id": "task-other"}}]}).status_code == 201

    assert worker.post("/internal/calls", json=call_body("run-w")).status_code == 200
    refused = [
        worker.post("/internal/calls", json=call_body("run-other", "call-2")),  # a run it did not open
        worker.post("/internal/calls", json=call_body("run-w", "call-3", agent="other")),  # another agent
        worker.post("/internal/calls", json=call_body("run-w", "call-4", before=[  # a decision of its own
            {"kind": "decision", "run_id": "run-w", "agent": "clerk",
             "payload": {"call_id": "call-9", "outcome": "allow"}}])),
        worker.post("/internal/calls", json=call_body("run-w", "call-5", before=[  # into another run
            {"kind": "model_response", "run_id": "run-other", "agent": "clerk", "payload": {"text": ""}}])),
    ]
    for answer in refused:
        assert answer.status_code == 401 and answer.json()["code"] == "UNAUTHORIZED", answer.text
    assert [k for k, _ in kinds_of(owner, "run-other")] == ["run_open"]
    assert [k for k, _ in kinds_of(owner, "run-w")] == ["run_open", "model_response", "decision"]


def kinds_of(http: httpx.Client, run_id: str) -> list[tuple[str, Any]]:
    rows = http.get("/internal/journal/entries", params={"run_id": run_id}).json()["entries"]
    return [(r["kind"], json.loads(r["payload"]).get("call_id")) for r in rows]


async def test_a_handed_over_result_is_committed_before_any_read_and_alone_when_nothing_follows(home, server):
    async with Runtime(home) as rt:
        counts = count_requests(rt)
        future = rt.journal.append_soon("plan", {"steps": ["look"]}, run_id="run-soon", agent="clerk")
        assert not counts  # handed over: nothing sent yet, the caller goes on at once
        assert [e.kind for e in rt.journal.entries(run_id="run-soon")] == ["plan"]  # the read sent it first
        assert future.result(timeout=5)[0].kind == "plan"
        later = rt.journal.append_soon("plan", {"steps": ["again"]}, run_id="run-soon", agent="clerk")
        assert later.result(timeout=5)[0].seq > future.result()[0].seq  # sent alone, soon
