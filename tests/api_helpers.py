"""Helpers for REST API tests: a server on 127.0.0.1 (a thread) with a client holding its token, keyed
requests, and the API's URL of a home ``apollia-os serve`` serves."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


def keyed(key: str) -> dict[str, str]:
    """The headers of a request sent with an ``Idempotency-Key``."""
    return {"Idempotency-Key": key}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextlib.contextmanager
def served(home: Any, token: str, *manifests: str, timeout: float = 60) -> Iterator[tuple[Any, httpx.Client]]:
    """A ``ServerThread`` on ``home`` (port 0) and a client of its ``/api/v1`` with ``manifests`` registered."""
    from apollia_nb.api.server import ServerThread

    with ServerThread(home, token=token) as server:
        with httpx.Client(base_url=server.url + "/api/v1", headers=auth(token), timeout=timeout) as client:
            for text in manifests:
                registered = client.post("/agents", json={"manifest": text})
                assert registered.status_code == 201, registered.text
            yield server, client


def api_url(home: Path) -> str:
    """The ``/api/v1`` URL ``apollia-os serve`` advertises in the home's ``server.json``."""
    from apollia_nb.api.server import read_server_json

    info = read_server_json(home / "server.json")
    assert info is not None, f"no server.json in {home}"
    return info.url + "/api/v1"
