"""What ``%load_ext apollia_nb`` leaves for later: in a fresh Python process with a shell configured as a
kernel's, loading the extension opens the home and imports none of the modules the home's opening does
not need (the HTTP stack, the API and its schemas, MCP, widgets' code, dataframes, Dask, plotting, the
verifier), and starts no process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

#: Imported on first use, never by loading the extension.
LAZY = (
    # HTTP, the REST API and its schemas, MCP
    "httpx", "httpx2", "h11", "pydantic", "fastapi", "starlette", "uvicorn", "mcp", "requests", "jinja2",
    # widgets' code (the module itself is only found while the home opens: see deferred.py), data, plots
    "ipywidgets.widgets", "pandas", "dask", "distributed", "PIL", "matplotlib", "cryptography",
    # what looks up a C library by running `ldconfig` in a subprocess
    "ctypes.util",
    # the package's own parts that only a use of them needs
    "apollia_nb.api", "apollia_nb.sdk", "apollia_nb.wire", "apollia_nb.federation", "apollia_nb.cli",
    "apollia_nb.witness", "apollia_nb.journal.verify", "apollia_nb.journal.replay", "apollia_nb.journal.export",
    "apollia_nb.runtime.models", "apollia_nb.runtime.remote", "apollia_nb.runtime.workers",
    "apollia_nb.runtime.dask_engine", "apollia_nb.notebook.widgets", "apollia_nb.notebook.handles",
    "apollia_nb.notebook.sql", "apollia_nb.journal.sql", "apollia_nb.runtime.served",
)

PROBE = textwrap.dedent("""
    import json, os, sys
    from traitlets.config import Config
    from IPython.core.interactiveshell import InteractiveShell

    lazy = json.loads(sys.argv[1])
    config = Config()
    config.IPKernelApp.connection_file = "kernel.json"  # as in a kernel: DuckDB's notebook progress bar
    shell = InteractiveShell.instance(config=config)
    before = set(sys.modules)
    spawned = []
    sys.addaudithook(lambda event, args: spawned.append(event) if event in (
        "subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.exec", "os.system") else None)
    shell.run_line_magic("load_ext", "apollia_nb")
    loaded = set(sys.modules) - before
    shell.run_line_magic("apollia", "status")  # the first use of the open home
    used = set(sys.modules) - before
    print(json.dumps({
        "opened": shell.magics_manager.registry["ApolliaMagics"].runtime is not None,
        "duckdb": "duckdb" in loaded,
        "before": sorted(m for m in lazy if m in before),
        "loaded": sorted(m for m in lazy if m in loaded),
        "after_status": sorted(m for m in lazy if m in used),
        "spawned": spawned,
    }))
""")


def probe(home, cwd) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(LAZY)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**_env(), "APOLLIA_HOME": str(home)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "APOLLIA_HOME"}


@pytest.mark.parametrize("which", ["new home", "existing home"])
def test_loading_imports_only_what_opening_the_home_needs(tmp_path, which):
    home = tmp_path / "home"
    if which == "existing home":
        assert probe(home, tmp_path)["opened"]  # the first load creates the home; the second measures
    seen = probe(home, tmp_path)
    assert seen["opened"] and seen["duckdb"]  # the home did open: the check looked at a real load
    assert seen["before"] == []  # nothing of the lazy set came with the shell, so each name is checked
    assert seen["loaded"] == []
    assert seen["spawned"] == []  # no `ldconfig` or other process while the home opens
    # the status line reads the open home: still no network stack, API, schemas, MCP, dataframes or Dask
    assert [m for m in seen["after_status"] if m.split(".")[0] in NOT_FOR_STATUS] == []


NOT_FOR_STATUS = {"httpx", "httpx2", "h11", "pydantic", "fastapi", "starlette", "uvicorn", "mcp", "pandas", "dask",
                  "distributed"}


GATED = '''
import sys
gate = sys.modules["apollia_test_gate"]
first = 1
gate.started.set()
gate.go.wait(30)
later = 2
'''


@pytest.mark.parametrize("run", range(3))
def test_a_deferred_module_read_by_two_threads_runs_once_and_no_thread_sees_it_half_run(tmp_path, monkeypatch, run):
    import threading
    import types

    from apollia_nb.notebook.deferred import widgets_on_first_use

    name = f"apollia_test_gated_{run}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(GATED)
    monkeypatch.syspath_prepend(str(tmp_path))
    gate = types.ModuleType("apollia_test_gate")
    gate.started, gate.go = threading.Event(), threading.Event()
    monkeypatch.setitem(sys.modules, "apollia_test_gate", gate)
    with widgets_on_first_use(frozenset({name})):
        module = __import__(name)
    assert not gate.started.is_set()  # found, not run
    seen: dict[str, object] = {}

    def read(attr: str) -> None:
        try:
            seen[attr] = getattr(module, attr)
        except AttributeError as exc:  # what a thread reading a half-run module got
            seen[attr] = exc

    first = threading.Thread(target=read, args=("first",))
    first.start()  # runs the module's code, which waits at the gate half-way
    assert gate.started.wait(30)
    second = threading.Thread(target=read, args=("later",))
    second.start()
    second.join(0.5)  # a reader of the half-run module would be done by now, with an error
    gate.go.set()
    first.join(30)
    second.join(30)
    assert seen == {"first": 1, "later": 2}
    assert module.first == 1 and type(module) is types.ModuleType
    monkeypatch.delitem(sys.modules, name)
