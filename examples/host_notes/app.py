"""The notes host: a small host product that keeps notes and summaries.

It exposes its notes over MCP (read only: ``search``, ``get``) and accepts
summaries over REST (``POST /summaries``, operationId ``createSummary``;
``GET /summaries``, ``listSummaries``), described by ``openapi.json`` (shipped
beside this file and served at ``/openapi.json``). One ASGI app serves both:
MCP at ``/mcp`` (streamable HTTP), REST beside it. ``build_mcp`` alone is
what the stdio mode runs.

Test faculties, off unless asked for:

* ``token``: ``/summaries`` then requires ``Authorization: Bearer <token>``
  (401 otherwise);
* ``faults``: ``POST /_fail`` with ``{"status": 503, "times": 1}`` makes the
  next ``times`` requests to ``/summaries`` answer that status — a way to see
  how a client handles a flaky host. Never enable it in a real deployment.
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from pathlib import Path
from typing import Any

__all__ = ["SEED_NOTES", "NotesStore", "build_mcp", "build_app", "openapi_document", "OPENAPI_PATH"]

OPENAPI_PATH = Path(__file__).with_name("openapi.json")

SEED_NOTES: list[dict[str, str]] = [
    {"id": "n1", "title": "Budget review", "author": "ana",
     "body": "The Q3 budget is 4% over plan; travel and cloud costs drove most of it. Cut travel first."},
    {"id": "n2", "title": "Hiring plan", "author": "ben",
     "body": "Two data engineers in Q4. The budget allows one now and one after the January review."},
    {"id": "n3", "title": "Customer call: Acme", "author": "ana",
     "body": "Acme wants the export feature by March and asked about on-premises hosting."},
    {"id": "n4", "title": "Offsite ideas", "author": "chloe",
     "body": "Lake house in May, or the city venue if the budget stays tight."},
]


class NotesStore:
    """Notes and summaries, in memory, optionally kept in a JSON file."""

    def __init__(self, data_path: Path | None = None) -> None:
        self._path = data_path
        self._lock = threading.Lock()
        data: dict[str, Any] = {}
        if data_path is not None and data_path.exists():
            data = json.loads(data_path.read_text(encoding="utf-8"))
        self.notes: list[dict[str, str]] = data.get("notes") or copy.deepcopy(SEED_NOTES)
        self.summaries: list[dict[str, Any]] = data.get("summaries") or []

    def _save(self) -> None:
        if self._path is not None:
            tmp = self._path.with_suffix(self._path.suffix + ".tmp")
            tmp.write_text(json.dumps({"notes": self.notes, "summaries": self.summaries}, indent=2), encoding="utf-8")
            tmp.replace(self._path)

    def search(self, query: str, limit: int = 5) -> list[dict[str, str]]:
        words = [w for w in query.lower().split() if w]
        hits = []
        for note in self.notes:
            text = f"{note['title']} {note['body']}".lower()
            if all(w in text for w in words):
                hits.append({"id": note["id"], "title": note["title"], "snippet": note["body"][:80]})
        return hits[: max(0, limit)]

    def get(self, note_id: str) -> dict[str, str] | None:
        return next((dict(n) for n in self.notes if n["id"] == note_id), None)

    def add_summary(self, title: str, text: str, note_ids: list[str]) -> dict[str, Any]:
        with self._lock:
            summary = {"id": f"s-{uuid.uuid4().hex[:8]}", "title": title, "text": text, "note_ids": note_ids}
            self.summaries.append(summary)
            self._save()
            return summary


def build_mcp(store: NotesStore) -> Any:
    """The MCP face: two read-only tools over the notes."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ToolAnnotations

    server = MCPServer("notes", instructions="Search and read the team's notes.", log_level="WARNING")
    read_only = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)

    @server.tool(title="Search notes", annotations=read_only)
    def search(query: str, limit: int = 5) -> dict[str, Any]:
        """Find notes whose title or body contain every word of the query."""
        return {"query": query, "notes": store.search(query, limit)}

    @server.tool(title="Read a note", annotations=read_only)
    def get(id: str) -> dict[str, Any]:
        """One note in full: title, author and body."""
        note = store.get(id)
        if note is None:
            raise ToolError(f"no note with id {id!r}")
        return note

    return server


def openapi_document(base_url: str | None = None) -> dict[str, Any]:
    """The shipped OpenAPI document; with ``base_url``, its ``servers`` name this running host."""
    doc = json.loads(OPENAPI_PATH.read_text(encoding="utf-8"))
    if base_url is not None:
        doc["servers"] = [{"url": base_url.rstrip("/")}]
    return doc


def build_app(store: NotesStore, *, token: str | None = None, faults: bool = False) -> Any:
    """One ASGI app: MCP at ``/mcp`` and the REST routes of ``openapi.json``."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    server = build_mcp(store)
    failing = {"status": 0, "times": 0}

    def refusal(request: Request) -> Response | None:
        if failing["times"] > 0:
            failing["times"] -= 1
            return JSONResponse({"detail": "failure injected by /_fail"}, status_code=failing["status"])
        if token is not None and request.headers.get("authorization") != f"Bearer {token}":
            return JSONResponse({"detail": "missing or wrong bearer token"}, status_code=401)
        return None

    @server.custom_route("/openapi.json", methods=["GET"])
    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document(str(request.base_url)))

    @server.custom_route("/summaries", methods=["GET", "POST"])
    async def summaries(request: Request) -> Response:
        refused = refusal(request)
        if refused is not None:
            return refused
        if request.method == "GET":
            return JSONResponse({"summaries": store.summaries})
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"detail": "the body must be JSON"}, status_code=400)
        problem = _check_summary(body, store)
        if problem:
            return JSONResponse({"detail": problem}, status_code=422)
        summary = store.add_summary(body["title"], body["text"], list(body.get("note_ids", [])))
        return JSONResponse(summary, status_code=201)

    if faults:
        @server.custom_route("/_fail", methods=["POST"])
        async def fail(request: Request) -> Response:
            body = await request.json()
            failing["status"] = int(body.get("status", 503))
            failing["times"] = int(body.get("times", 1))
            return JSONResponse(failing)

    return server.streamable_http_app()


def _check_summary(body: Any, store: NotesStore) -> str | None:
    if not isinstance(body, dict):
        return "the body must be an object"
    for key in ("title", "text"):
        if not isinstance(body.get(key), str) or not body[key].strip():
            return f"{key} must be a non-empty string"
    ids = body.get("note_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        return "note_ids must be an array of note ids"
    unknown = [i for i in ids if store.get(i) is None]
    if unknown:
        return f"unknown note id {unknown[0]!r}"
    extra = sorted(set(body) - {"title", "text", "note_ids"})
    if extra:
        return f"unknown field {extra[0]!r}"
    return None
