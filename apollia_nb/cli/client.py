"""``apollia-os`` as a client of the ``apollia-os serve`` that owns the home.

A home has one owner process. While ``apollia-os serve`` owns it (and
advertises itself in ``<home>/server.json``), every command works through it
and prints what it prints without a server:

* ``agents list|register|stop``, ``run`` and ``pending decide`` use the REST
  API: the agents are the server's and a task runs *there*. An attended
  ``run`` still asks at the terminal: it submits the task watched, and each
  decision the task waits on is shown here and answered over the API. A
  manifest's relative workspace root is made absolute against the directory
  the command runs in, as it is without a server;
* governance (``rules``, ``consents``, ``devmode``, ``policy check``), the
  journal (``runs list``, ``audit verify|checkpoint|prove|replay|export``) use
  the remote stores of client mode (``apollia_nb.runtime.remote``), so the
  command code is the same one: changes are journaled and stored by the
  server; ``verify`` checks here, under the home's own public key, the entries
  it reads a page at a time; ``export`` has the server verify in place, then
  reads the verified entries a page at a time into the bundle; proofs are made
  by the server and checked here; SQL runs on the server (nothing of the
  journal is copied here);
* ``policy remove`` and ``home repair`` need the home to themselves: they say
  so (``HOME_LOCKED``, naming the server to stop).

``served(args)`` decides: the server named in ``server.json`` holds the home's
lock, is alive and answers ``/health``. Otherwise commands run as owners, as
they do without a server; a stale ``server.json`` on a home another process
holds is ``SERVER_NOT_RUNNING`` (start the server, or remove the file).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from apollia_nb.cli.common import emit
from apollia_nb.errors import ApolliaError, HomeLocked
from apollia_nb.runtime.remote import ServerApi as _Api

__all__ = ["served", "remote", "route", "refuse_served", "kernel_owner", "kernel_locked"]

#: How long one wait for a task asks the server to hold the request.
WAIT_SECS = 25.0
#: How long an attended run waits before asking again for a task whose answered decision has not resumed yet.
POLL_SECS = 0.2


def _home(args: argparse.Namespace) -> Any:
    from apollia_nb.home import Home

    return Home.at(args.home, create=False)


def served(args: argparse.Namespace) -> Any:
    """The address of the ``apollia-os serve`` that owns the home, or None when none does.

    A ``server.json`` left by a server that stopped is ``SERVER_NOT_RUNNING`` when another live
    process holds the home (the command could not own it either); when nothing holds it, the
    command runs as the owner."""
    from apollia_nb.errors import ServerNotRunning
    from apollia_nb.runtime.remote import _alive, _read_json, find_server

    home = _home(args)
    if not home.server_json.exists():
        return None
    try:
        return find_server(home, HomeLocked("no server"))
    except ServerNotRunning:
        holder = _read_json(home.owner_lock_path) or {}
        pid = holder.get("pid")
        if isinstance(pid, int) and _alive(pid) and kernel_owner(home) is None:  # a kernel's: says which, and how
            raise
        return None
    except HomeLocked:  # not advertised: the command runs as an owner and says who holds it
        return None


@contextlib.contextmanager
def remote(args: argparse.Namespace) -> Iterator[Any]:
    """The served home's remote stores (``.journal``, ``.governance``), or None when no server owns it."""
    address = served(args)
    if address is None:
        yield None
        return
    from apollia_nb.runtime.remote import RemoteHome

    connection = RemoteHome(_home(args), address)
    try:
        yield connection
    finally:
        connection.close()


def refuse_served(args: argparse.Namespace, what: str) -> None:
    """Raise ``HOME_LOCKED`` when a server owns the home: ``what`` needs the home to itself."""
    address = served(args)
    if address is not None:
        raise HomeLocked(f"{what} needs the home {_home(args).path} to itself and `apollia-os serve` owns it "
                         f"({address.url}, process {address.pid}): stop the server, then run it again")


# --- the REST API ---------------------------------------------------------------------------------

def _with_api(fn: Callable[[argparse.Namespace, _Api], int]) -> Callable[[argparse.Namespace, Any], int]:
    @functools.wraps(fn)
    def run(args: argparse.Namespace, address: Any) -> int:
        api = _Api(address, timeout=WAIT_SECS + 30, home=_home(args))
        try:
            return fn(args, api)
        finally:
            api.close()

    return run


def _who(args: argparse.Namespace) -> str:
    from apollia_nb.cli.common import who

    return who(args)


@_with_api
def _agents_list(args: argparse.Namespace, api: _Api) -> int:
    from apollia_nb.cli.runtime import _agents_text

    agents = api("agents")
    emit(args, agents, _agents_text(agents))
    return 0


def absolute_workspace(text: str, manifest: Any, cwd: Path) -> tuple[str, str | None]:
    """The manifest text with a relative workspace root made absolute against ``cwd`` (as the CLI
    resolves it without a server), and a warning when that could not be done."""
    import json

    from apollia_nb.runtime.manifest import parse_manifest

    root = Path(manifest.workspace_root)
    if root.is_absolute():
        return text, None
    target = str((cwd / root).resolve())
    table = re.compile(r"^\s*\[workspace\]\s*(#.*)?$", re.M)
    if table.search(text) is None:
        candidate = text.rstrip("\n") + f"\n\n[workspace]\nroot = {json.dumps(target)}\n"
    else:
        candidate = re.sub(r"(^\s*\[workspace\][^\[]*?^\s*root\s*=\s*)(\"[^\"\n]*\"|'[^'\n]*')",
                           lambda m: m.group(1) + json.dumps(target), text, count=1, flags=re.M | re.S)
    try:
        if parse_manifest(candidate).workspace_root == target:
            return candidate, None
    except ApolliaError:
        pass
    return text, (f"the workspace root {manifest.workspace_root!r} is relative: the server resolves it "
                  "against its own working directory")


@_with_api
def _agents_register(args: argparse.Namespace, api: _Api) -> int:
    from apollia_nb.runtime.manifest import load_manifest

    manifest = load_manifest(args.file)  # errors name the key and line before the server is asked
    text, warning = absolute_workspace(args.file.read_text(encoding="utf-8"), manifest, Path.cwd())
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    data = api("register_agent", text, getattr(args, "keep_consents", None))
    warn = "".join(f"\nwarning: {w}" for w in data["warnings"])
    emit(args, data, f"registered {data['name']}: {data['state']}{warn}")
    return 0


@_with_api
def _agents_stop(args: argparse.Namespace, api: _Api) -> int:
    data = api("stop_agent", args.name)
    emit(args, data, f"{data['name']}: {data['state']}")
    return 0


def _settle(api: _Api, task_id: str) -> dict[str, Any]:
    """The task once it is finished or waiting on a person with nothing running."""
    while True:
        task = api("wait", task_id, "settled", WAIT_SECS)
        if task["status"] != "running":
            return task


def _open_cards(api: _Api, task_id: str) -> list[dict[str, Any]]:
    return [p for p in api("pending") if p.get("task_id") == task_id]


def _read_answer(prompt: str) -> str:
    """One line from the terminal; ``_NoAnswer`` at the end of input (never a refusal, nor a permission)."""
    from apollia_nb.cli.runtime import _NoAnswer

    print(prompt, end="", flush=True)
    line = sys.stdin.readline()
    if not line:
        raise _NoAnswer()
    return line


def _waiting_lines(api: _Api, task_id: str) -> list[str]:
    from apollia_nb.cli.runtime import waiting_line

    return [waiting_line(p) for p in _open_cards(api, task_id)]


@_with_api
def _run(args: argparse.Namespace, api: _Api) -> int:
    from apollia_nb.cli.runtime import _NoAnswer, _card_text, _task_line

    submitted = api("submit", args.agent, args.goal, not args.unattended, args.max_steps, (), args.approve_plan)
    for warning in submitted["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    task_id = submitted["id"]
    answered: set[str] = set()
    try:
        while True:
            task = _settle(api, task_id)
            if task["status"] != "waiting" or args.unattended:
                break
            if task["awaiting_plan_approval"]:
                print("plan:\n" + "\n".join(f"  {i + 1}. {s}" for i, s in enumerate(task["plan"])))
                reply = _read_answer("approve the plan? [y/N] ").strip().lower()
                if reply in ("y", "yes"):
                    api("approve_plan", task_id, None)
                else:
                    api("reject_plan", task_id, "rejected at the terminal")
                continue
            cards = [c for c in _open_cards(api, task_id) if c["id"] not in answered]
            if not cards:  # answered, its run not yet resumed on the server: ask again shortly
                time.sleep(POLL_SECS)
                continue
            for card in cards:
                print(_card_text(card))
                reply = _read_answer("answer: ").strip()
                while reply not in card["answers"]:
                    print(f"please answer one of: {', '.join(card['answers'])}")
                    reply = _read_answer("answer: ").strip()
                answered.add(card["id"])
                try:
                    api("decide", card["id"], reply, None, _who(args))
                except ApolliaError as exc:
                    if exc.code != "CONFLICT":  # answered elsewhere first: that answer stands
                        raise
    except (_NoAnswer, KeyboardInterrupt) as stop:
        # As without a server: no answer leaves the decision pending on the server, where the run waits.
        why = "interrupted" if isinstance(stop, KeyboardInterrupt) else "end of input"
        print()
        lines = [f"{why}: no answer given. " + _task_line(api("task", task_id))]
        waiting = _waiting_lines(api, task_id)
        if waiting:
            lines.append("the decision stays pending; the run resumes when it is answered:")
            lines += waiting
        print("\n".join(lines), file=sys.stderr)
        return 130 if why == "interrupted" else 1
    lines = [_task_line(task)]
    if task["result"]:
        lines.append(f"result: {task['result']}")
    if task["status"] == "waiting":
        lines += _waiting_lines(api, task_id)
    emit(args, task, "\n".join(lines))
    return 0 if task["status"] in ("completed", "waiting") else 1


@_with_api
def _pending_decide(args: argparse.Namespace, api: _Api) -> int:
    from apollia_nb.cli.runtime import _task_line

    decided = api("decide", args.id, args.answer, args.reason, _who(args), getattr(args, "values", None))
    lines = [f"{decided['id']}: {decided['answer']} by {decided['answered_by']}"]
    data: dict[str, Any] = {"decision": decided}
    task_id = decided.get("task_id")
    if task_id:
        try:
            data["task"] = _settle(api, task_id)
        except ApolliaError as exc:
            if exc.code != "UNKNOWN_TASK":  # a task of a kernel joined to the server: not the server's
                raise
        else:
            lines.append(_task_line(data["task"]))
    emit(args, data, "\n".join(lines))
    return 0


#: Commands that work through the REST API when a server owns the home, by the handler they replace.
_CLIENT: dict[str, Callable[[argparse.Namespace, Any], int]] = {
    "apollia_nb.cli.runtime._agents_list": _agents_list,
    "apollia_nb.cli.runtime._agents_register": _agents_register,
    "apollia_nb.cli.runtime._agents_stop": _agents_stop,
    "apollia_nb.cli.runtime._run": _run,
    "apollia_nb.cli.runtime._pending_decide": _pending_decide,
}


#: Commands that only read: on a home a kernel owns they say which kernel, and how to audit it.
_READ_ONLY = frozenset({
    "apollia_nb.cli.audit._verify", "apollia_nb.cli.audit._verifier_key", "apollia_nb.cli.audit._consistency",
    "apollia_nb.cli.audit._checkpoint", "apollia_nb.cli.audit._prove", "apollia_nb.cli.audit._export",
    "apollia_nb.cli.audit._replay", "apollia_nb.cli.governance._rules_list",
    "apollia_nb.cli.governance._consents_list", "apollia_nb.cli.runtime._pending_list",
    "apollia_nb.cli.runtime._agents_list", "apollia_nb.cli.runtime._runs_list",
})

_CONNECTION_FILE = re.compile(r"(?:^|\s)--?f(?:=|\s+)(\S+\.json)\b")


def kernel_owner(home: Any) -> dict[str, Any] | None:
    """``{"pid", "connection_file"}`` when the process that owns ``home`` (``owner.lock``) is a Jupyter
    kernel, else None. The connection file is None when its command line does not name one."""
    from apollia_nb.runtime.remote import _alive, _read_json

    holder = _read_json(home.owner_lock_path)
    if not holder or not isinstance(holder.get("pid"), int) or not _alive(holder["pid"]):
        return None
    command = str(holder.get("command", ""))
    found = _CONNECTION_FILE.search(command)
    if "kernel" not in command or ("ipykernel" not in command and found is None):
        return None
    return {"pid": holder["pid"], "connection_file": found.group(1) if found else None,
            "since": holder.get("since")}


def kernel_locked(home: Any, command: str) -> HomeLocked | None:
    """``HOME_LOCKED`` for a read-only command on a home a kernel owns: which kernel, and how to audit."""
    kernel = kernel_owner(home)
    if kernel is None:
        return None
    where = f", connection file {kernel['connection_file']}" if kernel["connection_file"] else ""
    return HomeLocked(
        f"`apollia-os {command}` cannot read the home {home.path}: a Jupyter kernel owns it (process "
        f"{kernel['pid']}{where}, since {kernel['since'] or '?'}), and its databases open in one process at a "
        "time. To audit it now, from that notebook: `%apollia verify` checks the journal, and "
        "`from apollia_nb.notebook import kernel_runtime; from apollia_nb.journal.export import export_journal; "
        "export_journal(kernel_runtime().rt.journal, 'bundle')` writes a bundle to audit here (`apollia-os audit "
        "verify --bundle bundle`). Or shut that kernel down and run the command again. To audit a home while "
        "kernels use it, start `apollia-os serve` for it before the kernels: they become its clients and "
        "every command here works through the server."
    )


def _read_only(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except HomeLocked as exc:
            action = getattr(args, f"{args.command}_command", None)
            better = kernel_locked(_home(args), f"{args.command} {action}" if action else args.command)
            if better is None:
                raise
            raise better from exc

    return run


def route(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The handler for the parsed command: its client form when a server owns the home."""
    handler = args.handler
    name = f"{getattr(handler, '__module__', '')}.{getattr(handler, '__name__', '')}"
    client = _CLIENT.get(name)
    address = served(args) if client is not None or name in _READ_ONLY else None
    if client is not None and address is not None:
        return functools.partial(client, address=address)
    if name in _READ_ONLY and address is None:
        return _read_only(handler)
    return handler
