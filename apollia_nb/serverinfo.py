"""``<home>/server.json``: how a client on this machine finds the ``apollia-os serve`` owning a home.

The server writes it once it listens (``{"url", "token", "pid"}``, mode 0600 from its first
byte) and removes it when it stops; the SDK's ``Client.from_home``, the CLI and a client
runtime read it. It sits below every surface so the server and its clients read the same
file the same way without importing each other.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ServerInfo", "is_loopback", "read_server_json", "write_server_json"]


@dataclass(frozen=True)
class ServerInfo:
    """What ``server.json`` holds."""

    url: str
    token: str
    pid: int

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "token": self.token, "pid": self.pid}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 in brackets or not) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def write_server_json(path: Path, info: ServerInfo) -> None:
    """Write ``server.json`` with mode 0600 from its first byte, atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(info.to_dict(), fh)
        fh.write("\n")
    os.replace(tmp, path)


def read_server_json(path: Path) -> ServerInfo | None:
    """What ``path`` advertises, or None when it is missing or not a server.json."""
    try:
        data = json.loads(path.read_text())
        return ServerInfo(url=str(data["url"]), token=str(data["token"]), pid=int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
