"""A witness answers every request, trusts one key per origin, and a quorum counts witnesses, not lines.

Malformed add-checkpoint requests (huge, negative, signed or zero-led numbers, overlong lines,
missing or extra lines, bad base64, bodies too large or not UTF-8, broken framing) reach a real
`apollia-os witness serve` process over a raw socket on 127.0.0.1 and each gets an answer with a
4xx status, never a dropped connection or a 5xx; the same process then still cosigns. The
decisions follow the July 2026 text of C2SP tlog-witness (422 for a same-size checkpoint with
another root and for a size-zero checkpoint without the empty tree's root).
"""

from __future__ import annotations

import base64
import os
import socket

import nacl.signing
import pytest
from witness_helpers import WitnessProcess, cli

from apollia_nb.errors import BadInput
from apollia_nb.journal.checkpoint import Checkpoint, NoteSigner, parse_note
from apollia_nb.journal.merkle import EMPTY_ROOT, consistency_proof, leaf_hash, root
from apollia_nb.journal.witness import (
    CosignatureVerifier,
    Cosigner,
    check_cosigned,
    format_add_checkpoint,
    witness_decide,
)
from apollia_nb.journal.witness_sender import parse_witnesses
from apollia_nb.witness.server import TRUST_FILE, WitnessState

ORIGIN = "example.org/log"
LEAVES = [leaf_hash(bytes([i]) * 32) for i in range(10)]


def signer(seed: int = 1, origin: str = ORIGIN) -> NoteSigner:
    return NoteSigner(origin, nacl.signing.SigningKey(bytes([seed]) * 32))


def note(s: NoteSigner, size: int, leaves: list[bytes] = LEAVES, *, root_hash: bytes | None = None) -> str:
    return s.sign(Checkpoint(s.name, size, root(leaves[:size]) if root_hash is None else root_hash).body())


def raw_note(s: NoteSigner, size_text: str) -> str:
    """A note signed over a body whose size line is any text (the signer signs bytes, not numbers)."""
    body = f"{s.name}\n{size_text}\n{base64.b64encode(root(LEAVES[:1])).decode()}\n"
    sig = s.sign(Checkpoint(s.name, 1, root(LEAVES[:1])).body())  # a signature line of the right shape
    line = sig[sig.index("\n\n") + 2:]
    return body + "\n" + line


def exchange(port: int, data: bytes, *, timeout: float = 20.0) -> tuple[int | None, bytes]:
    """Send raw bytes, read until the server closes or one answer is complete: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
            head, sep, body = got.partition(b"\r\n\r\n")
            if sep:
                length = [int(v) for k, v in (h.split(b":", 1) for h in head.split(b"\r\n")[1:] if b":" in h)
                          if k.strip().lower() == b"content-length"]
                if length and len(body) >= length[0]:
                    break
    if not got.startswith(b"HTTP/1."):
        return None, got
    head, _, body = got.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def post(body: bytes, *, headers: str | None = None) -> bytes:
    if headers is None:
        headers = f"Content-Length: {len(body)}\r\n"
    return b"POST /add-checkpoint HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers.encode() + b"\r\n" + body


@pytest.fixture
def witness(tmp_path):
    w = WitnessProcess(tmp_path / "w", signer().verifier_key())
    yield w
    w.stop()


GOOD = signer()
N4 = note(GOOD, 4)


def _malformed_bodies() -> dict[str, bytes]:
    proof = base64.b64encode(LEAVES[0]).decode()
    return {
        "old of 5,000 digits": f"old {'9' * 5000}\n\n{N4}".encode(),
        "old of 21 digits": f"old {'1' * 21}\n\n{N4}".encode(),
        "old of 2^64": f"old {1 << 64}\n\n{N4}".encode(),
        "negative old": f"old -1\n\n{N4}".encode(),
        "old with a plus sign": f"old +0\n\n{N4}".encode(),
        "old with a leading zero": f"old 00\n\n{N4}".encode(),
        "hexadecimal old": f"old 0x0\n\n{N4}".encode(),
        "old with a space before it": f"old  0\n\n{N4}".encode(),
        "old with a carriage return": f"old 0\r\n\n{N4}".encode(),
        "old line of 60,000 characters": f"old {'0' * 60000}\n\n{N4}".encode(),
        "no old line": f"\n{N4}".encode(),
        "no empty line before the checkpoint": f"old 0\n{N4}".encode(),
        "a proof line that is not base64": f"old 0\nnot-base64!\n\n{N4}".encode(),
        "a proof line of 31 bytes": f"old 0\n{base64.b64encode(bytes(31)).decode()}\n\n{N4}".encode(),
        "a proof line of 32 bytes without padding": f"old 0\n{proof.rstrip('=')}\n\n{N4}".encode(),
        "64 proof lines": ("old 0\n" + f"{proof}\n" * 64 + "\n" + N4).encode(),
        "a checkpoint size of 5,000 digits": f"old 0\n\n{raw_note(GOOD, '9' * 5000)}".encode(),
        "a checkpoint size of 2^64": f"old 0\n\n{raw_note(GOOD, str(1 << 64))}".encode(),
        "a negative checkpoint size": f"old 0\n\n{raw_note(GOOD, '-4')}".encode(),
        "a checkpoint size with a plus sign": f"old 0\n\n{raw_note(GOOD, '+4')}".encode(),
        "no checkpoint": b"old 0\n\n",
        "a checkpoint without signatures": f"old 0\n\n{N4.split(chr(10) + chr(10))[0]}\n".encode(),
        "not UTF-8": b"old 0\n\n" + N4.encode().replace(b"example", b"ex\xffmple"),
        "a NUL byte": b"old 0\n\n" + N4.encode().replace(b"example", b"ex\x00mple"),
        "empty": b"",
        # signed by the trusted key, but larger than any tree size the witness can record
        "a signed checkpoint of size 2^63": f"old 0\n\n{note(GOOD, 1 << 63, root_hash=LEAVES[0])}".encode(),
        "a signed checkpoint of size 2^64 - 1": f"old 0\n\n{note(GOOD, (1 << 64) - 1, root_hash=LEAVES[0])}".encode(),
    }


MALFORMED = _malformed_bodies()


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_request_is_answered_400(witness, case):
    status, body = exchange(witness.port, post(MALFORMED[case]))
    assert status == 400, (case, status, body[:200])
    assert body.strip(), case  # a reason, in words


BAD_FRAMING = {
    "Content-Length not a number": ("Content-Length: abc\r\n", b"old 0\n\n", 400),
    "negative Content-Length": ("Content-Length: -1\r\n", b"", 400),
    "Content-Length with a plus sign": ("Content-Length: +7\r\n", b"old 0\n\n", 400),
    "Content-Length with an underscore": ("Content-Length: 0_7\r\n", b"old 0\n\n", 400),
    "Content-Length in other digits": ("Content-Length: \u0667\r\n", b"old 0\n\n", 400),
    "Content-Length given twice": ("Content-Length: 7\r\nContent-Length: 7\r\n", b"old 0\n\n", 400),
    "chunked body": ("Transfer-Encoding: chunked\r\n", b"7\r\nold 0\n\n\r\n0\r\n\r\n", 400),
    "no Content-Length": ("", b"", 411),
    "Content-Length of 5,000 digits": ("Content-Length: " + "9" * 5000 + "\r\n", b"old 0\n\n", None),
    "a body over the limit": ("Content-Length: 200000\r\n", b"old 0\n" + b"A" * 199994, 413),
}


@pytest.mark.parametrize("case", sorted(BAD_FRAMING))
def test_a_request_with_broken_framing_is_answered(witness, case):
    headers, body, expected = BAD_FRAMING[case]
    status, text = exchange(witness.port, b"POST /add-checkpoint HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            + headers.encode("utf-8") + b"\r\n" + body)
    if expected is None:  # a header line over the server's limit, or a length over the body limit
        assert status in (400, 413, 431), (case, status, text[:200])
    else:
        assert status == expected, (case, status, text[:200])


def test_the_witness_still_cosigns_after_every_malformed_request(witness):
    for body in MALFORMED.values():
        exchange(witness.port, post(body))
    status, body = exchange(witness.port, post(format_add_checkpoint(0, [], N4)))
    assert status == 200 and body.decode().startswith("\u2014 "), body
    assert witness.proc.poll() is None


def test_a_body_that_never_comes_ends_in_408_not_a_stuck_thread(tmp_path, monkeypatch):
    import threading

    from apollia_nb.witness import server

    monkeypatch.setattr(server, "REQUEST_TIMEOUT", 0.5)
    state = WitnessState(tmp_path / "w", trust=[GOOD.verifier_key()])
    from http.server import ThreadingHTTPServer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), server._handler(state))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        status, body = exchange(httpd.server_address[1], post(b"old 0\n", headers="Content-Length: 500\r\n"))
        assert status == 408, body
    finally:
        httpd.shutdown()
        httpd.server_close()
        state.close()


# --- decisions as the July 2026 text has them -------------------------------------------------


def test_same_size_with_another_root_and_an_empty_tree_with_a_root_are_422():
    trusted = {GOOD.name: [GOOD.verifier()]}
    held: dict = {}

    def ask(old: int, proof: list[bytes], text: str):
        return witness_decide(format_add_checkpoint(old, proof, text), trusted=trusted, held=held)

    assert ask(0, [], note(GOOD, 0, root_hash=LEAVES[0])).status == 422  # size 0 must have the empty root
    empty = ask(0, [], note(GOOD, 0, root_hash=EMPTY_ROOT))
    assert empty.status == 200 and empty.record.root == EMPTY_ROOT
    held[GOOD.name] = empty.record
    assert ask(0, [LEAVES[0]], note(GOOD, 4)).status == 422  # from size 0 the proof is empty
    first = ask(0, [], note(GOOD, 4))
    assert first.status == 200
    held[GOOD.name] = first.record
    forked = [leaf_hash(b"x" * 32)] + LEAVES[1:]
    fork = ask(4, [], note(GOOD, 4, forked))
    assert (fork.status, fork.content_type) == (422, "text/plain; charset=utf-8")  # not a 409 with a size
    assert ask(4, [], note(GOOD, 4)).status == 200  # the same tree again
    assert ask(4, consistency_proof(4, 6, LEAVES), note(GOOD, 6)).status == 200
    assert ask(3, [], note(GOOD, 6)).status == 409  # not the size it holds: 409 with that size
    assert ask(7, [], note(GOOD, 6)).status == 400  # old larger than the checkpoint


def test_a_cosignature_never_carries_time_zero():
    cosigner = Cosigner("w.example/w", nacl.signing.SigningKey(bytes(32)))
    with pytest.raises(BadInput):
        cosigner.cosign(Checkpoint(ORIGIN, 1, LEAVES[0]).body(), 0)
    assert cosigner.cosign(Checkpoint(ORIGIN, 1, LEAVES[0]).body(), 1).timestamp == 1


# --- one key per origin ------------------------------------------------------------------------


def test_two_keys_for_one_origin_are_refused_at_start(tmp_path):
    alice, mallory = signer(1), signer(2)  # mallory names alice's origin with a key of her own
    with pytest.raises(BadInput, match="two keys for the origin"):
        WitnessState(tmp_path / "w", trust=[alice.verifier_key(), mallory.verifier_key()])
    assert not (tmp_path / "w" / TRUST_FILE).exists() or mallory.verifier_key() not in (
        tmp_path / "w" / TRUST_FILE).read_text()
    ok = WitnessState(tmp_path / "w", trust=[alice.verifier_key(), alice.verifier_key()])  # the same key twice
    ok.close()
    with pytest.raises(BadInput, match="two keys for the origin"):  # added to a file that holds alice's
        WitnessState(tmp_path / "w", trust=[mallory.verifier_key()])
    assert mallory.verifier_key() not in (tmp_path / "w" / TRUST_FILE).read_text()  # nothing was written
    with (tmp_path / "w" / TRUST_FILE).open("a") as f:  # written into the file by hand
        f.write(mallory.verifier_key() + "\n")
    with pytest.raises(BadInput, match="two keys for the origin"):
        WitnessState(tmp_path / "w")


def test_witness_serve_with_two_keys_for_one_origin_exits_with_the_reason(tmp_path):
    out = cli("witness", "serve", "--home-dir", str(tmp_path / "w"), "--trust", signer(1).verifier_key(),
              "--trust", signer(2).verifier_key())
    assert out.returncode == 3 and "BAD_INPUT" in out.stderr and "two keys for the origin" in out.stderr, out


def test_a_second_key_added_while_serving_locks_nobody_out(tmp_path, capfd):
    alice, mallory = signer(1), signer(2)
    state = WitnessState(tmp_path / "w", trust=[alice.verifier_key()])
    try:
        assert state.add_checkpoint(format_add_checkpoint(0, [], note(alice, 4)))[0] == 200
        path = tmp_path / "w" / TRUST_FILE
        with path.open("a") as f:
            f.write(mallory.verifier_key() + "\n")
        stamp = path.stat().st_mtime + 5
        os.utime(path, (stamp, stamp))  # seen as an edit whatever the clock's resolution
        other = [leaf_hash(b"m" * 32)] * 10
        # mallory's own tree under alice's origin: not trusted, so it cannot take alice's record
        assert state.add_checkpoint(format_add_checkpoint(4, consistency_proof(4, 9, other),
                                                          note(mallory, 9, other)))[0] == 403
        assert state.add_checkpoint(format_add_checkpoint(4, [], note(mallory, 4, other)))[0] == 403
        assert state.add_checkpoint(format_add_checkpoint(4, consistency_proof(4, 6, LEAVES),
                                                          note(alice, 6)))[0] == 200
        assert state.record(ORIGIN).size == 6
        assert "two keys for the origin" in capfd.readouterr().err
    finally:
        state.close()


# --- a quorum counts distinct witnesses --------------------------------------------------------


def _cosigned_log():
    n4 = note(GOOD, 4)
    body = parse_note(n4)[0]
    w1 = Cosigner("w1.example/w", nacl.signing.SigningKey(bytes([7]) * 32))
    return n4, body, w1


def test_a_witness_named_twice_counts_once():
    n4, body, w1 = _cosigned_log()
    cps = [(4, root(LEAVES[:4]), n4)]
    cos = [(4, w1.cosign(body, 5).line())]
    k = w1.verifier_key()
    assert check_cosigned(entries=4, checkpoints=cps, cosignatures=cos, witnesses=[k]).ok
    with pytest.raises(BadInput, match="distinct"):
        check_cosigned(entries=4, checkpoints=cps, cosignatures=cos, witnesses=[k, k], quorum=2)
    alone = check_cosigned(entries=4, checkpoints=cps, cosignatures=cos, witnesses=[k, k])
    assert alone.ok and alone.quorum == 1 and alone.cosigned_by == (k,) and len(alone.witnesses) == 1
    # the same public key under another name: a cosignature signs no name, so the line relabelled
    # with that name verifies too; it is still one witness
    alias = CosignatureVerifier("w2.example/w", w1.verifier.public_key)
    relabelled = Cosigner(alias.name, nacl.signing.SigningKey(bytes([7]) * 32)).cosign(body, 5).line()
    assert alias.verifies(body, Cosigner(alias.name, nacl.signing.SigningKey(bytes([7]) * 32)).cosign(body, 5))
    with pytest.raises(BadInput, match="distinct"):
        check_cosigned(entries=4, checkpoints=cps, cosignatures=[*cos, (4, relabelled)],
                       witnesses=[k, alias.key()], quorum=2)
    w2 = Cosigner("w2.example/w", nacl.signing.SigningKey(bytes([8]) * 32))  # a second witness indeed
    both = check_cosigned(entries=4, checkpoints=cps, cosignatures=[*cos, (4, w2.cosign(body, 6).line())],
                          witnesses=[k, w2.verifier_key(), k], quorum=2)
    assert both.ok and both.cosigned_by == (k, w2.verifier_key())
    with pytest.raises(BadInput):
        check_cosigned(entries=4, checkpoints=cps, cosignatures=cos, witnesses=[k], quorum=True)


def test_audit_verify_refuses_a_quorum_of_one_witness_listed_twice(tmp_path):
    _n4, _body, w1 = _cosigned_log()
    out = cli("audit", "verify", "--home", str(tmp_path / "nohome"), "--witness", w1.verifier_key(),
              "--witness", w1.verifier_key(), "--quorum", "2")
    assert out.returncode == 3 and "BAD_INPUT" in out.stderr and "distinct" in out.stderr, out


def test_a_home_naming_one_witness_twice_is_refused():
    _n4, _body, w1 = _cosigned_log()
    alias = CosignatureVerifier("w2.example/w", w1.verifier.public_key).key()
    for second in (w1.verifier_key(), alias):
        raw = {"journal": {"witnesses": [{"url": "http://127.0.0.1:1", "key": w1.verifier_key()},
                                         {"url": "http://127.0.0.1:2", "key": second}]}}
        with pytest.raises(BadInput, match="#2 names the witness key of #1 again"):
            parse_witnesses(raw)
