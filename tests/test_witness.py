"""Witnesses: two homes and one `apollia-os witness serve` process on loopback.

Cosignatures accumulate as runs end; a history rewritten and re-signed with the home's own key,
a home rolled back to an older copy and a fork shown to two auditors pass a plain `audit verify`
and are each caught by `audit verify --witness`; the witness keeps its state over a restart; a
stopped witness delays cosigning, never a run, and loses nothing.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from pathlib import Path

import duckdb
import httpx
import nacl.signing
import pytest
from notebook_fixtures import ip  # noqa: F401 - the fixture
from runtime_helpers import manifest
from witness_helpers import WitnessProcess, cli, configure

from apollia_nb.api.server import ServerThread
from apollia_nb.home import Home
from apollia_nb.journal import Journal
from apollia_nb.journal.checkpoint import (
    Checkpoint,
    NoteSigner,
    parse_checkpoint,
    parse_note,
)
from apollia_nb.journal.entry import GENESIS_HASH, canonical_payload, readable_payload, stored_entry_hash
from apollia_nb.journal.keys import load_or_create
from apollia_nb.journal.merkle import consistency_proof, leaf_hash, root
from apollia_nb.journal.witness import (
    CosignatureVerifier,
    Cosigner,
    check_cosigned,
    format_add_checkpoint,
    parse_cosignature_lines,
    witness_decide,
)
from apollia_nb.notebook.render import status_line
from apollia_nb.runtime import Runtime

TOKEN = "witness-test-token"


@pytest.fixture
def witnesses():
    started: list[WitnessProcess] = []

    def start(directory: Path, *trust: str, port: int = 0) -> WitnessProcess:
        w = WitnessProcess(directory, *trust, port=port)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
def place(tmp_path, monkeypatch):
    """Homes go under tmp_path; agents' workspaces in a folder beside them."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


def new_home(path: Path) -> tuple[Home, str]:
    home = Home.at(path)
    with Journal.open(home) as journal:
        return home, journal.verifier_key()


def wait_until(predicate, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {predicate}")
        time.sleep(0.05)


def latest_size(journal) -> int:
    note = journal.latest_checkpoint()
    return parse_checkpoint(parse_note(note)[0]).size


def run_tasks(home: Home, goals: list[str], *, cosigned: bool = True) -> list[dict]:
    """Run tasks in a real runtime; with ``cosigned``, wait until every witness holds the newest checkpoint."""
    with Runtime.blocking(home.path) as rt:
        if not rt.agents():
            rt.register_agent(manifest())
        for goal in goals:
            assert rt.run("clerk", goal).status == "completed"
        if cosigned:
            wait_until(lambda: all(w["cosigned_size"] == latest_size(rt.journal) for w in rt.witness_status()))
        return rt.witness_status()


def verify(*args: str) -> tuple[int, dict]:
    out = cli("audit", "verify", "--json", *args)
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


def witness_args(*ws: WitnessProcess) -> list[str]:
    return [a for w in ws for a in ("--witness", w.key)]


# --- two homes, one witness -----------------------------------------------------------------


def test_two_homes_accumulate_cosignatures_from_one_witness_process(place, witnesses):
    a, key_a = new_home(place / "a")
    b, key_b = new_home(place / "b")
    w = witnesses(place / "w", key_a, key_b)
    configure(a, w)
    configure(b, w)
    run_tasks(a, ["say done"])
    run_tasks(b, ["say done", "say it again"])
    status = run_tasks(a, ["say more"])
    [state] = status
    assert state["key_name"] == w.key.split("+")[0] and state["url"] == w.url and state["last_error"] is None
    for home in (a, b):
        code, data = verify("--home", str(home.path), *witness_args(w))
        assert code == 0 and data["ok"] and data["witness"]["ok"], data
        assert data["witness"]["checkpoint_size"] == data["entries"]
        assert data["witness"]["cosigned_by"] == [w.key]
    # accumulate: one cosignature per run's checkpoint, each verifying over its own checkpoint
    with Journal.open(a) as journal:
        cosigs = journal.cosignatures()
        bodies = {size: parse_note(note)[0] for size, _root, note in journal.checkpoints()}
    assert len(cosigs) == 2 and len({size for size, *_ in cosigs}) == 2
    verifier = CosignatureVerifier.from_key(w.key)
    for size, key, timestamp, line in cosigs:
        [cosig] = parse_cosignature_lines(line)
        assert key == w.key and cosig.timestamp == timestamp and verifier.verifies(bodies[size], cosig)
    # the witness holds the newest size of each origin
    held = json.loads(cli("witness", "key", "--home-dir", str(place / "w"), "--json").stdout)
    assert held["key"] == w.key
    assert sorted(log["size"] for log in held["logs"]) == sorted(
        verify("--home", str(h.path))[1]["entries"] for h in (a, b))
    # another witness's key, or a quorum of two with one witness cosigning, is refused
    other = Cosigner("other.example/w", nacl.signing.SigningKey.generate()).verifier_key()
    code, data = verify("--home", str(a.path), "--witness", w.key, "--witness", other)
    assert code == 1 and not data["ok"] and data["witness"]["missing"] == [other]
    assert "1 of the 2 cosignature(s) required" in data["witness"]["problem"]
    assert "other.example/w (its newest cosignature: none)" in data["witness"]["problem"]
    code, data = verify("--home", str(a.path), "--witness", w.key, "--witness", other, "--quorum", "1")
    assert code == 0 and data["ok"]
    bad = cli("audit", "verify", "--home", str(a.path), "--witness", w.key, "--quorum", "3")
    assert bad.returncode == 3 and "BAD_INPUT" in bad.stderr
    bad = cli("audit", "verify", "--home", str(a.path), "--witness", key_a)  # a journal key, not a witness key
    assert bad.returncode == 3 and "not a cosignature/v1 key" in bad.stderr
    # the bundle carries the cosignatures and is checked the same way
    assert cli("audit", "export", "--home", str(a.path), str(place / "bundle")).returncode == 0
    assert (place / "bundle" / "cosignatures.parquet").exists()
    code, data = verify("--bundle", str(place / "bundle"), *witness_args(w))
    assert code == 0 and data["witness"]["ok"]
    code, data = verify("--bundle", str(place / "bundle"), "--witness", other)
    assert code == 1 and not data["witness"]["ok"]


def test_entries_after_the_newest_checkpoint_are_not_witnessed(place, witnesses):
    a, key_a = new_home(place / "a")
    w = witnesses(place / "w", key_a)
    configure(a, w)
    run_tasks(a, ["say done"])
    with Journal.open(a) as journal:  # appended after the cosigned checkpoint; no checkpoint covers it yet
        journal.append("note", {"text": "late"})
    # closing, the journal wrote a checkpoint covering it, which no witness has seen yet
    code, data = verify("--home", str(a.path), *witness_args(w))
    assert code == 1 and "has 0 of the 1 cosignature(s) required" in data["witness"]["problem"]
    push = cli("witness", "push", "--home", str(a.path))
    assert push.returncode == 0, push.stdout + push.stderr
    assert verify("--home", str(a.path), *witness_args(w))[0] == 0


# --- what a witness catches -----------------------------------------------------------------


def _rewrite(home: Home, seq: int) -> None:
    """Change entry ``seq`` and re-sign everything after it, and every checkpoint, with the home's own key."""
    key = load_or_create(home)
    con = duckdb.connect(str(home.journal_db))
    try:
        origin = con.execute("SELECT value FROM meta WHERE key = 'origin'").fetchone()[0]
        rows = con.execute("SELECT seq, ts, run_id, agent, kind, payload, hash FROM entries ORDER BY seq").fetchall()
        prev, hashes = GENESIS_HASH, []
        for s, ts, run_id, agent, kind, payload, digest in rows:
            payload = bytes(payload)
            if s == seq:
                payload = canonical_payload({**readable_payload(payload), "rewritten": True})
            h = stored_entry_hash(s, ts, run_id, agent, kind, payload, prev)  # salted payloads: format 2
            if s >= seq:
                con.execute("UPDATE entries SET payload = ?, prev_hash = ?, hash = ?, signature = ? WHERE seq = ?",
                            [payload, prev, h, key.sign(h), s])
            prev = h
            hashes.append(h)
        signer = NoteSigner(origin, key.signing_key)
        for (size,) in con.execute("SELECT size FROM checkpoints").fetchall():
            r = root([leaf_hash(h) for h in hashes[:size]])
            con.execute("UPDATE checkpoints SET root = ?, note = ? WHERE size = ?",
                        [r, signer.sign(Checkpoint(origin, size, r).body()), size])
        # and makes it look like a journal from before the stored head, so that the next open
        # computes a head and frontier that match the rewritten entries
        con.execute("DELETE FROM frontier")
        con.execute("DELETE FROM entry_fields")
        con.execute("DELETE FROM meta WHERE key = 'frontier'")
    finally:
        con.close()


def test_a_history_rewritten_with_the_homes_own_key_is_caught(place, witnesses):
    a, key_a = new_home(place / "a")
    w = witnesses(place / "w", key_a)
    configure(a, w)
    run_tasks(a, ["say done", "say again"])
    _rewrite(a, 3)
    code, plain = verify("--home", str(a.path))
    assert code == 0 and plain["ok"]  # the key holder's rewrite passes on its own
    code, data = verify("--home", str(a.path), *witness_args(w))
    assert code == 1 and not data["ok"] and data["witness"]["missing"] == [w.key]
    # nor will the witness cosign the rewritten history
    push = cli("witness", "push", "--home", str(a.path), "--json")
    assert push.returncode == 1
    [state] = json.loads(push.stdout)["witnesses"]
    assert state["pending"] is False or "history differs" in state["last_error"]
    assert "history differs" in (state["last_error"] or ""), state


def test_a_rollback_to_an_older_copy_of_the_home_is_caught(place, witnesses):
    a, key_a = new_home(place / "a")
    w = witnesses(place / "w", key_a)
    configure(a, w)
    run_tasks(a, ["say done"])
    shutil.copytree(a.path, place / "a-old")
    run_tasks(a, ["say more", "and more"])
    shutil.rmtree(a.path)
    shutil.copytree(place / "a-old", a.path)
    assert verify("--home", str(a.path), *witness_args(w))[0] == 0  # put back and idle: the copy was cosigned
    asked = cli("witness", "push", "--home", str(a.path))  # asking the witness tells
    assert asked.returncode == 1 and "larger than this journal's newest" in asked.stdout, asked.stdout
    status = run_tasks(a, ["after the rollback"], cosigned=False)  # the run itself is not held up
    code, plain = verify("--home", str(a.path))
    assert code == 0 and plain["ok"]
    code, data = verify("--home", str(a.path), *witness_args(w))
    assert code == 1 and data["witness"]["missing"] == [w.key]
    push = json.loads(cli("witness", "push", "--home", str(a.path), "--json").stdout)
    [state] = push["witnesses"]
    assert state["pending"] and "rolled back" in state["last_error"], (status, state)


def test_a_fork_shown_to_two_auditors_is_caught(place, witnesses):
    a, key_a = new_home(place / "a")
    w = witnesses(place / "w", key_a)
    configure(a, w)
    run_tasks(a, ["say done"])
    shutil.copytree(a.path, place / "fork")  # the same key and origin, two futures
    fork = Home.at(place / "fork")
    run_tasks(a, ["what auditor one sees"])
    run_tasks(fork, ["what auditor two sees"], cosigned=False)
    for home, bundle in ((a, "one"), (fork, "two")):
        out = cli("audit", "export", "--home", str(home.path), str(place / bundle))
        assert out.returncode == 0, out.stderr
    assert verify("--bundle", str(place / "one"))[0] == 0 and verify("--bundle", str(place / "two"))[0] == 0
    code, one = verify("--bundle", str(place / "one"), *witness_args(w))
    assert code == 0 and one["witness"]["ok"]
    code, two = verify("--bundle", str(place / "two"), *witness_args(w))
    assert code == 1 and not two["witness"]["ok"] and two["witness"]["missing"] == [w.key]
    push = json.loads(cli("witness", "push", "--home", str(fork.path), "--json").stdout)
    assert "history differs" in push["witnesses"][0]["last_error"]


# --- the witness's own state ----------------------------------------------------------------


def test_a_restarted_witness_keeps_its_key_trust_and_latest_checkpoint(place, witnesses):
    a, key_a = new_home(place / "a")
    w = witnesses(place / "w", key_a)
    configure(a, w)
    run_tasks(a, ["say done"])
    with Journal.open(a) as journal:
        size, note = latest_size(journal), journal.latest_checkpoint()
    w.stop(kill=True)  # SIGKILL: what it answered 200 for was committed before the answer
    again = witnesses(place / "w")  # no --trust: trusted_keys remembers
    assert again.key == w.key
    r = httpx.post(f"{again.url}/add-checkpoint", content=format_add_checkpoint(0, [], note))
    assert (r.status_code, r.text, r.headers["content-type"]) == (409, f"{size}\n", "text/x.tlog.size")
    configure(a, again)
    run_tasks(a, ["after the restart"])  # cosigned from the size it remembered
    assert verify("--home", str(a.path), *witness_args(again))[0] == 0


def test_a_stopped_witness_delays_cosigning_and_loses_nothing(place, witnesses, monkeypatch):
    a, key_a = new_home(place / "a")
    w = witnesses(place / "w", key_a)
    configure(a, w)
    with ServerThread(a, token=TOKEN) as srv, httpx.Client(
            base_url=srv.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
        assert api.post("/agents", json={"manifest": manifest()}).status_code == 201

        def run(goal: str) -> None:
            task = api.post("/tasks", json={"agent": "clerk", "goal": goal}).json()
            done = api.get(f"/tasks/{task['id']}/wait", params={"until": "settled", "timeout": 30}).json()
            assert done["status"] == "completed"

        def state() -> dict:
            body = api.get("/audit/verify").json()
            assert body["ok"]
            [s] = body["witnesses"]
            return s

        run("first")
        wait_until(lambda: not state()["pending"])
        cosigned = state()["cosigned_size"]
        w.stop()
        run("while the witness is down")  # not held up, not failed
        down = wait_until(lambda: (s := state())["last_error"] and s)
        assert down["pending"] and down["cosigned_size"] == cosigned and down["last_error"].startswith("unreachable")
        code, served = verify("--home", str(a.path), *witness_args(w))  # through the server: not cosigned yet
        assert code == 1 and served["witness"]["missing"] == [w.key], served
        back = witnesses(place / "w", port=w.port)
        up = wait_until(lambda: (s := state())["pending"] is False and s)
        assert up["cosigned_size"] > cosigned and up["last_error"] is None
        pushed = cli("witness", "push", "--home", str(a.path), "--checkpoint", "--json")  # the server's sender
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        assert json.loads(pushed.stdout)["witnesses"][0]["cosigned_size"] >= up["cosigned_size"]
        code, served = verify("--home", str(a.path), *witness_args(w))  # through the server, cosigned now
        assert code == 0 and served["witness"]["checkpoint_size"] == up["cosigned_size"], served
        assert cli("audit", "export", "--home", str(a.path), str(place / "bundle")).returncode == 0
        assert verify("--bundle", str(place / "bundle"), *witness_args(w))[0] == 0
    code, data = verify("--home", str(a.path), *witness_args(back))
    assert code == 0 and data["witness"]["checkpoint_size"] == data["entries"]


@pytest.fixture
def witnessed_home(home, tmp_path, witnesses):
    """The kernel's home, naming a witness process and a witness nobody runs (before the kernel opens it)."""
    with Journal.open(home) as journal:
        vkey = journal.verifier_key()
    w = witnesses(tmp_path / "w", vkey)
    down = Cosigner("down.example/w", nacl.signing.SigningKey.generate())
    home.config_path.write_text(f'[[journal.witnesses]]\nurl = "{w.url}"\nkey = "{w.key}"\n'
                                f'[[journal.witnesses]]\nurl = "http://127.0.0.1:9"\nkey = "{down.verifier_key()}"\n')
    return w


def test_percent_apollia_status_shows_the_witnesses(witnessed_home, ip):  # noqa: F811 - the fixture
    w = witnessed_home
    ip.run_cell_magic("apollia", "agent", manifest())
    assert ip.run_cell_magic("apollia", "task clerk", "say done").join(10).status == "completed"
    report = wait_until(lambda: (r := ip.run_line_magic("apollia", "status")).data["witnesses"][0]["pending"] is False
                        and r.data["witnesses"][1]["last_error"] and r)
    up, unreachable = report.data["witnesses"]
    assert up["key"] == w.key and up["cosigned_size"] > 0 and up["last_error"] is None
    assert unreachable["pending"] and unreachable["last_error"].startswith("unreachable")
    text = report._repr_mimebundle_()["text/plain"]
    assert "witnesses 1/2 up to date (down.example/w: unreachable:" in text


def test_a_malformed_witness_entry_in_apollia_toml_refuses_to_open_the_home(place):
    a, _ = new_home(place / "a")
    a.config_path.write_text('[[journal.witnesses]]\nurl = "http://127.0.0.1:1"\nkey = "w+00000000+AAAA"\n')
    with pytest.raises(Exception) as refused:
        Runtime.blocking(a.path)
    assert getattr(refused.value, "code", None) == "BAD_INPUT" and "[[journal.witnesses]] #1" in str(refused.value)
    a.config_path.write_text("")
    with Runtime.blocking(a.path) as rt:  # nothing was left held
        assert rt.witness_status() is None


# --- formats and decisions, pure ------------------------------------------------------------


def _log(origin: str = "example.org/log"):
    signer = NoteSigner(origin, nacl.signing.SigningKey(bytes(range(32))))
    leaves = [leaf_hash(bytes([i]) * 32) for i in range(10)]

    def note(size: int, leaves=leaves) -> str:
        return signer.sign(Checkpoint(origin, size, root(leaves[:size])).body())

    return signer, leaves, note


def test_the_witness_answers_each_case_of_the_protocol():
    signer, leaves, note = _log()
    trusted = {signer.name: [signer.verifier()]}
    held: dict = {}

    def ask(old: int, proof: list[bytes], text: str):
        return witness_decide(format_add_checkpoint(old, proof, text), trusted=trusted, held=held)

    first = ask(0, [], note(4))
    assert first.status == 200 and first.record.size == 4
    held[signer.name] = first.record
    assert ask(0, [], note(6)).status == 409 and ask(0, [], note(6)).body == "4\n"
    assert ask(0, [], note(6)).content_type == "text/x.tlog.size"
    good = consistency_proof(5, 7, leaves)
    assert ask(4, consistency_proof(4, 7, leaves), note(7)).status == 200  # (not stored: held stays at 4)
    assert ask(4, [leaf_hash(b"y" * 32)], note(7)).status == 422
    assert ask(4, [], note(4)).status == 200  # the same checkpoint again
    assert ask(4, [leaves[0]], note(4)).status == 422  # equal sizes take no proof
    held[signer.name] = ask(4, consistency_proof(4, 5, leaves), note(5)).record
    assert ask(5, good, note(7)).status == 200 and ask(5, good[::-1], note(7)).status == 422
    forked = [leaf_hash(b"x" * 32)] + leaves[1:]
    assert ask(5, [], note(5, forked)).status == 422  # same size, another root (tlog-witness, July 2026)
    assert ask(5, consistency_proof(5, 7, forked), note(7, forked)).status == 422
    assert ask(8, [], note(7)).status == 400  # old larger than the checkpoint
    other = NoteSigner("example.org/other", nacl.signing.SigningKey.generate())
    assert ask(0, [], other.sign(Checkpoint(other.name, 1, leaves[0]).body())).status == 404
    impostor = NoteSigner(signer.name, nacl.signing.SigningKey.generate())
    assert ask(4, [], impostor.sign(Checkpoint(signer.name, 4, root(leaves[:4])).body())).status == 403
    assert witness_decide(b"new 4\n\n" + note(4).encode(), trusted=trusted, held=held).status == 400
    assert witness_decide(b"old 04\n\n" + note(4).encode(), trusted=trusted, held=held).status == 400
    assert witness_decide(b"old 4\nnot-base64\n\n" + note(4).encode(), trusted=trusted, held=held).status == 400


def test_cosignature_v1_bytes_and_keys():
    cosigner = Cosigner("witness.example/w1", nacl.signing.SigningKey(bytes(32)))
    body = "example.org/log\n3\n" + base64.b64encode(bytes(32)).decode() + "\n"
    cosig = cosigner.cosign(body, 1_700_000_000)
    raw = base64.b64decode(cosig.line().split(" ")[2])
    assert raw[:4] == cosigner.verifier.key_id and raw[4:12] == (1_700_000_000).to_bytes(8, "big")
    pub = bytes(nacl.signing.SigningKey(bytes(32)).verify_key)
    nacl.signing.VerifyKey(pub).verify(b"cosignature/v1\ntime 1700000000\n" + body.encode(), raw[12:])
    import hashlib

    assert cosigner.verifier.key_id == hashlib.sha256(b"witness.example/w1\n\x04" + pub).digest()[:4]
    vkey = cosigner.verifier_key()
    assert vkey.split("+")[2] == base64.b64encode(b"\x04" + pub).decode()
    assert CosignatureVerifier.from_key(vkey) == cosigner.verifier
    assert not cosigner.verifier.verifies(body.replace("\n3\n", "\n4\n"), cosig)


def test_the_auditor_check_names_what_is_missing():
    _signer, leaves, note = _log()
    w1 = Cosigner("w1.example/w", nacl.signing.SigningKey.generate())
    w2 = Cosigner("w2.example/w", nacl.signing.SigningKey.generate())
    n4, n6 = note(4), note(6)
    cps = [(4, root(leaves[:4]), n4), (6, root(leaves[:6]), n6)]
    line = lambda w, n: w.cosign(parse_note(n)[0], 1).line()
    cos = [(4, line(w1, n4)), (4, line(w2, n4)), (6, line(w1, n6)), (6, line(w2, n4))]  # w2's for 6 is for 4
    check = check_cosigned(entries=6, checkpoints=cps, cosignatures=cos, witnesses=[w1.verifier_key(), w2.verifier_key()])
    assert not check.ok and check.missing == (w2.verifier_key(),)
    assert [w["cosigned_size"] for w in check.witnesses] == [6, 4]
    assert check_cosigned(entries=6, checkpoints=cps, cosignatures=cos, witnesses=[w1.verifier_key(), w2.verifier_key()],
                          quorum=1).ok
    late = check_cosigned(entries=7, checkpoints=cps, cosignatures=cos, witnesses=[w1.verifier_key()])
    assert not late.ok and "entries 7..7 are after the newest checkpoint" in late.problem


def test_the_status_line_shows_the_witnesses():
    status = {"home": "/h", "journal_seq": 3, "journal_head": "ab" * 32, "developer_mode": False, "policy": "none",
              "witnesses": [{"key_name": "w1", "pending": False, "last_error": None},
                            {"key_name": "w2", "pending": True, "last_error": "unreachable: ConnectError"}]}
    assert status_line(status).endswith("witnesses 1/2 up to date (w2: unreachable: ConnectError)")


def test_racing_requests_cannot_roll_the_witness_back(tmp_path):
    import threading

    from apollia_nb.witness.server import WitnessState

    signer, leaves, note = _log()
    state = WitnessState(tmp_path / "w", trust=[signer.verifier_key()])
    try:
        assert state.add_checkpoint(format_add_checkpoint(0, [], note(4)))[0] == 200
        requests = [format_add_checkpoint(4, consistency_proof(4, n, leaves), note(n)) for n in (7, 9, 5, 8)]
        answers: list[int] = []
        threads = [threading.Thread(target=lambda r=r: answers.append(state.add_checkpoint(r)[0])) for r in requests]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(answers) == [200, 409, 409, 409]  # one extends 4; the others now hold the wrong old size
        held = state.record(signer.name)
        assert held.size in (5, 7, 8, 9) and held.root == root(leaves[:held.size])
    finally:
        state.close()
    again = WitnessState(tmp_path / "w")  # reopened: the same record, the same key
    try:
        assert again.record(signer.name) == held and again.trusted[signer.name] == [signer.verifier()]
    finally:
        again.close()
