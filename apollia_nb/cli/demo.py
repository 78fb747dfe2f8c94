"""``apollia-os demo``: a headless tour on a fresh home, told as a story.

Registers a scripted agent, gives it a task whose second step wants to write a
file (so governance asks), answers the card, lets the critic pass, then
verifies the journal and replays the run — offline, deterministic.
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from apollia_nb.errors import BadInput

MANIFEST = textwrap.dedent(
    """
    name = "clerk"
    description = "Keeps the notes folder tidy"
    instructions = "You keep the notes folder tidy."

    [model]
    provider = "scripted"

    [[model.script.planner]]
    steps = ["Read the meeting notes", "Write a summary file"]

    [[model.script.actor]]
    tool_calls = [{ name = "read_file", arguments = { path = "meeting.txt" } }]

    [[model.script.actor]]
    text = "The notes say the launch moves to Friday."

    [[model.script.actor]]
    tool_calls = [{ name = "write_file", arguments = { path = "summary.txt", content = "Launch moves to Friday." } }]

    [[model.script.actor]]
    text = "Wrote summary.txt."

    [[model.script.critic]]
    verdict = "pass"

    [tools]
    required = ["read_file", "write_file"]

    [workspace]
    root = "notes"

    [budget]
    max_steps = 20
    """
).lstrip()


def run_demo(home: str | None, *, json_output: bool = False, out: Any = None) -> int:
    import anyio

    from apollia_nb.home import resolve_home

    if home is None:
        base = Path(tempfile.mkdtemp(prefix="apollia-demo-"))
        home_path = base / "home"
    else:
        home_path = resolve_home(home)
        if home_path.exists() and any(home_path.iterdir()):
            raise BadInput(f"the demo needs a fresh home; {home_path} is not empty (omit --home to use a new one)")
        base = Path(tempfile.mkdtemp(prefix="apollia-demo-"))
    workdir = base / "work"
    (workdir / "notes").mkdir(parents=True, exist_ok=True)
    (workdir / "notes" / "meeting.txt").write_text("Launch moved from Wednesday to Friday.\n")
    lines: list[str] = []

    def say(text: str = "") -> None:
        lines.append(text)
        if not json_output:
            print(text, file=out, flush=True)

    async def main() -> dict[str, Any]:
        from apollia_nb.federation import open_sources
        from apollia_nb.runtime import Runtime

        async with Runtime(home_path, tool_sources=open_sources) as rt:
            say(f"apollia-nb demo — home {home_path}")
            say()
            agent = await rt.register_agent(MANIFEST, cwd=workdir)
            say(f"1. Registered agent '{agent.name}' ({agent.state.state.value}), scripted model, "
                f"workspace {agent.workspace}.")
            handle = await rt.submit("clerk", "Summarise the meeting notes into summary.txt")
            say(f"2. Gave it a task: {handle.record['goal']!r} (ceiling {handle.record['budget']['ceiling']} steps).")
            await handle.settled()
            plan = handle.record["plan"]
            say("   The planner proposed: " + "; ".join(f"{i + 1}. {s}" for i, s in enumerate(plan)))
            say("   read_file ran at once: reading is allowed (line 3).")
            [card] = handle.pending
            say(f"3. Governance asked before {card.tool}({json.dumps(card.arguments)}):")
            say(f"   line {card.line} — {card.reason}; answers on offer: {', '.join(card.answers)}.")
            card.answer("once", by="demo")
            say("   Answered 'once' (as a person would by clicking the card).")
            task = await handle
            say(f"4. The task is {task.status}: {task.result!r}; "
                f"{task.record['budget']['used']} of {task.record['budget']['ceiling']} steps used; "
                f"the critic said {task.record['verdict']['verdict']!r}.")
            summary = (agent.workspace / "summary.txt").read_text()
            say(f"   notes/summary.txt now reads: {summary!r}")
            report = rt.verify()
            say(f"5. Journal verified: {report.ok} — {report.entries} entries, every hash, link and signature "
                "checked.")
            replay = rt.replay(task.run_id)
            say(f"6. Replayed run {task.run_id} offline (no model, no tool): {replay.verdict}, "
                f"{replay.responses} model responses and {replay.calls} tool calls checked.")
            rows = rt.journal.entries(run_id=task.run_id)
            say(f"7. The run's {len(rows)} journal entries: " + ", ".join(e.kind for e in rows))
            say()
            say("Query it yourself (DuckDB from Python, or the duckdb CLI if you have it):")
            say(f"  python -c \"import duckdb; duckdb.connect('{home_path / 'journal.db'}', read_only=True)"
                ".sql('SELECT tool, outcome, line, answer FROM decisions').show()\"")
            say(f"Verify it yourself: apollia-os audit verify --home {home_path}")
            return {"home": str(home_path), "task": task.to_dict(), "verified": report.ok,
                    "replay": replay.to_dict()}

    result = anyio.run(main)
    if json_output:
        print(json.dumps(result, indent=2, default=str), file=out)
    ok = result["verified"] and result["replay"]["verdict"] == "identical" and result["task"]["status"] == "completed"
    return 0 if ok else 1
