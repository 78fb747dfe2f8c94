"""The shapes of the REST API's batches (pydantic only: the SDK imports them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from apollia_nb.wire import schemas as s

__all__ = ["BatchCounts", "BatchIn", "BatchOut", "BatchRow"]


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
