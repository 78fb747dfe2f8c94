"""``%load_ext apollia_nb`` in a fresh kernel, beside jupyter-ai's magics extensions loaded the same way.

Run: ``.venv/bin/python benchmarks/load_ext.py [--runs 7] [--peer-dir DIR] [--no-peers] [--home DIR]``

Every run starts a fresh IPython kernel (jupyter_client) and times, inside the
kernel, ``get_ipython().run_line_magic('load_ext', NAME)`` with
``time.perf_counter`` — the cost a user waits for when the cell runs, without the
kernel's own start. Bytecode caches are warm (one unmeasured load first).

Ours is measured twice: on a new home (the first load ever: keys, three DuckDB
files and the journal are created) and on an existing home (the common case),
and with ``--home DIR`` also on a copy of that home (e.g. a home of a million
entries kept by ``journal_scale.py --keep``; the copy is made once, before the
kernels start). The target is 300 ms. The kernels import ``apollia_nb`` from the
tree this script is in.

The peers are jupyter-ai's magics packages, each installed by pip into its own
virtual environment (not a dependency of this project): ``jupyter-ai-magics``
(``%load_ext jupyter_ai_magics``, jupyter-ai 2.x) and ``jupyter-ai-magic-commands``
(``%load_ext jupyter_ai_magic_commands``, jupyter-ai 3.x). A peer that does not
install is reported with pip's reason. Their environments go to a temporary folder,
or to ``--peer-dir`` to be kept and reused. Figures from one run of this script are
comparable with each other; the machine's load moves all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

TARGET_MS = 300.0
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Peer:
    package: str  # what pip installs
    extension: str  # what %load_ext loads


PEERS = (Peer("jupyter-ai-magics", "jupyter_ai_magics"), Peer("jupyter-ai-magic-commands", "jupyter_ai_magic_commands"))

MEASURE = """
import time as _bench_time
_bench_t0 = _bench_time.perf_counter()
get_ipython().run_line_magic('load_ext', {extension!r})
_bench_ms = (_bench_time.perf_counter() - _bench_t0) * 1000
_bench_loaded = {extension!r} in get_ipython().extension_manager.loaded
"""


@dataclass
class Series:
    label: str
    version: str
    samples: list[float] = field(default_factory=list)
    problem: str | None = None

    def row(self) -> str:
        if self.problem:
            return f"{self.label:<44} {self.version:<10} {self.problem}"
        median, low, high = statistics.median(self.samples), min(self.samples), max(self.samples)
        return (f"{self.label:<44} {self.version:<10} {median:9.0f} {low:9.0f} {high:9.0f}   "
                f"({len(self.samples)} kernels)")


def kernel_specs(root: Path, pythons: dict[str, Path]) -> KernelSpecManager:
    """A kernel spec per interpreter, in a folder of their own (no user or system spec interferes)."""
    for name, python in pythons.items():
        spec = root / name
        spec.mkdir(parents=True, exist_ok=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": name, "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(root)])


def load_once(specs: KernelSpecManager, kernel: str, extension: str, env: dict[str, str], cwd: Path) -> float:
    """Start a fresh kernel, time ``%load_ext`` inside it, shut it down; the milliseconds it took."""
    km = KernelManager(kernel_name=kernel, kernel_spec_manager=specs)
    km.start_kernel(env=env, cwd=str(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        reply = client.execute_interactive(
            MEASURE.format(extension=extension), timeout=120, output_hook=lambda msg: None,
            user_expressions={"ms": "_bench_ms", "loaded": "_bench_loaded"})
        content = reply["content"]
        if content["status"] != "ok":
            raise RuntimeError(f"{content.get('ename')}: {content.get('evalue')}")
        values = content["user_expressions"]
        if values["loaded"]["data"]["text/plain"] != "True":
            raise RuntimeError(f"{extension} did not load")
        return float(values["ms"]["data"]["text/plain"])
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=False)


def kernel_env(base: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("JUPYTER")}
    env.update({"IPYTHONDIR": str(base / "ipython"), "JUPYTER_PLATFORM_DIRS": "1",
                "MPLBACKEND": "agg", "PYTHONWARNINGS": "ignore"}, **extra)
    return env


def version_of(python: Path, package: str) -> str:
    done = subprocess.run([str(python), "-c", f"from importlib.metadata import version; print(version({package!r}))"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


def install_peer(peer: Peer, where: Path) -> tuple[Path | None, str | None]:
    """A virtual environment with ``peer`` and ipykernel; (python, None), or (None, why not)."""
    python = where / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", f"import {peer.extension}"],
                                          capture_output=True).returncode == 0:
        return python, None
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(where)], check=True)
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           peer.package, "ipykernel"], capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines()
                 if line.strip() and "is ignored" not in line]
        return None, "did not install: " + " / ".join(lines[-3:])
    return python, None


def measure(label: str, version: str, runs: int, once) -> Series:  # type: ignore[no-untyped-def]
    series = Series(label, version)
    try:
        once()  # unmeasured: writes bytecode caches, as any earlier use of the environment would have
        series.samples = [once() for _ in range(runs)]
    except Exception as exc:  # a peer that installs but does not load is reported, not fatal
        series.problem = f"did not load: {type(exc).__name__}: {exc}"
    return series


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh kernels per measurement (default 7)")
    parser.add_argument("--peer-dir", type=Path, default=None,
                        help="keep the peers' virtual environments here (default: a temporary folder)")
    parser.add_argument("--no-peers", action="store_true", help="measure apollia_nb only")
    parser.add_argument("--home", type=Path, default=None,
                        help="also measure on a copy of this existing home (it is not changed)")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="apollia-bench-load-ext-"))
    peer_dir = args.peer_dir or scratch / "peers"
    try:
        pythons = {"ours": Path(sys.executable)}
        peers: list[tuple[Peer, Path | None, str | None]] = []
        if not args.no_peers:
            for peer in PEERS:
                print(f"installing {peer.package} into {peer_dir / peer.package} …", flush=True)
                python, why = install_peer(peer, peer_dir / peer.package)
                peers.append((peer, python, why))
                if python is not None:
                    pythons[peer.package] = python
        specs = kernel_specs(scratch / "kernels", pythons)
        work = scratch / "work"
        work.mkdir()

        from apollia_nb import __version__

        counter = iter(range(10_000))

        def ours_new_home() -> float:
            home = scratch / f"new-home-{next(counter)}"
            return load_once(specs, "ours", "apollia_nb",
                             kernel_env(scratch, APOLLIA_HOME=str(home), PYTHONPATH=str(ROOT)), work)

        existing = scratch / "existing-home"

        def ours_on(home: Path):  # type: ignore[no-untyped-def]
            return lambda: load_once(specs, "ours", "apollia_nb",
                                     kernel_env(scratch, APOLLIA_HOME=str(home), PYTHONPATH=str(ROOT)), work)

        results = [
            measure("%load_ext apollia_nb (new home)", __version__, args.runs, ours_new_home),
            measure("%load_ext apollia_nb (existing home)", __version__, args.runs, ours_on(existing)),
        ]
        if args.home is not None:
            copy = scratch / "copied-home"
            shutil.copytree(args.home, copy, symlinks=True)
            results.append(measure(f"%load_ext apollia_nb ({args.home.name})", __version__, args.runs, ours_on(copy)))
        for peer, python, why in peers:
            label = f"%load_ext {peer.extension}"
            if python is None:
                results.append(Series(label, "-", problem=why))
                continue

            def peer_once(peer: Peer = peer) -> float:
                return load_once(specs, peer.package, peer.extension, kernel_env(scratch), work)

            results.append(measure(label, version_of(python, peer.package), args.runs, peer_once))

        print()
        print(f"%load_ext in a fresh kernel, timed inside the kernel; Python {sys.version.split()[0]}, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
        print(f"{'':<44} {'version':<10} {'median ms':>9} {'min ms':>9} {'max ms':>9}")
        for series in results:
            print(series.row())
        ours = statistics.median(results[1].samples) if results[1].samples else None
        if ours is not None:
            print()
            verdict = "within" if ours <= TARGET_MS else "OVER"
            print(f"apollia_nb on an existing home: median {ours:.0f} ms — {verdict} the {TARGET_MS:.0f} ms target")
            for series in results[2:]:
                if series.samples and not series.label.startswith("%load_ext apollia_nb"):
                    print(f"{series.label.split()[-1]}: median {statistics.median(series.samples) / ours:.1f}× ours")
        return 0 if ours is not None and not any(s.problem for s in results if "apollia_nb" in s.label) else 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"({time.monotonic() - started:.0f} s)")
    sys.exit(code)
