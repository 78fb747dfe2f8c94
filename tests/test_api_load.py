"""The load benchmark, small: 40 unattended tasks from 8 concurrent clients; the outcomes, not the speed.

Runs ``benchmarks/api_load.py`` (a real ``apollia-os serve`` subprocess, the sync
SDK in threads): readers complete on their own, writers wait on a person,
every decision is answered over HTTP, every task then completes, no journal
entry is lost and the journal verifies over the API and offline.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "api_load.py"


def _load_module():
    spec = importlib.util.spec_from_file_location("api_load", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["api_load"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)
def test_forty_unattended_tasks_from_eight_clients_lose_nothing(tmp_path):
    report = _load_module().run_load(tasks=40, clients=8, root=tmp_path)
    writers = {tid for tid, agent in report.agents.items() if agent == "writer"}
    assert len(report.agents) == 40 and len(writers) == 20
    assert {tid: s for tid, s in report.statuses_settled.items()} == {
        tid: ("waiting" if tid in writers else "completed") for tid in report.agents}
    assert report.pending_before == 20 and report.pending_after == 0
    assert len(report.decide_latencies) == 20
    assert set(report.statuses_final.values()) == {"completed"}
    assert report.run_problems == []
    assert report.verify_ok and report.offline_verify_ok, report.offline_verify_output
    assert report.verify_entries >= 40 * 10
    workspace = tmp_path / "workspace"
    assert (workspace / "out.txt").read_text() == "load"  # each writer's run wrote it once (run_problems)
