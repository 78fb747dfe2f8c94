"""One home, three processes: `apollia-os serve` owns it, two real IPython kernels are its clients.

The server is a real subprocess; the kernels are real ipykernels (jupyter_client)
running this interpreter with ``APOLLIA_HOME`` set to the server's home and
``%load_ext apollia_nb``. Their agents run in the kernels; the journal, consents
and pending decisions are the server's. Checked: one chain that verifies after
the server stops, a consent granted in one kernel applying in the other at once,
a decision of a kernel answered over the REST API resuming that kernel's run,
and the clear ``HOME_LOCKED`` once a kernel owns the home and nobody serves it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from apollia_nb.sdk import Client
from runtime_helpers import call, manifest

jupyter_client = pytest.importorskip("jupyter_client")

APOLLIA = [sys.executable, "-m", "apollia_nb"]


def writer(name: str, path: str) -> str:
    return manifest(name, actor=[{"tool_calls": [call("write_file", path=path, content=name)]}, {"text": "Done."}])


class Kernel:
    """A real kernel; ``run(code)`` returns its printed and displayed text, or raises with its error."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.km = jupyter_client.KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, *, timeout: float = 60) -> str:
        out: list[str] = []

        def hook(msg: dict) -> None:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(content["text"])
            elif msg["msg_type"] in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", ""))

        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=timeout)["content"]
        if reply["status"] != "ok":
            raise KernelError("\n".join(reply.get("traceback") or [f"{reply.get('ename')}: {reply.get('evalue')}"]))
        return "".join(out)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


class KernelError(Exception):
    pass


@pytest.fixture
def kernelspec(tmp_path, monkeypatch):
    prefix = tmp_path / "jupyter-prefix"
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix), "--name", "python3"],
                   check=True, capture_output=True, timeout=60)
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))


def serve(home: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=home.parent)
    assert proc.stdout.readline(), proc.stderr.read()  # one line once it listens
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    proc.stdout.close()
    proc.stderr.close()


def cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True, timeout=120)


def test_two_kernels_and_the_server_share_one_home(tmp_path, kernelspec, monkeypatch):
    monkeypatch.delenv("APOLLIA_TOKEN", raising=False)
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    server = serve(home)
    env = {**os.environ, "APOLLIA_HOME": str(home)}
    kernels: list[Kernel] = []
    try:
        a, b = Kernel(env, work), Kernel(env, work)
        kernels += [a, b]
        for kernel in (a, b):
            status = kernel.run("%load_ext apollia_nb")
            assert status.startswith(f"apollia: home {home.resolve()} · journal ")
            assert status.rstrip().endswith("· client of apollia-os serve")
        a.run("%%apollia agent\n" + writer("clerk", "a.txt"))
        b.run("%%apollia agent\n" + writer("clerk", "b.txt"))
        b.run("%%apollia agent\n" + writer("scribe", "s.txt"))

        # Kernel A answers `always` for `write`: the consent is the server's, so kernel B has it at once.
        a.run("%%apollia task clerk\nWrite a.txt")
        printed = a.run("task = _\nawait task.settled()\n[c.answer('always') for c in task.pending]\n"
                        "await task\nprint(task.status, task.run_id)")
        status_a, run_a = printed.split()
        assert status_a == "completed"
        b.run("%%apollia task clerk\nWrite b.txt")
        printed = b.run("task = _\nawait task\nprint(task.status, task.run_id, "
                        "[(d['outcome'], d['line'], d['answer']) for d in task.decisions()])")
        assert printed.startswith("completed run-")
        run_b = printed.split()[1]
        assert printed.rstrip().endswith("[('allow', 5, None)]")  # allowed by line 5, nobody asked

        # A decision of kernel B, answered over the REST API: kernel B's suspended run resumes.
        b.run("%%apollia task scribe --unattended\nWrite s.txt")
        printed = b.run("waiting = _\nawait waiting.settled()\nprint(waiting.status, waiting.run_id)")
        status_s, run_s = printed.split()
        assert status_s == "waiting"
        with Client.from_home(home) as api:
            [pending] = api.pending()
            assert (pending.agent, pending.tool, pending.run_id) == ("scribe", "write_file", run_s)
            api.decide(pending.id, "once", by="ops")
        printed = b.run("import asyncio\nawait asyncio.wait_for(waiting.wait(), 30)\nprint(waiting.status)")
        assert printed.strip() == "completed"
        assert {p.name: p.read_text() for p in work.iterdir()} == {"a.txt": "clerk", "b.txt": "clerk",
                                                                   "s.txt": "scribe"}

        # The decision view each kernel reads (a local copy of the server's journal) is the same chain.
        seen_by_a = a.run(f"from apollia_nb.notebook import kernel_runtime\n"
                          f"print(kernel_runtime().decisions({run_s!r}))")
        assert "'answer': 'once', 'answered_by': 'ops'" in seen_by_a
        latency = b.run("import statistics, time\nfrom apollia_nb.notebook import kernel_runtime\n"
                        "gov = kernel_runtime().rt.governance\nsamples = []\n"
                        "for _ in range(200):\n    t = time.perf_counter(); gov.view()\n"
                        "    samples.append(time.perf_counter() - t)\n"
                        "print(round(statistics.median(samples) * 1000, 3))")
        print(f"view() in a client kernel, the server in another process: median {latency.strip()} ms")
        assert float(latency) < 20

        stop(server)
        server = None
        verified = cli("audit", "verify", home=home)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert verified.stdout.startswith("ok:")
        for run_id in (run_a, run_b, run_s):  # every kernel's run, whole, in the one chain
            replayed = cli("audit", "replay", run_id, home=home)
            assert replayed.returncode == 0, replayed.stdout + replayed.stderr

        # Nobody serves the home now: kernel A takes it over; kernel B is told who holds it and what to run.
        pid_a = a.run("import os\nprint(os.getpid())").strip()
        owner = a.run("%unload_ext apollia_nb\n%load_ext apollia_nb")
        assert "client of" not in owner and owner.startswith("apollia: home ")
        b.run("%unload_ext apollia_nb")
        with pytest.raises(KernelError) as locked:
            b.run("%load_ext apollia_nb")
        message = str(locked.value)
        assert message.startswith("HOME_LOCKED: ") and f"process {pid_a}" in message
        assert "apollia-os serve" in message
    finally:
        for kernel in kernels:
            kernel.close()
        if server is not None:
            stop(server)
    assert not (home / "server.json").exists()
    verified = cli("audit", "verify", home=home)  # after kernel A, the owner, closed the journal
    assert verified.returncode == 0 and verified.stdout.startswith("ok:"), verified.stdout + verified.stderr
