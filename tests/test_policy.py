"""Organisation policy: keys, signatures, parsing, and every way a policy is refused."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from apollia_nb.errors import BadInput, PolicyRefused
from apollia_nb.governance.decision import Family, Policy
from apollia_nb.governance.policy import (
    evaluate_policy,
    keygen,
    load_policy,
    parse_policy,
    sign,
    sign_bytes,
    verify_signature,
)
from apollia_nb.home import Home

POLICY = b"""# refusals of the organisation
[refuse]
tools = ["http_request"]
connections = ["mcp:crm"]
families = ["send", "execute"]
"""


def _seed() -> bytes:
    return bytes(SigningKey.generate())


def _pub(seed: bytes) -> str:
    return base64.b64encode(bytes(SigningKey(seed).verify_key)).decode()


# --- parsing -----------------------------------------------------------------------


def test_parse_policy_reads_the_refusals() -> None:
    policy = parse_policy(POLICY)
    assert policy == Policy(
        refuse_tools={"http_request"},
        refuse_connections={"mcp:crm"},
        refuse_families={Family.SEND, Family.EXECUTE},
    )


def test_an_empty_refuse_table_and_an_empty_file_refuse_nothing() -> None:
    assert parse_policy(b"[refuse]\n") == Policy()
    assert parse_policy(b"") == Policy()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"[refuse\ntools = []", "not valid TOML"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[refuse]\ntools = []\n[allow]\ntools = []\n", "unknown top-level key or table 'allow'"),
        (b"name = 'acme'\n", "unknown top-level key or table 'name'"),
        (b"refuse = 3\n", "'refuse' must be a table"),
        (b"[refuse]\ncommands = ['rm']\n", "unknown key 'commands' in [refuse]"),
        (b"[refuse]\ntools = 'http_request'\n", "tools must be a list of strings, not str"),
        (b"[refuse]\nfamilies = [1]\n", "families must be a list of strings; it holds 1"),
        (b"[refuse]\ntools = ['']\n", "tools holds an empty name"),
        (b"[refuse]\nfamilies = ['sending']\n", "unknown family 'sending'"),
    ],
)
def test_parse_policy_refuses_with_a_precise_reason(data: bytes, words: str) -> None:
    with pytest.raises(PolicyRefused) as info:
        parse_policy(data)
    assert words in info.value.message
    assert info.value.code == "POLICY_REFUSED"


# --- signatures (pure) ---------------------------------------------------------------


def test_evaluate_accepts_a_policy_signed_by_a_trusted_key() -> None:
    seed, other = _seed(), _seed()
    state = evaluate_policy(POLICY, sign_bytes(POLICY, seed), [_pub(other), _pub(seed)])
    assert state.status == "accepted"
    assert state.key == _pub(seed)
    assert state.policy == parse_policy(POLICY)
    assert state.digest is not None and len(state.digest) == 64
    assert state.to_dict()["policy"] == {
        "refuse": {"tools": ["http_request"], "connections": ["mcp:crm"], "families": ["execute", "send"]}
    }


def test_evaluate_without_a_policy_is_none() -> None:
    state = evaluate_policy(None, None, [])
    assert (state.status, state.policy, state.key, state.digest) == ("none", None, None, None)


def _refusal(data: bytes, sig: bytes | None, keys: list[str] | None) -> str:
    state = evaluate_policy(data, sig, keys)
    assert state.status == "refused"
    assert state.policy is None and state.key is None
    return state.reason


def test_refused_when_unsigned() -> None:
    assert "not signed" in _refusal(POLICY, None, [_pub(_seed())])


def test_refused_when_the_signature_is_not_base64_or_not_64_bytes() -> None:
    key = [_pub(_seed())]
    assert "not valid base64" in _refusal(POLICY, b"not base64 at all!\n", key)
    assert "decodes to 32 bytes, not 64" in _refusal(POLICY, base64.b64encode(b"x" * 32), key)
    assert "not base64 text" in _refusal(POLICY, b"\xff\xff", key)


def test_refused_when_no_key_is_trusted() -> None:
    seed = _seed()
    assert "no trusted keys are configured" in _refusal(POLICY, sign_bytes(POLICY, seed), [])
    assert "no trusted keys are configured" in _refusal(POLICY, sign_bytes(POLICY, seed), None)


def test_refused_when_a_trusted_key_is_malformed() -> None:
    seed = _seed()
    sig = sign_bytes(POLICY, seed)
    assert "trusted key #2" in _refusal(POLICY, sig, [_pub(seed), "c2hvcnQ="])
    assert "decodes to 5 bytes, not 32" in _refusal(POLICY, sig, [_pub(seed), "c2hvcnQ="])
    assert "not valid base64" in _refusal(POLICY, sig, ["%%%"])


def test_refused_when_signed_by_an_untrusted_key() -> None:
    reason = _refusal(POLICY, sign_bytes(POLICY, _seed()), [_pub(_seed())])
    assert "verifies with no trusted key" in reason


@pytest.mark.parametrize(
    "changed",
    [
        POLICY + b"\n",  # a trailing newline added
        POLICY.replace(b"send", b"sene"),  # one byte
        POLICY[:-1],  # one byte removed
    ],
)
def test_refused_when_the_file_changed_after_signing(changed: bytes) -> None:
    seed = _seed()
    reason = _refusal(changed, sign_bytes(POLICY, seed), [_pub(seed)])
    assert "changed after it was signed" in reason


def test_refused_when_the_sig_belongs_to_another_file() -> None:
    seed = _seed()
    other = b"[refuse]\ntools = []\n"
    assert "verifies with no trusted key" in _refusal(POLICY, sign_bytes(other, seed), [_pub(seed)])


def test_a_signed_policy_with_bad_content_is_still_refused() -> None:
    seed = _seed()
    bad = b"[refuse]\nfamilies = ['sending']\n"
    assert "unknown family 'sending'" in _refusal(bad, sign_bytes(bad, seed), [_pub(seed)])


def test_the_signature_is_checked_before_the_content() -> None:
    """Bytes nobody trusted are not interpreted: the reason is the signature."""
    seed = _seed()
    bad = b"[refuse\n"
    assert "verifies with no trusted key" in _refusal(bad, sign_bytes(b"x", seed), [_pub(seed)])


def test_keys_problem_refuses() -> None:
    reason = evaluate_policy(POLICY, b"x", None, keys_problem="apollia.toml: broken").reason
    assert reason == "the trusted keys cannot be read: apollia.toml: broken"


def test_verify_signature_returns_the_verifying_key() -> None:
    seed = _seed()
    assert verify_signature(POLICY, sign_bytes(POLICY, seed), [" " + _pub(seed) + "\n"]) == _pub(seed)


# --- files: keygen, sign, load ------------------------------------------------------


def test_keygen_writes_a_private_key_0600_and_a_public_key(tmp_path: Path) -> None:
    out = tmp_path / "keys" / "policy.key"
    private, public = keygen(out)
    assert private == out
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    seed = base64.b64decode(out.read_text().strip(), validate=True)
    assert len(seed) == 32
    assert _pub(seed) == public
    assert (tmp_path / "keys" / "policy.key.pub").read_text().strip() == public


def test_keygen_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "policy.key"
    keygen(out)
    before = out.read_bytes()
    with pytest.raises(BadInput, match="already exists"):
        keygen(out)
    assert out.read_bytes() == before
    other = tmp_path / "other.key"
    (tmp_path / "other.key.pub").write_text("mine\n")
    with pytest.raises(BadInput, match="other.key.pub already exists"):
        keygen(other)
    assert not other.exists()


def test_keygen_ignores_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        private, _ = keygen(tmp_path / "k")
    finally:
        os.umask(old)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def _deposit(home: Home, data: bytes, key: Path) -> None:
    home.ensure()
    home.policy_path.write_bytes(data)
    sign(home.policy_path, key)


def test_sign_then_load_is_accepted_with_keys_from_apollia_toml(tmp_path: Path) -> None:
    home = Home.at(tmp_path / "home")
    private, public = keygen(tmp_path / "policy.key")
    _deposit(home, POLICY, private)
    sig = home.policy_sig_path.read_bytes()
    assert len(base64.b64decode(sig.strip(), validate=True)) == 64
    assert load_policy(home).status == "refused"  # no apollia.toml yet: no trusted keys
    home.config_path.write_text(f'[policy]\ntrusted_keys = ["{public}"]\n')
    state = load_policy(home)
    assert state.status == "accepted", state.reason
    assert state.key == public
    assert state.policy is not None and Family.SEND in state.policy.refuse_families


def test_load_policy_with_explicit_keys_and_each_file_problem(tmp_path: Path) -> None:
    home = Home.at(tmp_path / "home")
    private, public = keygen(tmp_path / "policy.key")
    assert load_policy(home, [public]).status == "none"
    home.policy_path.write_bytes(POLICY)
    assert "not signed" in load_policy(home, [public]).reason
    sign(home.policy_path, private)
    assert load_policy(home, [public]).status == "accepted"
    with home.policy_path.open("ab") as f:
        f.write(b"\n")
    assert "changed after it was signed" in load_policy(home, [public]).reason
    home.policy_sig_path.unlink()
    home.policy_sig_path.mkdir()
    state = load_policy(home, [public])
    assert state.status == "refused" and "organisation.toml.sig cannot be read" in state.reason


def test_load_policy_with_a_broken_apollia_toml_is_refused(tmp_path: Path) -> None:
    home = Home.at(tmp_path / "home")
    private, _ = keygen(tmp_path / "policy.key")
    _deposit(home, POLICY, private)
    home.config_path.write_text("[policy]\ntrusted_keys = 3\n")
    state = load_policy(home)
    assert state.status == "refused"
    assert "trusted keys cannot be read" in state.reason and "trusted_keys" in state.reason


def test_sign_refuses_a_policy_that_would_be_refused(tmp_path: Path) -> None:
    private, _ = keygen(tmp_path / "policy.key")
    bad = tmp_path / "organisation.toml"
    bad.write_bytes(b"[refuse]\nfamilies = ['nope']\n")
    with pytest.raises(BadInput, match="unknown family 'nope'"):
        sign(bad, private)
    assert not (tmp_path / "organisation.toml.sig").exists()


def test_sign_refuses_a_malformed_key_file(tmp_path: Path) -> None:
    policy = tmp_path / "organisation.toml"
    policy.write_bytes(POLICY)
    key = tmp_path / "bad.key"
    key.write_text("not a key\n")
    with pytest.raises(BadInput, match="not valid base64"):
        sign(policy, key)
    with pytest.raises(BadInput, match="cannot be read"):
        sign(policy, tmp_path / "missing.key")
    with pytest.raises(BadInput, match="cannot be read"):
        sign(tmp_path / "missing.toml", key)
