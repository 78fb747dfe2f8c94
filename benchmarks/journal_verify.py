"""``audit verify`` throughput on a large journal, beside the raw Ed25519 verify rates.

Run: ``.venv/bin/python benchmarks/journal_verify.py [--entries 50000]``, or
``benchmarks/journal_verify.py --home COPY`` on an existing home (verification
only reads it; still, point it at a copy of a home you keep).

Builds a journal of ``--entries`` entries (with a checkpoint every 5,000), or
takes ``--home``, then prints:

* the raw Ed25519 verify rate on one core: PyNaCl (libsodium, what the verifier
  uses) and ``cryptography`` (OpenSSL) when it is installed;
* where the time of a verification goes, per entry, over the first
  ``--sample`` entries: reading rows from DuckDB as the verifier does (as stored,
  one DuckDB thread, its memory limit), checking sequence, link, hash, key id and
  Merkle tree (this process), laying out the signature items, and the signatures
  themselves; and what that allows on 2 idle cores;
* ``verify_home`` checking every signature inline (1 process) and with 2 worker
  processes (built journals only);
* the whole ``apollia-os audit verify`` command as a fresh process (interpreter
  start and imports included), started by a small runner process of its own so
  that the runner's memory is not counted: wall time, CPU seconds of it and its
  workers, and peak RSS. ``--baseline TREE`` measures another checkout's command
  in the same run, the two alternating, and prints the ratios.

``--formats`` instead builds two journals of ``--entries`` entries, one of format 2
(salted commitments per payload field, what a home made now writes) and one of
format 1 (payloads hashed whole), prints the breakdown above for each, and verifies
them in turn ``--repeat`` times, alternating which goes first: ``verify_home`` (2 worker
processes) and the whole ``apollia-os audit verify`` command, each round; median wall
time and CPU seconds (this process and its workers) per entry, and the ratios.

On a shared machine wall-clock rates drop with the load, so the CPU seconds
spent are printed too, with the rate they allow on 2 idle cores.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

from nacl.signing import SigningKey

from apollia_nb.home import Home
from apollia_nb.journal import Draft, Journal
from apollia_nb.journal.verify import verify_home

PAYLOAD = {
    "call_id": "c-0001",
    "tool": "write_file",
    "family": "write",
    "arguments": {"path": "notes/summary.txt", "content": "x" * 120},
    "outcome": "allow",
    "line": 5,
    "answers": [],
    "reason": "standing consent for write",
}


def build(home: Home, entries: int, entry_format: str | None = None) -> None:
    with Journal.open(home, entry_format=entry_format) as journal:
        done = 0
        while done < entries:
            n = min(1000, entries - done)
            journal.append_many(Draft("decision", PAYLOAD, f"run-{done // 500}", "clerk") for _ in range(n))
            done += n
            if done % 5000 == 0:
                journal.checkpoint()


def raw_rates(n: int) -> dict[str, float]:
    """Signatures verified per CPU second on one core, by library."""
    from nacl.bindings import crypto_sign_open

    key = SigningKey.generate()
    public = bytes(key.verify_key)
    msgs = [os.urandom(32) for _ in range(n)]
    sigs = [key.sign(m).signature for m in msgs]
    rates: dict[str, float] = {}
    t = time.process_time()
    for m, s in zip(msgs, sigs):
        crypto_sign_open(s + m, public)
    rates["PyNaCl (libsodium) crypto_sign_open"] = n / (time.process_time() - t)
    from apollia_nb.journal.verify import _system_verify

    system = _system_verify()
    if system is not None:
        t = time.process_time()
        for m, s in zip(msgs, sigs):
            system(s, m, 32, public)
        rates["system libsodium crypto_sign_verify_detached"] = n / (time.process_time() - t)
    from apollia_nb.journal.verify import _zebra_verify

    zebra = _zebra_verify()
    if zebra is not None:
        t = time.process_time()
        for m, s in zip(msgs, sigs):
            zebra(s, m, public)
        rates["ed25519-zebra ed_verify"] = n / (time.process_time() - t)
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError:
        return rates
    verify = Ed25519PublicKey.from_public_bytes(public).verify
    t = time.process_time()
    for m, s in zip(msgs, sigs):
        verify(s, m)
    rates["cryptography (OpenSSL) Ed25519PublicKey.verify"] = n / (time.process_time() - t)
    return rates


def breakdown(home: Home, sample: int) -> float:
    """Print CPU microseconds per entry of each part of a verification over the first ``sample``
    entries; return the entries/s their sum allows on 2 idle cores."""
    import duckdb

    from apollia_nb.journal.keys import key_id, load_public_key
    from apollia_nb.journal.merkle import MerkleAccumulator
    from apollia_nb.journal.verify import (
        _COLUMNS,
        STREAM_MEMORY,
        _batch,
        _first_bad_index,
        _Scan,
    )

    public = load_public_key(home)
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        def part(label: str, work) -> tuple[float, object]:
            t = time.process_time()
            out = work()
            spent = (time.process_time() - t) * 1e6 / max(count, 1)
            print(f"  {label:<52}: {spent:7.2f} us/entry")
            return spent, out

        count = min(sample, con.execute("SELECT count(*) FROM entries").fetchone()[0])
        con.execute("SET threads = 1")
        con.execute(f"SET memory_limit = '{STREAM_MEMORY}'")

        def read() -> list[list[tuple]]:
            chunks, left = [], count
            cursor = con.execute(f"SELECT {_COLUMNS} FROM entries")
            while left and (rows := cursor.fetchmany(min(2_500, left))):
                chunks.append(rows)
                left -= len(rows)
            return chunks

        def scan() -> None:
            checker = _Scan(public, key_id(public), {}, acc=MerkleAccumulator())
            for chunk in chunks:
                checker.rows(chunk)
            assert checker.failure is None and checker.count == count, checker.failure

        def signatures() -> None:
            assert all(_first_bad_index(public, b.body) is None for b in batches)

        print(f"where the time goes (first {count:,} entries, CPU):")
        spent = []
        cost, chunks = part("DuckDB rows, 10 columns, as stored", read)
        spent.append(cost)
        spent.append(part("seq, link, hash, key id, Merkle (this process)", scan)[0])
        cost, batches = part("signature items (this process)", lambda: [_batch(c) for c in chunks])
        spent.append(cost)
        sigs = part("signatures (workers)", signatures)[0]
        total = sum(spent) + sigs
        print(f"  {'total':<52}: {total:7.2f} us/entry -> {2e6 / total:,.0f} entries/s on 2 idle cores "
              f"(signatures alone: {2e6 / sigs:,.0f})")
        return 2e6 / total
    finally:
        con.close()


#: Runs ``audit verify`` and reports its wall time, CPU (with its workers') and peak RSS: a process
#: of its own, so that the peak is the command's (a child of a large process may count its parent's pages).
_RUNNER = """
import json, os, resource, subprocess, sys, time
t = time.perf_counter()
out = subprocess.run([sys.executable, "-m", "apollia_nb", "audit", "verify", "--home", sys.argv[1]],
                     capture_output=True, text=True)
wall = time.perf_counter() - t
usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command waited for its workers
import apollia_nb
print(json.dumps({"ok": out.returncode == 0, "out": out.stdout + out.stderr, "wall": wall,
                  "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024,
                  "load": os.getloadavg()[0], "tree": apollia_nb.__file__}))
"""


def _command(home_dir: str, tree: str | None) -> dict:
    """One ``audit verify`` of ``home_dir`` with this tree's package, or ``tree``'s."""
    import json
    from pathlib import Path

    root = tree or str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", _RUNNER, home_dir], capture_output=True, text=True, env=env,
                         cwd=tempfile.gettempdir(), check=True)
    result = json.loads(out.stdout)
    assert result["ok"], result["out"]
    assert Path(result["tree"]).resolve().is_relative_to(Path(root).resolve()), result["tree"]
    return result


def whole_command(home_dir: str, entries: int, repeat: int, baseline: str | None = None) -> None:
    """The CLI as a fresh process, ``repeat`` times (alternating with ``baseline``'s when given):
    median CPU with its workers', best wall time, peak RSS; with a baseline, the ratios."""
    import statistics

    if repeat < 1:
        return
    trees = [("this tree", None)] + ([(f"baseline {baseline}", baseline)] if baseline else [])
    runs: dict[str, list[dict]] = {label: [] for label, _ in trees}
    for i in range(repeat):
        for label, tree in trees if i % 2 == 0 else trees[::-1]:
            runs[label].append(_command(home_dir, tree))
    medians = {}
    for label, results in runs.items():
        cpu = statistics.median(r["cpu"] for r in results)
        wall = min(r["wall"] for r in results)
        peak = max(r["rss_mb"] for r in results)
        load = statistics.mean(r["load"] for r in results)
        medians[label] = (cpu, peak)
        print(f"apollia-os audit verify, {label:<16}: {entries / wall:9,.0f} entries/s, {wall:.1f} s wall "
              f"(best of {len(results)}) at load average {load:.2f}; CPU {cpu:.2f} s (median, with its workers) "
              f"-> {entries / (cpu / 2):,.0f} entries/s on 2 idle cores; peak RSS {peak:.0f} MB")
    if baseline:
        (cpu, peak), (cpu0, peak0) = medians.values()
        print(f"this tree / baseline: CPU {cpu / cpu0:.3f}, peak RSS {peak / peak0:.3f}")


def _cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its waited-for children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def formats(entries: int, repeat: int, sample: int, baseline: str | None = None) -> None:
    """Format 2 against format 1, the same entries, verified alternately in one run: the breakdown
    of each, ``verify_home`` (2 worker processes) and the whole ``audit verify`` command (and
    ``baseline``'s command too, when given, right after this tree's)."""
    import statistics

    with tempfile.TemporaryDirectory() as d:
        homes = {fmt: Home.at(os.path.join(d, f"format{fmt}")) for fmt in ("1", "2")}
        for fmt, home in homes.items():
            build(home, entries, fmt)
        bound = {}
        for fmt, home in homes.items():
            print(f"format {fmt}: ", end="")
            bound[fmt] = breakdown(home, sample)
        figures: dict[str, tuple[list[float], list[float], list[float]]] = {fmt: ([], [], []) for fmt in homes}
        command: dict[str, list[dict]] = {fmt: [] for fmt in homes}
        before: dict[str, list[dict]] = {fmt: [] for fmt in homes}
        loads = []
        for i in range(repeat):
            for fmt, home in (homes.items() if i % 2 == 0 else reversed(homes.items())):
                s0, c0 = _cpu()
                t = time.perf_counter()
                report = verify_home(home, workers=2)
                wall = time.perf_counter() - t
                s1, c1 = _cpu()
                assert report.ok and report.entries == entries and report.format == fmt, report
                figures[fmt][0].append(wall / entries)
                figures[fmt][1].append((s1 - s0 + c1 - c0) / entries)
                figures[fmt][2].append((s1 - s0) / entries)
                command[fmt].append(_command(str(home.path), None))
                if baseline:
                    before[fmt].append(_command(str(home.path), baseline))
                loads.append(os.getloadavg()[0])
        med = {fmt: tuple(statistics.median(f) for f in fs) for fmt, fs in figures.items()}
        for fmt, (w, c, here) in med.items():
            print(f"verify_home, format {fmt}: {1 / w:9,.0f} entries/s wall, {c * 1e6:.1f} us CPU per entry "
                  f"(here + workers; here {here * 1e6:.1f})")
        cmd = {fmt: (statistics.median(r["wall"] for r in rs), statistics.median(r["cpu"] for r in rs))
               for fmt, rs in command.items()}
        for fmt, (wall, cpu) in cmd.items():
            print(f"apollia-os audit verify, format {fmt}: {entries / wall:9,.0f} entries/s wall (median of {repeat}), "
                  f"CPU {cpu * 1e6 / entries:.1f} us per entry with its workers -> {entries / (cpu / 2):,.0f} "
                  "entries/s on 2 idle cores")
        print(f"format 2 / format 1, breakdown: entries/s on 2 idle cores {bound['2'] / bound['1']:.3f}")
        print(f"format 2 / format 1, verify_home: throughput {med['1'][0] / med['2'][0]:.3f}, "
              f"CPU per entry {med['2'][1] / med['1'][1]:.3f} (here {med['2'][2] / med['1'][2]:.3f})")
        print(f"format 2 / format 1, audit verify: throughput {cmd['1'][0] / cmd['2'][0]:.3f}, "
              f"CPU per entry {cmd['2'][1] / cmd['1'][1]:.3f}")
        if baseline:
            old = {fmt: (statistics.median(r["wall"] for r in rs), statistics.median(r["cpu"] for r in rs))
                   for fmt, rs in before.items()}
            for fmt, (wall, cpu) in old.items():
                print(f"baseline {baseline}, format {fmt}: {entries / wall:9,.0f} entries/s wall, "
                      f"CPU {cpu * 1e6 / entries:.1f} us per entry with its workers")
            print(f"baseline, format 2 / format 1, audit verify: throughput {old['1'][0] / old['2'][0]:.3f}, "
                  f"CPU per entry {old['2'][1] / old['1'][1]:.3f}")
        print(f"load average during the rounds: {min(loads):.2f}-{max(loads):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=50_000, help="entries of the journal built")
    parser.add_argument("--home", help="an existing home to verify instead (a copy: verification only reads it)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N for each verify figure")
    parser.add_argument("--sample", type=int, default=100_000, help="entries the time is broken down over")
    parser.add_argument("--baseline", help="another checkout whose `audit verify` is measured in the same run")
    parser.add_argument("--formats", action="store_true",
                        help="only journals of format 2 (salted commitments) vs format 1, verified alternately")
    args = parser.parse_args()
    if args.formats:
        formats(args.entries, args.repeat, args.sample, args.baseline)
        print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        return

    for label, rate in raw_rates(20_000).items():
        print(f"raw {label:<47}: {rate:9,.0f} signatures/s, 1 core")
    if args.home is not None:
        home = Home.at(args.home)
        import duckdb

        con = duckdb.connect(str(home.journal_db), read_only=True)
        n = con.execute("SELECT count(*) FROM entries").fetchone()[0]
        con.close()
        breakdown(home, args.sample)
        whole_command(args.home, n, args.repeat, args.baseline)
        print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        return

    n = args.entries
    with tempfile.TemporaryDirectory() as d:
        home = Home.at(d)
        t = time.perf_counter()
        build(home, n)
        print(f"built {n:,} entries in {time.perf_counter() - t:.1f} s")
        breakdown(home, args.sample)

        for workers, label in ((1, "inline, 1 process"), (2, "2 worker processes")):
            best, cpu = 0.0, (0.0, 0.0)
            for _ in range(args.repeat):
                s0, c0 = _cpu()
                t = time.perf_counter()
                report = verify_home(home, workers=workers)
                rate = n / (time.perf_counter() - t)
                s1, c1 = _cpu()
                assert report.ok and report.entries == n, report
                if rate > best:
                    best, cpu = rate, (s1 - s0, c1 - c0)
            main_cpu, worker_cpu = cpu
            # What the CPU time allows on 2 otherwise idle cores: the busier of this
            # process and an even share of all the work.
            bound = n / max(main_cpu, (main_cpu + worker_cpu) / 2)
            print(f"verify_home, {label:<19}     : {best:9,.0f} entries/s; "
                  f"CPU {main_cpu:.2f} s here + {worker_cpu:.2f} s in workers "
                  f"-> {bound:,.0f} entries/s on 2 idle cores")
        whole_command(d, n, args.repeat, args.baseline)
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
