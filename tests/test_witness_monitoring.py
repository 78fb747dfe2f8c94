"""The witness's monitoring API and cosigning onward from the empty tree (C2SP tlog-witness, July 2026).

``GET <monitoring prefix>/<origin hash>/checkpoint`` on a real ``apollia-os witness serve`` process:
404 before the witness cosigned anything for the log, then the latest cosigned checkpoint with the
log signatures it verified and the very cosignature add-checkpoint returned, across a restart.
A witness that cosigned the empty tree cosigns onward from old size zero with an empty proof.
"""

from __future__ import annotations

import hashlib

import httpx
import nacl.signing
import pytest
from witness_helpers import WitnessProcess

from apollia_nb.journal.checkpoint import Checkpoint, NoteSigner, parse_note
from apollia_nb.journal.merkle import EMPTY_ROOT, consistency_proof, leaf_hash, root
from apollia_nb.journal.witness import CosignatureVerifier, format_add_checkpoint, parse_cosignature_lines

ORIGIN = "example.org/monitored"
LEAVES = [leaf_hash(bytes([i]) * 32) for i in range(10)]


def _signer(seed: int = 7, origin: str = ORIGIN) -> NoteSigner:
    return NoteSigner(origin, nacl.signing.SigningKey(bytes([seed]) * 32))


def _note(s: NoteSigner, size: int) -> str:
    return s.sign(Checkpoint(s.name, size, root(LEAVES[:size]) if size else EMPTY_ROOT).body())


def _add(w: WitnessProcess, old: int, proof: list[bytes], note: str) -> httpx.Response:
    return httpx.post(f"{w.url}/add-checkpoint", content=format_add_checkpoint(old, proof, note), timeout=20)


def _monitor(w: WitnessProcess, origin: str = ORIGIN, *, raw: str | None = None) -> httpx.Response:
    digest = raw if raw is not None else hashlib.sha256(origin.encode()).hexdigest()
    return httpx.get(f"{w.url}/{digest}/checkpoint", timeout=20)


@pytest.fixture
def witness(tmp_path):
    log = _signer()
    w = WitnessProcess(tmp_path / "w", log.verifier_key())
    yield w, log
    w.stop()


def test_the_monitoring_api_is_404_until_the_witness_cosigned_the_log(witness):
    w, log = witness
    assert _monitor(w).status_code == 404
    other = _signer(9, "example.org/other")
    assert _add(w, 0, [], _note(other, 1)).status_code == 404  # unknown origin: nothing held
    assert _monitor(w, "example.org/other").status_code == 404


def test_the_empty_tree_is_cosigned_and_served_then_cosigned_onward_from_old_size_zero(witness):
    w, log = witness
    empty = _add(w, 0, [], _note(log, 0))
    assert empty.status_code == 200
    served = _monitor(w)
    assert served.status_code == 200
    body, sigs = parse_note(served.text)
    assert body == parse_note(_note(log, 0))[0]
    assert [s.line() for s in sigs if s.name == w.key.split("+")[0]] == [empty.text]
    # onward from the empty tree: old size zero, no proof (the empty tree is consistent with any tree)
    assert _add(w, 0, [LEAVES[0]], _note(log, 4)).status_code == 422  # a proof from size zero: refused
    onward = _add(w, 0, [], _note(log, 4))
    assert onward.status_code == 200
    assert _add(w, 0, [], _note(log, 5)).status_code == 409  # now it holds 4
    assert _add(w, 0, [], _note(log, 5)).text == "4\n"
    body, sigs = parse_note(_monitor(w).text)
    assert body.splitlines()[1] == "4"


def test_the_served_checkpoint_carries_the_verified_log_signature_and_the_returned_cosignature(witness, tmp_path):
    w, log = witness
    assert _add(w, 0, [], _note(log, 3)).status_code == 200
    stranger = _signer(11)  # same origin, a key the witness does not trust: its line is not served
    note = _note(log, 5)
    signed_twice = note + stranger.sign(Checkpoint(ORIGIN, 5, root(LEAVES[:5])).body()).split("\n\n", 1)[1]
    answer = _add(w, 3, consistency_proof(3, 5, LEAVES), signed_twice)
    assert answer.status_code == 200
    served = _monitor(w)
    assert served.status_code == 200
    body, sigs = parse_note(served.text)
    assert body == parse_note(note)[0]
    assert [s.line() for s in sigs] == [parse_note(note)[1][0].line(), answer.text]
    cosig = parse_cosignature_lines(answer.text)[0]
    assert CosignatureVerifier.from_key(w.key).verifies(body, cosig)
    assert log.verifier().verifies(body, sigs[0])
    # the same answer after a restart: it comes from what the witness stored
    w.stop()
    again = WitnessProcess(w.directory)
    try:
        assert _monitor(again).text == served.text
    finally:
        again.stop()


@pytest.mark.parametrize("path", [
    "UPPER",  # the origin hash in upper case
    "short",  # not 64 hex digits
    "extra",  # a further path segment
])
def test_an_origin_hash_not_in_the_protocol_s_form_is_404(witness, path):
    w, log = witness
    assert _add(w, 0, [], _note(log, 2)).status_code == 200
    digest = hashlib.sha256(ORIGIN.encode()).hexdigest()
    url = {"UPPER": f"{w.url}/{digest.upper()}/checkpoint", "short": f"{w.url}/{digest[:63]}/checkpoint",
           "extra": f"{w.url}/{digest}/checkpoint/x"}[path]
    assert httpx.get(url, timeout=20).status_code == 404
    assert _monitor(w).status_code == 200
