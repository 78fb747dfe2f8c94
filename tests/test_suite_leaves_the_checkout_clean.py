"""A test run that leaves new untracked files in the checkout's root or in ``tests/`` fails, naming
them (a test wrote where the run started instead of its ``tmp_path``); files that were there before
the run, files deeper in the tree, and a copy that is no git checkout do not fail it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")


def _checkout(tmp_path: Path, *, git: bool = True) -> Path:
    root = tmp_path / "checkout"
    (root / "tests").mkdir(parents=True)
    shutil.copy(CONFTEST, root / "tests" / "conftest.py")
    (root / ".gitignore").write_text(".pytest_cache/\n__pycache__/\n")
    if git:
        subprocess.run(["git", "init", "-q", str(root)], check=True, timeout=60)
        subprocess.run(["git", "-C", str(root), "add", "."], check=True, timeout=60)
        subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org", "commit",
                        "-q", "-m", "tracked"], check=True, timeout=60)
    return root


def _run(root: Path, body: str) -> subprocess.CompletedProcess[str]:
    (root / "tests" / "test_it.py").write_text(f"from pathlib import Path\n\n\ndef test_it():\n    {body}\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                           "-n", "0", "tests/test_it.py"], cwd=root, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("where", ["a.txt", "tests/f0.txt", "made/"])
def test_a_file_a_test_writes_into_the_checkout_fails_the_run_and_is_named(tmp_path, where):
    root = _checkout(tmp_path)
    write = (f"Path({where!r}).mkdir(); Path({where!r}, 'x').write_text('b')" if where.endswith("/")
             else f"Path({where!r}).write_text('b')")
    out = _run(root, write)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 passed" in out.stdout and f"new untracked files in the checkout ({where})" in out.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_files_there_before_deeper_down_or_in_tmp_path_do_not_fail_it(tmp_path):
    root = _checkout(tmp_path)
    (root / "notes.txt").write_text("mine")  # untracked before the run
    (root / "tests" / "data").mkdir()
    (root / "tests" / "data" / "kept.txt").write_text("x")  # an untracked folder in tests/, before
    out = _run(root, "Path('notes.txt').write_text('changed'); Path('tests/data/new.txt').write_text('x')")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "untracked" not in out.stdout


def test_a_copy_that_is_no_git_checkout_is_not_checked(tmp_path):
    root = _checkout(tmp_path, git=False)
    out = _run(root, "Path('a.txt').write_text('b')")
    assert out.returncode == 0, out.stdout + out.stderr
