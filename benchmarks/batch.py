"""Batches: items per second for tasks of 10 governed calls, at concurrency 1, 4 and 16, beside a plain
loop of ``submit`` calls (all submitted, then all awaited) in the same run, on one machine; and on a
``dask.distributed`` LocalCluster of 2 worker processes, each a client of an ``apollia-os serve`` subprocess
(``--dask``, needs ``dask[distributed]``), with its ratio to the local batch at the same concurrency
(target: at least 0.5x), and how long the Dask batch's items ran on the workers (Dask's task stream).
``--dask-only`` skips the local runs; ``--warm`` has the workers run an untimed batch of 2 items first (what
a cluster that ran a batch before has imported); ``--spy DIR`` records the server and each worker with
py-spy during the Dask batch (``--spy-executable``: the py-spy to run; ``--spy-idle``: waiting threads too).
Each line gives CPU ms per item too: the process's for a local run; for a Dask batch the server's, the two
workers' and the driver's (with the scheduler, which a LocalCluster runs in the driver).

Each item is a task whose actor makes ``--calls`` allowed calls of a custom read tool, then ends; every
run uses a fresh home. Run from the repository root::

    .venv/bin/python benchmarks/batch.py [--items 64] [--calls 10] [--concurrency 1 4 16] [--dask 16] [--dask-only]
        [--warm] [--spy DIR [--spy-idle] [--spy-executable PATH]]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from governed_call import AGENT, manifest_text, read_note  # noqa: E402

from apollia_nb.runtime import Runtime  # noqa: E402
from apollia_nb.runtime.tools import ToolDef  # noqa: E402


async def one(items: int, calls: int, concurrency: int | None) -> tuple[float, float]:
    """Items per second and CPU ms per item (this process, every thread): a batch at ``concurrency``, or
    (None) a plain loop of submit calls."""
    with tempfile.TemporaryDirectory(prefix="apollia-bench-batch-") as tmp:
        root = Path(tmp)
        async with Runtime(root / "home") as rt:
            await rt.register_agent(manifest_text(calls, root / "workspace"),
                                    tools=[ToolDef.from_function(read_note, family="read")])
            rows = [{"n": i} for i in range(items)]
            t0, c0 = time.perf_counter(), _cpu()
            if concurrency is None:
                handles = [await rt.submit(AGENT, f"Read the notes of item {r['n']}", watched=False) for r in rows]
                statuses = [(await h).status for h in handles]
            else:
                batch = await rt.batch(AGENT, rows, goal="Read the notes of item {n}", concurrency=concurrency)
                await batch
                statuses = [r["status"] for r in batch.rows()]
            elapsed, cpu = time.perf_counter() - t0, _cpu() - c0
            if statuses != ["completed"] * items:
                raise SystemExit(f"not every item completed: {sorted(set(statuses))}")
            if not rt.verify().ok:
                raise SystemExit("the journal does not verify")
    return items / elapsed, cpu / items * 1000


def _serve(home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "apollia_nb", "serve", "--home", str(home), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _spy(executable: str, pid: int, out: Path, idle: bool = False) -> subprocess.Popen[bytes]:
    """py-spy recording ``pid`` (every thread, collapsed stacks; ``idle``: waiting threads too) into ``out``
    until it is sent SIGINT."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([executable, "record", "--pid", str(pid), "--rate", "100", "--format", "raw",
                             "--threads", *(["--idle"] if idle else []), "--nonblocking", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _cpu(pid: int | None = None) -> float:
    """CPU seconds (user + system, every thread) of process ``pid`` (None: this one) so far."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _print_items(tasks: list[dict], t0: float, elapsed: float) -> None:
    """Where a Dask batch's time went: each item's time on its worker, and how many ran at once."""
    spans = sorted((s["start"], s["stop"]) for t in tasks for s in t.get("startstops", ())
                   if s.get("action") == "compute")
    if not spans:
        return
    busy = sorted(stop - start for start, stop in spans)
    first, last = spans[0][0], max(stop for _, stop in spans)
    print(f"  items on the workers: {len(busy)}, each {busy[len(busy) // 2] * 1000:.0f} ms median, "
          f"{busy[-1] * 1000:.0f} ms max; {sum(busy):.1f} s in all over {last - first:.1f} s "
          f"(on average {sum(busy) / max(last - first, 1e-9):.1f} at once) of the batch's {elapsed:.1f} s")


async def on_dask(items: int, calls: int, concurrency: int, spy: Path | None = None,
                  spy_executable: str = "py-spy", spy_idle: bool = False,
                  warm: bool = False) -> tuple[float, dict[str, float]]:
    """Items per second and CPU ms per item of each process (the server, the two workers, the driver with
    the scheduler): a batch at ``concurrency`` on a LocalCluster with 2 worker processes, the home
    served by ``apollia-os serve`` (the driver and every worker its clients). ``spy``: a directory for
    py-spy profiles of the server (``server.txt``) and of each worker (``worker-N.txt``) during the batch.
    ``warm``: a batch of 2 items runs on the cluster first, untimed (the workers have imported what an item
    needs, as on a cluster that ran a batch before; each batch still opens its own client runtime on each
    worker, timed)."""
    from distributed import Client, LocalCluster

    with tempfile.TemporaryDirectory(prefix="apollia-bench-dask-") as tmp:
        root = Path(tmp)
        server = _serve(root / "home")
        try:
            if not server.stdout.readline():
                raise SystemExit(f"apollia-os serve did not start: {server.stderr.read()}")
            with LocalCluster(n_workers=2, threads_per_worker=max(1, concurrency // 2), processes=True,
                              host="127.0.0.1", dashboard_address=":0") as lc, Client(lc) as client:
                async with Runtime(root / "home") as rt:
                    await rt.register_agent(manifest_text(calls, root / "workspace"),
                                            tools=[ToolDef.from_function(read_note, family="read")])
                    rows = [{"n": i} for i in range(items)]
                    pids = client.run(os.getpid)  # the workers are up before the clock starts
                    if warm:
                        await (await rt.batch(AGENT, rows[:2], goal="Read the notes of item {n}",
                                              concurrency=2, engine="dask", scheduler=client))
                    spies = [] if spy is None else [
                        _spy(spy_executable, pid, spy / name, spy_idle) for pid, name in
                        [(server.pid, "server.txt"),
                         *((p, f"worker-{i + 1}.txt") for i, p in enumerate(pids.values()))]]
                    if spies:
                        time.sleep(0.5)  # py-spy attaches
                    from distributed import get_task_stream

                    t0 = time.perf_counter()
                    cpu0 = (_cpu(server.pid), sum(client.run(_cpu).values()), _cpu())
                    with get_task_stream(client) as stream:
                        batch = await rt.batch(AGENT, rows, goal="Read the notes of item {n}",
                                               concurrency=concurrency, engine="dask", scheduler=client)
                        await batch
                    elapsed = time.perf_counter() - t0
                    cpu1 = (_cpu(server.pid), sum(client.run(_cpu).values()), _cpu())
                    cpu = {name: (b - a) / items * 1000
                           for name, a, b in zip(("server", "workers", "driver"), cpu0, cpu1)}
                    _print_items(stream.data, t0, elapsed)
                    for proc in spies:
                        proc.send_signal(signal.SIGINT)
                        proc.wait(timeout=60)
                    statuses = [r["status"] for r in batch.rows()]
                    if statuses != ["completed"] * items:
                        raise SystemExit(f"not every item completed: {sorted(set(statuses))}")
                    if not rt.verify().ok:
                        raise SystemExit("the journal does not verify")
        finally:
            server.terminate()
            server.wait(timeout=60)
    return items / elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--dask", type=int, nargs="*", default=[16], metavar="CONCURRENCY",
                        help="batches on a LocalCluster of 2 workers at these concurrencies (none: skip)")
    parser.add_argument("--spy", type=Path, default=None,
                        help="a directory for py-spy profiles of the server and each worker during the Dask batches")
    parser.add_argument("--spy-executable", default="py-spy", help="the py-spy to run (default: on PATH)")
    parser.add_argument("--spy-idle", action="store_true",
                        help="py-spy records waiting threads too (where an item waits, not only where CPU goes)")
    parser.add_argument("--dask-only", action="store_true", help="only the Dask batches (no ratio)")
    parser.add_argument("--warm", action="store_true",
                        help="the Dask workers run an untimed batch of 2 items first (their imports done)")
    args = parser.parse_args()
    import apollia_nb

    print(f"apollia_nb from {Path(apollia_nb.__file__).parent} (the server and the workers import the same)")
    print(f"{args.items} items, tasks of {args.calls} governed calls each; load average {os.getloadavg()[0]:.1f}")
    print(f"{'how':<28}{'items/s':>10}   CPU ms per item")
    local: dict[int, float] = {}
    if not args.dask_only:
        figure, cpu = anyio.run(one, args.items, args.calls, None)
        print(f"{'plain loop of submit':<28}{figure:>10.1f}   {cpu:.1f}")
    for c in [] if args.dask_only else args.concurrency:
        (figure, cpu) = anyio.run(one, args.items, args.calls, c)
        local[c] = figure
        print(f"{f'batch, concurrency {c}':<28}{figure:>10.1f}   {cpu:.1f}")
    for c in args.dask:
        spy = None if args.spy is None else args.spy / f"dask-{c}"
        figure, cpus = anyio.run(on_dask, args.items, args.calls, c, spy, args.spy_executable, args.spy_idle,
                                 args.warm)
        parts = ", ".join(f"{name} {ms:.1f}" for name, ms in cpus.items())
        print(f"{f'dask, 2 workers, conc. {c}':<28}{figure:>10.1f}   {sum(cpus.values()):.1f} ({parts})")
        if c in local:
            print(f"  {figure / local[c]:.2f}x the local batch at concurrency {c} (target >= 0.5x)")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
