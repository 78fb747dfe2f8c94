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
