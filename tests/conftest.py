"""Shared fixtures: a fresh home per test, the anyio backend, manifests.

The suite runs in worker processes (pytest-xdist, ``dev/test.sh``) as well as in one process
(``-n 0``). Each process gets its own IPython, Jupyter and matplotlib folders (none of the user's
``~/.ipython``, ``~/.jupyter`` or ``~/.cache`` is read or written), and what is built once for the
whole run -- the wheel and a virtual environment holding it -- is built by the first worker that
needs it, under a lock, in a folder every worker of the run shares.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Where a Jupyter kernel, an IPython shell or matplotlib would write under the user's HOME.
_PROCESS_DIRS = {"IPYTHONDIR": "ipython", "JUPYTER_CONFIG_DIR": "jupyter-config",
                 "JUPYTER_DATA_DIR": "jupyter-data", "JUPYTER_RUNTIME_DIR": "jupyter-runtime"}
_saved_env: dict[str, str | None] = {}
_scratch: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """This process's own IPython and Jupyter folders; matplotlib's font cache is shared by a run's
    workers (it locks its own cache), which inherit the folder from the process that starts them."""
    scratch = tempfile.mkdtemp(prefix="apollia-tests-")
    _scratch.append(scratch)
    wanted = {name: os.path.join(scratch, sub) for name, sub in _PROCESS_DIRS.items()}
    if "PYTEST_XDIST_WORKER" not in os.environ:
        wanted["MPLCONFIGDIR"] = os.path.join(scratch, "matplotlib")
    for name, value in wanted.items():
        _saved_env.setdefault(name, os.environ.get(name))
        os.environ[name] = value


_ROOT = Path(__file__).resolve().parents[1]
_untracked_at_start: set[str] | None = None


def _untracked_in_root() -> set[str] | None:
    """Untracked files directly in the checkout's root or in ``tests/`` (None: not a git checkout)."""
    import subprocess

    if not (_ROOT / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(_ROOT), "status", "--porcelain", "-z", "--untracked-files=normal"],
                             capture_output=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = set()
    for line in out.decode("utf-8", "surrogateescape").split("\0"):
        path = line[3:]
        if line.startswith("?? ") and (path.rstrip("/").count("/") == 0 or
                                        (path.startswith("tests/") and path.rstrip("/").count("/") == 1)):
            found.add(path)
    return found


def pytest_sessionstart(session: pytest.Session) -> None:
    global _untracked_at_start
    # the run's own process (it finishes after every worker); an xdist worker has workerinput, while
    # PYTEST_XDIST_WORKER is also inherited by any pytest a test starts in a subprocess
    if not hasattr(session.config, "workerinput"):
        _untracked_at_start = _untracked_in_root()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test that wrote into the checkout (a workspace of ".", a relative path, no tmp_path) fails the run."""
    if _untracked_at_start is None:
        return
    after = _untracked_in_root()
    gained = sorted((after or set()) - _untracked_at_start)
    if gained:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = (f"the run left new untracked files in the checkout ({', '.join(gained)}): a test wrote "
                   "where it was started instead of its tmp_path (a workspace root of '.' with no "
                   "monkeypatch.chdir, or a relative path)")
        if reporter is not None:
            reporter.write_line(f"ERROR: {message}", red=True)
        else:
            print(f"ERROR: {message}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    for name, value in _saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _saved_env.clear()
    for scratch in _scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    _scratch.clear()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding a slow test first, each file's tests in their own order: the workers start the
    longest files first, so that none of them is left running alone at the end of the run."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


def _run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every worker of this run shares (the run's own base folder when there are none)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


@contextlib.contextmanager
def _run_lock(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """Hold an exclusive lock shared by this run's workers; yields the run's shared folder."""
    shared = _run_dir(tmp_path_factory)
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield shared
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
def tree_build_lock(tmp_path_factory):
    """Hold it while building this checkout (``pip wheel``/``pip install`` of the root run the panel's Node
    build in ``labextension/`` when it looks stale) or while making the panel look stale: one at a time."""
    return lambda: _run_lock(tmp_path_factory, "tree-build")


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory, tree_build_lock):
    """The project's wheel, built once per test run as a release is (with the panel's Node build):
    the first worker that needs it builds it, the others wait for it and read the same file."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    with tree_build_lock() as shared:
        dist = shared / "dist"
        if not (shared / "dist.done").exists():  # never built, or a build that failed: (again) from scratch
            shutil.rmtree(dist, ignore_errors=True)
            dist.mkdir()
            built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                                    "--disable-pip-version-check", str(root), "-w", str(dist)],
                                   capture_output=True, text=True, timeout=600, cwd=dist)
            assert built.returncode == 0, built.stdout + built.stderr
            (shared / "dist.done").touch()
    [wheel] = dist.glob("apollia_nb-*.whl")
    return wheel


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory, built_wheel):
    """A fresh virtual environment holding the built wheel and its dependencies (from pip's cache), as a
    user's: made once per test run, like the wheel, and only read by the tests that use it."""
    import subprocess
    import sys

    with _run_lock(tmp_path_factory, "wheel-venv") as shared:
        venv = shared / "wheel-venv" / "venv"  # made where it stays: a virtual environment cannot be moved
        if not (shared / "wheel-venv.done").exists():
            shutil.rmtree(venv.parent, ignore_errors=True)
            venv.parent.mkdir()
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
            installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                                        "--disable-pip-version-check", str(built_wheel)],
                                       capture_output=True, text=True, timeout=900, env=env)
            assert installed.returncode == 0, installed.stdout + installed.stderr
            (shared / "wheel-venv.done").touch()
    return venv

