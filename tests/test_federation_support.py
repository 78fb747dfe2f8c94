"""Helpers shared by the federation tests (no tests here): installed third-party servers, a faulty server, cards."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / ".test-peers"
TIME_PYTHON = PEERS / "venv-time" / "bin" / "python"
FILESYSTEM_JS = PEERS / "npm" / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
EVERYTHING_JS = PEERS / "npm" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"

#: A real MCP server (the project's own SDK) that can crash, hang, and says where it started.
FAULTY_SERVER = '''
import os, sys
import anyio
from mcp.server.mcpserver import MCPServer

print(f"faulty server starting pid={os.getpid()}", file=sys.stderr, flush=True)
marker = os.environ.get("FAULTY_MARKER")
if marker:
    with open(marker, "a") as f:
        f.write(f"{os.getpid()}\\n")
server = MCPServer("faulty", log_level="WARNING")

@server.tool()
def pid() -> dict[str, int]:
    """This server's process id."""
    return {"pid": os.getpid()}

@server.tool()
def crash() -> str:
    """Exit at once, mid-call."""
    os._exit(3)

@server.tool()
async def hang() -> str:
    """Never answer."""
    await anyio.sleep_forever()
    return "unreachable"

@server.tool()
def echo(text: str) -> str:
    """Say it back."""
    return text

anyio.run(server.run_stdio_async)
'''


def require_peer(path: Path) -> Path:
    """A third-party server installed by dev/install-test-mcp-servers.sh: fail in CI, skip locally."""
    if path.exists():
        return path
    message = f"{path.relative_to(REPO)} is missing: run `bash dev/install-test-mcp-servers.sh`"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def node() -> str:
    found = shutil.which("node")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node is not on PATH")
        pytest.skip("node is not on PATH")
    return found


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(str(value))


def write_config(home: Any, *, servers: dict[str, dict[str, Any]] | None = None,
                 hosts: dict[str, dict[str, Any]] | None = None, trusted_keys: list[str] | None = None) -> None:
    lines: list[str] = []
    if trusted_keys is not None:
        lines += ["[policy]", f"trusted_keys = {toml_value(trusted_keys)}", ""]
    for section, entries in (("mcp.servers", servers or {}), ("hosts", hosts or {})):
        for name, table in entries.items():
            lines.append(f"[{section}.{name}]")
            lines += [f"{key} = {toml_value(value)}" for key, value in table.items()]
            lines.append("")
    home.config_path.write_text("\n".join(lines), encoding="utf-8")


def faulty_server(tmp_path: Path, **extra: Any) -> tuple[dict[str, Any], Path]:
    """Config for the faulty server, and the file it appends its pid to when it starts."""
    script = tmp_path / "faulty_server.py"
    script.write_text(FAULTY_SERVER, encoding="utf-8")
    marker = tmp_path / "faulty-started.txt"
    config = {
        "command": sys.executable, "args": [str(script)], "env": {"FAULTY_MARKER": str(marker)},
        "families": {"pid": "read", "crash": "read", "hang": "read", "echo": "read"},
        **extra,
    }
    return config, marker


async def answer_all(rt: Any, handle: Any, answer: str = "once") -> list[Any]:
    """Run a watched task to its end, answering every card as it comes; return the cards in order."""
    cards: list[Any] = []
    while True:
        changed = anyio.Event()
        unsubscribe = rt.subscribe(lambda kind, obj: changed.set())
        try:
            await handle.settled()
            if handle.status in ("completed", "failed", "cancelled"):
                return cards
            pending = handle.pending
            for card in pending:
                cards.append(card)
                card.answer(answer)
            if not pending:  # answered, not yet moving on: wait for the run to change
                await changed.wait()
        finally:
            unsubscribe()


def results(rt: Any, run_id: str) -> list[dict[str, Any]]:
    """The ``tool_result`` payloads of a run, in order."""
    return [json.loads(e.payload) for e in rt.journal.entries(run_id=run_id) if e.kind == "tool_result"]


def decisions(rt: Any, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.payload) for e in rt.journal.entries(run_id=run_id) if e.kind == "decision"]


@pytest.fixture(scope="module")
def everything_url():
    """server-everything over streamable HTTP on 127.0.0.1, one process for the module; its URL."""
    script = require_peer(EVERYTHING_JS)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([node(), str(script), "streamableHttp"], env={"PORT": str(port), "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"server-everything exited: {proc.stderr.read()}")
                time.sleep(0.05)
        else:
            pytest.fail("server-everything did not listen within 30 s")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


