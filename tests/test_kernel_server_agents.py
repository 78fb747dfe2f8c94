"""A real kernel joined to a real `apollia-os serve` drives the server's agents beside its own.

The server is a subprocess; its agent is registered with the CLI (a client of
the server, in the work folder). The kernel (a real ipykernel, ``APOLLIA_HOME``
set to the served home) lists both agents, marked by where they run, submits a
task to the server's agent with ``%%apollia task``, answers its card from code
and awaits it to completion. The file the task wrote is in the workspace, and
the decision is in the home's one chain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runtime_helpers import call, manifest
from test_shared_home import Kernel, kernelspec, serve, stop  # noqa: F401 - kernelspec is a fixture

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def test_a_joined_kernel_lists_and_drives_the_servers_agent(tmp_path, kernelspec, monkeypatch):  # noqa: F811
    monkeypatch.delenv("APOLLIA_TOKEN", raising=False)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    (work / "clerk.toml").write_text(
        manifest("clerk", actor=[{"tool_calls": [call("write_file", path="out.txt", content="hi")]},
                                 {"text": "Wrote it."}]))
    server = serve(home)
    kernel = None
    env = {**os.environ, "APOLLIA_HOME": str(home)}
    try:
        reg = subprocess.run([*APOLLIA, "agents", "register", "clerk.toml"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=120)
        assert reg.returncode == 0 and "registered clerk: active" in reg.stdout, reg.stderr
        kernel = Kernel(env, work)
        kernel.run("%load_ext apollia_nb")
        kernel.run("get_ipython().run_cell_magic('apollia', 'agent', " + repr(manifest("scribe")) + ")")
        listed = kernel.run("import json\n"
                            "a = get_ipython().run_line_magic('apollia', 'agents')\n"
                            "print(json.dumps([(x['name'], x['runs']) for x in a.data]))\n"
                            "print(a.text)")
        first, _, table = listed.partition("\n")
        assert json.loads(first) == [["scribe", "kernel"], ["clerk", "server"]]
        assert "runs" in table and "server" in table

        out = kernel.run("t = get_ipython().run_cell_magic('apollia', 'task clerk', 'Write out.txt')\n"
                         "t.join(60, settled=True)\n"
                         "print(type(t).__name__, t.runs, t.status, [(c.tool, c.waiting) for c in t.pending])")
        assert out.strip() == "NotebookTask server waiting [('write_file', True)]"
        out = kernel.run("card = t.pending[0].answer('once')\n"
                         "print(card.waiting, card.answered_by)\n"
                         "done = await t\n"
                         "print(done.status, done.result)\n"
                         "print(done.decisions()[-1]['answer'])\n"
                         "print(t.pending)")
        lines = out.split("\n")
        assert lines[0].startswith("False ") and lines[0] != "False None"  # answered, by the kernel's user
        assert lines[1:4] == ["completed Wrote it.", "once", "[]"]
        assert "runs on the server" in kernel.run("print(repr(t))")
        assert (work / "out.txt").read_text() == "hi"  # the server's agent wrote in its workspace

        # An agent neither the kernel nor the server has is still a clear error.
        with pytest.raises(Exception, match="UNKNOWN_AGENT"):
            kernel.run("get_ipython().run_cell_magic('apollia', 'task ghost', 'boo')")
        tasks = subprocess.run([*APOLLIA, "pending", "list", "--json"], env=env, capture_output=True, text=True,
                               timeout=120)
        assert json.loads(tasks.stdout) == []
    finally:
        if kernel is not None:
            kernel.close()
        stop(server)
    verify = subprocess.run([*APOLLIA, "audit", "verify", "--home", str(home)], capture_output=True, text=True,
                            timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
