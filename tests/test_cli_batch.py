"""`apollia-os batch AGENT ITEMS`, as a user runs it: as the home's owner and through `apollia-os serve`."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from runtime_helpers import call, manifest

from apollia_nb.api.server import ServerThread
from apollia_nb.cli.batch import progress_line

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def run_cli(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "APOLLIA_HOME": str(home)}
    return subprocess.run([*APOLLIA, *args], capture_output=True, text=True, env=env, timeout=120, cwd=cwd)


def test_an_owner_batch_writes_its_results_and_exits_1_while_items_wait(home, tmp_path):
    work = tmp_path / "work"
    (tmp_path / "writer.toml").write_text(
        manifest(actor=[{"tool_calls": [call("write_file", path="out.txt", content="hi")]}, {"text": "Wrote."}]))
    (work / "items.csv").write_text("id,path\na,x.md\nb,y.md\n")
    assert run_cli("agents", "register", str(tmp_path / "writer.toml"), home=home.path, cwd=work).returncode == 0
    out = run_cli("batch", "clerk", "items.csv", "--goal", "Summarise {path}", "--key", "id", home=home.path, cwd=work)
    assert out.returncode == 1, out.stderr
    rows = [json.loads(line) for line in (work / "items.results.jsonl").read_text().splitlines()]
    assert [(r["key"], r["status"], r["goal"]) for r in rows] == [("a", "waiting", "Summarise x.md"),
                                                                  ("b", "waiting", "Summarise y.md")]
    assert "2 waiting" in out.stdout and "pending list" in out.stdout
    assert "0/2" in out.stderr  # the final progress line
    listed = run_cli("pending", "list", "--json", home=home.path, cwd=work)
    assert sorted(p["task_id"] for p in json.loads(listed.stdout)) == sorted(r["task_id"] for r in rows)

    bad = run_cli("batch", "clerk", "items.csv", "--goal", "Summarise {colour}", home=home.path, cwd=work)
    assert bad.returncode == 3 and "BAD_INPUT" in bad.stderr and "colour" in bad.stderr
    (work / "broken.jsonl").write_text('{"a": 1}\nnot json\n')
    bad = run_cli("batch", "clerk", "broken.jsonl", home=home.path, cwd=work)
    assert bad.returncode == 3 and "broken.jsonl:2" in bad.stderr


def test_a_batch_through_the_server_writes_csv_and_exits_0(home, tmp_path):
    work = tmp_path / "work"
    (tmp_path / "clerk.toml").write_text(manifest())
    (work / "items.jsonl").write_text("".join(json.dumps({"goal": f"Count to {i}"}) + "\n" for i in range(5)))
    with ServerThread(home.path, port=0):
        assert run_cli("agents", "register", str(tmp_path / "clerk.toml"), home=home.path, cwd=work).returncode == 0
        out = run_cli("batch", "clerk", "items.jsonl", "--concurrency", "2", "--out", "done.csv",
                      home=home.path, cwd=work)
        assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader((work / "done.csv").open()))
    assert [r["goal"] for r in rows] == [f"Count to {i}" for i in range(5)]
    assert {r["status"] for r in rows} == {"completed"} and {r["result"] for r in rows} == {"Done."}


def test_the_progress_line():
    counts = {"pending": 1, "running": 2, "waiting": 1, "completed": 5, "failed": 1, "cancelled": 0}
    assert progress_line(counts, 10, width=10) == "[######....]  6/10 done 5 · waiting 1 · failed 1 · running 3"
