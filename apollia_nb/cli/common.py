"""What every command group of ``apollia-os`` shares: printing its answer, and who is acting.

The package's ``__init__`` assembles the groups; the groups (and the served commands of
``client.py``) take these from here, so none of them imports the module that dispatches to it.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["emit", "who"]


def emit(args: argparse.Namespace, data: object, text: str) -> None:
    """Print ``data`` as JSON with ``--json``, else ``text``."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=str))
    else:
        print(text)


def who(args: argparse.Namespace) -> str:
    """The person a change is recorded as made by: ``--by``, else the JupyterHub user (in a hub's terminal),
    else the login name, else ``cli``."""
    from apollia_nb.governance.people import login_name

    if getattr(args, "by", None):
        return str(args.by)
    return login_name("cli")
