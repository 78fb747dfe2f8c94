"""A host of the test's own on 127.0.0.1: an OpenAPI document and answers the test scripts.

No tests here. ``LoopbackHost.answer(method, path)`` chooses the response; every request
received is kept in ``requests`` (method, path as sent, headers, body) so a test can
assert what did or did not reach the host.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, str, bytes]  # status, content type, body


class LoopbackHost:
    def __init__(self, answer: Callable[[str, str], Answer] | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answer = answer or (lambda method, path: (200, "application/json", b"{}"))
        host = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                host.requests.append({"method": self.command, "path": self.path,
                                      "headers": dict(self.headers), "body": body})
                status, kind, payload = host.answer(self.command, self.path)
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "LoopbackHost":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def openapi(paths: dict[str, dict[str, Any]]) -> str:
    """An OpenAPI 3 document (JSON text) with these path items."""
    return json.dumps({"openapi": "3.0.3", "info": {"title": "t", "version": "1"}, "paths": paths})


def operation(op_id: str, *, params: tuple[str, ...] = (), body: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": op_id, "responses": {"200": {"description": "ok"}},
                          "parameters": [{"name": p, "in": "path", "required": True,
                                          "schema": {"type": "string"}} for p in params]}
    if body is not None:
        op["requestBody"] = {"content": {"application/json": {"schema": body}}}
    return op
