"""`apollia-os run` names its run; `apollia-os runs list` and `%apollia runs` list the journal's runs;
`%apollia consents grant|revoke` changes standing consents from a notebook."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from apollia_nb.notebook.magics import ApolliaMagicError
from notebook_fixtures import ip  # noqa: F401 - the fixture
from runtime_helpers import call, manifest

APOLLIA = [sys.executable, "-m", "apollia_nb"]
WRITE = manifest(actor=[{"tool_calls": [call("write_file", path="out.txt", content="hi")]}, {"text": "Wrote it."}])


def run_cli(*args: str, home: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "APOLLIA_HOME": str(home)}
    return subprocess.run([*APOLLIA, *args], capture_output=True, text=True, input=stdin, env=env, timeout=120)


def test_run_prints_its_run_id_and_runs_list_shows_agent_status_start_and_entries(home, tmp_path):
    (tmp_path / "clerk.toml").write_text(WRITE)
    assert run_cli("agents", "register", str(tmp_path / "clerk.toml"), home=home.path).returncode == 0
    assert run_cli("runs", "list", home=home.path).stdout.strip() == "no runs yet"
    done = run_cli("run", "clerk", "Write out.txt", home=home.path, stdin="once\n")
    assert done.returncode == 0, done.stderr
    [first] = re.findall(r"run (run-[0-9a-f]{12})", done.stdout)
    waiting = run_cli("run", "clerk", "Write it again", "--unattended", home=home.path)
    [second] = re.findall(r"run (run-[0-9a-f]{12})", waiting.stdout)
    # the hint offers every answer on offer (write outside developer mode: once, always, refuse)
    assert re.search(r"apollia-os pending decide pd-\S+ once\|always\|refuse`", waiting.stdout), waiting.stdout

    listed = run_cli("runs", "list", "--json", home=home.path)
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)
    assert [(r["run_id"], r["agent"], r["kind"], r["status"]) for r in runs] == [
        (first, "clerk", "task", "completed"), (second, "clerk", "task", "open")]
    assert all(r["started_at"].endswith("Z") and r["entries"] > 3 for r in runs)
    assert runs[0]["finished_at"] is not None and runs[1]["finished_at"] is None
    text = run_cli("runs", "list", home=home.path).stdout.splitlines()
    assert text[0].split() == ["RUN", "AGENT", "KIND", "STATUS", "STARTED", "ENTRIES"]  # the header
    assert len(text) == 3 and text[1].split()[:4] == [first, "clerk", "task", "completed"]
    assert text[1].endswith(f"{runs[0]['entries']} entries")


def test_runs_list_on_a_home_without_a_journal_yet_says_so(tmp_path):
    out = run_cli("runs", "list", home=tmp_path / "fresh")
    assert out.returncode == 0 and out.stdout.strip() == "no runs yet"


def test_percent_apollia_runs_lists_the_runs_of_the_journal(ip):
    ip.run_cell_magic("apollia", "agent", manifest())
    task = ip.run_cell_magic("apollia", "task clerk", "say done").join(10)
    report = ip.run_line_magic("apollia", "runs")
    assert [(r["run_id"], r["agent"], r["status"]) for r in report.data] == [(task.run_id, "clerk", "completed")]
    plain = report._repr_mimebundle_()["text/plain"]
    assert task.run_id in plain and "1 run(s)" in plain


def test_consents_grant_and_revoke_from_a_notebook(ip):
    ip.run_cell_magic("apollia", "agent", WRITE)
    granted = ip.run_line_magic("apollia", "consents grant clerk write")
    assert granted.data["agent"] == "clerk" and granted.data["family"] == "write"
    listed = ip.run_line_magic("apollia", "consents")
    assert [(c["agent"], c["family"]) for c in listed.data] == [("clerk", "write")]
    task = ip.run_cell_magic("apollia", "task clerk --unattended", "write").join(10)
    assert task.status == "completed"  # the standing consent answered: nothing asked
    ip.run_line_magic("apollia", "consents revoke clerk write")
    assert ip.run_line_magic("apollia", "consents").data == []
    with pytest.raises(ApolliaMagicError) as bad:
        ip.run_line_magic("apollia", "consents grant clerk")
    assert "AGENT FAMILY" in str(bad.value)
    with pytest.raises(ApolliaMagicError) as unknown:
        ip.run_line_magic("apollia", "consents grant clerk flying")
    assert unknown.value.code in ("BAD_INPUT", "BAD_FAMILY", "UNKNOWN_FAMILY")
    with pytest.raises(ApolliaMagicError) as none:
        ip.run_line_magic("apollia", "consents revoke clerk write")
    assert none.value.code == "NOT_FOUND"


def test_demo_says_and_does_what_its_home_is(tmp_path):
    shared = tmp_path / "shared"
    helped = run_cli("demo", "--help", home=shared)
    said = " ".join(helped.stdout.split())  # argparse wraps to the terminal's width
    assert "default: a fresh temporary folder; never $APOLLIA_HOME" in said and "default: $APOLLIA_HOME" not in said
    demo = run_cli("demo", home=shared)
    assert demo.returncode == 0, demo.stderr
    assert not shared.exists()  # $APOLLIA_HOME is not the demo's home


def test_an_unknown_provider_names_the_file_line_and_key_and_registers_nothing(home, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "clerk"\n\n[model]\nprovider = "gpt9"\n')
    out = run_cli("agents", "register", str(bad), home=home.path)
    assert out.returncode == 3
    assert f"MANIFEST_INVALID: {bad}:4: unknown provider 'gpt9' for \"model.provider\"" in out.stderr
    assert "expected scripted, openai or anthropic" in out.stderr
    assert not home.runtime_db.exists()
