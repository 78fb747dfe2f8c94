"""The type checker holds the whole package, and the two homes to one contract.

``mypy`` (configured in ``pyproject.toml``) checks every module of ``apollia_nb``
with no error code disabled. The owner's ``Journal``/``GovernanceStore``/
``RuntimeRecords`` and the client's ``RemoteJournal``/``RemoteGovernance`` are each
assigned to their face in ``Runtime`` (``journal/contract.py``,
``governance/contract.py``, ``runtime/capabilities.py``), and ``Runtime`` is
checked against each narrow face it hands itself as (``GovernedHost``,
``TaskHost``, ``ChatHost`` ...). A ``# type: ignore`` names its error code and
says why on its line.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mypy")


def test_the_whole_package_type_checks() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(ROOT / ".mypy_cache")],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout


def test_the_checker_is_given_the_whole_package_and_no_disabled_code() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["files"] == ["apollia_nb"]
    assert "disable_error_code" not in config
    assert all("disable_error_code" not in o for o in config.get("overrides", []))


def test_every_ignore_names_its_code() -> None:
    bare = []
    for path in sorted((ROOT / "apollia_nb").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for found in re.finditer(r"#\s*type:\s*ignore(\[[a-z-]+(?:,\s*[a-z-]+)*\])?(.*)", line):
                if found.group(1) is None:
                    bare.append(f"{path.relative_to(ROOT)}:{number} names no code")
    assert bare == []
