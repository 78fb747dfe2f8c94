"""The type checker holds the two homes to one contract.

``mypy`` (configured in ``pyproject.toml``) checks the runtime and the home's
stores: the owner's ``Journal``/``GovernanceStore``/``RuntimeRecords`` and the
client's ``RemoteJournal``/``RemoteGovernance`` are each assigned to their face
in ``Runtime`` (``journal/contract.py``, ``governance/contract.py``,
``runtime/capabilities.py``), and ``Runtime`` is checked against each narrow
face it hands itself as (``GovernedHost``, ``TaskHost``, ``ChatHost`` ...).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mypy")


def test_the_runtime_and_the_stores_keep_their_faces() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(ROOT / ".mypy_cache")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout
