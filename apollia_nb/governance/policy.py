"""Organisation policy: a signed TOML file of refusals that the home only obeys when trusted.

An organisation deposits ``policy/organisation.toml`` in the home together with
``policy/organisation.toml.sig`` (base64 of the 64-byte Ed25519 signature over
the file's exact bytes). The home trusts the base64 32-byte public keys listed
in ``[policy] trusted_keys`` of ``apollia.toml``. The policy holds refusals, and may say who must
approve calls (``governance/approvals.py``)::

    [refuse]
    tools = ["http_request"]
    connections = ["mcp:crm"]
    families = ["send"]

    [approvals.families.send]
    four_eyes = true        # not the person who started the run
    approvers = 2           # two distinct people

    [approvals.tools."mcp:crm/delete_contact"]
    four_eyes = true

A policy is ``none`` (nothing deposited: no organisation refusals),
``accepted`` (it parses and a trusted key signed these exact bytes) or
``refused`` (anything else, with a precise reason). A refused policy makes
governance fail closed; it never becomes a permission.

Once a home has had a policy (its journal records one loaded or refused), a
missing ``organisation.toml`` is not ``none`` but ``refused``: the file
vanished. ``none`` comes back only when an operator removes the policy on
purpose (``apollia-os policy remove``, journaled ``policy_removed``). A policy
replaced by another that a trusted key signed is a legitimate change: it is
accepted and journaled like the first.

The core is pure: ``evaluate_policy`` takes bytes and returns a
``PolicyState``; ``load_policy``, ``keygen`` and ``sign`` are the thin edges
that touch files. The signature is checked before the content is parsed, so
bytes nobody trusted are never interpreted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from apollia_nb.config import load_config
from apollia_nb.errors import BadInput, PolicyRefused
from apollia_nb.governance.decision import Family, Policy
from apollia_nb.home import Home

__all__ = [
    "PolicyState",
    "PolicyStatus",
    "parse_policy",
    "verify_signature",
    "evaluate_policy",
    "load_policy",
    "keygen",
    "sign",
    "sign_bytes",
    "policy_to_dict",
    "SIGNATURE_SUFFIX",
    "MISSING_REASON",
]

MISSING_REASON = (
    "policy/organisation.toml is missing, but this home had an organisation policy (see the journal); "
    "restore the file and its .sig, or remove the policy on purpose with `apollia-os policy remove`"
)

PolicyStatus = Literal["none", "accepted", "refused"]
SIGNATURE_SUFFIX = ".sig"
_REFUSE_KEYS = ("tools", "connections", "families")
_FAMILY_NAMES = tuple(f.value for f in Family)


@dataclass(frozen=True)
class PolicyState:
    """What the home makes of its deposited policy.

    ``policy`` is set only when ``status == "accepted"``; ``key`` is the trusted
    public key (base64) that verified it; ``digest`` is the SHA-256 (hex) of
    the policy file's bytes when there is a file.
    """

    status: PolicyStatus
    reason: str
    policy: Policy | None = None
    key: str | None = None
    digest: str | None = None

    @property
    def refused(self) -> bool:
        return self.status == "refused"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "key": self.key,
            "digest": self.digest,
            "policy": policy_to_dict(self.policy) if self.policy is not None else None,
        }


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """``{"refuse": {"tools", "connections", "families"}}`` with sorted lists, and ``approvals`` when it
    requires any (``{"families": {name: {"four_eyes", "approvers"}}, "tools": {...}}``)."""
    return {
        "refuse": {
            "tools": sorted(policy.refuse_tools),
            "connections": sorted(policy.refuse_connections),
            "families": sorted(f.value for f in policy.refuse_families),
        },
        **({"approvals": {
            group: {name: {"four_eyes": four, "approvers": count}
                    for kind, name, four, count in policy.approvals if kind == singular}
            for group, singular in (("families", "family"), ("tools", "tool"))}} if policy.approvals else {}),
    }


# --- pure core ---------------------------------------------------------------------


def _string_list(table: str, key: str, value: object) -> list[str]:
    if not isinstance(value, list):
        raise PolicyRefused(f"[{table}] {key} must be a list of strings, not {type(value).__name__}")
    for item in value:
        if not isinstance(item, str):
            raise PolicyRefused(
                f"[{table}] {key} must be a list of strings; it holds {item!r} ({type(item).__name__})"
            )
        if not item.strip():
            raise PolicyRefused(f"[{table}] {key} holds an empty name")
    return value


def parse_policy(data: bytes) -> Policy:
    """Parse a policy file's bytes; raise ``PolicyRefused`` saying exactly what is wrong."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyRefused(f"the policy is not UTF-8 text: {exc}") from None
    import tomllib  # only with a policy to read: about 2 ms of CPU a load without one does not pay

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyRefused(f"the policy is not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"refuse", "approvals"})
    if unknown:
        raise PolicyRefused(
            f"unknown top-level key or table {unknown[0]!r} in the policy (only [refuse] and [approvals] are allowed)"
        )
    approvals = _parse_approvals(doc.get("approvals", {}))
    refuse = doc.get("refuse", {})
    if not isinstance(refuse, dict):
        raise PolicyRefused("'refuse' must be a table: [refuse]")
    unknown = sorted(set(refuse) - set(_REFUSE_KEYS))
    if unknown:
        raise PolicyRefused(
            f"unknown key {unknown[0]!r} in [refuse] (allowed: tools, connections, families)"
        )
    tools = _string_list("refuse", "tools", refuse.get("tools", []))
    connections = _string_list("refuse", "connections", refuse.get("connections", []))
    families = _string_list("refuse", "families", refuse.get("families", []))
    for name in families:
        if name not in _FAMILY_NAMES:
            raise PolicyRefused(
                f"unknown family {name!r} in [refuse] families (known: {', '.join(_FAMILY_NAMES)})"
            )
    return Policy(
        refuse_tools=frozenset(tools),
        refuse_connections=frozenset(connections),
        refuse_families=frozenset(Family(f) for f in families),
        approvals=approvals,
    )


#: The most distinct approvers a policy may require of one call.
MAX_APPROVERS = 10


def _parse_approvals(table: object) -> tuple[tuple[str, str, bool, int], ...]:
    """``[approvals.families.<family>]`` and ``[approvals.tools."<tool>"]``, each with ``four_eyes``
    (a boolean) and ``approvers`` (1 to 10): who must approve those calls. Anything else refuses."""
    if not isinstance(table, dict):
        raise PolicyRefused("'approvals' must be a table: [approvals.families.send] or [approvals.tools.\"NAME\"]")
    unknown = sorted(set(table) - {"families", "tools"})
    if unknown:
        raise PolicyRefused(f"unknown key {unknown[0]!r} in [approvals] (allowed: families, tools)")
    out: list[tuple[str, str, bool, int]] = []
    for group, kind in (("families", "family"), ("tools", "tool")):
        entries = table.get(group, {})
        if not isinstance(entries, dict):
            raise PolicyRefused(f"[approvals] {group} must be a table of tables")
        for name, req in entries.items():
            where = f"[approvals.{group}.{name}]"
            if kind == "family" and name not in _FAMILY_NAMES:
                raise PolicyRefused(f"unknown family {name!r} in {where} (known: {', '.join(_FAMILY_NAMES)})")
            if not isinstance(name, str) or not name.strip():
                raise PolicyRefused(f"[approvals] {group} holds an empty name")
            if not isinstance(req, dict):
                raise PolicyRefused(f"{where} must be a table (four_eyes = true, approvers = 2)")
            bad = sorted(set(req) - {"four_eyes", "approvers"})
            if bad:
                raise PolicyRefused(f"unknown key {bad[0]!r} in {where} (allowed: four_eyes, approvers)")
            four_eyes = req.get("four_eyes", False)
            approvers = req.get("approvers", 1)
            if not isinstance(four_eyes, bool):
                raise PolicyRefused(f"{where} four_eyes must be true or false, not {four_eyes!r}")
            if isinstance(approvers, bool) or not isinstance(approvers, int) or not 1 <= approvers <= MAX_APPROVERS:
                raise PolicyRefused(f"{where} approvers must be a whole number from 1 to {MAX_APPROVERS}, "
                                    f"not {approvers!r}")
            out.append((kind, name, four_eyes, approvers))
    return tuple(sorted(out))


def _b64(text: str | bytes, what: str, size: int) -> bytes:
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise PolicyRefused(f"{what} is not base64 text") from None
    stripped = text.strip()
    try:
        raw = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError):
        raise PolicyRefused(f"{what} is not valid base64") from None
    if len(raw) != size:
        raise PolicyRefused(f"{what} decodes to {len(raw)} bytes, not {size}")
    return raw


def verify_signature(data: bytes, signature: bytes, trusted_keys: Sequence[str]) -> str:
    """Return the trusted key (base64) whose signature over ``data`` this is.

    Raises ``PolicyRefused`` when the signature is malformed, no key is
    trusted, a trusted key is malformed, or no trusted key made it.
    """
    sig = _b64(signature, "the signature (organisation.toml.sig)", 64)
    if not trusted_keys:
        raise PolicyRefused(
            "no trusted keys are configured: add the signer's public key to "
            "[policy] trusted_keys in apollia.toml"
        )
    keys: list[tuple[str, VerifyKey]] = []
    for index, key in enumerate(trusted_keys):
        raw = _b64(key, f"trusted key #{index + 1} in [policy] trusted_keys ({key[:16]!r})", 32)
        try:
            keys.append((key.strip(), VerifyKey(raw)))
        except Exception as exc:  # pragma: no cover - 32 bytes always make a key
            raise PolicyRefused(f"trusted key #{index + 1} is not an Ed25519 key: {exc}") from None
    for text, verify_key in keys:
        try:
            verify_key.verify(data, sig)
        except BadSignatureError:
            continue
        return text
    raise PolicyRefused(
        "the signature verifies with no trusted key: the policy changed after it was signed, "
        "the .sig belongs to another file, or the signer's key is not in [policy] trusted_keys"
    )


def evaluate_policy(
    data: bytes | None,
    signature: bytes | None,
    trusted_keys: Sequence[str] | None,
    *,
    keys_problem: str | None = None,
    expected: bool = False,
) -> PolicyState:
    """Decide what a deposited policy is worth. Pure: bytes in, a ``PolicyState`` out.

    ``data`` None: no policy is deposited. ``signature`` None: the ``.sig`` is
    missing. ``keys_problem``: why the trusted keys could not be read, if so.
    ``expected``: the home has had a policy, so its absence is refused.
    """
    if data is None:
        if expected:
            return PolicyState("refused", MISSING_REASON)
        return PolicyState("none", "no organisation policy is deposited")
    digest = hashlib.sha256(data).hexdigest()
    if signature is None:
        return PolicyState(
            "refused", "the policy is not signed: policy/organisation.toml.sig is missing", digest=digest
        )
    if keys_problem is not None:
        return PolicyState("refused", f"the trusted keys cannot be read: {keys_problem}", digest=digest)
    try:
        key = verify_signature(data, signature, trusted_keys or ())
        policy = parse_policy(data)
    except PolicyRefused as exc:
        return PolicyState("refused", exc.message, digest=digest)
    return PolicyState(
        "accepted", f"signed by trusted key {key}", policy=policy, key=key, digest=digest
    )


def sign_bytes(data: bytes, seed: bytes) -> bytes:
    """The base64 signature line (with newline) for ``data`` under a 32-byte seed."""
    signed = SigningKey(seed).sign(data)
    return base64.b64encode(signed.signature) + b"\n"


# --- edges: files ------------------------------------------------------------------


def _read_optional(path: Path, what: str) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PolicyRefused(f"{what} cannot be read: {exc.strerror or exc}") from None


def load_policy(home: Home, trusted_keys: Sequence[str] | None = None, *, expected: bool = False) -> PolicyState:
    """Read the home's deposited policy and judge it.

    ``trusted_keys`` None: take them from ``[policy] trusted_keys`` of
    ``apollia.toml``. ``expected``: the home has had a policy (a missing file is refused).
    """
    try:
        data = _read_optional(home.policy_path, "policy/organisation.toml")
    except PolicyRefused as exc:
        return PolicyState("refused", exc.message)
    if data is None:
        return evaluate_policy(None, None, None, expected=expected)
    try:
        signature = _read_optional(home.policy_sig_path, "policy/organisation.toml.sig")
    except PolicyRefused as exc:
        return PolicyState("refused", exc.message, digest=hashlib.sha256(data).hexdigest())
    keys_problem: str | None = None
    if trusted_keys is None:
        try:
            trusted_keys = load_config(home.config_path).trusted_keys
        except BadInput as exc:
            keys_problem = exc.message
        except OSError as exc:
            keys_problem = f"apollia.toml: {exc.strerror or exc}"
    return evaluate_policy(data, signature, trusted_keys, keys_problem=keys_problem)


def _pub_path(private: Path) -> Path:
    return private.with_name(private.name + ".pub")


def keygen(out: Path) -> tuple[Path, str]:
    """Write a new signing key to ``out`` (base64 seed, mode 0600) and ``out.pub``.

    Refuses (``BadInput``) to overwrite either file. Returns the private key's
    path and the public key in base64, ready for ``[policy] trusted_keys``.
    """
    out = Path(out)
    pub = _pub_path(out)
    for path in (out, pub):
        if path.exists() or path.is_symlink():
            raise BadInput(f"{path} already exists; refusing to overwrite a key")
    out.parent.mkdir(parents=True, exist_ok=True)
    key = SigningKey.generate()
    public_b64 = base64.b64encode(bytes(key.verify_key)).decode("ascii")
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise BadInput(f"{out} already exists; refusing to overwrite a key") from None
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, base64.b64encode(bytes(key)) + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        fd = os.open(pub, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise BadInput(f"{pub} already exists; refusing to overwrite a key") from None
    try:
        os.write(fd, public_b64.encode("ascii") + b"\n")
    finally:
        os.close(fd)
    return out, public_b64


def _read_seed(key_file: Path) -> bytes:
    try:
        text = Path(key_file).read_bytes()
    except OSError as exc:
        raise BadInput(f"the key {key_file} cannot be read: {exc.strerror or exc}") from None
    try:
        return _b64(text, f"the key {key_file}", 32)
    except PolicyRefused as exc:
        raise BadInput(f"{exc.message} (expected the base64 seed written by `policy keygen`)") from None


def sign(policy_file: Path, key_file: Path) -> Path:
    """Sign ``policy_file``'s exact bytes; write ``<policy_file>.sig``; return its path.

    A policy that would be refused for its content is not signed (``BadInput``).
    """
    policy_file = Path(policy_file)
    try:
        data = policy_file.read_bytes()
    except OSError as exc:
        raise BadInput(f"the policy {policy_file} cannot be read: {exc.strerror or exc}") from None
    try:
        parse_policy(data)
    except PolicyRefused as exc:
        raise BadInput(f"{policy_file}: {exc.message}; not signed") from None
    seed = _read_seed(Path(key_file))
    sig_path = policy_file.with_name(policy_file.name + SIGNATURE_SUFFIX)
    tmp = sig_path.with_name(sig_path.name + ".tmp")
    tmp.write_bytes(sign_bytes(data, seed))
    os.replace(tmp, sig_path)
    return sig_path
