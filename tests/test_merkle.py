"""RFC 6962 Merkle trees: published vectors, a reference MTH, and generated proofs."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from apollia_nb.errors import BadInput, IntegrityError
from apollia_nb.journal.merkle import (
    EMPTY_ROOT,
    MerkleAccumulator,
    ProofError,
    consistency_path,
    consistency_proof,
    inclusion_path,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root,
    verify_consistency,
    verify_inclusion,
)

VECTORS = Path(__file__).parent / "vectors" / "rfc6962-merkle"  # a copy of the public RFC 6962 vectors (Apache-2.0, LICENSE beside them)
INCLUSION_FILES = sorted((VECTORS / "inclusion").rglob("*.json"))
CONSISTENCY_FILES = sorted((VECTORS / "consistency").rglob("*.json"))


def _b64(value: str | None) -> bytes:
    return base64.b64decode(value) if value else b""


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _vector_id(path: Path) -> str:
    return str(path.relative_to(VECTORS))


# --- published vectors (transparency-dev/merkle testdata) ----------------------


def test_vector_files_are_present() -> None:
    assert len(INCLUSION_FILES) > 90
    assert len(CONSISTENCY_FILES) > 90


@pytest.mark.parametrize("path", INCLUSION_FILES, ids=_vector_id)
def test_inclusion_vector(path: Path) -> None:
    case = _load(path)
    args = (
        case["leafIdx"],
        case["treeSize"],
        _b64(case["leafHash"]),
        [_b64(p) for p in case["proof"] or []],
        _b64(case["root"]),
    )
    if case["wantErr"]:
        with pytest.raises(ProofError):
            verify_inclusion(*args)
    else:
        verify_inclusion(*args)


@pytest.mark.parametrize("path", CONSISTENCY_FILES, ids=_vector_id)
def test_consistency_vector(path: Path) -> None:
    case = _load(path)
    args = (
        case["size1"],
        case["size2"],
        _b64(case["root1"]),
        _b64(case["root2"]),
        [_b64(p) for p in case["proof"] or []],
    )
    if case["wantErr"]:
        with pytest.raises(ProofError):
            verify_consistency(*args)
    else:
        verify_consistency(*args)


# --- hashing and roots ------------------------------------------------------------


def reference_mth(data: list[bytes]) -> bytes:
    """MTH straight from RFC 6962 §2.1, over raw leaf data."""
    n = len(data)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + data[0]).digest()
    k = 1
    while k * 2 < n:
        k *= 2
    return hashlib.sha256(b"\x01" + reference_mth(data[:k]) + reference_mth(data[k:])).digest()


def _data(n: int) -> list[bytes]:
    return [f"entry {i}".encode() for i in range(n)]


def test_hash_functions_use_rfc_domain_separation() -> None:
    assert EMPTY_ROOT == hashlib.sha256(b"").digest()
    assert leaf_hash(b"x") == hashlib.sha256(b"\x00x").digest()
    a, b = leaf_hash(b"a"), leaf_hash(b"b")
    assert node_hash(a, b) == hashlib.sha256(b"\x01" + a + b).digest()


def test_root_of_known_rfc_tree() -> None:
    # The eight-leaf tree used by the RFC 6962 reference tests (certificate-transparency).
    data = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243",
                                        "5051525354555657", "606162636465666768696a6b6c6d6e6f")]
    assert root([leaf_hash(d) for d in data]).hex() == (
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"
    )
    assert root([leaf_hash(data[0])]).hex() == (
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
    )


def test_root_matches_reference_and_accumulator_for_every_size() -> None:
    data = _data(300)
    leaves = [leaf_hash(d) for d in data]
    acc = MerkleAccumulator()
    assert acc.size == 0 and acc.root() == EMPTY_ROOT == root([])
    for n in range(1, len(leaves) + 1):
        acc.append(leaves[n - 1])
        want = root(leaves[:n])
        assert acc.size == n
        assert acc.root() == want, n
        assert len(acc.hashes) == n.bit_count()
        if n <= 130:
            assert reference_mth(data[:n]) == want, n


def test_root_handles_large_trees_iteratively() -> None:
    n = (1 << 16) + 3
    leaves = [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(n)]
    acc = MerkleAccumulator.from_leaf_hashes(leaves)
    assert acc.root() == root(leaves)
    left = root(leaves[: 1 << 16])
    assert root(leaves) == node_hash(left, root(leaves[1 << 16 :]))


def test_accumulator_copy_is_independent_and_state_round_trips() -> None:
    leaves = [leaf_hash(d) for d in _data(11)]
    acc = MerkleAccumulator.from_leaf_hashes(leaves[:7])
    snap = acc.copy()
    for h in leaves[7:]:
        acc.append(h)
    assert snap.size == 7 and snap.root() == root(leaves[:7])
    assert acc.size == 11 and acc.root() == root(leaves)
    again = MerkleAccumulator.from_state(acc.size, acc.hashes)
    again.append(leaf_hash(b"next"))
    assert again.root() == root(leaves + [leaf_hash(b"next")])


def test_generators_reject_bad_input_with_stable_code() -> None:
    leaves = [leaf_hash(d) for d in _data(5)]
    acc = MerkleAccumulator()
    for bad in (b"short", "not bytes", b"\x00" * 33):
        with pytest.raises(BadInput) as err:
            acc.append(bad)  # type: ignore[arg-type]
        assert err.value.code == "BAD_INPUT"
    assert acc.size == 0
    with pytest.raises(BadInput):
        root([b"\x00" * 31])
    with pytest.raises(BadInput):
        MerkleAccumulator.from_state(3, [leaves[0]])
    with pytest.raises(BadInput):
        MerkleAccumulator.from_state(-1, [])
    with pytest.raises(BadInput):
        inclusion_proof(5, leaves)
    with pytest.raises(BadInput):
        inclusion_proof(-1, leaves)
    with pytest.raises(BadInput):
        inclusion_proof(0, leaves, size=6)
    with pytest.raises(BadInput):
        consistency_proof(3, 2, leaves)
    with pytest.raises(BadInput):
        consistency_proof(0, 3, leaves)
    with pytest.raises(BadInput):
        consistency_proof(0, 0, leaves)
    with pytest.raises(BadInput):
        consistency_proof(2, 6, leaves)
    assert consistency_proof(3, 3, leaves) == []


def _bad_input(call) -> str:
    with pytest.raises(BadInput) as err:
        call()
    return err.value.message


def test_generators_name_the_bad_argument_never_a_type_error() -> None:
    leaves = [leaf_hash(d) for d in _data(5)]
    # A wrong type of index or size is refused as bad input before it is compared.
    for index in ("0", 5, -1, True, 2.0):
        assert _bad_input(lambda index=index: inclusion_proof(index, leaves)) == (
            f"leaf index {index!r} is not in a tree of size 5")
    # The index is checked before the leaves.
    for index in (-1, 1):
        assert _bad_input(lambda index=index: inclusion_proof(index, [b"short"])) == (
            f"leaf index {index} is not in a tree of size 1")
    sizes = "tree sizes must be non-negative integers"
    for old, new in (("1", 5), (1, "5"), (1, 5.0), (-1, 3), (2, -1), (False, 3)):
        assert _bad_input(lambda old=old, new=new: consistency_proof(old, new, leaves)) == sizes
    for size in (6, -1, 2.0, True):
        assert _bad_input(lambda size=size: inclusion_proof(0, leaves, size=size)) == (
            f"tree size {size!r} is not within the 5 leaves given")
    assert _bad_input(lambda: consistency_proof(3, 2, leaves)) == "old size 3 is larger than new size 2"
    assert _bad_input(lambda: consistency_proof(2, 6, leaves)) == "new size 6 exceeds the 5 leaves given"
    for new in (0, 3):
        assert _bad_input(lambda new=new: consistency_proof(0, new, leaves)) == (
            "a consistency proof from the empty tree proves nothing")


def _subtree(lo: int, hi: int) -> bytes:
    return root(LEAVES[lo:hi])


def test_paths_from_subtree_reader_verify() -> None:
    for n in range(1, 20):
        for i in range(n):
            path = inclusion_path(i, n, _subtree)
            verify_inclusion(i, n, LEAVES[i], path, ROOTS[n])
            assert path == inclusion_proof(i, LEAVES[:n])
        for m in range(1, n):
            path = consistency_path(m, n, _subtree)
            verify_consistency(m, n, ROOTS[m], ROOTS[n], path)
            assert path == consistency_proof(m, n, LEAVES)
    # Equal sizes: the empty proof, and no range is read.
    reads: list[tuple[int, int]] = []
    assert consistency_path(5, 5, lambda lo, hi: reads.append((lo, hi)) or _subtree(lo, hi)) == []
    assert reads == []


def test_paths_from_subtree_reader_reject_bad_input() -> None:
    def never(lo: int, hi: int) -> bytes:
        raise AssertionError(f"range {lo}..{hi} read for a refused argument")

    for index, size in ((5, 5), (0, 0), (-1, 5), (True, 5), ("0", 5), (0, -1), (0, 5.0), (0, False)):
        assert _bad_input(lambda index=index, size=size: inclusion_path(index, size, never)) == (
            f"leaf index {index!r} is not in a tree of size {size!r}")
    sizes = "tree sizes must be non-negative integers"
    for old, new in (("1", 5), (1, "5"), (-1, 5), (1, -5), (True, 5), (1, 5.0)):
        assert _bad_input(lambda old=old, new=new: consistency_path(old, new, never)) == sizes
    assert _bad_input(lambda: consistency_path(6, 5, never)) == "old size 6 is larger than new size 5"
    for new in (0, 5):
        assert _bad_input(lambda new=new: consistency_path(0, new, never)) == (
            "a consistency proof from the empty tree proves nothing")


def test_proof_error_is_an_integrity_failure() -> None:
    assert issubclass(ProofError, IntegrityError)
    with pytest.raises(ProofError) as err:
        verify_inclusion(1, 1, leaf_hash(b""), [], leaf_hash(b""))
    assert err.value.code == "INTEGRITY_FAILURE"


# --- generated proofs: every index and old size up to 70 ---------------------------

MAX_N = 70
LEAVES = [leaf_hash(d) for d in _data(MAX_N)]
ROOTS = [root(LEAVES[:n]) for n in range(MAX_N + 1)]
OTHER = hashlib.sha256(b"someone else's hash").digest()


def _flip(h: bytes, bit: int) -> bytes:
    b = bytearray(h)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


def _mutations(proof: list[bytes], salt: int) -> list[tuple[str, list[bytes]]]:
    """Proofs that differ from ``proof``: a flipped bit in every element, every element
    dropped, an element added at the front, middle and end."""
    out: list[tuple[str, list[bytes]]] = []
    for i, p in enumerate(proof):
        # The flipped bit position moves with the case, so across all cases every bit is hit.
        bit = (salt * 37 + i * 11) % 256
        out.append((f"flip {i}:{bit}", proof[:i] + [_flip(p, bit)] + proof[i + 1 :]))
        out.append((f"drop {i}", proof[:i] + proof[i + 1 :]))
    for pos in {0, len(proof) // 2, len(proof)}:
        out.append((f"add OTHER at {pos}", proof[:pos] + [OTHER] + proof[pos:]))
        if proof:
            dup = proof[min(pos, len(proof) - 1)]
            out.append((f"add dup at {pos}", proof[:pos] + [dup] + proof[pos:]))
    return out


def test_every_inclusion_proof_verifies_and_every_mutation_fails() -> None:
    for n in range(1, MAX_N + 1):
        for i in range(n):
            proof = inclusion_proof(i, LEAVES[:n])
            assert proof == inclusion_proof(i, LEAVES, size=n)
            verify_inclusion(i, n, LEAVES[i], proof, ROOTS[n])
            for what, bad in _mutations(proof, salt=n * 71 + i):
                with pytest.raises(ProofError):
                    verify_inclusion(i, n, LEAVES[i], bad, ROOTS[n])
                    pytest.fail(f"n={n} i={i}: {what} verified")
            # A tree size is bound only through its root: the same path can verify for a
            # neighbouring size whose tree has the same shape along it, which is why sizes
            # come from signed checkpoints. Sizes tested here change the path's shape.
            wrong_args = [
                (i, n, LEAVES[i], proof, _flip(ROOTS[n], (n + i) % 256)),
                (i, n, LEAVES[i], proof, ROOTS[n - 1] if n > 1 else OTHER),
                (i, n, _flip(LEAVES[i], i % 256), proof, ROOTS[n]),
                (i, n, LEAVES[(i + 1) % n] if n > 1 else OTHER, proof, ROOTS[n]),
                (i, n * 2, LEAVES[i], proof, ROOTS[n]),
                (n, n, LEAVES[i], proof, ROOTS[n]),
            ]
            if n > 1:
                wrong_args.append(((i + 1) % n, n, LEAVES[i], proof, ROOTS[n]))
            for args in wrong_args:
                with pytest.raises(ProofError):
                    verify_inclusion(*args)
                    pytest.fail(f"n={n} i={i}: {args[:2]} verified")


def test_every_consistency_proof_verifies_and_every_mutation_fails() -> None:
    for n in range(1, MAX_N + 1):
        for m in range(1, n + 1):
            proof = consistency_proof(m, n, LEAVES[:n])
            assert proof == consistency_proof(m, n, LEAVES)
            verify_consistency(m, n, ROOTS[m], ROOTS[n], proof)
            for what, bad in _mutations(proof, salt=n * 71 + m):
                with pytest.raises(ProofError):
                    verify_consistency(m, n, ROOTS[m], ROOTS[n], bad)
                    pytest.fail(f"m={m} n={n}: {what} verified")
            wrong_args = [
                (m, n, _flip(ROOTS[m], (n + m) % 256), ROOTS[n], proof),
                (m, n, ROOTS[m], _flip(ROOTS[n], (n * m) % 256), proof),
                (m, n, OTHER, ROOTS[n], proof),
                (m, n, ROOTS[m], OTHER, proof),
                (0, n, EMPTY_ROOT, ROOTS[n], proof),
                (m, n * 2, ROOTS[m], ROOTS[n], proof),
            ]
            if m < n:
                wrong_args += [
                    (m, n, ROOTS[n], ROOTS[m], proof),
                    (m + 1, n, ROOTS[m], ROOTS[n], proof),
                    (m, n, ROOTS[m], ROOTS[n], []),
                ]
            if m > 1:
                wrong_args.append((m - 1, n, ROOTS[m], ROOTS[n], proof))
            for args in wrong_args:
                with pytest.raises(ProofError):
                    verify_consistency(*args)
                    pytest.fail(f"m={m} n={n}: {args[:2]} verified")


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 32, 33, 70])
def test_every_bit_of_every_proof_element_matters(n: int) -> None:
    i, m = n // 3, max(1, (2 * n) // 3)
    incl = inclusion_proof(i, LEAVES[:n])
    cons = consistency_proof(m, n, LEAVES)
    for j, p in enumerate(incl):
        for bit in range(256):
            bad = incl[:j] + [_flip(p, bit)] + incl[j + 1 :]
            with pytest.raises(ProofError):
                verify_inclusion(i, n, LEAVES[i], bad, ROOTS[n])
    for j, p in enumerate(cons):
        for bit in range(256):
            bad = cons[:j] + [_flip(p, bit)] + cons[j + 1 :]
            with pytest.raises(ProofError):
                verify_consistency(m, n, ROOTS[m], ROOTS[n], bad)


def test_equal_sizes_and_empty_tree() -> None:
    verify_consistency(5, 5, ROOTS[5], ROOTS[5], [])
    with pytest.raises(ProofError):
        verify_consistency(5, 5, ROOTS[5], ROOTS[4], [])
    with pytest.raises(ProofError):
        verify_consistency(5, 5, ROOTS[5], ROOTS[5], [ROOTS[5]])
    for n in (0, 1, 7):
        with pytest.raises(ProofError):
            verify_consistency(0, n, EMPTY_ROOT, ROOTS[n], [])
    with pytest.raises(ProofError):
        verify_inclusion(0, 0, LEAVES[0], [], EMPTY_ROOT)


def test_malformed_proof_elements_are_rejected() -> None:
    proof = inclusion_proof(2, LEAVES[:8])
    for bad_element in (b"", proof[0] + b"\x00", proof[0][:-1]):
        with pytest.raises(ProofError, match="is not 32 bytes"):
            verify_inclusion(2, 8, LEAVES[2], [bad_element] + proof[1:], ROOTS[8])
    with pytest.raises(ProofError):
        verify_inclusion(2, 8, LEAVES[2], proof, ROOTS[8][:31])
    with pytest.raises(ProofError):
        verify_inclusion(-1, 8, LEAVES[2], proof, ROOTS[8])


def _reason(call) -> str:
    with pytest.raises(ProofError) as err:
        call()
    return err.value.message


def test_inclusion_proof_errors_say_what_is_wrong() -> None:
    proof = inclusion_proof(2, LEAVES[:8])
    leaf, top = LEAVES[2], ROOTS[8]
    sizes = "leaf index and tree size must be non-negative integers"
    # Exactly one of index and size invalid is enough.
    assert _reason(lambda: verify_inclusion(-1, 8, leaf, proof, top)) == sizes
    assert _reason(lambda: verify_inclusion(2, -8, leaf, proof, top)) == sizes
    assert _reason(lambda: verify_inclusion(True, 8, leaf, proof, top)) == sizes
    assert _reason(lambda: verify_inclusion(2, 8.0, leaf, proof, top)) == sizes
    assert _reason(lambda: verify_inclusion(8, 8, leaf, proof, top)) == "leaf index 8 is not in a tree of size 8"
    # A 32-character str or a bytearray is not a hash: a ProofError, never a TypeError.
    for bad in ("x" * 32, bytearray(leaf), leaf[:31]):
        assert _reason(lambda bad=bad: verify_inclusion(2, 8, bad, proof, top)) == "leaf hash is not 32 bytes"
        assert _reason(lambda bad=bad: verify_inclusion(2, 8, leaf, proof, bad)) == "root hash is not 32 bytes"
        assert _reason(lambda bad=bad: verify_inclusion(2, 8, leaf, [bad] + proof[1:], top)) == (
            "proof element 0 is not 32 bytes")
    # No proof at all (None) is the empty proof: enough for a tree of one leaf, too short otherwise.
    assert verify_inclusion(0, 1, LEAVES[0], None, ROOTS[1]) is None
    assert _reason(lambda: verify_inclusion(2, 8, leaf, None, top)) == "inclusion proof is too short"
    assert _reason(lambda: verify_inclusion(2, 8, leaf, proof + [leaf], top)) == "inclusion proof is too long"
    assert _reason(lambda: verify_inclusion(2, 8, leaf, proof[:-1], top)) == "inclusion proof is too short"
    assert _reason(lambda: verify_inclusion(2, 8, LEAVES[3], proof, top)) == (
        "inclusion proof does not lead to the root")


def test_consistency_proof_errors_say_what_is_wrong() -> None:
    proof = consistency_proof(3, 8, LEAVES[:8])
    old, new = ROOTS[3], ROOTS[8]
    sizes = "tree sizes must be non-negative integers"
    assert _reason(lambda: verify_consistency(-1, 8, old, new, proof)) == sizes
    assert _reason(lambda: verify_consistency(3, -1, old, new, proof)) == sizes
    assert _reason(lambda: verify_consistency(3, False, old, new, proof)) == sizes
    assert _reason(lambda: verify_consistency(9, 8, old, new, proof)) == "old size 9 is larger than new size 8"
    assert _reason(lambda: verify_consistency(0, 8, EMPTY_ROOT, new, [])) == (
        "a consistency proof from the empty tree proves nothing")
    assert _reason(lambda: verify_consistency(8, 8, new, new, [new])) == (
        "equal tree sizes need an empty consistency proof")
    assert _reason(lambda: verify_consistency(8, 8, new, old, [])) == "equal tree sizes but different roots"
    assert verify_consistency(8, 8, new, new, []) is None
    assert _reason(lambda: verify_consistency(3, 8, old, new, [])) == "consistency proof is empty"
    assert _reason(lambda: verify_consistency(3, 8, old, new, proof + [new])) == "consistency proof is too long"
    assert _reason(lambda: verify_consistency(3, 8, old, new, proof[:-1])) == "consistency proof is too short"
    assert _reason(lambda: verify_consistency(3, 8, ROOTS[4], new, proof)) == (
        "consistency proof does not lead to the old root")
    assert _reason(lambda: verify_consistency(3, 8, old, ROOTS[7], proof)) == (
        "consistency proof does not lead to the new root")


def test_accumulator_repr_shows_size_and_root() -> None:
    acc = MerkleAccumulator.from_leaf_hashes(LEAVES[:5])
    assert repr(acc) == f"MerkleAccumulator(size=5, root={ROOTS[5].hex()})"
    assert repr(MerkleAccumulator()) == f"MerkleAccumulator(size=0, root={EMPTY_ROOT.hex()})"


def test_accumulator_errors_say_exactly_what_is_wrong():
    from apollia_nb.errors import BadInput
    from apollia_nb.journal.merkle import MerkleAccumulator

    with pytest.raises(BadInput) as info:
        MerkleAccumulator.from_state(-1, [])
    assert info.value.message == "accumulator size must be a non-negative integer, got -1"
    with pytest.raises(BadInput) as info:
        MerkleAccumulator.from_state(3, [bytes(32)])
    assert info.value.message == "an accumulator of size 3 holds 2 hashes, got 1"
    with pytest.raises(BadInput) as info:
        MerkleAccumulator().append(b"short")
    assert info.value.message == "leaf hash is not 32 bytes"


@pytest.mark.parametrize(
    ("leaves", "message"),
    [
        ([b"\x00" * 32, "a" * 32], "leaf hash 1 is not 32 bytes"),  # 32 characters, but not bytes
        ([b"\x00" * 32, bytearray(32)], "leaf hash 1 is not 32 bytes"),
        ([b"\x00" * 32, b"\x00" * 32, b"\x00" * 31], "leaf hash 2 is not 32 bytes"),  # named: the first bad one
        (["a" * 32, b"\x00" * 5], "leaf hash 0 is not 32 bytes"),
    ],
    ids=["str", "bytearray", "short-third", "both-bad"],
)
def test_a_root_of_a_bad_leaf_names_the_first_one_exactly(leaves: list, message: str) -> None:
    for build in (root, lambda ls: inclusion_proof(0, ls), lambda ls: consistency_proof(1, len(ls), ls)):
        with pytest.raises(BadInput) as err:
            build(leaves)
        assert err.value.message == message and err.value.code == "BAD_INPUT"
