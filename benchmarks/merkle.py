"""Costs of the journal's Merkle tree and checkpoints at journal scale.

Run: ``.venv/bin/python benchmarks/merkle.py [LEAVES]`` (default 1,000,000).
Prints one line per measurement; nothing is written to disk.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable

import nacl.signing

from apollia_nb.journal.checkpoint import Checkpoint, NoteSigner, open_checkpoint
from apollia_nb.journal.merkle import (
    MerkleAccumulator,
    consistency_proof,
    inclusion_proof,
    root,
    verify_consistency,
    verify_inclusion,
)


def timed(label: str, fn: Callable[[], object], repeat: int = 1) -> object:
    start = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    elapsed = (time.perf_counter() - start) / repeat
    print(f"{label:<48} {elapsed * 1e6:14,.1f} µs")
    return out


def main(n: int) -> None:
    leaves = [hashlib.sha256(i.to_bytes(8, "big")).digest() for i in range(n)]
    print(f"leaves: {n:,}")

    r = timed("root(leaves)", lambda: root(leaves))

    def build() -> MerkleAccumulator:
        acc = MerkleAccumulator()
        for h in leaves:
            acc.append(h)
        return acc

    acc = timed("MerkleAccumulator: append every leaf", build)
    assert isinstance(acc, MerkleAccumulator)
    per_append = timed("MerkleAccumulator.root() (x1000)", acc.root, repeat=1000)
    assert per_append == r

    i = n // 3
    proof = timed("inclusion_proof(n // 3)", lambda: inclusion_proof(i, leaves))
    assert isinstance(proof, list)
    timed("verify_inclusion (x1000)", lambda: verify_inclusion(i, n, leaves[i], proof, r), repeat=1000)

    m = n - n // 7
    old = root(leaves[:m])
    cproof = timed("consistency_proof(n - n // 7, n)", lambda: consistency_proof(m, n, leaves))
    assert isinstance(cproof, list)
    timed(
        "verify_consistency (x1000)",
        lambda: verify_consistency(m, n, old, r, cproof),
        repeat=1000,
    )

    signer = NoteSigner("bench.example/journal", nacl.signing.SigningKey(b"\x07" * 32))
    verifier = signer.verifier()
    cp = Checkpoint("bench.example/journal", n, r)
    note = timed("sign checkpoint (x1000)", lambda: signer.sign(cp.body()), repeat=1000)
    assert isinstance(note, str)
    timed("open_checkpoint (x1000)", lambda: open_checkpoint(note, [verifier]), repeat=1000)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
