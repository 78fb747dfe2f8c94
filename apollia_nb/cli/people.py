"""``apollia-os people add|list|revoke|rotate|me``: the people of a home and their roles.

``people me`` says who this command acts as: on a served home, who the server says the token sent is
(``/api/v1/people/me``, any role); on a home nobody serves, the local user, its owner.

On a served home the command is a client of the server (``/api/v1/people``, role ``admin``; the token is
``$APOLLIA_TOKEN`` when set, else the owner's from ``server.json``); on a home nobody serves, it changes
``governance.db`` itself, as the home's owner. A token is printed once, when it is made.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from apollia_nb.cli.backend import ServedHome, open_home

__all__ = ["register"]


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    from apollia_nb.governance.people import ROLE_WORDS, ROLES

    people = sub.add_parser("people", help="people of a served home: personal tokens and roles")
    psub = people.add_subparsers(dest="people_command", metavar="ACTION")
    psub.required = True
    roles = "; ".join(f"{r}: {ROLE_WORDS[r]}" for r in ROLES)
    p = psub.add_parser("add", parents=[common], help="add a person and print their token (shown once)",
                        description=f"Roles — {roles}.")
    p.add_argument("name")
    p.add_argument("--role", dest="roles", action="append", required=True, choices=ROLES,
                   help="a role (repeat for more)")
    p.set_defaults(handler=_add)
    p = psub.add_parser("list", parents=[common], help="every person: name, roles, created, rotated, revoked")
    p.set_defaults(handler=_list)
    p = psub.add_parser("revoke", parents=[common], help="revoke a person's token (at once)")
    p.add_argument("name")
    p.set_defaults(handler=_revoke)
    p = psub.add_parser("rotate", parents=[common], help="a new token for a person (shown once); the old one stops")
    p.add_argument("name")
    p.set_defaults(handler=_rotate)
    p = psub.add_parser("me", parents=[common], help="who this command acts as: name, roles, how authenticated")
    p.set_defaults(handler=_me)


def _do(args: argparse.Namespace, method: str, path: str, body: Any, local: str) -> Any:
    from urllib.parse import quote

    from apollia_nb.errors import StorageError

    with open_home(args) as home:
        if isinstance(home, ServedHome):
            path = path.format(name=quote(getattr(args, "name", ""), safe=""))
            return home.remote.call(method, path, json=body, unreachable=StorageError,
                                    what=f"`people {args.people_command}` could not be sent").json()
        if local == "me":  # nobody serves the home: this command owns it, as the local user
            from apollia_nb.governance.approvals import local_person

            return {"name": local_person(), "roles": ["admin"], "auth": "local"}
        with home.governance(write=method != "GET") as store:
            from apollia_nb.governance.people import OWNER, People

            people = People(store)
            if local == "list":
                return [p.to_dict() for p in people.list()]
            if local == "add":
                person, token = people.add(args.name, args.roles, by=OWNER)
                return {**person.to_dict(), "token": token}
            if local == "rotate":
                person, token = people.rotate(args.name, by=OWNER)
                return {**person.to_dict(), "token": token}
            return people.revoke(args.name, by=OWNER).to_dict()


def _print_token(args: argparse.Namespace, data: dict[str, Any], what: str) -> int:
    if args.json:
        print(json.dumps(data))
        return 0
    print(f"{what} {data['name']} ({', '.join(data['roles'])}); their token, shown this once:", file=sys.stderr)
    print(data["token"])
    return 0


def _add(args: argparse.Namespace) -> int:
    return _print_token(args, _do(args, "POST", "/people", {"name": args.name, "roles": args.roles}, "add"), "added")


def _rotate(args: argparse.Namespace) -> int:
    return _print_token(args, _do(args, "POST", "/people/{name}/rotate", None, "rotate"), "rotated the token of")


def _revoke(args: argparse.Namespace) -> int:
    data = _do(args, "POST", "/people/{name}/revoke", None, "revoke")
    print(json.dumps(data) if args.json else f"revoked {data['name']}")
    return 0


def _list(args: argparse.Namespace) -> int:
    data = _do(args, "GET", "/people", None, "list")
    if args.json:
        print(json.dumps(data))
        return 0
    if not data:
        print("no people (the owner's token is the home's only one)")
    for p in data:
        print(f"{p['name']}\t{','.join(p['roles'])}\tcreated {p['created_at']} by {p['created_by']}\t"
              f"rotated {p['rotated_at'] or '-'}\t{'revoked ' + p['revoked_at'] if p['revoked'] else 'active'}")
    return 0


def _me(args: argparse.Namespace) -> int:
    data = _do(args, "GET", "/people/me", None, "me")
    if args.json:
        print(json.dumps(data))
        return 0
    held = ", ".join(data["roles"]) or "no role on this home"
    how = {"owner": "the owner's token", "token": "token", "hub": "JupyterHub",
           "local": "the local user, the home's owner"}.get(data["auth"], data["auth"])
    print(f"{data['name']} ({held}; by {how})")
    return 0
