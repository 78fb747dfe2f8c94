"""The shapes of the REST API's batches (pydantic), and the requests for them (``Routes``, ``batch_request``):
the SDK and a served home's client both send them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from apollia_nb.wire import schemas as s
from apollia_nb.wire.http import Req as _Req
from apollia_nb.wire.http import post as _post
from apollia_nb.wire.http import q as _q

__all__ = ["BatchCounts", "BatchIn", "BatchOut", "BatchRow", "Routes", "batch_request", "items_list"]


class BatchIn(s._In):
    agent: s.NonEmpty
    items: list[dict[str, Any]] = Field(max_length=100_000, description="the items: JSON objects")
    goal: s.Text = Field(description="a template filled from each item's fields, e.g. `Summarise {path}`")
    concurrency: int = Field(4, ge=1, le=1000, description="items pending or running at once at most")
    max_steps: int | None = Field(None, ge=1, le=1_000_000, description="each item's step ceiling")
    key: str | None = Field(None, min_length=1, max_length=200,
                            description="the field that keys each item (default: its position)")


class BatchCounts(s._Out):
    pending: int
    running: int
    waiting: int
    completed: int
    failed: int
    cancelled: int


class BatchOut(s._Out):
    id: str
    agent: str
    status: Literal["running", "completed", "cancelled"]
    goal: str
    concurrency: int
    max_steps: int | None
    total: int
    counts: BatchCounts
    created_at: str
    updated_at: str


class BatchRow(s._Out):
    index: int
    key: Any
    status: s.TaskStatus
    result: Any
    error_code: str | None
    run_id: str | None
    steps_used: int
    task_id: str | None
    goal: str


def items_list(items: Any) -> list[dict[str, Any]]:
    """A DataFrame's rows (its index kept as ``index`` unless it is the default range), or the list as it is."""
    to_dict = getattr(items, "to_dict", None)
    if callable(to_dict) and hasattr(items, "columns"):
        import json

        return json.loads(items.to_json(orient="records", date_format="iso"))
    return list(items)


def batch_request(agent: str, items: Any, goal: str, concurrency: int, max_steps: int | None,
                  key: str | None) -> _Req:
    body: dict[str, Any] = {"agent": agent, "items": items_list(items), "goal": goal, "concurrency": concurrency}
    if max_steps is not None:
        body["max_steps"] = max_steps
    if key is not None:
        body["key"] = key
    return _post("/batches", body, BatchOut)


class Routes:
    batches = staticmethod(lambda: _Req("GET", "/batches", model=list[BatchOut]))
    batch = staticmethod(lambda batch_id: _Req("GET", f"/batches/{_q(batch_id)}", model=BatchOut))
    results = staticmethod(lambda batch_id: _Req("GET", f"/batches/{_q(batch_id)}/results", model=list[BatchRow]))
    cancel = staticmethod(lambda batch_id: _post(f"/batches/{_q(batch_id)}/cancel", model=BatchOut))
    events = staticmethod(lambda batch_id: _Req("GET", f"/batches/{_q(batch_id)}/events"))
