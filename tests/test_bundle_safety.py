"""An audit bundle cannot run anything on the auditor's machine.

A real home (`apollia-os demo`) is exported; each test alters a copy of the bundle the way a
hostile author could (dot-commands in any case, writes, attaches, installs, reads of the
auditor's files, a redefined view, a changed README, links and pipes in place of files) and
`apollia-os audit verify --bundle` must fail with `BUNDLE_FILE_ALTERED` naming the file. The
documented query workflow takes the views from the auditor's own install, and the real
`duckdb` command-line client proves that a tampered `views.sql` no longer runs through it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

APOLLIA = [sys.executable, "-m", "apollia_nb"]
ENV = {k: v for k, v in os.environ.items() if k != "APOLLIA_TOKEN"}


def run(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APOLLIA, *args], check=False, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=timeout)


def duckdb_cli() -> str:
    found = Path(sys.executable).with_name("duckdb")
    path = str(found) if found.exists() else shutil.which("duckdb")
    assert path, "the duckdb command-line client is missing: pip install 'duckdb-cli>=1.5,<1.6'"
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    place = tmp_path_factory.mktemp("bundle-safety")
    done = run("demo", "--home", str(place / "home"))
    assert done.returncode == 0, done.stderr
    out = run("audit", "export", "--home", str(place / "home"), str(place / "bundle"))
    assert out.returncode == 0, out.stderr
    return place / "bundle"


@pytest.fixture
def bundle(exported, tmp_path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(exported, copy)
    return copy


def verify(bundle: Path, *extra: str, timeout: float = 120) -> tuple[int, dict]:
    out = run("audit", "verify", "--bundle", str(bundle), "--json", *extra, timeout=timeout)
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


def refused(bundle: Path, name: str) -> dict:
    code, data = verify(bundle)
    assert code == 1 and data["ok"] is False, data
    assert data["code"] == "BUNDLE_FILE_ALTERED" and data["file"] == name, data
    assert name in data["problem"]
    text = run("audit", "verify", "--bundle", str(bundle))
    assert text.returncode == 1 and text.stdout.startswith(f"FAILED: BUNDLE_FILE_ALTERED: {name}"), text.stdout
    return data


def test_an_exported_bundle_verifies_and_its_views_are_this_installs(bundle):
    code, data = verify(bundle)
    assert code == 0 and data["ok"] and data["entries"] > 20, data
    views = run("audit", "views")
    assert views.returncode == 0 and views.stdout == (bundle / "views.sql").read_text(encoding="utf-8")
    assert run("audit", "views", "--json").stdout.strip().startswith("{")


# Each of these, appended to views.sql, would run (or redirect, write, attach, install, read)
# under `duckdb -init views.sql`.
APPENDED = {
    "shell": ".shell touch MARKER\n",
    "system": ".system touch MARKER\n",
    "sh": ".sh touch MARKER\n",
    "shell in capitals": ".SHELL touch MARKER\n",
    "shell in mixed case": ".ShElL touch MARKER\n",
    "read another script": ".read other.sql\n",
    "output to a file": ".output ../overwritten.txt\nSELECT 1;\n",
    "once to a file": ".once ../overwritten.txt\nSELECT 1;\n",
    "attach a database": "ATTACH '../attached.db' AS a;\nCREATE TABLE a.t AS SELECT 1;\n",
    "copy to a file": "COPY (SELECT 1) TO '../copied.csv';\n",
    "install an extension": "INSTALL httpfs;\n",
    "load an extension": "LOAD httpfs;\n",
    "read the auditor's files": "CREATE OR REPLACE VIEW journal AS SELECT * FROM read_text('~/.ssh/*');\n",
    "redefine a view": "CREATE OR REPLACE VIEW decisions AS SELECT * FROM entry_fields WHERE false;\n",
    "a comment only": "-- nothing here\n",
    "an empty line": "\n",
}


@pytest.mark.parametrize("case", sorted(APPENDED))
def test_anything_added_to_views_sql_fails_verify(bundle, case):
    with (bundle / "views.sql").open("a", encoding="utf-8") as f:
        f.write(APPENDED[case])
    refused(bundle, "views.sql")


def test_views_sql_changed_inside_or_cut_fails_verify(bundle):
    original = (bundle / "views.sql").read_text(encoding="utf-8")
    changes = {
        "a view redefined in place": original.replace("WHERE d.kind = 'decision'", "WHERE false"),
        "a dot-command first": ".shell touch MARKER\n" + original,
        "carriage returns": original.replace("\n", "\r\n"),
        "cut short": original[: len(original) // 2],
        "emptied": "",
    }
    for text in changes.values():
        (bundle / "views.sql").write_bytes(text.encode("utf-8"))
        refused(bundle, "views.sql")


def test_a_changed_readme_fails_verify(bundle):
    original = (bundle / "README.md").read_text(encoding="utf-8")
    assert 'duckdb -cmd "$(apollia-os audit views --bundle .)"' in original
    for text in (original.replace('duckdb -cmd "$(apollia-os audit views --bundle .)"', "duckdb -init setup.sql"),
                 original + "\nThen run `sh check.sh`.\n",
                 original.replace("apollia-os audit verify --bundle .", "apollia-os audit verify --bundle /")):
        (bundle / "README.md").write_text(text, encoding="utf-8")
        refused(bundle, "README.md")


def test_the_other_files_the_readme_names_are_checked_too(bundle):
    meta = json.loads((bundle / "meta.json").read_text())
    for key, value in (("entries", meta["entries"] - 1), ("head_hash", "0" * 64), ("origin", "elsewhere/log"),
                       ("key_id", "0" * 16), ("checkpoints", meta["checkpoints"] + 1), ("entries", True)):
        (bundle / "meta.json").write_text(json.dumps({**meta, key: value}, indent=2) + "\n")
        refused(bundle, "meta.json")
    (bundle / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    note = (bundle / "checkpoint.txt").read_text()
    (bundle / "checkpoint.txt").write_text(note + "\u2014 extra AAAA\n")
    refused(bundle, "checkpoint.txt")
    (bundle / "checkpoint.txt").write_text(note)
    vkey = (bundle / "journal.vkey").read_text()
    (bundle / "journal.vkey").write_text(vkey + "more\n")
    refused(bundle, "journal.vkey")
    (bundle / "journal.vkey").write_text(vkey)
    pub = (bundle / "journal.pub").read_text()
    (bundle / "journal.pub").write_text("  " + pub)
    refused(bundle, "journal.pub")
    (bundle / "journal.pub").write_text(pub)
    assert verify(bundle)[0] == 0  # every file put back: it verifies again


def test_links_folders_and_pipes_are_refused_before_anything_reads_them(bundle, tmp_path):
    same = tmp_path / "views-copy.sql"
    shutil.copy(bundle / "views.sql", same)
    (bundle / "views.sql").unlink()
    (bundle / "views.sql").symlink_to(same)  # even with the right bytes behind it
    refused(bundle, "views.sql")
    (bundle / "views.sql").unlink()
    shutil.copy(same, bundle / "views.sql")
    shutil.move(bundle / "README.md", tmp_path / "README.md")
    (bundle / "README.md").mkdir()
    refused(bundle, "README.md")
    (bundle / "README.md").rmdir()
    shutil.move(tmp_path / "README.md", bundle / "README.md")
    for name in ("meta.json", "entries.parquet"):  # a pipe would hold a reader forever
        shutil.move(bundle / name, tmp_path / name)
        os.mkfifo(bundle / name)
        code, data = verify(bundle, timeout=60)
        assert code == 1 and data["code"] == "BUNDLE_FILE_ALTERED" and data["file"] == name, data
        (bundle / name).unlink()
        shutil.move(tmp_path / name, bundle / name)
    assert verify(bundle)[0] == 0


def test_a_bundle_without_its_conveniences_still_verifies(bundle):
    (bundle / "views.sql").unlink()
    (bundle / "README.md").unlink()
    code, data = verify(bundle)
    assert code == 0 and data["ok"], data


def test_the_documented_query_runs_nothing_a_tampered_bundle_brought(bundle):
    """The real duckdb CLI: the workflow the README documents takes the views from this install."""
    (bundle / "views.sql").write_text(
        (bundle / "views.sql").read_text(encoding="utf-8")
        + ".shell touch MARKER\nCREATE OR REPLACE VIEW decisions AS SELECT * FROM entry_fields WHERE false;\n",
        encoding="utf-8")
    assert verify(bundle)[0] == 1
    # the README's command, through a real shell, in the bundle's folder
    readme = (bundle / "README.md").read_text(encoding="utf-8")
    command = 'duckdb -cmd "$(apollia-os audit views --bundle .)"'
    assert command in readme
    apollia = " ".join(f"'{a}'" for a in APOLLIA)
    line = command.replace("duckdb", f"'{duckdb_cli()}'", 1).replace("apollia-os", apollia)
    out = subprocess.run(["bash", "-c", line + " -json -c 'SELECT count(*) AS n FROM decisions'"],
                         check=False, capture_output=True, text=True, cwd=bundle, env=ENV, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["n"] >= 1  # the real decisions, not the bundle's empty view
    assert not (bundle / "MARKER").exists()
    # from another folder, by absolute path
    sql = run("audit", "views", "--bundle", str(bundle)).stdout
    out = subprocess.run([duckdb_cli(), "-json", "-cmd", sql, "-c", "SELECT count(*) AS n FROM runs"],
                         check=False, capture_output=True, text=True, cwd=bundle.parent, timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout)[0]["n"] >= 1, out.stderr
    assert not (bundle / "MARKER").exists() and not (bundle.parent / "MARKER").exists()
    # control: the tampered file would have run under `duckdb -init views.sql`
    subprocess.run([duckdb_cli(), "-init", "views.sql", "-c", "SELECT 1"], check=False, capture_output=True, text=True,
                   cwd=bundle, timeout=120)
    assert (bundle / "MARKER").exists()


def test_audit_views_names_a_bundle_or_refuses(tmp_path, bundle):
    out = run("audit", "views", "--bundle", str(tmp_path / "nothing"))
    assert out.returncode == 3 and "NOT_FOUND" in out.stderr, out
    odd = tmp_path / "odd\nname"
    shutil.copytree(bundle, odd)
    out = run("audit", "views", "--bundle", str(odd))
    assert out.returncode == 3 and "BAD_INPUT" in out.stderr, out
    quoted = tmp_path / "it's here"
    shutil.copytree(bundle, quoted)
    sql = run("audit", "views", "--bundle", str(quoted)).stdout
    out = subprocess.run([duckdb_cli(), "-json", "-cmd", sql, "-c", "SELECT count(*) AS n FROM journal"],
                         check=False, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0 and json.loads(out.stdout)[0]["n"] > 20, out.stderr
