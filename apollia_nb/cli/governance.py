"""``apollia-os`` commands for governance: rules, developer mode, consents, organisation policy.

Reading commands open ``governance.db`` for the instant they read it.
Commands that change governance own the home for their duration (``OwnerLock``;
another owner is ``HOME_LOCKED``, naming it) and journal the change before it
takes effect. On a home ``apollia-os serve`` owns, each works through the server
(``cli/backend.py``), which journals and stores the change. ``policy keygen`` and ``policy sign`` touch only the files they
name; ``policy check`` says what the home makes of its deposited policy and
exits 1 when it is refused; ``policy remove`` is the only way back from a
policy to none (a policy file that just vanished is refused).

What the home has had comes from its journal: a ``governance.db`` or policy it
records and that is gone is reported, never read as "nothing configured".
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from apollia_nb.cli.common import emit, who
from apollia_nb.errors import BadInput
from apollia_nb.home import Home

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add ``rules``, ``devmode``, ``consents`` and ``policy`` to the parser."""
    rules = sub.add_parser("rules", help="fine rules: a tool, an optional prefix, allow or deny")
    rsub = rules.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    p = rsub.add_parser("list", parents=[common], help="every fine rule, oldest first")
    p.set_defaults(handler=_rules_list)
    p = rsub.add_parser("add", parents=[common], help="add a fine rule")
    p.add_argument("tool", help="the tool the rule names, e.g. bash_executor or mcp:notes/search")
    p.add_argument("--effect", required=True, metavar="allow|deny",
                   help="deny refuses on line 2 for any tool; allow acts on code execution in developer mode")
    p.add_argument("--prefix", default=None, help="a prefix of the call's first argument (default: any)")
    p.add_argument("--agent", default="*", help="the agent it applies to (default: * for every agent)")
    p.add_argument("--by", default=None, help="who makes the change (default: the user name)")
    p.set_defaults(handler=_rules_add)
    p = rsub.add_parser("remove", parents=[common], help="remove a fine rule by id")
    p.add_argument("id")
    p.add_argument("--by", default=None, help="who makes the change (default: the user name)")
    p.set_defaults(handler=_rules_remove)

    p = sub.add_parser("devmode", parents=[common], help="show, or turn on or off, developer mode")
    p.add_argument("state", nargs="?", default=None, metavar="on|off")
    p.add_argument("--by", default=None, help="who makes the change (default: the user name)")
    p.set_defaults(handler=_devmode)

    consents = sub.add_parser("consents", help="standing consents of agents for families")
    csub = consents.add_subparsers(dest="consents_command", metavar="ACTION", required=True)
    p = csub.add_parser("list", parents=[common],
                        help="every standing consent: who gave it, when, from which card, when it ends")
    p.add_argument("--agent", default=None, help="only this agent's consents")
    p.set_defaults(handler=_consents_list)
    p = csub.add_parser("revoke", parents=[common], help="revoke an agent's standing consent for a family")
    p.add_argument("agent")
    p.add_argument("family")
    p.add_argument("--by", default=None, help="who makes the change (default: the user name)")
    p.set_defaults(handler=_consents_revoke)

    policy = sub.add_parser("policy", help="the signed organisation policy")
    psub = policy.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    p = psub.add_parser("keygen", parents=[common], help="create an Ed25519 key pair for signing policies")
    p.add_argument("--out", type=Path, default=None,
                   help="the private key's path (default: <home>/keys/policy.key); the public key goes beside it (.pub)")
    p.set_defaults(handler=_policy_keygen)
    p = psub.add_parser("sign", parents=[common], help="sign a policy file; writes FILE.sig")
    p.add_argument("file", type=Path)
    p.add_argument("--key", type=Path, required=True, help="the private key written by `policy keygen`")
    p.set_defaults(handler=_policy_sign)
    p = psub.add_parser("check", parents=[common], help="is the deposited policy accepted? (exit 1: refused)")
    p.set_defaults(handler=_policy_check)
    p = psub.add_parser("remove", parents=[common],
                        help="remove the deposited policy on purpose (journaled); the home has none afterwards")
    p.add_argument("--by", default=None, help="who makes the change (default: the user name)")
    p.set_defaults(handler=_policy_remove)


# --- shared -------------------------------------------------------------------------


def _home(args: argparse.Namespace, *, create: bool = True) -> Any:
    return Home.at(args.home, create=create)


@contextmanager
def _reader(args: argparse.Namespace, *, reading: bool = False) -> Iterator[Any]:
    """A store for reading: it creates nothing, and expects what the journal records (the server's
    governance when `apollia-os serve` owns the home)."""
    from apollia_nb.cli.backend import open_home

    with open_home(args, reading=reading) as home, home.governance() as store:
        yield store


@contextmanager
def _owned_store(args: argparse.Namespace, *, alone: str | None = None) -> Iterator[Any]:
    """A store on a home this command owns, journaling each change before it takes effect; the server's
    governance (which journals and stores the change) when `apollia-os serve` owns the home. ``alone``:
    the change needs the home's files to itself (refused with ``HOME_LOCKED`` while it is served)."""
    from apollia_nb.cli.backend import open_home

    with open_home(args) as home, home.governance(write=True, alone=alone) as store:
        yield store


def _when(value: str | None) -> str:
    return value or "-"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


# --- rules --------------------------------------------------------------------------


def _rule_words(rule: dict[str, Any]) -> str:
    prefix = f" under {rule['prefix']!r}" if rule["prefix"] is not None else ""
    scope = "every agent" if rule["agent"] == "*" else f"agent {rule['agent']}"
    return f"{rule['effect']} {rule['tool']}{prefix} for {scope}"


def _rules_list(args: argparse.Namespace) -> int:
    with _reader(args, reading=True) as store:
        rules = [r.to_dict() for r in store.rules()]
    if not rules:
        emit(args, rules, "no fine rules")
        return 0
    rows = [
        [r["id"], r["effect"], r["tool"], r["prefix"] if r["prefix"] is not None else "(any)", r["agent"],
         f"{_when(r['created_at'])} by {r['created_by']}"]
        for r in rules
    ]
    emit(args, rules, _table(["ID", "EFFECT", "TOOL", "PREFIX", "AGENT", "ADDED"], rows))
    return 0


def _rules_add(args: argparse.Namespace) -> int:
    with _owned_store(args) as store:
        rule = store.add_rule(args.tool, args.effect, prefix=args.prefix, agent=args.agent, by=who(args)).to_dict()
    emit(args, rule, f"rule {rule['id']}: {_rule_words(rule)}")
    return 0


def _rules_remove(args: argparse.Namespace) -> int:
    with _owned_store(args) as store:
        rule = store.remove_rule(args.id, by=who(args)).to_dict()
    emit(args, rule, f"removed rule {rule['id']}: {_rule_words(rule)}")
    return 0


# --- developer mode -----------------------------------------------------------------


def _devmode(args: argparse.Namespace) -> int:

    if args.state is None:
        with _reader(args) as store:
            state = store.developer_mode_state()
    elif args.state in ("on", "off"):
        with _owned_store(args) as store:
            state = store.set_developer_mode(args.state == "on", by=who(args))
    else:
        raise BadInput(f"devmode takes on or off, not {args.state!r}")
    data = state.to_dict()
    since = f" (since {data['changed_at']}, by {data['changed_by']})" if data["changed_by"] else ""
    emit(args, data, f"developer mode: {'on' if data['enabled'] else 'off'}{since}")
    return 0


# --- consents -----------------------------------------------------------------------


def _consent_ends(consent: dict[str, Any]) -> str:
    state, until = consent.get("state") or "in force", consent.get("until")
    if state == "unreadable":
        return "its end does not read (it does not apply)"
    if until is None:
        return "until revoked"
    return f"ended {until}" if state == "ended" else until


def _consents_list(args: argparse.Namespace) -> int:
    from apollia_nb.governance.store import validate_agent

    agent = validate_agent(args.agent) if args.agent is not None else None
    with _reader(args, reading=True) as store:
        consents = [c.to_dict() for c in store.consents() if agent is None or c.agent == agent]
    if not consents:
        emit(args, consents, "no standing consents" + (f" of {agent}" if agent else ""))
        return 0
    rows = [[c["agent"], c["family"], c["granted_by"], _when(c["granted_at"]), c.get("card") or "-",
             _consent_ends(c)] for c in consents]
    emit(args, consents, _table(["AGENT", "FAMILY", "GIVEN BY", "AT", "CARD", "ENDS"], rows))
    return 0


def _consents_revoke(args: argparse.Namespace) -> int:
    with _owned_store(args) as store:
        consent = store.revoke_consent(args.agent, args.family, by=who(args)).to_dict()
    emit(args, consent, f"revoked the standing consent of {consent['agent']} for {consent['family']}")
    return 0


# --- organisation policy ----------------------------------------------------------


def _policy_keygen(args: argparse.Namespace) -> int:
    from apollia_nb.governance.policy import keygen  # lazy: PyNaCl, for the policy commands

    out = args.out if args.out is not None else _home(args).keys_dir / "policy.key"
    private, public = keygen(out)
    pub_file = private.with_name(private.name + ".pub")
    data = {"private_key": str(private), "public_key_file": str(pub_file), "public_key": public}
    emit(args, data, "\n".join([
        f"private key: {private} (keep it secret)",
        f"public key:  {pub_file}",
        "trust it in apollia.toml of each home:",
        "  [policy]",
        f'  trusted_keys = ["{public}"]',
    ]))
    return 0


def _policy_sign(args: argparse.Namespace) -> int:
    from apollia_nb.governance.policy import sign  # lazy: PyNaCl, for the policy commands

    sig = sign(args.file, args.key)
    emit(args, {"file": str(args.file), "signature": str(sig)}, f"signed {args.file}: {sig}")
    return 0


def _policy_check(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home

    with open_home(args) as where:
        home = where.home
        state, known = where.policy_state()
    data = {"path": str(home.policy_path), **state.to_dict()}
    lines = [f"policy: {state.status}", f"reason: {state.reason}"]
    if not known:
        note = ("the journal is held by the process that owns the home, so the policy the home had could not be "
                "checked here; the owner's view is in `%apollia status` and GET /api/v1/governance/policy")
        data["note"] = note
        lines.append(f"note: {note}")
    if state.key is not None:
        lines.append(f"key: {state.key}")
    if state.digest is not None:
        lines.append(f"sha256: {state.digest}")
    if state.policy is not None:
        refuse = data["policy"]["refuse"]
        for what in ("tools", "connections", "families"):
            lines.append(f"refuses {what}: {', '.join(refuse[what]) or '-'}")
    emit(args, data, "\n".join(lines))
    return 1 if state.status == "refused" else 0


def _policy_remove(args: argparse.Namespace) -> int:
    home = _home(args, create=False)
    with _owned_store(args, alone="`policy remove`") as store:
        state = store.remove_policy(by=who(args)).to_dict()
    emit(args, {"path": str(home.policy_path), **state},
         f"removed the organisation policy of {home.path} (journaled)\npolicy: {state['status']}")
    return 0
