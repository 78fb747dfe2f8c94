"""The REST API's batches: ``POST /batches``, ``GET /batches[/{id}[/results|/events]]``, cancel.

A batch over the API is the runtime's batch (``apollia_nb/runtime/batch.py``):
its items are a JSON list of objects, its goal a template filled from each item.
Its ``router`` is included by ``api/app.py``'s ``create_app``.
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent

from apollia_nb.api.deps import (
    API_PREFIX,
    authorize,
    closing,
    error_responses,
    first,
    json_route,
    runtime_of,
    stream_errors,
)
from apollia_nb.api.idempotency import Effect, Found, effect_ref
from apollia_nb.errors import ApolliaError
from apollia_nb.wire.batches import BatchIn, BatchOut, BatchRow

__all__ = ["BatchIn", "BatchOut", "BatchRow", "results_text", "router"]

router = APIRouter(dependencies=[Depends(authorize)], responses=error_responses(401, 422))


def _route(method: str, path: str, status: int = 200, **kw: Any) -> Any:
    return json_route(router, method, path, status, **kw)


_COLUMNS = list(BatchRow.model_fields)


async def _find_batch(request: Request, ref: dict[str, Any] | None) -> Found | None:
    """The batch a keyed request named before it was recorded, if it was."""
    batch_id = (ref or {}).get("batch_id")
    if not isinstance(batch_id, str):
        return None
    try:
        batch = request.app.state.runtime.get_batch(batch_id).to_dict()
    except ApolliaError:
        return None
    return 202, batch, f"{API_PREFIX}/batches/{batch_id}"


async def _find_cancelled(request: Request, ref: dict[str, Any] | None) -> Found | None:
    """The batch, when it is cancelled (what a keyed cancel left it as)."""
    try:
        batch = request.app.state.runtime.get_batch(request.path_params["batch_id"]).to_dict()
    except ApolliaError:
        return None
    return (200, batch, None) if batch["status"] == "cancelled" else None


_BATCH_EFFECT = Effect(find=_find_batch, name=lambda: {"batch_id": f"batch-{uuid.uuid4().hex[:12]}"})
_CANCELLED = Effect(find=_find_cancelled)


def results_text(rows: list[dict[str, Any]], fmt: str) -> str:
    """The rows as JSON Lines or CSV (values that are not text are written as JSON)."""
    if fmt == "jsonl":
        return "".join(json.dumps(row, default=str) + "\n" for row in rows)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: v if isinstance(v, str) or v is None else json.dumps(v) for k, v in row.items()})
    return out.getvalue()


@_route("POST", "/batches", 202, response_model=BatchOut, operation_id="createBatch", tags=["batches"],
        summary="Run an agent over many items", responses=error_responses(404, 409, 413, 422), effect=_BATCH_EFFECT,
        description="Records the batch and its items, then returns at once; each item runs as an unattended "
                    "task (its first call that would ask suspends it into `GET /pending-decisions`, the others "
                    "go on). 400 `BAD_INPUT` when an item cannot fill the goal (nothing is recorded).")
async def create_batch(request: Request, response: Response, body: BatchIn,
                       rt: Any = Depends(runtime_of)) -> dict[str, Any]:
    handle = await rt.batch(body.agent, list(body.items), goal=body.goal, concurrency=body.concurrency,
                            max_steps=body.max_steps, key=body.key,
                            batch_id=effect_ref(request, "batch_id"))  # named before it is recorded: a retry finds it
    response.headers["Location"] = f"{API_PREFIX}/batches/{handle.id}"
    return handle.to_dict()


@_route("GET", "/batches", storage=True, response_model=list[BatchOut], operation_id="listBatches",
        tags=["batches"], summary="Batches, oldest first")
async def list_batches(rt: Any = Depends(runtime_of)) -> list[dict[str, Any]]:
    return [b.to_dict() for b in rt.batches()]


@_route("GET", "/batches/{batch_id}", storage=True, response_model=BatchOut, operation_id="getBatch",
        tags=["batches"], summary="One batch and its counts", responses=error_responses(404))
async def get_batch(batch_id: str, rt: Any = Depends(runtime_of)) -> dict[str, Any]:
    return rt.get_batch(batch_id).to_dict()


@_route("GET", "/batches/{batch_id}/results", storage=True, response_model=list[BatchRow],
        operation_id="batchResults", tags=["batches"], summary="A batch's items and their results",
        responses={**error_responses(404), 200: {"content": {"application/x-ndjson": {}, "text/csv": {}}}},
        description="One row per item, in item order, as the items stand now. `format=jsonl` or `csv` "
                    "answers JSON Lines or CSV instead of a JSON list.")
async def batch_results(batch_id: str, format: Literal["json", "jsonl", "csv"] = Query("json"),
                        rt: Any = Depends(runtime_of)) -> Any:
    rows = rt.get_batch(batch_id).rows()
    if format == "json":
        return rows
    media = "application/x-ndjson" if format == "jsonl" else "text/csv"
    return Response(results_text(rows, format), media_type=media)


@_route("POST", "/batches/{batch_id}/cancel", response_model=BatchOut, operation_id="cancelBatch", effect=_CANCELLED,
        tags=["batches"], summary="Cancel a batch", responses=error_responses(404, 409),
        description="Items not started never start; every unfinished item's task is cancelled (its pending "
                    "decisions refused). 409 when the batch is already completed or cancelled.")
async def cancel_batch(batch_id: str, rt: Any = Depends(runtime_of)) -> dict[str, Any]:
    return (await rt.get_batch(batch_id).cancel()).to_dict()


async def _existing_batch(batch_id: str, rt: Any = Depends(runtime_of)) -> Any:
    return rt.get_batch(batch_id)


@router.get("/batches/{batch_id}/events", response_class=EventSourceResponse, operation_id="batchEvents",
            tags=["batches"], summary="A batch's progress (server-sent events)",
            responses=stream_errors(404, events={"batch": "BatchOut"}),
            description="`event: batch` with the batch's JSON (as `GET /batches/{id}`) now and whenever its "
                        "counts change, until it is completed or cancelled; then the stream ends.")
async def batch_events(request: Request, handle: Any = Depends(_existing_batch),
                       rt: Any = Depends(runtime_of)) -> AsyncIterator[ServerSentEvent]:
    stop = closing(request)
    changed = anyio.Event()

    def listener(kind: str, obj: Any) -> None:
        if kind == "batch" and getattr(obj, "id", None) == handle.id:
            changed.set()

    unsubscribe = rt.subscribe(listener)
    try:
        last: dict[str, Any] | None = None
        while True:
            changed = anyio.Event()
            data = rt.get_batch(handle.id).to_dict()
            if last is None or (data["counts"], data["status"]) != (last["counts"], last["status"]):
                yield ServerSentEvent(event="batch", data=data)
                last = data
            if data["status"] != "running":
                return
            await first(changed, stop)
            if stop.is_set():
                return
    finally:
        unsubscribe()
