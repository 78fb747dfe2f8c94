"""The `duckdb` command-line client an auditor installs (`pip install duckdb-cli`, 1.5.x) opens the journal.

A real run (`apollia-os demo`) writes a home; the real `duckdb` binary then
opens its `journal.db` read-only and an exported bundle through `views.sql`,
and every view must give the rows the library's own DuckDB gives.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from apollia_nb.journal.views import VIEW_NAMES

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def duckdb_cli() -> str:
    found = Path(sys.executable).with_name("duckdb")
    path = str(found) if found.exists() else shutil.which("duckdb")
    assert path, "the duckdb command-line client is missing: pip install 'duckdb-cli>=1.5,<1.6'"
    return path


def cli(*args: str, script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([duckdb_cli(), *args], input=script, capture_output=True, text=True, cwd=cwd,
                          timeout=60)


def rows(con: duckdb.DuckDBPyConnection, view: str) -> list[dict]:
    """The view as the CLI's `-json` prints it: times and everything else as their text."""
    cur = con.execute(f"SELECT * FROM {view}")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def cli_rows(out: str) -> list[dict]:
    return json.loads(out) if out.strip() else []


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("duck") / "home"
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_TOKEN"}
    done = subprocess.run([*APOLLIA, "demo", "--home", str(home)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return home


def test_the_cli_is_a_1_x_release():
    out = subprocess.run([duckdb_cli(), "--version"], capture_output=True, text=True, timeout=30)
    assert out.stdout.startswith("v1."), out.stdout  # older than the library: the case the format is chosen for


def compare(view: str, out: subprocess.CompletedProcess[str], expected: list[dict]) -> None:
    assert out.returncode == 0, out.stderr
    got = cli_rows(out.stdout)
    assert len(got) == len(expected), view
    for g, e in zip(got, expected, strict=True):
        assert set(g) == set(e), view
        for name, value in e.items():
            if isinstance(value, (int, str)) and not isinstance(value, bool) and name != "payload":
                assert g[name] == value, (view, name)


def test_journal_db_opens_in_the_cli(demo_home):
    db = demo_home / "journal.db"
    con = duckdb.connect(str(db), read_only=True)
    try:
        expected = {view: rows(con, view) for view in VIEW_NAMES}
    finally:
        con.close()
    assert len(expected["journal"]) > 20 and any(r["answer"] == "once" for r in expected["decisions"])
    for view in VIEW_NAMES:
        out = cli("-readonly", "-json", str(db), script=f"SELECT * FROM {view};\n", cwd=demo_home)
        compare(view, out, expected[view])
    raw = cli("-readonly", "-json", str(db), cwd=demo_home,
              script="SELECT seq, hex(hash) AS h, octet_length(signature) AS s FROM entries ORDER BY seq;\n")
    assert raw.returncode == 0, raw.stderr
    assert [r["s"] for r in cli_rows(raw.stdout)] == [64] * len(expected["journal"])
    assert [r["h"].lower() for r in cli_rows(raw.stdout)] == [r["hash"] for r in expected["journal"]]


def test_a_bundle_opens_in_the_cli(demo_home, tmp_path, monkeypatch):
    bundle = tmp_path / "bundle"
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_TOKEN"}
    done = subprocess.run([*APOLLIA, "audit", "export", str(bundle), "--home", str(demo_home)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    monkeypatch.chdir(bundle)  # views.sql names the Parquet files relative to the bundle
    con = duckdb.connect(":memory:")
    try:
        con.execute((bundle / "views.sql").read_text())
        expected = {view: rows(con, view) for view in VIEW_NAMES}
    finally:
        con.close()
    for view in VIEW_NAMES:
        out = cli("-json", script=f".read views.sql\nSELECT * FROM {view};\n", cwd=bundle)
        compare(view, out, expected[view])
    assert any(r["answer"] == "once" for r in expected["decisions"])
    cps = cli("-json", script=".read views.sql\nSELECT size, octet_length(root) AS n FROM checkpoints;\n", cwd=bundle)
    assert cps.returncode == 0 and all(r["n"] == 32 for r in cli_rows(cps.stdout)), cps.stderr
