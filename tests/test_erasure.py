"""A journal that can forget a field and still verify: salted commitments (format 2) and signed erasure."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

from apollia_nb.cli import main
from apollia_nb.errors import BadInput
from apollia_nb.home import Home
from apollia_nb.journal import Draft, Journal, verify_home
from apollia_nb.journal.entry import (
    canonical_json,
    commitment,
    erase_sealed,
    open_sealed,
    seal_payload,
    stored_entry_hash,
)
from apollia_nb.runtime import Runtime
from runtime_helpers import call, manifest
from scan_home import assert_absent, find_everywhere

pytestmark = pytest.mark.anyio

CANARY = "Zebulon-Quartermain-4711"  # a person's name, as a tool's output would carry it


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def _runs(home: Home, ws: Path, secrets: list[str]) -> None:
    """One run per secret: the agent reads a workspace file holding it (its output carries it)."""
    ws.mkdir(exist_ok=True)
    async with Runtime(home) as rt:
        for i, secret in enumerate(secrets):
            (ws / f"p{i}.txt").write_text(f"customer: {secret}\n")
            name = f"clerk{i}"
            await rt.register_agent(manifest(name, workspace=str(ws), actor=[
                {"tool_calls": [call("read_file", path=f"p{i}.txt")]}, {"text": "done"}]))
            task = await (await rt.submit(name, f"Look up customer {i}"))
            assert task.status == "completed", task.error


def _entries(home: Home) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(home.journal_db), read_only=True)
    try:
        return con.execute("SELECT seq, ts, run_id, agent, kind, payload, prev_hash, hash, signature, key_id "
                           "FROM entries ORDER BY seq").fetchall()
    finally:
        con.close()


def _result_seqs(home: Home, needle: str) -> list[int]:
    return [r[0] for r in _entries(home) if r[4] == "tool_result" and needle.encode() in bytes(r[5])]


def _edit(home: Home, seq: int, payload: bytes) -> None:
    con = duckdb.connect(str(home.journal_db))
    try:
        con.execute("UPDATE entries SET payload = ? WHERE seq = ?", [payload, seq])
    finally:
        con.close()


# --- the entry format ------------------------------------------------------------------------


def test_a_new_home_commits_to_salted_fields_and_says_its_format(home, capsys):
    with Journal.open(home) as journal:
        entry = journal.append("plan", {"steps": ["a"], "why": "x"})
        assert journal.format == "2"
    stored = json.loads(entry.stored)
    assert set(stored) == {"steps", "why", "@salts"} and set(stored["@salts"]) == {"steps", "why"}
    assert stored == json.loads(bytes(_entries(home)[0][5]))  # the row holds them, beside the fields
    # readers never see the salts: the entry's payload is its fields, canonical, as appended and as read
    assert entry.payload == canonical_json({"steps": ["a"], "why": "x"}) and entry.data() == {"steps": ["a"], "why": "x"}
    with Journal.open(home) as journal:
        assert journal.get(1) == entry and journal.entries() == [entry]
    code, out, _ = run_cli(capsys, "audit", "verify", "--home", str(home.path))
    assert code == 0 and "format 2 (salted commitments" in out, out
    code, out, _ = run_cli(capsys, "audit", "verify", "--home", str(home.path), "--json")
    assert json.loads(out)["format"] == "2"


def test_an_old_format_home_keeps_its_format_verifies_and_refuses_erasure(home, capsys):
    with Journal.open(home, entry_format="1") as journal:
        entry = journal.append("plan", {"steps": ["a"]})
    assert entry.payload == canonical_json({"steps": ["a"]})  # hashed whole, as before
    with Journal.open(home) as journal:  # a later open keeps it
        assert journal.format == "1"
        assert b"@salts" not in journal.append("plan", {"steps": ["b"]}).payload
    code, out, _ = run_cli(capsys, "audit", "verify", "--home", str(home.path))
    assert code == 0 and "format 1 (payloads hashed whole" in out, out
    code, _, err = run_cli(capsys, "audit", "erase", "--home", str(home.path), "--seq", "1", "--reason", "asked")
    assert code != 0 and "BAD_INPUT" in err and "format 1" in err


@pytest.mark.parametrize("payload", [{"@salts": {}}, {"@erased": 1, "a": 1}, {"@x": 1}])
def test_a_payload_may_not_use_the_formats_own_keys(home, payload):
    with Journal.open(home) as journal:
        with pytest.raises(BadInput, match="'@"):
            journal.append("plan", payload)
        assert journal.head()[0] == 0


def test_sealing_is_canonical_json_with_the_salts_beside_the_fields():
    payload = {"b": 1, "a": "é", "0": None, "Z": [1.5, {"y": True}], "zz": {"k": "v"}}
    salts = bytes(range(16 * len(payload)))
    stored, committed = seal_payload(payload, salts)
    data = json.loads(stored)
    assert stored == canonical_json(data)  # one canonical object, "@salts" where sort_keys puts it
    ordered = sorted(payload)
    want = {k: hashlib.sha256(salts[16 * i:16 * i + 16] + canonical_json(payload[k])).hexdigest()
            for i, k in enumerate(ordered)}
    assert json.loads(committed) == want and committed == canonical_json(want)
    with pytest.raises(BadInput):
        seal_payload(payload, salts[:-1])


def _independent_verify(rows: list[tuple[Any, ...]], public_key: bytes) -> int:
    """docs/journal.md's formulas for format 2, with hashlib and the published key only."""
    from nacl.signing import VerifyKey

    def field(value: Any) -> bytes:
        if value is None:
            return b"\x00"
        data = value.encode() if isinstance(value, str) else bytes(value)
        return b"\x01" + len(data).to_bytes(4, "big") + data

    def canon(value: Any) -> bytes:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode()

    prev, erased = bytes(32), 0
    for seq, ts, run_id, agent, kind, payload, prev_hash, digest, sig, key_id in rows:
        stored = json.loads(bytes(payload))
        assert canon(stored) == bytes(payload)
        salts, gone = stored.pop("@salts"), stored.pop("@erased", {})
        commits = {k: hashlib.sha256(bytes.fromhex(salts[k]) + canon(v)).hexdigest() for k, v in stored.items()}
        commits.update(gone)
        erased += len(gone)
        encoding = (b"apollia-nb/journal-entry/v2\n" + seq.to_bytes(8, "big") + field(ts) + field(run_id)
                    + field(agent) + field(kind) + field(canon(commits)) + bytes(prev_hash))
        assert bytes(prev_hash) == prev
        assert hashlib.sha256(encoding).digest() == bytes(digest), seq
        VerifyKey(public_key).verify(bytes(digest), bytes(sig))
        prev = bytes(digest)
    return erased


# --- tampering ---------------------------------------------------------------------------------


@pytest.fixture
def journal_home(home):
    with Journal.open(home) as journal:
        journal.append_many(Draft("tool_result", {"call_id": f"c{i}", "tool": "read_file", "status": "ok",
                                                  "output": f"secret {i}", "output_digest": "d"}, "r", "a")
                            for i in range(6))
    return home


def test_a_changed_field_value_is_caught_at_its_seq(journal_home):
    stored = bytes(_entries(journal_home)[2][5])
    _edit(journal_home, 3, stored.replace(b"secret 2", b"secret 9"))
    report = verify_home(journal_home)
    assert (report.ok, report.first_bad_seq) == (False, 3)
    assert "hash does not match" in report.problem


def test_a_reformatted_but_equal_salted_payload_is_caught(journal_home):
    stored = bytes(_entries(journal_home)[2][5])
    _edit(journal_home, 3, stored.replace(b",", b", "))
    report = verify_home(journal_home)
    assert (report.ok, report.first_bad_seq) == (False, 3)
    assert "canonical" in report.problem


@pytest.mark.parametrize("how", ["erased_commitment", "value_only", "salt_only", "both_gone"])
def test_a_field_removed_without_an_erasure_entry_is_caught(journal_home, how):
    stored = bytes(_entries(journal_home)[3][5])
    data = json.loads(stored)
    if how == "erased_commitment":  # the same bytes an erase leaves: the hash still matches
        changed = erase_sealed(stored, ["output"])
    elif how == "value_only":
        del data["output"]
        changed = canonical_json(data)
    elif how == "salt_only":
        del data["@salts"]["output"]
        changed = canonical_json(data)
    else:
        del data["output"], data["@salts"]["output"]
        changed = canonical_json(data)
    _edit(journal_home, 4, changed)
    report = verify_home(journal_home)
    assert (report.ok, report.first_bad_seq) == (False, 4), report
    assert "output" in report.problem or "hash does not match" in report.problem
    if how != "both_gone":
        assert "output" in report.problem


def test_an_erasure_entry_cannot_excuse_a_removal_before_itself(journal_home):
    """An erasure names earlier entries only: one that names a later entry excuses nothing."""
    with Journal.open(journal_home) as journal:
        journal.append("erasure", {"erased": [{"seq": 8, "fields": ["output"]}], "by": "x", "reason": "y"})
        journal.append("tool_result", {"call_id": "c8", "tool": "t", "status": "ok", "output": "secret 8",
                                       "output_digest": "d"}, run_id="r", agent="a")
    _edit(journal_home, 8, erase_sealed(bytes(_entries(journal_home)[7][5]), ["output"]))
    report = verify_home(journal_home)
    assert (report.ok, report.first_bad_seq) == (False, 8) and "output" in report.problem


# --- erasure -------------------------------------------------------------------------------------


@pytest.fixture
async def runs_home(home, tmp_path):
    await _runs(home, tmp_path / "ws", [CANARY, "Other-Person-0042", "Third-Customer-9981"])
    return home


async def test_erase_one_field_keeps_the_chain_and_leaves_no_byte_behind(runs_home, capsys, tmp_path):
    home = runs_home
    h = ["--home", str(home.path)]
    [seq] = _result_seqs(home, CANARY)
    assert find_everywhere(home.path, CANARY)  # the scan sees it before
    assert run_cli(capsys, "audit", "checkpoint", *h, "--out", str(tmp_path / "before.txt"))[0] == 0
    before = _entries(home)
    code, out, err = run_cli(capsys, "audit", "erase", *h, "--seq", str(seq), "--field", "output",
                             "--reason", "the customer asked", "--json")
    assert code == 0, err
    done = json.loads(out)
    assert done["erased"] == [{"seq": seq, "fields": ["output"]}] and done["fields"] == 1
    after = _entries(home)
    # every entry keeps its hash and signature; the erasure is one more, signed, entry
    assert [r[7] for r in after[:len(before)]] == [r[7] for r in before]
    erasure = after[done["erasure_seq"] - 1]
    assert erasure[4] == "erasure" and CANARY.encode() not in bytes(erasure[5])
    assert json.loads(bytes(erasure[5]))["erased"] == [{"seq": seq, "fields": ["output"]}]
    code, out, _ = run_cli(capsys, "audit", "verify", *h)
    assert code == 0 and "1 field(s) erased (commitments verified, payloads gone)" in out, out
    # a checkpoint taken before the erasure: its entries' hashes, so its root and consistency, hold
    assert run_cli(capsys, "audit", "verify", *h, "--checkpoint", str(tmp_path / "before.txt"))[0] == 0
    assert run_cli(capsys, "audit", "consistency", *h, "--from", str(tmp_path / "before.txt"))[0] == 0
    # the formulas of docs/journal.md, written here with hashlib and the published key alone
    pub = base64.b64decode(run_cli(capsys, "audit", "verifier-key", *h)[1].strip().split("+", 2)[2])[1:]
    assert _independent_verify(after, pub) == 1
    # the other runs keep theirs; the erased one is nowhere in the home's files
    assert_absent(home.path, CANARY)
    assert find_everywhere(home.path, "Other-Person-0042")
    # and nowhere in what an auditor exports
    assert run_cli(capsys, "audit", "export", *h, str(tmp_path / "bundle"))[0] == 0
    assert run_cli(capsys, "audit", "export", *h, "--format", "ocsf", str(tmp_path / "events.jsonl"))[0] == 0
    assert_absent(tmp_path / "bundle", CANARY)
    assert CANARY not in (tmp_path / "events.jsonl").read_text()
    assert run_cli(capsys, "audit", "verify", "--bundle", str(tmp_path / "bundle"))[0] == 0


async def test_erase_a_whole_entry_and_the_runtime_copies(runs_home, capsys):
    home = runs_home
    h = ["--home", str(home.path)]
    seqs = [r[0] for r in _entries(home) if r[4] == "decision" and b"p1.txt" in bytes(r[5])]
    [results] = [_result_seqs(home, "Other-Person-0042")]
    for seq in [*seqs, *results]:
        code, _, err = run_cli(capsys, "audit", "erase", *h, "--seq", str(seq), "--reason", "asked")
        assert code == 0, err
    code, out, _ = run_cli(capsys, "audit", "verify", *h, "--json")
    report = json.loads(out)
    assert report["ok"] and report["erased"] >= 5, report
    assert_absent(home.path, "Other-Person-0042")
    assert find_everywhere(home.path, "Third-Customer-9981")
    # the runtime opens again and takes work on the erased home
    async with Runtime(home) as rt:
        assert rt.journal.format == "2"


async def test_erase_refuses_what_it_cannot_do_and_changes_nothing(runs_home, capsys):
    home = runs_home
    h = ["--home", str(home.path)]
    [seq] = _result_seqs(home, CANARY)
    before = _entries(home)
    for argv, word in [
        (["--seq", str(seq), "--field", "nonesuch", "--reason", "x"], "no field"),
        (["--seq", "100000", "--reason", "x"], "NOT_FOUND"),
        (["--seq", str(seq), "--reason", "  "], "reason"),
    ]:
        code, _, err = run_cli(capsys, "audit", "erase", *h, *argv)
        assert code != 0 and word in err, err
    assert _entries(home) == before
    code, _, err = run_cli(capsys, "audit", "erase", *h, "--seq", str(seq), "--reason", "x")
    assert code == 0, err
    erasure_seq = len(before) + 1
    code, _, err = run_cli(capsys, "audit", "erase", *h, "--seq", str(erasure_seq), "--reason", "x")
    assert code != 0 and "never erased" in err


async def test_erase_while_the_home_is_in_use_is_home_locked(runs_home, capsys):
    home = runs_home
    [seq] = _result_seqs(home, CANARY)
    async with Runtime(home):
        code, _, err = run_cli(capsys, "audit", "erase", "--home", str(home.path), "--seq", str(seq),
                               "--reason", "x")
    assert code != 0 and "HOME_LOCKED" in err
    assert find_everywhere(home.path, CANARY)


def test_commitment_is_sha256_of_salt_and_canonical_value():
    salt = os.urandom(16)
    assert commitment(salt, b'"x"') == hashlib.sha256(salt + b'"x"').digest()
    stored, committed = seal_payload({"a": "x"}, salt)
    assert stored_entry_hash(1, "t", None, None, "plan", stored, bytes(32)) == stored_entry_hash(
        1, "t", None, None, "plan", erase_sealed(stored, ["a"]), bytes(32))
    assert open_sealed(erase_sealed(stored, ["a"])).erased == {"a": commitment(salt, b'"x"').hex()}


async def test_replay_of_a_run_with_an_erased_field_is_incomplete_naming_it_never_diverged(runs_home, capsys):
    home = runs_home
    h = ["--home", str(home.path)]
    [seq] = _result_seqs(home, CANARY)
    run_id = [r[2] for r in _entries(home) if r[0] == seq][0]
    code, out, _ = run_cli(capsys, "audit", "replay", *h, run_id, "--json")
    assert (code, json.loads(out)["verdict"]) == (0, "identical")
    for field in ("output", "arguments"):  # the result's output, then the call's arguments
        target = seq if field == "output" else [r[0] for r in _entries(home) if r[2] == run_id
                                                and r[4] == "tool_call"][0]
        assert run_cli(capsys, "audit", "erase", *h, "--seq", str(target), "--field", field, "--reason", "x")[0] == 0
        code, out, _ = run_cli(capsys, "audit", "replay", *h, run_id, "--json")
        result = json.loads(out)
        assert (code, result["verdict"], result["divergences"]) == (2, "incomplete", []), result
        assert any(f"entry {target} (" in m and field in m and "erased" in m for m in result["missing"])
    # the model's own calls erased: which calls it asked for is unknown, not a divergence
    response = [r[0] for r in _entries(home) if r[2] == run_id and r[4] == "model_response"][0]
    assert run_cli(capsys, "audit", "erase", *h, "--seq", str(response), "--reason", "x")[0] == 0
    code, out, _ = run_cli(capsys, "audit", "replay", *h, run_id, "--json")
    result = json.loads(out)
    assert (code, result["verdict"], result["divergences"]) == (2, "incomplete", []), result


# --- witnesses -----------------------------------------------------------------------------------


def test_a_witness_goes_on_cosigning_after_an_erasure(tmp_path, monkeypatch):
    """An erasure changes no entry hash: the witness accepts the next checkpoint as consistent with
    the one it cosigned before, and verify --witness holds with the field counted as erased."""
    from witness_helpers import WitnessProcess, cli, configure

    from apollia_nb.journal.checkpoint import parse_checkpoint, parse_note

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    home = Home.at(tmp_path / "home")
    with Journal.open(home) as journal:
        vkey = journal.verifier_key()
    witness = WitnessProcess(tmp_path / "w", vkey)
    try:
        configure(home, witness)

        def run(goal: str) -> None:
            with Runtime.blocking(home.path) as rt:
                if not rt.agents():
                    rt.register_agent(manifest())
                assert rt.run("clerk", goal).status == "completed"
                size = parse_checkpoint(parse_note(rt.journal.latest_checkpoint())[0]).size
                deadline = time.monotonic() + 30
                while not all(w["cosigned_size"] == size for w in rt.witness_status()):
                    assert time.monotonic() < deadline, rt.witness_status()
                    time.sleep(0.05)

        run(f"Write to {CANARY}")
        [seq] = [r[0] for r in _entries(home) if r[4] == "run_open" and CANARY.encode() in bytes(r[5])]
        out = cli("audit", "erase", "--home", str(home.path), "--seq", str(seq), "--field", "goal",
                  "--reason", "asked")
        assert out.returncode == 0, out.stderr
        run("say done again")
        out = cli("audit", "verify", "--home", str(home.path), "--witness", witness.key, "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        report = json.loads(out.stdout)
        assert report["ok"] and report["witness"]["ok"] and report["erased"] == 1, report
    finally:
        witness.stop()


def test_the_views_read_an_erased_field_as_null_and_the_erased_view_names_it(journal_home, capsys, tmp_path):
    from apollia_nb.journal.views import bundle_sql

    h = ["--home", str(journal_home.path)]
    assert run_cli(capsys, "audit", "erase", *h, "--seq", "3", "--field", "output", "--reason", "asked")[0] == 0
    assert run_cli(capsys, "audit", "erase", *h, "--seq", "5", "--reason", "asked")[0] == 0
    want = [(3, "tool_result", "output"), *((5, "tool_result", f) for f in
                                            ("call_id", "output", "output_digest", "status", "tool"))]
    con = duckdb.connect(str(journal_home.journal_db), read_only=True)
    try:
        assert con.execute("SELECT seq, kind, field FROM erased ORDER BY seq, field").fetchall() == want
        assert con.execute("SELECT payload->>'output', payload->>'tool' FROM journal WHERE seq = 3").fetchone() \
            == (None, "read_file")
        # the typed columns the views read were computed again: the erased entry's are NULL
        assert con.execute("SELECT call_id, tool, status FROM entry_fields WHERE seq = 5").fetchone() \
            == (None, None, None)
        assert con.execute("SELECT count(*) FROM tool_calls WHERE call_id = 'c4'").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM tool_calls WHERE call_id = 'c2'").fetchone() == (1,)
    finally:
        con.close()
    # a bundle carries the erasure entries and gives the same rows through this install's views
    assert run_cli(capsys, "audit", "export", *h, str(tmp_path / "b"))[0] == 0
    con = duckdb.connect()
    try:
        con.execute(bundle_sql(tmp_path / "b"))
        assert con.execute("SELECT seq, kind, field FROM erased ORDER BY seq, field").fetchall() == want
        assert con.execute("SELECT count(*) FROM journal WHERE kind = 'erasure'").fetchone() == (2,)
    finally:
        con.close()
    for i in (2, 4):
        assert_absent(tmp_path / "b", f"secret {i}")


def test_an_erase_interrupted_after_its_entry_verifies_and_the_next_erase_finishes_it(journal_home, capsys):
    """Stopped after the erasure entry and before the rows changed (what a crash there leaves): the
    named field still present verifies; the next erase of the home removes it too."""
    with Journal.open(journal_home) as journal:
        journal.append("erasure", {"erased": [{"seq": 3, "fields": ["output"]}], "by": "x", "reason": "asked"})
    report = verify_home(journal_home)
    assert report.ok and report.erased == 0, report
    assert find_everywhere(journal_home.path, "secret 2")
    h = ["--home", str(journal_home.path)]
    code, out, err = run_cli(capsys, "audit", "erase", *h, "--seq", "4", "--field", "output", "--reason", "y",
                             "--json")
    assert code == 0, err
    assert json.loads(out)["erased"] == [{"seq": 3, "fields": ["output"]}, {"seq": 4, "fields": ["output"]}]
    report = verify_home(journal_home)
    assert report.ok and report.erased == 2, report
    for i in (2, 3):
        assert_absent(journal_home.path, f"secret {i}")
    assert find_everywhere(journal_home.path, "secret 4")
