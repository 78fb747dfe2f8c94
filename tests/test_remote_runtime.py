"""Client mode in one process: runtimes that find a ``ServerThread`` owning their home become its clients.

The server is real (uvicorn on an ephemeral port, the home's journal and
governance); the clients are real runtimes on the test's event loop. What is
checked: one journal chain for everyone, governance changes seen at once,
answers given anywhere reaching the run that waits, failing closed without
the server, and ``HOME_LOCKED`` when nobody serves the home.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import anyio
import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.errors import BadAnswer, BadInput, Conflict, HomeLocked, ServerNotRunning, UnknownDecision
from apollia_nb.governance.decision import Call, Family, decide
from apollia_nb.home import OwnerLock
from apollia_nb.runtime import Runtime
from apollia_nb.sdk import Client
from runtime_helpers import call, manifest

pytestmark = pytest.mark.anyio

TOKEN = "remote-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def writer(name: str = "clerk", path: str = "out.txt") -> str:
    return manifest(name, actor=[{"tool_calls": [call("write_file", path=path, content="hi")]},
                                 {"text": "Wrote it."}])


@pytest.fixture
def server(home):
    with ServerThread(home, token=TOKEN) as srv:
        yield srv


@pytest.fixture
def api(server):
    with Client(server.url, TOKEN) as client:
        yield client


def decisions(rt: Runtime, run_id: str) -> list[dict]:
    return [e.data() for e in rt.journal.entries(run_id=run_id, kinds=["decision"])]


async def test_clients_run_their_agents_here_and_journal_into_the_servers_one_chain(home, server, api):
    async with Runtime(home) as a, Runtime(home) as b:
        assert (a.mode, b.mode) == ("client", "client")
        for rt, path in ((a, "a.txt"), (b, "b.txt")):
            await rt.register_agent(writer(path=path))
        api.register_agent(writer("served", "s.txt"))
        served = api.submit("served", "Write s.txt")
        ha, hb = await a.submit("clerk", "Write a.txt"), await b.submit("clerk", "Write b.txt")
        for handle in (ha, hb):
            await handle.settled()
            [card] = handle.pending
            card.answer("once")
        with anyio.fail_after(20):
            await ha
            await hb
        assert (ha.status, hb.status) == ("completed", "completed")
        assert api.wait(served.id).status == "waiting"

        # Each client's task lives in its own process; the server knows only its own.
        assert [t.id for t in api.tasks()] == [served.id]
        assert len(a.tasks()) == len(b.tasks()) == 1
        # One chain: every run's entries are in the server's journal, which verifies.
        for handle in (ha, hb):
            kinds = [e["kind"] for e in api.entries(run_id=handle.run_id, limit=1000).model_dump()["entries"]]
            assert kinds[0] == "run_open" and kinds[-1] == "run_seal" and "answer" in kinds
        assert api.verify().ok
        assert a.verify().ok  # from the client's own copy, under the home's public key
        rows = a.journal.sql("SELECT run_id, status FROM runs WHERE run_id IN (?, ?) ORDER BY run_id",
                             sorted([ha.run_id, hb.run_id]))
        assert [status for _, status in rows] == ["completed", "completed"]
        assert a.replay(hb.run_id).verdict == "identical"
    assert (home.path / "server.json").exists()


async def test_sql_in_a_client_runs_where_the_journal_is_stored_and_reads_no_file(home, server, tmp_path):
    from apollia_nb.notebook.sql import run_query

    async with Runtime(home) as client:
        assert client.mode == "client"
        client.journal.append("plan", {"steps": ["look"]}, run_id="r-sql")
        counted = run_query(client.journal, "SELECT count(*) FROM journal WHERE run_id = 'r-sql'", want_frame=False)
        assert counted.rows == [(1,)]
        for query in ("SELECT * FROM read_text('/etc/passwd')", f"SELECT * FROM glob('{home.path}/keys/*')",
                      f"SELECT * FROM read_blob('{home.path}/keys/journal.key')"):
            with pytest.raises(BadInput) as info:
                run_query(client.journal, query)
            assert "only the journal's tables and views can be read" in info.value.message
        with pytest.raises(BadInput, match="COPY statements are refused"):
            client.journal.sql(f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'")
        assert not (tmp_path / "x.csv").exists()


async def test_a_consent_granted_in_one_client_applies_in_another_at_once(home, server, api):
    async with Runtime(home) as a, Runtime(home) as b:
        await a.register_agent(writer(path="a.txt"))
        await b.register_agent(writer(path="b.txt"))
        first = await a.submit("clerk", "Write a.txt")
        await first.settled()
        first.pending[0].answer("always", by="alice")
        with anyio.fail_after(20):
            await first
        second = await b.submit("clerk", "Write b.txt")
        with anyio.fail_after(20):
            await second
        assert second.status == "completed" and not second.pending
        [decided] = decisions(b, second.run_id)
        assert (decided["outcome"], decided["line"]) == ("allow", 5)
        assert [c.to_dict()["granted_by"] for c in b.governance.consents()] == ["alice"]

        api.revoke_consent("clerk", "write")
        view = b.governance.view()  # no waiting, no refresh: the next view has it
        assert ("clerk", Family.WRITE) not in view.consents
        assert decide(Call(agent="clerk", tool="write_file", family=Family.WRITE), view).outcome.value == "ask"


async def test_the_snapshot_answers_304_while_nothing_changed(home, server, api):
    with httpx.Client(base_url=server.url + "/api/v1", headers=AUTH) as http:
        first = http.get("/internal/governance/snapshot")
        assert first.status_code == 200
        etag = first.headers["ETag"]
        assert etag == f'"{first.json()["generation"]}"'
        unchanged = http.get("/internal/governance/snapshot", headers={"If-None-Match": etag})
        assert (unchanged.status_code, unchanged.content) == (304, b"")
        api.set_developer_mode(True)
        changed = http.get("/internal/governance/snapshot", headers={"If-None-Match": etag})
        assert changed.status_code == 200 and changed.json()["developer_mode"] is True
        assert changed.headers["ETag"] != etag
        assert http.get("/internal/governance/snapshot", headers={}).status_code == 200
    async with Runtime(home) as rt:
        view = rt.governance.view()
        assert rt.governance.view() is view  # held while the server says 304
        assert view.developer_mode and rt.governance.developer_mode_state().enabled
        rt.governance.set_developer_mode(False, by="bob")
        assert rt.governance.view().developer_mode is False
        assert rt.governance.policy_state().status == "none"


async def test_an_answer_given_elsewhere_resumes_the_clients_run(home, server, api):
    async with Runtime(home) as rt:
        await rt.register_agent(writer())
        await rt.register_agent(writer("scribe", "other.txt"))  # each agent has its own scripted model
        unattended = await rt.submit("clerk", "Write out.txt", watched=False)
        watched = await rt.submit("scribe", "Write other.txt")
        for handle in (unattended, watched):
            await handle.settled()
            assert handle.status == "waiting"
        by_task = {p.task_id: p for p in api.pending()}
        assert set(by_task) == {unattended.id, watched.id}
        api.decide(by_task[unattended.id].id, "once", by="carol")
        api.decide(by_task[watched.id].id, "refuse", by="carol")
        with anyio.fail_after(20):
            await unattended
            await watched
        assert unattended.status == "completed"
        assert watched.status == "failed" and watched.error["code"] == "REFUSED"
        answers = [e.data() for e in rt.journal.entries(run_id=unattended.run_id, kinds=["answer"])]
        assert [(x["answer"], x["answered_by"]) for x in answers] == [("once", "carol")]
        assert api.pending() == []


async def test_answers_are_recorded_once_by_the_server(home, server, api):
    api.register_agent(writer("served", "s.txt"))
    served = api.submit("served", "Write s.txt")
    assert api.wait(served.id).status == "waiting"
    async with Runtime(home) as rt:
        await rt.register_agent(writer())
        mine = await rt.submit("clerk", "Write out.txt")
        await mine.settled()
        [card] = mine.pending
        with pytest.raises(BadAnswer):
            card.answer("sometimes")
        with pytest.raises(UnknownDecision):
            rt.answer("pd-nobody", "once")
        card.answer("once")
        with pytest.raises(Conflict):
            rt.answer(card.id, "refuse")
        with anyio.fail_after(20):
            await mine
        assert mine.status == "completed"
        # A decision of the server's own run, answered from the client: the server's run resumes.
        [theirs] = [p for p in rt.pending_decisions() if p["task_id"] == served.id]
        assert rt.answer(theirs["id"], "once", by="dave")["status"] == "answered"
        assert api.wait(served.id, until="finished").status == "completed"
    answers = [e for e in api.entries(limit=1000).model_dump()["entries"] if e["kind"] == "answer"]
    assert sorted(e["payload"]["answered_by"] for e in answers) == ["dave", "user"]


async def test_without_the_server_governance_fails_closed_and_nothing_is_journaled(home):
    srv = ServerThread(home, token=TOKEN).start()
    try:
        rt = await Runtime.open(home)
        await rt.register_agent(writer())
        assert rt.governance.view().readable
    finally:
        srv.stop()
    try:
        view = rt.governance.view()
        assert view.readable is False and "did not answer" in view.unreadable_reason
        assert decide(Call(agent="clerk", tool="write_file", family=Family.WRITE), view).outcome.value == "refuse"
        assert decide(Call(agent="clerk", tool="read_file", family=Family.READ), view).outcome.value == "allow"
        with pytest.raises(ServerNotRunning, match="nothing was sent.*the server is not running"):
            rt.journal.append("note", {"x": 1})
    finally:
        await rt.aclose()
    # Now the home is free: a runtime owns it again, and the chain verifies.
    async with Runtime(home) as owner:
        assert owner.mode == "owner"
        assert owner.verify().ok
        assert not owner.journal.entries(kinds=["note"])


async def test_a_closing_client_cancels_its_suspended_runs(home, server, api):
    rt = await Runtime.open(home)
    await rt.register_agent(writer())
    handle = await rt.submit("clerk", "Write out.txt", watched=False)
    await handle.settled()
    [pending] = api.pending()
    await rt.aclose()
    assert api.pending() == []
    kinds = [(e["kind"], e["payload"]) for e in api.entries(run_id=handle.run_id, limit=100).model_dump()["entries"]]
    assert ("answer", {"call_id": pending.call_id, "decision_id": pending.id, "answer": "refuse",
                       "answered_by": "cancel", "reason": "the task was cancelled",
                       "by_role": "admin", "auth": "owner", "digest": pending.digest}) in kinds  # sent by the client with the owner's token
    assert kinds[-1][0] == "run_seal" and kinds[-1][1]["status"] == "cancelled"
    assert api.verify().ok


async def test_a_home_owned_and_not_served_is_home_locked(home):
    holder = OwnerLock(home).acquire()
    try:
        with pytest.raises(HomeLocked) as plain:
            async with Runtime(home):
                pass
        assert f"process {os.getpid()}" in plain.value.message and "apollia-os serve" in plain.value.message

        # A server.json nobody answers for (the port is closed): named, and still HOME_LOCKED.
        dead = "http://127.0.0.1:9"
        home.server_json.write_text(json.dumps({"url": dead, "token": "x", "pid": os.getpid()}))
        with pytest.raises(HomeLocked) as stale:
            async with Runtime(home):
                pass
        assert dead in stale.value.message and "does not answer" in stale.value.message
        assert f"process {os.getpid()}" in stale.value.message and "apollia-os serve" in stale.value.message

        # Advertised by a process that is not the holder: not trusted either.
        home.server_json.write_text(json.dumps({"url": dead, "token": "x", "pid": 1}))
        with pytest.raises(HomeLocked, match="does not answer"):
            async with Runtime(home):
                pass
    finally:
        holder.release()
        home.server_json.unlink(missing_ok=True)


async def test_internal_routes_need_the_token_and_refuse_bad_input(home, server):
    url = server.url + "/api/v1/internal"
    assert httpx.get(url + "/journal/head").status_code == 401
    with httpx.Client(base_url=url, headers=AUTH) as http:
        bad = http.post("/journal/entries", json={"entries": [{"kind": "Bad Kind", "payload": {}}]})
        assert bad.status_code == 422 and bad.json()["code"] == "BAD_INPUT"
        assert http.post("/journal/entries", json={"entries": []}).status_code == 422
        assert http.post("/journal/entries", json={"entries": [{"kind": "note", "payload": [1]}]}).status_code == 422
        head = http.get("/journal/head").json()
        added = http.post("/journal/entries", json={"entries": [
            {"kind": "note", "payload": {"b": 2, "a": "é"}, "run_id": "r1", "agent": "x"},
            {"kind": "note", "payload": {"n": 1.5}, "run_id": "r1"},
        ]})
        assert added.status_code == 201
        rows = added.json()["entries"]
        assert [r["seq"] for r in rows] == [head["seq"] + 1, head["seq"] + 2]
        assert rows[0]["payload"] == '{"a":"é","b":2}' and rows[0]["prev_hash"] == head["hash"]
        page = http.get("/journal/entries", params={"run_id": "r1", "limit": 1}).json()
        assert page["entries"] == rows[:1] and page["next_since_seq"] == rows[0]["seq"]
        rest = http.get("/journal/entries", params={"run_id": "r1", "since_seq": page["next_since_seq"]}).json()
        assert rest == {"entries": rows[1:], "next_since_seq": None}
        assert http.get("/answers", params={"ids": "pd-nobody"}).json()["code"] == "UNKNOWN_DECISION"
        pending = http.post("/pending-decisions", json={
            "run_id": "r1", "agent": "x", "tool": "write_file", "family": "write", "arguments": {"path": "p"},
            "answers": ["once", "once"]})
        assert pending.status_code == 422
        consent = http.post("/governance/consents", json={"agent": "x", "family": "execute", "by": "me"})
        assert consent.status_code == 422


async def test_a_long_poll_answers_with_the_decision_once_it_is_answered(home, server, api):
    with httpx.Client(base_url=server.url + "/api/v1/internal", headers=AUTH) as http:
        made = http.post("/pending-decisions", json={
            "run_id": "r1", "agent": "x", "tool": "write_file", "family": "write", "arguments": {"path": "p"},
            "answers": ["once", "refuse"], "line": 6}).json()
        assert http.get("/answers", params={"ids": made["id"], "timeout": 0}).json() == []
        async with anyio.create_task_group() as tg:
            got: list = []

            async def wait() -> None:
                async with httpx.AsyncClient(base_url=server.url + "/api/v1/internal", headers=AUTH) as ahttp:
                    got.append((await ahttp.get("/answers", params={"ids": made["id"], "timeout": 30})).json())

            tg.start_soon(wait)  # open or not yet when the answer comes: either way it answers with it
            await anyio.to_thread.run_sync(lambda: api.decide(made["id"], "refuse", by="erin"))
        [[answered]] = got
        assert (answered["id"], answered["answer"], answered["answered_by"]) == (made["id"], "refuse", "erin")


async def test_view_latency_in_client_mode(home, server):
    async with Runtime(home) as rt:
        rt.governance.view()
        samples = []
        for _ in range(200):
            started = time.perf_counter()
            rt.governance.view()
            samples.append(time.perf_counter() - started)
        median_ms = statistics.median(samples) * 1000
        print(f"client view(): median {median_ms:.2f} ms, p90 {sorted(samples)[179] * 1000:.2f} ms")
        assert median_ms < 20


async def test_a_client_runtime_is_not_served_again(home, server):
    from apollia_nb.api.app import create_app

    async with Runtime(home) as rt:
        with pytest.raises(HomeLocked) as twice:
            create_app(rt, token="another")
    assert f"process {os.getpid()}" in twice.value.message and server.url in twice.value.message


async def test_a_conversation_in_a_client_waits_for_an_answer_given_over_the_api(home, server, api):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[{"tool_calls": [call("write_file", path="a", content="b")]},
                                                {"text": "written"}]))
        session = rt.sessions.open("clerk")
        exchange = session.send("write a")
        with anyio.fail_after(20):
            async for event in exchange.stream():
                if event["type"] == "card":
                    [pending] = await anyio.to_thread.run_sync(api.pending)
                    assert pending.id == event["card"]["id"] and pending.task_id == session.id
                    await anyio.to_thread.run_sync(lambda: api.decide(pending.id, "once", by="frank"))
        assert exchange.reply == "written"
        assert (rt.agent("clerk").workspace / "a").read_text() == "b"
        await session.close()
        kinds = [e.kind for e in rt.journal.entries(run_id=session.r["run_id"])]
        assert kinds[0] == "run_open" and kinds[-1] == "run_seal" and "answer" in kinds


async def test_a_server_of_another_journal_is_not_joined(home, server, tmp_path):
    from apollia_nb.home import Home
    from apollia_nb.journal.store import Journal

    other = Home.at(tmp_path / "other")
    Journal.open(other).close()  # its own key
    holder = OwnerLock(other).acquire()
    try:
        other.server_json.write_text(json.dumps({"url": server.url, "token": TOKEN, "pid": os.getpid()}))
        with pytest.raises(HomeLocked, match="signs its journal with another key"):
            async with Runtime(other):
                pass
    finally:
        holder.release()
