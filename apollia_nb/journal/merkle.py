"""RFC 6962 Merkle trees over journal entry hashes: roots, proofs, verification.

The journal's entry hashes are the leaves of an RFC 6962 (RFC 9162 §2.1) Merkle
tree. A signed checkpoint commits to the tree's size and root; an inclusion proof
shows that one entry is in the tree a checkpoint describes, and a consistency
proof shows that a later checkpoint's tree extends an earlier one, so an auditor
holding an old checkpoint detects truncation and rewritten history.

Everything here is pure: bytes in, values out. Hashing is SHA-256 with the RFC's
domain separation::

    leaf_hash(d)     = SHA-256(0x00 || d)
    node_hash(l, r)  = SHA-256(0x01 || l || r)
    MTH({})          = SHA-256("")                     (EMPTY_ROOT)
    MTH(D[n])        = node_hash(MTH(D[0:k]), MTH(D[k:n]))  with k the largest
                       power of two smaller than n

Functions that take ``leaf_hashes`` expect leaves that are already hashed (each
32 bytes). Generators (``root``, ``inclusion_proof``, ``consistency_proof``,
``MerkleAccumulator``) raise :class:`~apollia_nb.errors.BadInput` for arguments
outside their domain; verifiers raise :class:`ProofError` for anything that does
not prove what it claims, including malformed proofs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

from apollia_nb.errors import BadInput, IntegrityError

__all__ = [
    "HASH_SIZE",
    "EMPTY_ROOT",
    "ProofError",
    "leaf_hash",
    "node_hash",
    "root",
    "MerkleAccumulator",
    "inclusion_proof",
    "inclusion_path",
    "verify_inclusion",
    "consistency_proof",
    "consistency_path",
    "verify_consistency",
]

HASH_SIZE = 32
_sha256 = hashlib.sha256
EMPTY_ROOT: bytes = _sha256(b"").digest()


class ProofError(IntegrityError):
    """A Merkle inclusion or consistency proof does not verify (INTEGRITY_FAILURE)."""


def leaf_hash(data: bytes) -> bytes:
    """SHA-256(0x00 || data): the hash of one leaf."""
    return _sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): the hash of an interior node."""
    return _sha256(b"\x01" + left + right).digest()


# --- building -----------------------------------------------------------------


def _check_leaves(leaves: Sequence[bytes]) -> None:
    if not leaves:
        return
    # Two C-level passes; the slow loop runs only to name the first bad leaf.
    if set(map(type, leaves)) == {bytes} and set(map(len, leaves)) == {HASH_SIZE}:
        return
    for i, h in enumerate(leaves):
        if not isinstance(h, bytes) or len(h) != HASH_SIZE:
            raise BadInput(f"leaf hash {i} is not {HASH_SIZE} bytes")


def _mth(level: Sequence[bytes]) -> bytes:
    """Merkle Tree Hash of checked leaf hashes, bottom-up one level at a time.

    Pairing neighbours level by level and carrying a lone last node up unchanged
    builds exactly the RFC's left-balanced tree, without recursion.
    """
    n = len(level)
    if n == 0:
        return EMPTY_ROOT
    sha = _sha256
    while n > 1:
        it = iter(level)
        nxt = [sha(b"\x01" + a + b).digest() for a, b in zip(it, it)]
        if n & 1:
            nxt.append(level[n - 1])
        level = nxt
        n = len(level)
    return level[0]


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    """The Merkle Tree Hash of a sequence of leaf hashes (EMPTY_ROOT when empty)."""
    _check_leaves(leaf_hashes)
    return _mth(leaf_hashes)


class MerkleAccumulator:
    """An append-only Merkle tree kept as its compact range.

    Holds one hash per set bit of ``size``: the roots of the perfect subtrees
    the tree decomposes into, largest (leftmost) first. ``append`` is amortised
    O(1) and at worst O(log n) hashes; ``root`` is O(log n). Memory is O(log n),
    so a journal can keep one open while appending without keeping every leaf.
    """

    __slots__ = ("_size", "_stack")

    def __init__(self) -> None:
        self._size = 0
        self._stack: list[bytes] = []

    @classmethod
    def from_leaf_hashes(cls, leaf_hashes: Iterable[bytes]) -> MerkleAccumulator:
        acc = cls()
        for h in leaf_hashes:
            acc.append(h)
        return acc

    @classmethod
    def from_state(cls, size: int, hashes: Sequence[bytes]) -> MerkleAccumulator:
        """Rebuild from ``(size, hashes)`` as returned by :attr:`size` and :attr:`hashes`."""
        if not _is_size(size):
            raise BadInput(f"accumulator size must be a non-negative integer, got {size!r}")
        if len(hashes) != size.bit_count():
            raise BadInput(
                f"an accumulator of size {size} holds {size.bit_count()} hashes, got {len(hashes)}"
            )
        _check_leaves(hashes)
        acc = cls()
        acc._size = size
        acc._stack = list(hashes)
        return acc

    @property
    def size(self) -> int:
        """Number of leaves appended."""
        return self._size

    @property
    def hashes(self) -> tuple[bytes, ...]:
        """The compact range: perfect-subtree roots, leftmost first."""
        return tuple(self._stack)

    def append(self, leaf_hash: bytes) -> None:
        """Add one leaf hash (32 bytes) at index ``size``."""
        if not isinstance(leaf_hash, bytes) or len(leaf_hash) != HASH_SIZE:
            raise BadInput(f"leaf hash is not {HASH_SIZE} bytes")
        stack = self._stack
        h = leaf_hash
        n = self._size
        while n & 1:
            h = _sha256(b"\x01" + stack.pop() + h).digest()
            n >>= 1
        stack.append(h)
        self._size += 1

    def extend(self, leaf_hashes: Sequence[bytes]) -> None:
        """Add leaf hashes (32 bytes each) in order, as ``append`` of each does, in one loop.

        Nothing is added when any of them is not 32 bytes (``BadInput`` names the first)."""
        _check_leaves(leaf_hashes)
        stack, n, sha = self._stack, self._size, _sha256
        pop, push = stack.pop, stack.append
        for h in leaf_hashes:
            m = n
            while m & 1:
                h = sha(b"\x01" + pop() + h).digest()
                m >>= 1
            push(h)
            n += 1
        self._size = n

    def root(self) -> bytes:
        """The Merkle Tree Hash of all leaves appended so far."""
        stack = self._stack
        if not stack:
            return EMPTY_ROOT
        r = stack[-1]
        for h in reversed(stack[:-1]):
            r = _sha256(b"\x01" + h + r).digest()
        return r

    def copy(self) -> MerkleAccumulator:
        acc = MerkleAccumulator()
        acc._size = self._size
        acc._stack = list(self._stack)
        return acc

    def __repr__(self) -> str:
        return f"MerkleAccumulator(size={self._size}, root={self.root().hex()})"


# --- proofs -------------------------------------------------------------------


def _is_size(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _split(n: int) -> int:
    """The largest power of two smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def inclusion_path(index: int, size: int, subtree: Callable[[int, int], bytes]) -> list[bytes]:
    """PATH(index, D[size]) of RFC 6962 §2.1.1, lowest sibling first, from ``subtree(lo, hi)``:
    the Merkle Tree Hash of leaves ``lo`` to ``hi - 1``. The ranges asked for partition the
    tree without the leaf itself, so a reader that streams each range from storage reads every
    leaf hash once and holds O(log n) of them."""
    if not _is_size(size) or not _is_size(index) or index >= size:
        raise BadInput(f"leaf index {index!r} is not in a tree of size {size!r}")
    path: list[bytes] = []
    lo, hi, m = 0, size, index
    while hi - lo > 1:
        k = _split(hi - lo)
        if m < k:
            path.append(subtree(lo + k, hi))
            hi = lo + k
        else:
            path.append(subtree(lo, lo + k))
            lo += k
            m -= k
    path.reverse()
    return path


def consistency_path(old_size: int, new_size: int, subtree: Callable[[int, int], bytes]) -> list[bytes]:
    """PROOF(old_size, D[new_size]) of RFC 6962 §2.1.2 from ``subtree(lo, hi)`` (see
    :func:`inclusion_path`). Same domain as :func:`consistency_proof`."""
    if not _is_size(old_size) or not _is_size(new_size):
        raise BadInput("tree sizes must be non-negative integers")
    if old_size > new_size:
        raise BadInput(f"old size {old_size} is larger than new size {new_size}")
    if old_size == 0:
        raise BadInput("a consistency proof from the empty tree proves nothing")
    if old_size == new_size:
        return []
    # SUBPROOF(m, D[lo:hi], b), unrolled: descend, collecting the sibling at each level.
    path: list[bytes] = []
    lo, hi, m, complete = 0, new_size, old_size, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:
            path.append(subtree(lo + k, hi))
            hi = lo + k
        else:
            path.append(subtree(lo, lo + k))
            lo += k
            m -= k
            complete = False
    if not complete:
        path.append(subtree(lo, hi))
    path.reverse()
    return path


def inclusion_proof(
    index: int, leaf_hashes: Sequence[bytes], size: int | None = None
) -> list[bytes]:
    """The audit path PATH(index, D[size]) of RFC 6962 §2.1.1, lowest sibling first.

    ``size`` defaults to ``len(leaf_hashes)``; only the first ``size`` leaves are used.
    """
    n = len(leaf_hashes) if size is None else size
    if not _is_size(n) or n > len(leaf_hashes):
        raise BadInput(f"tree size {n!r} is not within the {len(leaf_hashes)} leaves given")
    if not _is_size(index) or index >= n:
        raise BadInput(f"leaf index {index!r} is not in a tree of size {n}")
    leaves = leaf_hashes[:n]
    _check_leaves(leaves)
    return inclusion_path(index, n, lambda lo, hi: _mth(leaves[lo:hi]))


def consistency_proof(
    old_size: int, new_size: int, leaf_hashes: Sequence[bytes]
) -> list[bytes]:
    """PROOF(old_size, D[new_size]) of RFC 6962 §2.1.2 from the first new_size leaves.

    Empty when the sizes are equal. A proof from the empty tree (old_size 0,
    even to size 0) is refused: it proves nothing, and :func:`verify_consistency`
    rejects it.
    """
    if not _is_size(old_size) or not _is_size(new_size):
        raise BadInput("tree sizes must be non-negative integers")
    if old_size > new_size:
        raise BadInput(f"old size {old_size} is larger than new size {new_size}")
    if new_size > len(leaf_hashes):
        raise BadInput(f"new size {new_size} exceeds the {len(leaf_hashes)} leaves given")
    if old_size == 0:
        raise BadInput("a consistency proof from the empty tree proves nothing")
    if old_size == new_size:
        return []
    leaves = leaf_hashes[:new_size]
    _check_leaves(leaves)
    return consistency_path(old_size, new_size, lambda lo, hi: _mth(leaves[lo:hi]))


# --- verification (RFC 9162 §2.1.3.2 and §2.1.4.2) ------------------------------


def _check_proof(proof: Sequence[bytes]) -> list[bytes]:
    if proof is None:
        return []
    out = list(proof)
    for i, p in enumerate(out):
        if not isinstance(p, bytes) or len(p) != HASH_SIZE:
            raise ProofError(f"proof element {i} is not {HASH_SIZE} bytes")
    return out


def verify_inclusion(
    index: int, size: int, leaf_hash: bytes, proof: Sequence[bytes], root: bytes
) -> None:
    """Check that ``leaf_hash`` is leaf ``index`` of the tree of ``size`` leaves with ``root``.

    Follows RFC 9162 §2.1.3.2. Raises :class:`ProofError` on any mismatch or
    malformed input; returns None when the proof holds.
    """
    if not _is_size(index) or not _is_size(size):
        raise ProofError("leaf index and tree size must be non-negative integers")
    if index >= size:
        raise ProofError(f"leaf index {index} is not in a tree of size {size}")
    if not isinstance(leaf_hash, bytes) or len(leaf_hash) != HASH_SIZE:
        raise ProofError(f"leaf hash is not {HASH_SIZE} bytes")
    if not isinstance(root, bytes) or len(root) != HASH_SIZE:
        raise ProofError(f"root hash is not {HASH_SIZE} bytes")
    path = _check_proof(proof)
    fn, sn = index, size - 1
    r = leaf_hash
    for p in path:
        if sn == 0:
            raise ProofError("inclusion proof is too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("inclusion proof is too short")
    if r != root:
        raise ProofError("inclusion proof does not lead to the root")


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Check that the tree (new_size, new_root) extends the tree (old_size, old_root).

    Follows RFC 9162 §2.1.4.2 for 0 < old_size < new_size. Equal sizes need an
    empty proof and identical roots. A proof from the empty tree (old_size 0) is
    rejected: it would prove nothing. Raises :class:`ProofError`.
    """
    if not _is_size(old_size) or not _is_size(new_size):
        raise ProofError("tree sizes must be non-negative integers")
    if old_size > new_size:
        raise ProofError(f"old size {old_size} is larger than new size {new_size}")
    if old_size == 0:
        raise ProofError("a consistency proof from the empty tree proves nothing")
    path = _check_proof(proof)
    if old_size == new_size:
        if path:
            raise ProofError("equal tree sizes need an empty consistency proof")
        if old_root != new_root:
            raise ProofError("equal tree sizes but different roots")
        return
    # 1. An empty path fails.
    if not path:
        raise ProofError("consistency proof is empty")
    # 2. If old_size is an exact power of two, prepend old_root.
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    # 3.-4.
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    # 5.
    fr = sr = path[0]
    # 6.
    for c in path[1:]:
        if sn == 0:
            raise ProofError("consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    # 7.
    if sn != 0:
        raise ProofError("consistency proof is too short")
    if fr != old_root:
        raise ProofError("consistency proof does not lead to the old root")
    if sr != new_root:
        raise ProofError("consistency proof does not lead to the new root")
