"""``apollia-os witness``: run a witness for a team's homes, and send a home's checkpoints to its witnesses.

``witness serve`` keeps its state in ``--home-dir`` (default ``$APOLLIA_WITNESS_HOME``,
else ``~/.apollia-witness``): its signing key, the journal keys it trusts and the
latest checkpoint it cosigned per origin (see ``apollia_nb/witness/server.py``).
``witness key`` prints its verifier key (for ``[[journal.witnesses]]`` and
``audit verify --witness``). ``witness push`` sends the home's newest checkpoint to
every configured witness now (exit 1 when one of them has not cosigned it); on a home
``apollia-os serve`` owns, the server's sender does, and the command reports (waiting
up to ``cli.backend.SERVED_WAIT_SECS`` for it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from apollia_nb.cli.common import emit

__all__ = ["register"]


def _witness_dir(value: str | None) -> Path:
    return Path(value or os.environ.get("APOLLIA_WITNESS_HOME") or Path.home() / ".apollia-witness").expanduser()


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    witness = sub.add_parser("witness", help="cosign checkpoints of trusted journals; send a home's checkpoints")
    wsub = witness.add_subparsers(dest="witness_command", metavar="ACTION", required=True)

    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--home-dir", default=None, metavar="DIR",
                       help="the witness's folder (default: $APOLLIA_WITNESS_HOME, else ~/.apollia-witness)")
    where.add_argument("--json", action="store_true", help="print data as JSON")

    p = wsub.add_parser("serve", parents=[where],
                        help="serve C2SP tlog-witness add-checkpoint for the trusted journal keys")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default 0)")
    p.add_argument("--trust", action="append", default=[], metavar="VKEY",
                   help="trust this journal verifier key (`apollia-os audit checkpoint` origin key; repeatable; "
                        "remembered in DIR/trusted_keys)")
    p.add_argument("--name", default=None,
                   help="the witness's key name, fixed on first start (default: <hostname>/apollia-witness)")
    p.set_defaults(handler=_serve)

    p = wsub.add_parser("key", parents=[where], help="print the witness's verifier key (creating it if needed)")
    p.add_argument("--name", default=None, help="the key name on first use (as for serve)")
    p.set_defaults(handler=_key)

    p = wsub.add_parser("push", parents=[common],
                        help="send the home's newest checkpoint to every witness now (exit 1: one did not cosign it)")
    p.add_argument("--checkpoint", action="store_true", help="sign a checkpoint of every entry first")
    p.set_defaults(handler=_push)


def _serve(args: argparse.Namespace) -> int:
    from apollia_nb.witness.server import WitnessState, serve

    state = WitnessState(_witness_dir(args.home_dir), name=args.name, trust=args.trust)

    def listening(url: str) -> None:
        trusted = sorted(state.trusted)
        if args.json:
            print(json.dumps({"url": url, "pid": os.getpid(), "name": state.name, "key": state.verifier_key(),
                              "trusted_origins": trusted}))
        else:
            print(f"apollia-os witness serve: listening on {url} (pid {os.getpid()}; stop with Ctrl+C)")
            print(f"witness key: {state.verifier_key()}")
            print(f"trusted origins: {', '.join(trusted) if trusted else 'none (add --trust VKEY)'}")
        sys.stdout.flush()

    serve(state, host=args.host, port=args.port, on_listening=listening)
    return 0


def _key(args: argparse.Namespace) -> int:
    from apollia_nb.witness.server import WitnessState

    state = WitnessState(_witness_dir(args.home_dir), name=args.name)
    try:
        emit(args, {"name": state.name, "key": state.verifier_key(), "logs": state.logs()}, state.verifier_key())
    finally:
        state.close()
    return 0


def _push(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home
    from apollia_nb.config import load_config
    from apollia_nb.errors import BadInput
    from apollia_nb.journal.witness_sender import parse_witnesses

    with open_home(args) as home:
        config = home.home.config_path
        witnesses = parse_witnesses(load_config(config).raw, str(config))
        if not witnesses:
            raise BadInput(f"{config} names no witness: add [[journal.witnesses]] with url and key")
        status = home.push_witnesses(witnesses, checkpoint=args.checkpoint)
    lines = [f"{w['key_name']} ({w['url']}): "
             + (f"FAILED: {w['last_error']}" if w["last_error"] else f"cosigned size {w['cosigned_size']}")
             for w in status]
    emit(args, {"witnesses": status}, "\n".join(lines))
    return 1 if any(w["pending"] or w["last_error"] for w in status) else 0
