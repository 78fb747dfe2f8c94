"""``audit verify`` throughput on a large journal, beside the raw Ed25519 verify rates.

Run: ``.venv/bin/python benchmarks/journal_verify.py [--entries 50000]``, or
``benchmarks/journal_verify.py --home COPY`` on an existing home (verification
only reads it; still, point it at a copy of a home you keep).

Builds a journal of ``--entries`` entries (with a checkpoint every 5,000), or
takes ``--home``, then prints:

* the raw Ed25519 verify rate on one core: PyNaCl (libsodium, what the verifier
  uses) and ``cryptography`` (OpenSSL) when it is installed;
* where the time of a verification goes, per entry, over the first
  ``--sample`` entries: reading rows from DuckDB, checking sequence, link, hash,
  key id and Merkle tree (this process), laying out the signature items, and the
  signatures themselves; and what that allows on 2 idle cores;
* ``verify_home`` checking every signature inline (1 process) and with 2 worker
  processes (built journals only);
* the whole ``apollia-os audit verify`` command as a fresh process (interpreter
  start and imports included): wall time, CPU seconds of it and its workers, and
  peak RSS.

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


def build(home: Home, entries: int) -> None:
    with Journal.open(home) as journal:
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
    from apollia_nb.journal.verify import _COLUMNS, RANGE, _batch, _first_bad_index, _Scan

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

        def read() -> list[list[tuple]]:
            chunks = []
            for low in range(1, count + 1, RANGE):
                cursor = con.execute(f"SELECT {_COLUMNS} FROM entries WHERE seq BETWEEN ? AND ? ORDER BY seq",
                                     [low, min(low + RANGE - 1, count)])
                while rows := cursor.fetchmany(2_500):
                    chunks.append(rows)
            return chunks

        def scan() -> None:
            checker = _Scan(public, key_id(public), {}, acc=MerkleAccumulator())
            for chunk in chunks:
                for row in chunk:
                    checker.row(row)
            assert checker.failure is None and checker.count == count, checker.failure

        def signatures() -> None:
            assert all(_first_bad_index(public, b.body) is None for b in batches)

        print(f"where the time goes (first {count:,} entries, CPU):")
        spent = []
        cost, chunks = part("DuckDB rows, 10 columns, seq ranges sorted", read)
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


def whole_command(home_dir: str, entries: int, repeat: int) -> None:
    """The CLI as a fresh process: best wall time of ``repeat``, its CPU with its workers', peak RSS."""
    if repeat < 1:
        return
    best = None
    for _ in range(repeat):
        load = os.getloadavg()[0]
        _, c0 = _cpu()
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "apollia_nb", "audit", "verify", "--home", home_dir],
                             capture_output=True, text=True)
        wall = time.perf_counter() - t
        _, c1 = _cpu()  # the command waited for its workers, so their CPU is counted in its own
        assert out.returncode == 0, out.stdout + out.stderr
        if best is None or wall < best[0]:
            best = (wall, c1 - c0, load)
    wall, cpu, load = best
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest process waited for
    print(f"apollia-os audit verify (fresh process)    : {entries / wall:9,.0f} entries/s, {wall:.1f} s wall at "
          f"load average {load:.2f}; CPU {cpu:.1f} s (with its workers) -> {entries / (cpu / 2):,.0f} entries/s "
          f"on 2 idle cores; peak RSS {peak:.0f} MB")


def _cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its waited-for children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=50_000, help="entries of the journal built")
    parser.add_argument("--home", help="an existing home to verify instead (a copy: verification only reads it)")
    parser.add_argument("--repeat", type=int, default=3, help="best of N for each verify figure")
    parser.add_argument("--sample", type=int, default=100_000, help="entries the time is broken down over")
    args = parser.parse_args()

    for label, rate in raw_rates(20_000).items():
        print(f"raw {label:<47}: {rate:9,.0f} signatures/s, 1 core")
    if args.home is not None:
        home = Home.at(args.home)
        import duckdb

        con = duckdb.connect(str(home.journal_db), read_only=True)
        n = con.execute("SELECT count(*) FROM entries").fetchone()[0]
        con.close()
        breakdown(home, args.sample)
        whole_command(args.home, n, args.repeat)
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
        whole_command(d, n, args.repeat)
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
