"""The REST API: ``create_app`` (FastAPI) and the server of ``apollia-os serve``.

Imported lazily: ``import apollia_nb.api`` costs nothing until a name is used,
so the CLI stays quick; the wire format it shares with the SDK is :mod:`apollia_nb.wire.schemas`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "serve", "ServerThread", "API_PREFIX"]


def __getattr__(name: str) -> Any:
    if name in ("create_app", "API_PREFIX"):
        from apollia_nb.api import app

        return getattr(app, name)
    if name in ("serve", "ServerThread"):
        from apollia_nb.api import server

        return getattr(server, name)
    raise AttributeError(f"module 'apollia_nb.api' has no attribute {name!r}")
