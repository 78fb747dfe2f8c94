"""``apollia-os rules|devmode|consents|policy``: in-process through ``main`` and as a real process."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apollia_nb.cli import main
from apollia_nb.governance.store import GovernanceStore
from apollia_nb.home import Home

APOLLIA_OS = Path(sys.executable).parent / "apollia-os"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def journal_entries(home: Path) -> list[tuple[str, dict[str, Any], str | None]]:
    """The home's journal, after checking that it verifies."""
    from apollia_nb.journal import Journal, verify_home

    report = verify_home(Home.at(home))
    assert report.ok, report
    with Journal.open(Home.at(home)) as journal:
        return [(e.kind, json.loads(e.payload), e.agent) for e in journal.entries()]


# --- rules ----------------------------------------------------------------------------


def test_rules_add_list_remove_and_journal(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    code, out, _ = run(capsys, "rules", "list", "--home", str(home))
    assert (code, out.strip()) == (0, "no fine rules")
    assert run_json(capsys, "rules", "list", "--home", str(home)) == []

    code, out, _ = run(capsys, "rules", "add", "bash_executor", "--effect", "allow", "--prefix", "git status",
                       "--home", str(home), "--by", "ana")
    assert code == 0
    assert "allow bash_executor under 'git status' for every agent" in out
    rule_id = out.split()[1].rstrip(":")
    deny = run_json(capsys, "rules", "add", "write_file", "--effect", "deny", "--prefix", "secrets/",
                    "--agent", "clerk", "--home", str(home), "--by", "bo")
    assert {k: deny[k] for k in ("tool", "prefix", "effect", "agent", "created_by")} == {
        "tool": "write_file", "prefix": "secrets/", "effect": "deny", "agent": "clerk", "created_by": "bo",
    }
    listed = run_json(capsys, "rules", "list", "--home", str(home))
    assert [r["id"] for r in listed] == [rule_id, deny["id"]]
    code, out, _ = run(capsys, "rules", "list", "--home", str(home))
    assert out.splitlines()[0].split() == ["ID", "EFFECT", "TOOL", "PREFIX", "AGENT", "ADDED"]
    assert rule_id in out and "secrets/" in out and "by bo" in out

    removed = run_json(capsys, "rules", "remove", rule_id, "--home", str(home), "--by", "cy")
    assert removed["id"] == rule_id
    assert [r.id for r in GovernanceStore(Home.at(home)).rules()] == [deny["id"]]

    entries = journal_entries(home)
    assert [(k, p["id"], p["by"]) for k, p, _ in entries if k.startswith("rule_")] == [
        ("rule_added", rule_id, "ana"), ("rule_added", deny["id"], "bo"), ("rule_removed", rule_id, "cy"),
    ]


def test_a_bad_effect_is_bad_input(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    code, out, err = run(capsys, "rules", "add", "bash_executor", "--effect", "maybe", "--home", str(home))
    assert code == 3 and out == ""
    assert err.startswith("error: BAD_INPUT: ") and "'allow' or 'deny'" in err
    code, _, err = run(capsys, "rules", "add", "bash_executor", "--effect", "maybe", "--home", str(home), "--json")
    assert code == 3 and json.loads(err)["code"] == "BAD_INPUT"
    code, _, err = run(capsys, "rules", "add", "x", "--effect", "deny", "--agent", "Bad Name", "--home", str(home))
    assert code == 3 and "BAD_INPUT" in err
    assert GovernanceStore(Home.at(home)).rules() == []


def test_a_missing_effect_is_bad_input(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["rules", "add", "bash_executor", "--home", str(home)])
    assert info.value.code == 3
    assert "BAD_INPUT" in capsys.readouterr().err


def test_removing_an_unknown_rule_is_unknown_rule(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    code, _, err = run(capsys, "rules", "remove", "r-00000000", "--home", str(home))
    assert code == 3 and err.startswith("error: UNKNOWN_RULE: ") and "r-00000000" in err


# --- the home owned by another process -------------------------------------------------


@pytest.fixture
def owner(home: Path) -> Iterator[subprocess.Popen[str]]:
    code = (
        "import sys\n"
        "from apollia_nb.home import Home, OwnerLock\n"
        "lock = OwnerLock(Home.at(sys.argv[1])).acquire()\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(home)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    try:
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_changes_to_an_owned_home_are_home_locked(
    capsys: pytest.CaptureFixture[str], home: Path, owner: subprocess.Popen[str]
) -> None:
    for argv in (
        ["rules", "add", "bash_executor", "--effect", "deny"],
        ["rules", "remove", "r-1"],
        ["devmode", "on"],
        ["consents", "revoke", "clerk", "write"],
    ):
        code, _, err = run(capsys, *argv, "--home", str(home))
        assert code == 3, argv
        assert err.startswith("error: HOME_LOCKED: ") and f"process {owner.pid}" in err
    # Reading needs no ownership.
    code, out, _ = run(capsys, "rules", "list", "--home", str(home))
    assert (code, out.strip()) == (0, "no fine rules")
    code, out, _ = run(capsys, "devmode", "--home", str(home))
    assert (code, out.strip()) == (0, "developer mode: off")


# --- developer mode and consents -------------------------------------------------------


def test_devmode(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    assert run(capsys, "devmode", "--home", str(home))[1].strip() == "developer mode: off"
    code, out, _ = run(capsys, "devmode", "on", "--home", str(home), "--by", "ana")
    assert code == 0 and out.startswith("developer mode: on (since ") and "by ana" in out
    assert run_json(capsys, "devmode", "--home", str(home))["enabled"] is True
    assert run_json(capsys, "devmode", "off", "--home", str(home))["enabled"] is False
    code, _, err = run(capsys, "devmode", "maybe", "--home", str(home))
    assert code == 3 and "BAD_INPUT" in err
    kinds = [(k, p["enabled"]) for k, p, _ in journal_entries(home) if k == "devmode_changed"]
    assert kinds == [("devmode_changed", True), ("devmode_changed", False)]


def test_consents_list_and_revoke(capsys: pytest.CaptureFixture[str], home: Path) -> None:
    assert run(capsys, "consents", "list", "--home", str(home))[1].strip() == "no standing consents"
    store = GovernanceStore(Home.at(home))
    store.grant_consent("clerk", "write", by="ana")
    store.grant_consent("clerk", "send", by="ana")
    listed = run_json(capsys, "consents", "list", "--home", str(home))
    assert [(c["agent"], c["family"], c["granted_by"]) for c in listed] == [
        ("clerk", "send", "ana"), ("clerk", "write", "ana"),
    ]
    code, out, _ = run(capsys, "consents", "list", "--home", str(home))
    assert out.splitlines()[0].split() == ["AGENT", "FAMILY", "GIVEN", "BY", "AT", "CARD", "ENDS"]
    assert out.splitlines()[1].split()[-2:] == ["until", "revoked"]
    code, out, _ = run(capsys, "consents", "revoke", "clerk", "send", "--home", str(home), "--by", "cy")
    assert (code, out.strip()) == (0, "revoked the standing consent of clerk for send")
    assert [c.family.value for c in store.consents()] == ["write"]
    code, _, err = run(capsys, "consents", "revoke", "clerk", "send", "--home", str(home))
    assert code == 3 and err.startswith("error: NOT_FOUND: ")
    code, _, err = run(capsys, "consents", "revoke", "clerk", "sending", "--home", str(home))
    assert code == 3 and "BAD_INPUT" in err and "unknown family" in err
    assert [(k, p) for k, p, _ in journal_entries(home) if k == "consent_revoked"] == [
        ("consent_revoked", {"agent": "clerk", "family": "send", "by": "cy"}),
    ]


# --- organisation policy -----------------------------------------------------------------


def test_policy_keygen_sign_deposit_check(capsys: pytest.CaptureFixture[str], home: Path, tmp_path: Path) -> None:
    code, out, _ = run(capsys, "policy", "check", "--home", str(home))
    assert code == 0 and out.splitlines()[0] == "policy: none"

    keys = run_json(capsys, "policy", "keygen", "--home", str(home))
    private = Path(keys["private_key"])
    assert private == Home(home).keys_dir / "policy.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert Path(keys["public_key_file"]).read_text().strip() == keys["public_key"]
    code, _, err = run(capsys, "policy", "keygen", "--home", str(home))
    assert code == 3 and "already exists" in err

    draft = tmp_path / "organisation.toml"
    draft.write_text('[refuse]\nfamilies = ["send"]\ntools = ["http_request"]\n')
    code, out, _ = run(capsys, "policy", "sign", str(draft), "--key", str(private), "--home", str(home))
    assert code == 0 and out.strip() == f"signed {draft}: {draft}.sig"

    h = Home.at(home)
    h.policy_path.write_bytes(draft.read_bytes())
    h.policy_sig_path.write_bytes(Path(f"{draft}.sig").read_bytes())
    code, out, _ = run(capsys, "policy", "check", "--home", str(home))
    assert code == 1 and out.splitlines()[0] == "policy: refused" and "no trusted keys" in out

    h.config_path.write_text(f'[policy]\ntrusted_keys = ["{keys["public_key"]}"]\n')
    code, out, _ = run(capsys, "policy", "check", "--home", str(home))
    assert code == 0, out
    assert out.splitlines()[:3] == [
        "policy: accepted", f"reason: signed by trusted key {keys['public_key']}", f"key: {keys['public_key']}",
    ]
    assert "refuses families: send" in out and "refuses tools: http_request" in out
    data = run_json(capsys, "policy", "check", "--home", str(home))
    assert data["status"] == "accepted" and data["policy"]["refuse"]["tools"] == ["http_request"]

    with h.policy_path.open("ab") as f:
        f.write(b"\n")
    code, out, _ = run(capsys, "policy", "check", "--home", str(home), "--json")
    assert code == 1 and "changed after it was signed" in json.loads(out)["reason"]


def test_policy_keygen_out_and_sign_errors(capsys: pytest.CaptureFixture[str], home: Path, tmp_path: Path) -> None:
    keys = run_json(capsys, "policy", "keygen", "--out", str(tmp_path / "k" / "org.key"), "--home", str(home))
    assert keys["public_key_file"] == str(tmp_path / "k" / "org.key.pub")
    bad = tmp_path / "bad.toml"
    bad.write_text("[refuse]\nfamilies = ['nope']\n")
    code, _, err = run(capsys, "policy", "sign", str(bad), "--key", keys["private_key"])
    assert code == 3 and "BAD_INPUT" in err and "unknown family 'nope'" in err
    assert not Path(f"{bad}.sig").exists()


# --- a real process -------------------------------------------------------------------------


def test_the_installed_command(home: Path, tmp_path: Path) -> None:
    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(APOLLIA_OS), *argv, "--home", str(home)],
                              capture_output=True, text=True, timeout=120)

    added = cli("rules", "add", "bash_executor", "--effect", "deny", "--prefix", "rm", "--json")
    assert added.returncode == 0, added.stderr
    rule = json.loads(added.stdout)
    assert (rule["tool"], rule["prefix"], rule["effect"], rule["agent"]) == ("bash_executor", "rm", "deny", "*")
    listed = cli("rules", "list", "--json")
    assert [r["id"] for r in json.loads(listed.stdout)] == [rule["id"]]
    bad = cli("rules", "add", "bash_executor", "--effect", "sometimes")
    assert bad.returncode == 3 and bad.stderr.startswith("error: BAD_INPUT: ")
    unknown = cli("rules", "remove", "r-deadbeef")
    assert unknown.returncode == 3 and unknown.stderr.startswith("error: UNKNOWN_RULE: ")

    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nfrom apollia_nb.home import Home, OwnerLock\n"
         "OwnerLock(Home.at(sys.argv[1])).acquire()\nprint('ready', flush=True)\nsys.stdin.read()\n",
         str(home)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        locked = cli("rules", "remove", rule["id"])
        assert locked.returncode == 3
        assert locked.stderr.startswith("error: HOME_LOCKED: ") and f"process {holder.pid}" in locked.stderr
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert cli("rules", "remove", rule["id"]).returncode == 0
    assert json.loads(cli("rules", "list", "--json").stdout) == []
