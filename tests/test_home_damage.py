"""A damaged database file of the home is a coded refusal naming the file and its repair, never a traceback.

One home made by the real CLI (``apollia-os demo``), copied for each case; then one byte of
``journal.db``, ``runtime.db`` or ``governance.db`` flipped in its header, its first block, its
middle or its end, or the file cut in half or emptied. ``apollia-os serve`` and ``apollia-os audit
verify`` run as subprocesses, the owner ``Runtime`` opens in this process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from apollia_nb.errors import GovernanceUnreadable, HomeFileCorrupt
from apollia_nb.home import damage_error, is_damage
from apollia_nb.runtime import Runtime

APOLLIA = [sys.executable, "-m", "apollia_nb"]
PLACES = ["header", "first_block", "middle", "end", "cut_in_half", "empty"]
HEADERS = 3 * 4096  # a DuckDB file's main and database headers, before its first block


def damage(path: Path, where: str) -> None:
    size = path.stat().st_size
    if where == "empty":
        path.write_bytes(b"")
        return
    if where == "cut_in_half":
        os.truncate(path, size // 2)
        return
    offset = {"header": 8, "first_block": HEADERS + 100, "middle": size // 2 + 100, "end": size - 100}[where]
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def refused(done: subprocess.CompletedProcess[str], code: str, *words: str) -> str:
    """The one line a refused command prints: ``error: CODE: message``, exit 3, no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 3, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {code}: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True, timeout=120,
                          cwd=home.parent)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home used as a user would: agents, a task, decisions (every file has data in several blocks)."""
    home = tmp_path_factory.mktemp("made") / "home"
    done = cli("demo", home=home)
    assert done.returncode == 0, done.stderr
    return home


@pytest.fixture
def copy(made: Path, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    shutil.copytree(made, home)
    return home


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize("name", ["journal.db", "runtime.db"])
def test_serve_refuses_a_damaged_file_with_one_coded_line(copy: Path, name: str, where: str) -> None:
    damage(copy / name, where)
    before = (copy / name).read_bytes()
    serve = subprocess.run([*APOLLIA, "serve", "--home", str(copy), "--port", "0"], capture_output=True,
                           text=True, timeout=120, cwd=copy.parent)
    refused(serve, "HOME_FILE_CORRUPT", str(copy / name), "nothing was changed", "from a backup",
            "apollia-os home repair")
    assert serve.stdout == "" and not (copy / "server.json").exists()
    assert (copy / name).read_bytes() == before  # nothing was written to it


@pytest.mark.parametrize("where", PLACES)
def test_audit_verify_refuses_a_damaged_journal_with_one_coded_line(copy: Path, where: str) -> None:
    damage(copy / "journal.db", where)
    refused(cli("audit", "verify", home=copy), "HOME_FILE_CORRUPT", str(copy / "journal.db"),
            "apollia-os home repair --archive-journal")


@pytest.mark.parametrize("where", PLACES)
def test_audit_verify_does_not_read_runtime_or_governance_db(copy: Path, where: str) -> None:
    damage(copy / "runtime.db", where)
    damage(copy / "governance.db", where)
    done = cli("audit", "verify", home=copy)
    assert done.returncode == 0 and done.stdout.startswith("ok:"), done.stderr


@pytest.mark.anyio
@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize("name", ["journal.db", "runtime.db"])
async def test_the_owner_runtime_open_raises_home_file_corrupt(copy: Path, name: str, where: str) -> None:
    damage(copy / name, where)
    with pytest.raises(HomeFileCorrupt) as raised:
        async with Runtime(copy):
            pass
    assert str(copy / name) in raised.value.message
    assert raised.value.code == "HOME_FILE_CORRUPT" and raised.value.http_status == 503


@pytest.mark.anyio
@pytest.mark.parametrize("where", PLACES)
async def test_a_damaged_governance_db_fails_closed_naming_the_file(copy: Path, where: str) -> None:
    damage(copy / "governance.db", where)
    async with Runtime(copy) as rt:
        view = rt.governance.view()
        assert not view.readable
        assert "governance.db" in view.unreadable_reason
        with pytest.raises(GovernanceUnreadable, match="governance.db"):
            rt.governance.set_developer_mode(True, by="ops")


@pytest.mark.parametrize("where", ["middle", "end"])
def test_a_rows_block_that_does_not_read_is_found_by_a_later_read_as_damage(copy: Path, where: str) -> None:
    """What a running server or command meets when DuckDB reads a damaged block late: a real DuckDB
    error, classified as damage and named; other DuckDB errors are not."""
    path = copy / "runtime.db"
    damage(path, where)
    con = duckdb.connect(str(path), read_only=True)
    try:
        errors = []
        for table in ("agents", "tasks"):
            for sql in (f"SELECT bit_xor(hash(COLUMNS(*))) FROM {table}",
                        f"SELECT count(*) FROM {table} WHERE id IN (SELECT id FROM {table})"
                        if table == "tasks" else "SELECT count(*) FROM agents WHERE name IN (SELECT name FROM agents)"):
                try:
                    con.execute(sql).fetchall()
                except duckdb.Error as exc:
                    errors.append(exc)
        assert errors, "the damaged block was not read"
        found = damage_error(errors[0], path)
        assert isinstance(found, HomeFileCorrupt) and str(path) in found.message
        with pytest.raises(duckdb.Error) as other:
            con.execute("SELECT * FROM no_such_table")
        assert not is_damage(other.value) and damage_error(other.value, path) is None
    finally:
        con.close()
