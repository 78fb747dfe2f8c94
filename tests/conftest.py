"""Shared fixtures: a fresh home per test, the anyio backend, manifests."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh, empty home; the working directory is a scratch folder beside it."""
    from apollia_nb.home import Home

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("APOLLIA_HOME", str(tmp_path / "home"))
    return Home.at(tmp_path / "home")


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory):
    """The project's wheel, built once per test session as a release is (with the panel's Node build)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "--disable-pip-version-check", str(root), "-w", str(dist)],
                           capture_output=True, text=True, timeout=600, cwd=dist)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = dist.glob("apollia_nb-*.whl")
    return wheel


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory, built_wheel):
    """A fresh virtual environment holding the built wheel and its dependencies (from pip's cache), as a user's."""
    import os
    import subprocess
    import sys

    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                                str(built_wheel)], capture_output=True, text=True, timeout=900, env=env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return venv
