"""``audit verify`` throughput on a large journal, beside the raw PyNaCl verify rate.

Run: ``.venv/bin/python benchmarks/journal_verify.py [--entries 50000]``

Builds a journal of ``--entries`` entries (with a checkpoint every 5,000), then
times: raw ``VerifyKey.verify`` on one core; ``verify_home`` checking every
signature inline (1 process) and with 2 worker processes; and the whole
``apollia-os audit verify`` command as a fresh process (interpreter start and
imports included). On a shared machine wall-clock rates drop with the load, so
the CPU seconds spent are printed too, with the rate they allow on 2 idle cores.
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


def raw_pynacl(n: int) -> float:
    key = SigningKey.generate()
    msgs = [os.urandom(32) for _ in range(n)]
    sigs = [key.sign(m).signature for m in msgs]
    verify = key.verify_key.verify
    t = time.perf_counter()
    for m, s in zip(msgs, sigs):
        verify(m, s)
    return n / (time.perf_counter() - t)


def _cpu() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its waited-for children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3, help="best of N for each verify figure")
    args = parser.parse_args()
    n = args.entries

    with tempfile.TemporaryDirectory() as d:
        home = Home.at(d)
        t = time.perf_counter()
        build(home, n)
        print(f"built {n:,} entries in {time.perf_counter() - t:.1f} s")

        raw = raw_pynacl(20_000)
        print(f"raw PyNaCl VerifyKey.verify, 1 core        : {raw:9,.0f} signatures/s")

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
            print(f"verify_home, {label:<19}     : {best:9,.0f} entries/s  ({best / raw:.2f}x raw verify); "
                  f"CPU {main_cpu:.2f} s here + {worker_cpu:.2f} s in workers "
                  f"-> {bound:,.0f} entries/s on 2 idle cores")

        best = 0.0
        for _ in range(args.repeat):
            t = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-m", "apollia_nb", "audit", "verify", "--home", d],
                capture_output=True, text=True,
            )
            best = max(best, n / (time.perf_counter() - t))
            assert out.returncode == 0, out.stdout + out.stderr
        print(f"apollia-os audit verify (fresh process)    : {best:9,.0f} entries/s  ({best / raw:.2f}x raw verify)")
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
