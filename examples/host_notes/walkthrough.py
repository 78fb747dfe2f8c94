"""Federation, start to end, offline: read a host's notes over MCP, write a summary back over REST.

Run from the repository root::

    python examples/host_notes/walkthrough.py

It starts the notes host on a free port of 127.0.0.1, makes a throwaway home
whose ``apollia.toml`` points at the host (``[mcp.servers.notes]`` and
``[hosts.notes]``), registers a scripted agent that calls
``mcp:notes/search`` and then ``rest:notes/createSummary``, answers the
consent card from code, and prints what the journal recorded for both paths.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from apollia_nb.home import Home  # noqa: E402
from apollia_nb.federation import open_sources  # noqa: E402
from apollia_nb.runtime import Runtime  # noqa: E402

OPENAPI = REPO / "examples" / "host_notes" / "openapi.json"

MANIFEST = """
name = "scribe"
description = "Summarises the host's notes and files the summary with the host."
instructions = "Find the notes about the budget and write a short summary back to the host."

[model]
provider = "scripted"

[[model.script.planner]]
steps = ["Find the budget notes", "File a summary with the host"]

[[model.script.actor]]
tool_calls = [{ name = "mcp:notes/search", arguments = { query = "budget" } }]

[[model.script.actor]]
text = "Found the budget notes: n1, n2 and n4."

[[model.script.actor]]
[[model.script.actor.tool_calls]]
name = "rest:notes/createSummary"
[model.script.actor.tool_calls.arguments]
title = "Budget, in short"
text = "Q3 is 4% over plan; cut travel first. One hire now, one after January."
note_ids = ["n1", "n2"]

[[model.script.actor]]
text = "Filed the summary with the notes host."

[tools]
required = ["mcp:notes/search", "rest:notes/createSummary"]
"""


def start_host(token: str) -> tuple[subprocess.Popen[str], str]:
    """The notes host on a free port; its first line of output is its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.host_notes", "--port", "0", "--token", token],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url:
        proc.wait()
        raise SystemExit(f"the notes host did not start (exit {proc.returncode})")
    return proc, url


def write_config(home: Home, url: str) -> None:
    home.config_path.write_text(
        f"""# Read the host's notes over MCP; `search` only reads, so it runs without asking.
[mcp.servers.notes]
url = "{url}/mcp"
families = {{ search = "read" }}

# Write back through the host's REST API; POST to a host on this machine is `write`.
[hosts.notes]
base_url = "{url}"
openapi = "{OPENAPI.as_posix()}"
token_env = "NOTES_TOKEN"
""",
        encoding="utf-8",
    )


async def walk(home: Home) -> None:
    async with Runtime(home, tool_sources=open_sources) as rt:
        agent = await rt.register_agent(MANIFEST)
        print(f"agent {agent.name}: {agent.state.state.value}; tools {', '.join(agent.offered)}")
        for name in agent.offered:
            tooldef = agent.tools.get(name)
            family = tooldef.family.value if tooldef.family else "unclassified"
            print(f"  {name}: family {family}, connection {tooldef.connection}")

        handle = await rt.submit("scribe", "Summarise the budget notes for the host")
        while True:
            changed = asyncio.Event()
            unsubscribe = rt.subscribe(lambda kind, obj: changed.set())
            try:
                await handle.settled()
                if handle.status in ("completed", "failed", "cancelled"):
                    break
                for card in handle.pending:
                    print(f"\nconsent card: {card.agent} wants {card.tool} ({card.family}), line {card.line}")
                    print(f"  arguments: {card.arguments}")
                    print(f"  hints:     {card.hints}")
                    print(f"  answers:   {' / '.join(card.answers)} -> answering once")
                    card.answer("once", by="walkthrough")
                await changed.wait()  # until the run moves on
            finally:
                unsubscribe()
        print(f"\ntask {handle.status}: {handle.result}")

        print("\nthe journal's decisions and tool calls for this run:")
        rows = rt.journal.sql(
            "SELECT d.tool, d.family, d.outcome, d.line, d.answer, c.status "
            "FROM decisions d JOIN tool_calls c ON c.run_id = d.run_id AND c.tool = d.tool "
            "WHERE d.run_id = ? ORDER BY d.seq",
            [handle.run_id],
        )
        print(f"  {'tool':28} {'family':8} {'outcome':8} line  answer  status")
        for tool, family, outcome, line, answer, status in rows:
            print(f"  {tool:28} {family or '-':8} {outcome:8} {line:>4}  {answer or '-':6}  {status}")
        tokens_in_journal = sum(os.environ["NOTES_TOKEN"] in e.payload.decode() for e in rt.journal.entries())
        print(f"\nentries mentioning the host's token: {tokens_in_journal}")
        print(f"the journal verifies: {rt.verify().ok}")


def main() -> int:
    token = secrets.token_urlsafe(16)
    os.environ["NOTES_TOKEN"] = token
    proc, url = start_host(token)
    print(f"notes host at {url} (MCP at {url}/mcp, OpenAPI at {url}/openapi.json)")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            home = Home.at(Path(tmp) / "home")
            write_config(home, url)
            work = Path(tmp) / "work"  # the agent's workspace: beside the home, not in the repository
            work.mkdir()
            os.chdir(work)
            asyncio.run(walk(home))
        import httpx

        stored = httpx.get(f"{url}/summaries", headers={"Authorization": f"Bearer {token}"}).json()["summaries"]
        print(f"\nthe host now holds {len(stored)} summary: {stored[-1]['title']!r} about {stored[-1]['note_ids']}")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
