"""Durable journal appends per second: sequential, 16 concurrent appenders, beside raw DuckDB.

Run: ``.venv/bin/python benchmarks/journal_append.py [--n 2000] [--threads 16]``

Every figure counts only appends that returned, i.e. were committed. The raw
DuckDB baseline inserts rows of the same shape into the same schema, one
autocommit ``INSERT`` per row, without hashing or signing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path

import duckdb

from apollia_nb.home import Home
from apollia_nb.journal.store import _SCHEMA, Journal

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


def sequential(n: int) -> float:
    with tempfile.TemporaryDirectory() as d, Journal.open(Home.at(d)) as journal:
        journal.append("plan", {"warm": True})
        t = time.perf_counter()
        for i in range(n):
            journal.append("decision", PAYLOAD, run_id="run-1", agent="clerk")
        return n / (time.perf_counter() - t)


def concurrent(n_per_thread: int, threads: int) -> tuple[float, dict[str, int]]:
    with tempfile.TemporaryDirectory() as d, Journal.open(Home.at(d)) as journal:
        journal.append("plan", {"warm": True})
        barrier = threading.Barrier(threads + 1)

        def work(k: int) -> None:
            barrier.wait()
            for _ in range(n_per_thread):
                journal.append("decision", PAYLOAD, run_id=f"run-{k}", agent="clerk")

        pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        rate = n_per_thread * threads / (time.perf_counter() - t0)
        stats = journal.stats
        stats["transactions"] -= 1  # the warm-up
        return rate, stats


def raw_duckdb(n: int) -> float:
    """One autocommit INSERT per row into the journal's schema: no hash, no signature."""
    import json

    payload = json.dumps(PAYLOAD, sort_keys=True, separators=(",", ":")).encode()
    with tempfile.TemporaryDirectory() as d:
        con = duckdb.connect(str(Path(d) / "raw.db"))
        for ddl in _SCHEMA:
            con.execute(ddl)
        prev = bytes(32)
        t = time.perf_counter()
        for seq in range(1, n + 1):
            digest = hashlib.sha256(prev + payload).digest()
            con.execute(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [seq, "2026-11-29T00:00:00.000000Z", "run-1", "clerk", "decision", payload,
                 prev, digest, os.urandom(64), "0123456789abcdef"],
            )
            prev = digest
        rate = n / (time.perf_counter() - t)
        con.close()
        return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="sequential appends (and raw inserts)")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--per-thread", type=int, default=500)
    args = parser.parse_args()

    raw = raw_duckdb(args.n)
    seq = sequential(args.n)
    conc, stats = concurrent(args.per_thread, args.threads)
    batch = args.per_thread * args.threads / max(1, stats["transactions"])
    print(f"raw DuckDB autocommit INSERT, 1 row each : {raw:9,.0f} rows/s")
    print(f"journal.append, sequential               : {seq:9,.0f} entries/s  ({seq / raw:.2f}x raw)")
    print(f"journal.append, {args.threads} threads                : {conc:9,.0f} entries/s  "
          f"({conc / raw:.2f}x raw; {stats['transactions']} transactions, "
          f"mean batch {batch:.1f}, largest {stats['largest_batch']})")
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
