"""docs/drive-it-from-your-product.md runs: its Python blocks, in order, against a real `apollia-os serve`.

Each block's printed output must be the ``text`` block that follows it in the
guide, except where the guide says the output varies from run to run (the
event stream, whose intermediate states depend on timing: there only the
final line is checked).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "drive-it-from-your-product.md"


def blocks() -> list[tuple[str, str | None]]:
    """(python code, the text block right after it or None)."""
    found = re.findall(r"```(python|text)\n(.*?)```", GUIDE.read_text(), flags=re.S)
    out: list[tuple[str, str | None]] = []
    for kind, body in found:
        if kind == "python":
            out.append((body, None))
        elif out and out[-1][1] is None:
            out[-1] = (out[-1][0], body)
    return out


@pytest.fixture
def served_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("APOLLIA_HOME", str(home))
    proc = subprocess.Popen([sys.executable, "-m", "apollia_nb", "serve"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ})
    try:
        assert proc.stdout.readline().startswith("apollia-os serve: listening on http://127.0.0.1:")
        yield tmp_path
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        proc.stdout.close()
        proc.stderr.close()


def test_the_guide_runs_and_prints_what_it_shows(served_home):
    namespace: dict[str, object] = {"__name__": "guide"}
    found = blocks()
    assert len(found) >= 9
    for code, expected in found:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(GUIDE), "exec"), namespace)
        got = out.getvalue()
        assert expected is not None, f"no output shown after:\n{code}"
        if "task_events" in code:
            assert got.splitlines()[-1] == expected.splitlines()[-1], got
            assert all(line.startswith("task ") for line in got.splitlines()), got
        else:
            assert got == expected, f"{code}\nprinted:\n{got}"
    assert (served_home / "notes" / "summary.txt").read_text() == "ok"
