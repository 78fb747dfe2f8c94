"""The Python SDK of the REST API: ``Client``, ``AsyncClient``, typed results, one exception per code.

Light to import (httpx and pydantic; no FastAPI, no DuckDB), so a host product
can drive a server without installing the runtime's weight into its process.
"""

from __future__ import annotations

from apollia_nb.sdk import errors
from apollia_nb.sdk.client import AsyncClient, Client, Event
from apollia_nb.wire.schemas import (
    Agent,
    Consent,
    DeveloperMode,
    EntriesPage,
    JournalEntry,
    PendingDecision,
    Policy,
    ReplayResult,
    Rule,
    Session,
    Submission,
    Task,
    VerifyReport,
)

__all__ = [
    "Client",
    "AsyncClient",
    "Event",
    "errors",
    "Agent",
    "Task",
    "Submission",
    "Session",
    "PendingDecision",
    "Rule",
    "Consent",
    "DeveloperMode",
    "Policy",
    "VerifyReport",
    "ReplayResult",
    "JournalEntry",
    "EntriesPage",
]
