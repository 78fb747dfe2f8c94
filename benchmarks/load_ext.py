"""``%load_ext apollia_nb`` in a fresh kernel, beside jupyter-ai's magics extensions loaded the same way.

Run: ``.venv/bin/python benchmarks/load_ext.py [--runs 7] [--peer-dir DIR] [--no-peers] [--home DIR]
[--baseline TREE] [--breakdown] [--phases]``

Every run starts a fresh IPython kernel (jupyter_client) and times, inside the
kernel, ``get_ipython().run_line_magic('load_ext', NAME)`` with
``time.perf_counter`` — the cost a user waits for when the cell runs, without the
kernel's own start — and the CPU time the kernel process spent meanwhile (every
thread, ``time.process_time``), the steadier figure on a busy machine. Bytecode
caches are warm (one unmeasured load first): the kernels write them to a folder
of the scratch directory (``PYTHONPYCACHEPREFIX``), and ``PYTHONDONTWRITEBYTECODE``
is not passed on, since a kernel that compiles every module from source each time
measures the compiler (about twice the time), not the extension.

Ours is measured twice: on a new home (the first load ever: keys, three DuckDB
files and the journal are created) and on an existing home (the common case),
and with ``--home DIR`` also on a copy of that home (e.g. a home of a million
entries kept by ``journal_scale.py --keep``; the copy is made once, before the
kernels start). The target is 300 ms. The kernels import ``apollia_nb`` from the
tree this script is in (checked in each kernel: ``apollia_nb.__file__``).

``--baseline TREE`` measures a second checkout the same way in the same run (e.g.
``git worktree add /tmp/before HEAD~3``), its kernels alternating with this tree's,
each tree on homes of its own. ``--breakdown`` adds three kernels per tree started
with ``python -X importtime``: how many modules ``%load_ext`` imported and the
largest by their own import time, medians (wall time inside a loaded kernel, so
read them as shares, not exact costs). ``--phases`` adds kernels per tree on the existing home
that take the load apart, each phase timed as CPU of the kernel process: DuckDB's import, the
imports of the package's modules the load imports, DuckDB's first connection in the process (an
in-memory one), the journal's open, ``runtime.db``'s open and its
whole-file read (``home.check_whole``), the home's record from the journal, the governance read, and
then ``%load_ext`` itself with all of that imported and the files closed again (what is left: opening
the same files again in one owner, the runtime's start and the panel's comm target). The phases open
the same files the load opens, so their sum is more than one load; read them as where the time goes.

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
import ast
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
from typing import Any

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
import os as _bench_os, sys as _bench_sys, time as _bench_time
_bench_before = set(_bench_sys.modules)
_bench_os.write(2, b"%(start)s\\n")
_bench_c0, _bench_t0 = _bench_time.process_time(), _bench_time.perf_counter()
get_ipython().run_line_magic('load_ext', %(extension)r)
_bench_ms = (_bench_time.perf_counter() - _bench_t0) * 1000
_bench_cpu = (_bench_time.process_time() - _bench_c0) * 1000
_bench_os.write(2, b"%(end)s\\n")
_bench_loaded = %(extension)r in get_ipython().extension_manager.loaded
_bench_file = getattr(_bench_sys.modules.get(%(extension)r), "__file__", None)
_bench_new = len(set(_bench_sys.modules) - _bench_before)
"""
START, END = "--- load_ext starts ---", "--- load_ext ends ---"

PHASES = """
import time as _bench_time
_bench_phases = []
def _bench_phase(name, c0):
    _bench_phases.append((name, (_bench_time.process_time() - c0) * 1000))
    return _bench_time.process_time()
_bench_c = _bench_time.process_time()
import duckdb
_bench_c = _bench_phase("import duckdb", _bench_c)
import apollia_nb.notebook.magics, apollia_nb.notebook.panel, apollia_nb.notebook.bridge, apollia_nb.notebook.render
import apollia_nb.runtime, apollia_nb.runtime.records, apollia_nb.runtime.chat, apollia_nb.runtime.batch
import apollia_nb.runtime.breaker, apollia_nb.journal.store, apollia_nb.journal.accounting, apollia_nb.governance.store
import apollia_nb.config
_bench_c = _bench_phase("import apollia_nb's modules", _bench_c)
from apollia_nb.home import Home, check_whole
from apollia_nb.journal.store import Journal
from apollia_nb.journal.accounting import HomeFacts, read_home_facts
from apollia_nb.runtime.records import RuntimeRecords
from apollia_nb.governance.store import GovernanceStore
_bench_home = Home.at(None, create=False)
_bench_c = _bench_time.process_time()
from apollia_nb.notebook.deferred import widgets_on_first_use  # as the load does: widgets found, not run
with widgets_on_first_use():
    duckdb.connect(":memory:").close()
_bench_c = _bench_phase("DuckDB's first connection (an in-memory one)", _bench_c)
_bench_journal = Journal.open(_bench_home)
_bench_c = _bench_phase("journal open (journal.db)", _bench_c)
_bench_records = RuntimeRecords(_bench_home.runtime_db)
_bench_c = _bench_phase("runtime.db open", _bench_c)
check_whole(_bench_records._con, _bench_home.runtime_db)
_bench_c = _bench_phase("runtime.db whole-file read", _bench_c)
_bench_facts = _bench_records.home_facts()
_bench_record = read_home_facts(_bench_journal, since=HomeFacts.from_json(_bench_facts) if _bench_facts else None).record()
_bench_c = _bench_phase("home record from the journal", _bench_c)
_bench_gov = GovernanceStore.open(_bench_home, _bench_journal, record=_bench_record, trusted_keys=None)
_bench_gov.view()
_bench_c = _bench_phase("governance read (governance.db)", _bench_c)
_bench_gov.close(); _bench_records.close(); _bench_journal.close()
_bench_c = _bench_time.process_time()
get_ipython().run_line_magic('load_ext', 'apollia_nb')
_bench_c = _bench_phase("%load_ext after these (files opened again, runtime start, panel comm)", _bench_c)
"""


@dataclass(frozen=True)
class Load:
    ms: float  # wall time
    cpu_ms: float  # CPU time of the kernel process, every thread
    modules: int  # modules imported by the load
    importtime: str = ""  # the kernel's -X importtime lines of the load, when asked for


@dataclass
class Series:
    label: str
    version: str
    loads: list[Load] = field(default_factory=list)
    problem: str | None = None

    @property
    def samples(self) -> list[float]:
        return [load.ms for load in self.loads]

    def row(self) -> str:
        if self.problem:
            return f"{self.label:<48} {self.version:<10} {self.problem}"
        median, low, high = statistics.median(self.samples), min(self.samples), max(self.samples)
        cpu = statistics.median(load.cpu_ms for load in self.loads)
        return (f"{self.label:<48} {self.version:<10} {median:9.0f} {low:9.0f} {high:9.0f} {cpu:9.0f}   "
                f"({len(self.loads)} kernels, {self.loads[-1].modules} modules)")


def kernel_specs(root: Path, pythons: dict[str, Path]) -> KernelSpecManager:
    """A kernel spec per interpreter, and one under ``-X importtime`` (``NAME-importtime``), in a
    folder of their own (no user or system spec interferes)."""
    for name, python in pythons.items():
        for suffix, flags in (("", []), ("-importtime", ["-X", "importtime"])):
            spec = root / f"{name}{suffix}"
            spec.mkdir(parents=True, exist_ok=True)
            (spec / "kernel.json").write_text(json.dumps({
                "argv": [str(python), *flags, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": name, "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(root)])


def load_once(specs: KernelSpecManager, kernel: str, extension: str, env: dict[str, str], cwd: Path,
              *, tree: Path | None = None, importtime: bool = False) -> Load:
    """Start a fresh kernel, time ``%load_ext`` inside it, shut it down. ``tree``: the checkout the
    extension must be imported from."""
    km = KernelManager(kernel_name=kernel + ("-importtime" if importtime else ""), kernel_spec_manager=specs)
    with tempfile.TemporaryFile("w+") as stderr:
        km.start_kernel(env=env, cwd=str(cwd), stdout=subprocess.DEVNULL,
                        stderr=stderr if importtime else subprocess.DEVNULL)
        client = km.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            reply = client.execute_interactive(
                MEASURE % {"extension": extension, "start": START, "end": END}, timeout=120,
                output_hook=lambda msg: None,
                user_expressions={"ms": "_bench_ms", "cpu": "_bench_cpu", "loaded": "_bench_loaded",
                                  "file": "_bench_file", "new": "_bench_new"})
            content = reply["content"]
            if content["status"] != "ok":
                raise RuntimeError(f"{content.get('ename')}: {content.get('evalue')}")
            values = {k: v["data"]["text/plain"] for k, v in content["user_expressions"].items()}
            if values["loaded"] != "True":
                raise RuntimeError(f"{extension} did not load")
            where = values["file"].strip("'\"")
            if tree is not None and not Path(where).resolve().is_relative_to(tree.resolve()):
                raise RuntimeError(f"{extension} was imported from {where}, not from {tree}")
        finally:
            client.stop_channels()
            km.shutdown_kernel(now=False)
        lines = ""
        if importtime:
            stderr.seek(0)
            text = stderr.read()
            lines = text[text.find(START):text.find(END)]
    return Load(float(values["ms"]), float(values["cpu"]), int(values["new"]), lines)


def phases_once(specs: KernelSpecManager, env: dict[str, str], cwd: Path) -> dict[str, float]:
    """A fresh kernel running ``PHASES``: the CPU ms of each phase, in order."""
    km = KernelManager(kernel_name="ours", kernel_spec_manager=specs)
    km.start_kernel(env=env, cwd=str(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        reply = client.execute_interactive(PHASES, timeout=120, output_hook=lambda msg: None,
                                           user_expressions={"phases": "__import__('json').dumps(_bench_phases)"})
        content = reply["content"]
        if content["status"] != "ok":
            raise RuntimeError(f"{content.get('ename')}: {content.get('evalue')}")
        text = content["user_expressions"]["phases"]["data"]["text/plain"]
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=False)
    return dict(json.loads(ast.literal_eval(text)))  # the repr of a JSON string


def kernel_env(base: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")
           and not k.startswith("JUPYTER")}
    env.update({"IPYTHONDIR": str(base / "ipython"), "JUPYTER_PLATFORM_DIRS": "1",
                "MPLBACKEND": "agg", "PYTHONWARNINGS": "ignore",
                "PYTHONPYCACHEPREFIX": str(base / "pycache")}, **extra)
    return env


def breakdown(label: str, loads: list[str], top: int = 15) -> list[str]:
    """What a load imported (``-X importtime`` lines of several kernels): the largest modules by their
    own import time and the totals by package, each the median over the kernels."""
    runs: list[dict[str, int]] = []
    for lines in loads:
        rows: dict[str, int] = {}
        for line in lines.splitlines():
            if line.startswith("import time:") and "self [us]" not in line:
                self_us, _cumulative, name = line[len("import time:"):].split("|")
                rows[name.strip()] = int(self_us)
        runs.append(rows)
    names = sorted(set().union(*runs))
    median = {name: statistics.median(run.get(name, 0) for run in runs) for name in names}
    by_package: dict[str, float] = {}
    for name, us in median.items():
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] == "apollia_nb" else parts[0].lstrip("_")
        by_package[key] = by_package.get(key, 0) + us
    out = [f"{label}: {len(names)} modules imported, {sum(median.values()) / 1000:.0f} ms of import time "
           f"(own, wall; median of {len(runs)} kernels)"]
    out.append("  by package: " + ", ".join(
        f"{name} {us / 1000:.1f}" for name, us in sorted(by_package.items(), key=lambda kv: -kv[1])[:top]))
    out.append("  largest:    " + ", ".join(
        f"{name} {us / 1000:.1f}" for name, us in sorted(median.items(), key=lambda kv: -kv[1])[:top]))
    return out


def measure(label: str, version: str, runs: int, once) -> Series:  # type: ignore[no-untyped-def]
    return measure_alternating([(label, version, once)], runs)[0]


def measure_alternating(what: list[tuple[str, str, Any]], runs: int) -> list[Series]:
    """Each ``(label, version, once)`` ``runs`` times, one kernel of each in turn."""
    series = [Series(label, version) for label, version, _ in what]
    for one, (_, _, once) in zip(series, what):
        try:
            once()  # unmeasured: writes bytecode caches, as any earlier use of the environment would have
        except Exception as exc:  # a peer that installs but does not load is reported, not fatal
            one.problem = f"did not load: {type(exc).__name__}: {exc}"
    for _ in range(runs):
        for one, (_, _, once) in zip(series, what):
            if one.problem is None:
                try:
                    one.loads.append(once())
                except Exception as exc:
                    one.problem = f"did not load: {type(exc).__name__}: {exc}"
    return series


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh kernels per measurement (default 7)")
    parser.add_argument("--peer-dir", type=Path, default=None,
                        help="keep the peers' virtual environments here (default: a temporary folder)")
    parser.add_argument("--no-peers", action="store_true", help="measure apollia_nb only")
    parser.add_argument("--home", type=Path, default=None,
                        help="also measure on a copy of this existing home (it is not changed)")
    parser.add_argument("--baseline", type=Path, default=None, metavar="TREE",
                        help="also measure the apollia_nb of this checkout, alternating with this tree's")
    parser.add_argument("--breakdown", action="store_true",
                        help="three more kernels per tree under -X importtime: what the load imported")
    parser.add_argument("--phases", action="store_true",
                        help="more kernels per tree (--runs) taking the load apart into phases, CPU ms each")
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
        trees = [("", ROOT)] + ([(" baseline", args.baseline.resolve())] if args.baseline else [])

        def load_ours(tree: Path, home: Path | None, importtime: bool = False) -> Load:
            home = home or scratch / f"new-home-{next(counter)}"
            env = kernel_env(scratch, APOLLIA_HOME=str(home), PYTHONPATH=str(tree))
            return load_once(specs, "ours", "apollia_nb", env, work, tree=tree, importtime=importtime)

        homes: list[tuple[str, Path | None]] = [("new home", None), ("existing home", scratch / "existing-home")]
        if args.home is not None:
            homes.append((args.home.name, scratch / "copied-home"))
        results: list[Series] = []
        for name, home in homes:
            what = []
            for tag, tree in trees:
                # each tree opens homes of its own (a new one each time, or its own existing one)
                tree_home = home.with_name(home.name + tag.replace(" ", "-")) if home is not None else None
                if tree_home is not None and args.home is not None and name == args.home.name:
                    shutil.copytree(args.home, tree_home, symlinks=True)
                what.append((f"%load_ext apollia_nb ({name}){tag}", __version__,
                             lambda tree=tree, home=tree_home: load_ours(tree, home)))
            results.extend(measure_alternating(what, args.runs))
        details: list[str] = []
        if args.breakdown:
            for tag, tree in trees:
                home = scratch / ("existing-home" + tag.replace(" ", "-"))
                lines = [load_ours(tree, home, importtime=True).importtime for _ in range(3)]
                details += breakdown(f"existing home{tag} ({tree})", lines)
        if args.phases:
            for tag, tree in trees:
                home = scratch / ("existing-home" + tag.replace(" ", "-"))
                env = kernel_env(scratch, APOLLIA_HOME=str(home), PYTHONPATH=str(tree))
                runs = [phases_once(specs, env, work) for _ in range(args.runs)]
                details.append(f"phases, existing home{tag} ({tree}): CPU ms, median of {len(runs)} kernels")
                for name in runs[0]:
                    details.append(f"  {name:<72} {statistics.median(run[name] for run in runs):7.1f}")
        for peer, python, why in peers:
            label = f"%load_ext {peer.extension}"
            if python is None:
                results.append(Series(label, "-", problem=why))
                continue

            def peer_once(peer: Peer = peer) -> Load:
                return load_once(specs, peer.package, peer.extension, kernel_env(scratch), work)

            results.append(measure(label, version_of(python, peer.package), args.runs, peer_once))

        print()
        print(f"%load_ext in a fresh kernel, timed inside the kernel; Python {sys.version.split()[0]}, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
        print(f"{'':<48} {'version':<10} {'median ms':>9} {'min ms':>9} {'max ms':>9} {'CPU ms':>9}")
        for series in results:
            print(series.row())
        if details:
            print()
            print("\n".join(details))
        existing = {series.label: series for series in results if series.samples}
        mine = existing.get("%load_ext apollia_nb (existing home)")
        ours = statistics.median(mine.samples) if mine is not None else None
        if ours is not None:
            print()
            verdict = "within" if ours <= TARGET_MS else "OVER"
            print(f"apollia_nb on an existing home: median {ours:.0f} ms — {verdict} the {TARGET_MS:.0f} ms target")
            before = existing.get("%load_ext apollia_nb (existing home) baseline")
            if before is not None and mine is not None:
                cpu = [statistics.median(load.cpu_ms for load in s.loads) for s in (before, mine)]
                print(f"baseline {args.baseline}: median {statistics.median(before.samples):.0f} ms, "
                      f"CPU {cpu[0]:.0f} → {cpu[1]:.0f} ms")
            for series in results:
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
