"""Batches over the REST API and the SDK: created (idempotently), watched, answered, read as JSON, JSONL, CSV."""

from __future__ import annotations

import csv
import io
import json

import httpx
from runtime_helpers import call, manifest

from apollia_nb.api.server import ServerThread
from apollia_nb.errors import BadInput, UnknownBatch
from apollia_nb.sdk import Client

TOKEN = "batch-api-token"
WRITER = manifest(actor=[{"tool_calls": [call("write_file", path="out.txt", content="ok")]}, {"text": "Wrote it."}])
ITEMS = [{"id": f"doc-{i}", "path": f"notes/{i}.md"} for i in range(6)]


def _batch_events(api: httpx.Client, batch_id: str):
    with api.stream("GET", f"/batches/{batch_id}/events") as response:
        assert response.status_code == 200
        name = None
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                assert name == "batch"
                yield json.loads(line.split(":", 1)[1])


def test_a_batch_over_rest_waits_is_decided_over_rest_and_its_results_come_as_json_jsonl_and_csv(home):
    with ServerThread(home, token=TOKEN) as srv, httpx.Client(
            base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
        assert api.post("/agents", json={"manifest": WRITER}).status_code == 201
        body = {"agent": "clerk", "items": ITEMS, "goal": "Summarise {path}", "concurrency": 2, "key": "id"}
        first = api.post("/batches", json=body, headers={"Idempotency-Key": "b-1"})
        assert first.status_code == 202, first.text
        again = api.post("/batches", json=body, headers={"Idempotency-Key": "b-1"})
        assert again.json()["id"] == first.json()["id"]  # a retry does not start a second batch
        batch = first.json()
        assert first.headers["Location"] == f"/api/v1/batches/{batch['id']}" and batch["total"] == 6
        for seen in _batch_events(api, batch["id"]):
            if seen["counts"]["waiting"] == 6:
                break
        assert len(api.get("/batches").json()) == 1
        pending = api.get("/pending-decisions").json()
        assert len(pending) == 6 and {p["tool"] for p in pending} == {"write_file"}
        for p in pending:
            assert api.post("/pending-decisions/decide", json={"id": p["id"], "answer": "once"}).status_code == 200
        final = list(_batch_events(api, batch["id"]))[-1]
        assert final["status"] == "completed" and final["counts"]["completed"] == 6

        rows = api.get(f"/batches/{batch['id']}/results").json()
        assert [r["key"] for r in rows] == [i["id"] for i in ITEMS]
        assert [r["goal"] for r in rows] == [f"Summarise {i['path']}" for i in ITEMS]
        assert {r["result"] for r in rows} == {"Wrote it."}
        lines = api.get(f"/batches/{batch['id']}/results", params={"format": "jsonl"}).text.splitlines()
        assert [json.loads(line) for line in lines] == rows
        table = list(csv.DictReader(io.StringIO(api.get(f"/batches/{batch['id']}/results",
                                                        params={"format": "csv"}).text)))
        assert [r["key"] for r in table] == [i["id"] for i in ITEMS] and table[0]["status"] == "completed"
        assert api.get("/audit/verify").json()["ok"] is True

        cancel = api.post(f"/batches/{batch['id']}/cancel")
        assert cancel.status_code == 409 and cancel.json()["code"] == "INVALID_TRANSITION"
        missing = api.get("/batches/batch-nope")
        assert missing.status_code == 404 and missing.json()["code"] == "UNKNOWN_BATCH"
        bad = api.post("/batches", json={**body, "goal": "Summarise {colour}"})
        assert bad.status_code == 422 and bad.json()["code"] == "BAD_INPUT" and "colour" in bad.json()["message"]
        assert api.post("/batches", json={**body, "concurrency": 0}).status_code == 422
        assert len(api.get("/batches").json()) == 1  # nothing recorded by the refused ones


def test_the_sdk_runs_a_batch_over_a_dataframe_and_cancels_one(home):
    import pandas as pd

    with ServerThread(home, token=TOKEN) as srv, Client(srv.url, TOKEN) as client:
        client.register_agent(manifest())
        frame = pd.DataFrame({"path": ["a.md", "b.md", "c.md"]})
        batch = client.batch("clerk", frame, "Summarise {path}", concurrency=3)
        for event in client.batch_events(batch.id):
            last = event.data
        assert last["status"] == "completed"
        rows = client.batch_results(batch.id)
        assert [r.goal for r in rows] == ["Summarise a.md", "Summarise b.md", "Summarise c.md"]
        assert [r.status for r in rows] == ["completed"] * 3 and client.get_batch(batch.id).counts.completed == 3

        client.register_agent(WRITER.replace('name = "clerk"', 'name = "writer"'))
        waiting = client.batch("writer", [{"n": 1}, {"n": 2}], "Write {n}")
        for event in client.batch_events(waiting.id):
            if event.data["counts"]["waiting"] == 2:
                break
        cancelled = client.cancel_batch(waiting.id)
        assert cancelled.status == "cancelled" and cancelled.counts.cancelled == 2
        assert client.pending() == []
        try:
            client.get_batch("batch-missing")
        except UnknownBatch:
            pass
        else:
            raise AssertionError("UNKNOWN_BATCH expected")
        try:
            client.batch("clerk", [{"x": 1}], "Use {y}")
        except BadInput as exc:
            assert "'y'" in exc.message
        else:
            raise AssertionError("BAD_INPUT expected")
