"""The SDK's requests for batches (``Client.batch`` and the rest)."""

from __future__ import annotations

from typing import Any

from apollia_nb.wire.batches import BatchOut, BatchRow
from apollia_nb.wire.http import Req as _Req
from apollia_nb.wire.http import post as _post
from apollia_nb.wire.http import q as _q

__all__ = ["Routes", "batch_request", "items_list"]


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
