"""kill -9 at random moments never loses a returned append, never breaks the chain.

A zygote process imports everything once and forks one child per round (so a
round costs a fork, not an interpreter start). The child opens the journal,
says ``ready``, and appends from several threads, writing ``seq hash`` to stdout
with one ``write`` right after each ``append`` returns. The test kills it with
SIGKILL after a random delay, then reopens the journal here: it must verify and
hold every reported entry, identical.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from apollia_nb.home import Home
from apollia_nb.journal import Journal, verify_journal

ROUNDS = 200
ROUNDS_PER_HOME = 20
THREADS = 4

ZYGOTE = textwrap.dedent(
    """
    import os, sys, threading
    from apollia_nb.home import Home
    from apollia_nb.journal.store import Journal

    def child(home_path, threads):
        journal = Journal.open(Home.at(home_path))
        os.write(1, b"ready\\n")

        def work(n):
            i = 0
            while True:
                entry = journal.append("tool_call", {"call_id": f"{n}-{i}", "tool": "t", "arguments": {"i": i}},
                                       run_id=f"run-{n}", agent="killer")
                os.write(1, b"entry %d %s\\n" % (entry.seq, entry.hash.hex().encode()))
                i += 1

        for n in range(threads):
            threading.Thread(target=work, args=(n,), daemon=True).start()
        threading.Event().wait()

    for line in sys.stdin:
        home_path = line.strip()
        pid = os.fork()
        if pid == 0:
            try:
                child(home_path, int(sys.argv[1]))
            finally:
                os._exit(1)
        os.write(1, b"forked %d\\n" % pid)
        os.waitpid(pid, 0)
        os.write(1, b"reaped %d\\n" % pid)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(170)
def test_kill_nine_at_random_moments(tmp_path):
    seed = int(os.environ.get("KILLNINE_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE, str(THREADS)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    reported_total = 0
    try:
        for round_ in range(ROUNDS):
            home = Home.at(tmp_path / f"home-{round_ // ROUNDS_PER_HOME}")
            zygote.stdin.write(f"{home.path}\n".encode())
            reported: dict[int, str] = {}
            pid = None
            # a quarter of the kills land while the child is still opening the journal
            kill_early = rng.random() < 0.25
            ready = False
            while pid is None or not (ready or kill_early):
                line = zygote.stdout.readline().decode()
                assert line, f"zygote ended (seed {seed})"
                word, _, rest = line.strip().partition(" ")
                if word == "forked":
                    pid = int(rest)
                elif word == "ready":
                    ready = True
            time.sleep(rng.uniform(0, 0.06))  # a random moment, not an ordering
            os.kill(pid, signal.SIGKILL)
            while True:
                line = zygote.stdout.readline().decode()
                assert line, f"zygote ended (seed {seed})"
                word, _, rest = line.strip().partition(" ")
                if word == "entry":
                    seq, digest = rest.split()
                    reported[int(seq)] = digest
                elif word == "reaped":
                    assert int(rest) == pid
                    break
            reported_total += len(reported)

            with Journal.open(home) as journal:
                report = verify_journal(journal, workers=1)
                assert report.ok, f"round {round_} (seed {seed}): {report}"
                if reported:
                    stored = {e.seq: e.hash.hex() for e in journal.entries(since_seq=min(reported) - 1)}
                    missing = {s: h for s, h in reported.items() if stored.get(s) != h}
                    assert not missing, f"round {round_} (seed {seed}): lost or changed {sorted(missing)[:5]}"
    finally:
        zygote.stdin.close()
        zygote.wait(timeout=30)
    assert reported_total > ROUNDS  # appends really were in flight when the kills landed
