"""The home: resolution order, creation, and one owner process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from apollia_nb.errors import HomeLocked
from apollia_nb.home import Home, OwnerLock, resolve_home


def test_explicit_home_wins_over_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("APOLLIA_HOME", str(tmp_path / "env"))
    assert resolve_home(tmp_path / "flag") == (tmp_path / "flag").resolve()


def test_environment_used_when_no_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("APOLLIA_HOME", str(tmp_path / "env"))
    assert resolve_home(None) == (tmp_path / "env").resolve()


def test_default_is_dot_apollia_in_user_home(tmp_path, monkeypatch):
    monkeypatch.delenv("APOLLIA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_home() == (tmp_path / ".apollia").resolve()


def test_missing_home_is_created_private(tmp_path):
    home = Home.at(tmp_path / "a" / "b")
    assert home.path.is_dir() and home.keys_dir.is_dir() and home.policy_dir.is_dir()
    assert oct(os.stat(home.path).st_mode & 0o777) == oct(0o700)
    assert oct(os.stat(home.keys_dir).st_mode & 0o777) == oct(0o700)


def test_second_owner_in_same_process_is_refused(tmp_path):
    home = Home.at(tmp_path)
    with OwnerLock(home):
        with pytest.raises(HomeLocked) as err:
            OwnerLock(home).acquire()
    assert str(os.getpid()) in err.value.message
    assert "apollia-os serve" in err.value.message
    # Released: a new owner can take it.
    OwnerLock(home).acquire().release()


def test_second_process_is_told_who_holds_the_home(tmp_path):
    home = Home.at(tmp_path)
    child = textwrap.dedent(
        f"""
        from apollia_nb.home import Home, OwnerLock
        from apollia_nb.errors import HomeLocked
        try:
            OwnerLock(Home.at({str(tmp_path)!r})).acquire()
        except HomeLocked as exc:
            print(exc.code, exc.message)
        else:
            print("ACQUIRED")
        """
    )
    with OwnerLock(home):
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout
    assert out.startswith("HOME_LOCKED")
    assert f"process {os.getpid()}" in out
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ACQUIRED"
