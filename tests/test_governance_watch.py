"""The governance snapshot is known unchanged from a file watch, and any change is seen at once.

``GovernanceStore.view()`` runs on every tool call. While its ``FileWatch`` is quiet
it makes no ``stat()``; a change by any process to ``governance.db`` or the policy
files fires the watch inside that process's own system call, so the very next
``view()`` reads it — however long ``FULL_CHECK_SECS`` is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from apollia_nb.governance import store as store_module
from apollia_nb.governance.store import GovernanceStore
from apollia_nb.governance.watch import FileWatch
from apollia_nb.home import Home

APOLLIA = [sys.executable, "-m", "apollia_nb"]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def cli(*args: str, home: Path) -> None:
    done = subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    cli("rules", "add", "bash_executor", "--effect", "deny", "--prefix", "rm", home=path)
    return path


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every ``stat()`` the store makes of its files; the stat() comparison made rare."""
    seen: list[str] = []
    real = store_module._stat

    def counting(path: str) -> object:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(store_module, "_stat", counting)
    monkeypatch.setattr(store_module, "FULL_CHECK_SECS", 3600.0)
    yield seen


@linux_only
def test_an_unchanged_snapshot_costs_no_stat(home: Path, stats: list[str]) -> None:
    store = GovernanceStore(Home(home))
    first = store.view()
    stats.clear()
    for _ in range(200):
        assert store.view() is first
    assert stats == []


@linux_only
def test_a_rule_another_process_adds_is_seen_by_the_next_view(home: Path, stats: list[str]) -> None:
    store = GovernanceStore(Home(home))
    assert [r.prefix for r in store.view().rules] == ["rm"]
    cli("rules", "add", "write_file", "--effect", "deny", "--prefix", "secrets/", home=home)
    assert [r.prefix for r in store.view().rules] == ["rm", "secrets/"]
    assert stats  # the watch fired: the files were compared again
    stats.clear()
    store.view()
    assert stats == []  # and a new watch is quiet


@linux_only
def test_a_deleted_or_replaced_governance_db_is_seen_by_the_next_view(home: Path, stats: list[str],
                                                                      tmp_path: Path) -> None:
    store = GovernanceStore(Home(home), expect_db=True)
    assert store.view().readable
    db = home / "governance.db"
    moved = tmp_path / "kept.db"
    os.replace(db, moved)
    view = store.view()
    assert not view.readable and "missing" in view.unreadable_reason
    assert [r.prefix for r in view.rules] == ["rm"]  # the deny rules it had still refuse
    os.replace(moved, db)  # back: readable again
    assert store.view().readable


def test_without_a_watch_the_files_are_compared_on_every_view(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                             stats: list[str]) -> None:
    monkeypatch.setattr("apollia_nb.governance.watch._libc", None)  # no inotify (another system)
    store = GovernanceStore(Home(home))
    store.view()
    stats.clear()
    store.view()
    assert len(stats) == 5
    cli("rules", "add", "write_file", "--effect", "deny", home=home)
    assert len(store.view().rules) == 2


def test_the_files_are_compared_again_after_full_check_secs(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                            stats: list[str]) -> None:
    monkeypatch.setattr(store_module, "FULL_CHECK_SECS", 0.0)
    store = GovernanceStore(Home(home))
    first = store.view()
    stats.clear()
    assert store.view() is first
    assert len(stats) == 5  # compared although the watch is quiet


@linux_only
@pytest.mark.parametrize(
    "change",
    ["write", "touch", "chmod", "delete", "replace", "make the missing file", "make the missing folder",
     "rename away"],
)
def test_a_watch_fires_on_every_change_of_a_watched_name(tmp_path: Path, change: str) -> None:
    present = tmp_path / "governance.db"
    present.write_bytes(b"x")
    missing = tmp_path / "governance.db.wal"
    deeper = tmp_path / "policy" / "organisation.toml"
    watch = FileWatch([str(present), str(missing), str(deeper)])
    assert watch.armed and watch.quiet()
    (tmp_path / "journal.log").write_bytes(b"other files come and go")  # not watched: still quiet
    (tmp_path / "journal.log").unlink()
    assert watch.quiet()
    if change == "write":
        with present.open("ab") as f:
            f.write(b"y")
    elif change == "touch":
        os.utime(present, ns=(1, 1))
    elif change == "chmod":
        present.chmod(0o600)
    elif change == "delete":
        present.unlink()
    elif change == "replace":
        (tmp_path / "new").write_bytes(b"z")
        os.replace(tmp_path / "new", present)
    elif change == "make the missing file":
        missing.write_bytes(b"")
    elif change == "make the missing folder":
        deeper.parent.mkdir()
    else:
        os.replace(present, tmp_path / "elsewhere")
    assert not watch.quiet()
    assert not watch.quiet()  # and it stays fired
    watch.close()


@linux_only
def test_a_path_through_a_symbolic_link_is_never_watched(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    watch = FileWatch([str(tmp_path / "link" / "governance.db")])
    assert not watch.armed and not watch.quiet()


@linux_only
def test_closing_the_store_stops_watching_and_a_later_view_still_sees_changes(home: Path, stats: list[str]) -> None:
    store = GovernanceStore(Home(home))
    store.view()
    watch = store._cached.watch  # type: ignore[union-attr]
    assert watch is not None and watch.armed
    fd = watch._fd
    store.close()
    assert not watch.armed
    with pytest.raises(OSError):
        os.fstat(fd)  # the inotify instance is given back (a user has only so many)
    cli("rules", "add", "write_file", "--effect", "deny", home=home)
    assert len(store.view().rules) == 2


@linux_only
def test_a_forked_child_never_reads_its_parents_watch(tmp_path: Path) -> None:
    """The child shares the parent's inotify queue: reading it would hide a change from the parent."""
    path = tmp_path / "governance.db"
    path.write_bytes(b"x")
    watch = FileWatch([str(path)])
    assert watch.quiet()
    pid = os.fork()
    if pid == 0:  # the child: changes the file and asks its copy of the watch
        code = 0
        try:
            with path.open("ab") as f:
                f.write(b"y")
            code = 3 if watch.quiet() else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not watch.quiet()  # the parent still got the event
