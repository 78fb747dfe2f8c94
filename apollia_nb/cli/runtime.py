"""``apollia-os`` commands that drive the runtime: run, agents, pending, demo."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from apollia_nb.cli.common import emit

__all__ = ["register"]


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "run", parents=[common], help="run a task with a registered agent",
        description="Run a task and print its status and run id. Without --unattended, each call that needs "
                    "a person asks at the terminal (the answers on offer). Ctrl+C or the end of input at the "
                    "prompt is no answer: the task goes on unattended and its decision stays pending (answer it "
                    "later with `apollia-os pending decide ID ANSWER`); the exit status is then 130 (Ctrl+C) "
                    "or 1.")
    p.add_argument("agent")
    p.add_argument("goal")
    p.add_argument("--unattended", action="store_true",
                   help="do not prompt: stop at the first call that would ask and list it in `pending`")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--approve-plan", action="store_true", help="show the plan and ask before running it")
    p.set_defaults(handler=_run)

    agents = sub.add_parser("agents", help="register, list and stop agents")
    asub = agents.add_subparsers(dest="agents_command", metavar="ACTION", required=True)
    a = asub.add_parser("list", parents=[common], help="registered agents and their states")
    a.set_defaults(handler=_agents_list)
    a = asub.add_parser("register", parents=[common], help="register an agent from a TOML manifest (in place of an idle one of that name)")
    a.add_argument("file", type=Path)
    keep = a.add_mutually_exclusive_group()
    keep.add_argument("--keep-consents", dest="keep_consents", action="store_true", default=None,
                      help="re-registering with changed tools, workspace or model: keep its standing consents")
    keep.add_argument("--drop-consents", dest="keep_consents", action="store_false",
                      help="re-registering with changed tools, workspace or model: revoke its standing consents")
    a.set_defaults(handler=_agents_register)
    a = asub.add_parser("stop", parents=[common], help="stop an agent (drains its runs)")
    a.add_argument("name")
    a.set_defaults(handler=_agents_stop)

    pending = sub.add_parser("pending", help="decisions waiting for a person")
    psub = pending.add_subparsers(dest="pending_command", metavar="ACTION", required=True)
    a = psub.add_parser("list", parents=[common], help="waiting decisions, oldest first, each with its task and goal")
    a.set_defaults(handler=_pending_list)
    a = psub.add_parser("decide", parents=[common], help="answer a waiting decision; its run resumes")
    a.add_argument("id")
    a.add_argument("answer", help="once, always or refuse (only those on offer)")
    a.add_argument("--for", dest="lasting", default=None, metavar="LIFETIME",
                   help="with always: how long the standing consent lasts (30m, 8h, 7d; default: until revoked)")
    a.add_argument("--reason", default=None)
    a.add_argument("--by", default=None, help="who answers (default: the user name)")
    a.add_argument("--values", default=None, type=_json_object, metavar="JSON",
                   help="a server's question answered once: the form's values, a JSON object")
    a.add_argument("--digest", default=None, metavar="DIGEST",
                   help="the decision's digest as `pending list` showed it: the answer approves that call alone "
                        "(another is refused STALE_APPROVAL)")
    expiry = a.add_mutually_exclusive_group()
    expiry.add_argument("--expires-in", dest="expires_in", default=None, type=float, metavar="SECONDS",
                        help="the approval's lifetime: the call is refused (and the refusal journaled) when it "
                             "would run later")
    expiry.add_argument("--expires-at", dest="expires_at", default=None, metavar="WHEN",
                        help="the approval's end, ISO 8601 with an offset")
    a.set_defaults(handler=_pending_decide)

    runs = sub.add_parser("runs", help="the runs in the journal")
    rsub = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=True)
    a = rsub.add_parser("list", parents=[common], help="every run: agent, kind, status, start and entry count")
    a.set_defaults(handler=_runs_list)

    n = sub.add_parser("notebooks", help="copy the example notebooks (and the decision explorer) into a folder",
                       description="Copy the example notebooks, the decision explorer they use and their README "
                                   "into DIR (created if missing); nothing in DIR is overwritten. Then open them "
                                   "with `jupyter lab DIR`. Each notebook makes its own fresh home.")
    n.add_argument("dir", type=Path, metavar="DIR")
    n.add_argument("--json", action="store_true", help="print data as JSON")
    n.set_defaults(handler=_notebooks)

    d = sub.add_parser("demo", help="a headless tour on a fresh home")
    d.add_argument("--home", help="an empty or new folder for the demo's home (default: a fresh temporary "
                                  "folder; never $APOLLIA_HOME)")
    d.add_argument("--json", action="store_true", help="print data as JSON")
    d.set_defaults(handler=_demo)


def _who(args: argparse.Namespace) -> str:
    from apollia_nb.cli.common import who

    return who(args)


def _task_line(task: dict[str, Any]) -> str:
    err = task["error"]
    tail = f" — {err['code']}: {err['message']}" if err else ""
    budget = task["budget"]
    return (f"task {task['id']} ({task['agent']}): {task['status']}, steps {budget['used']}/{budget['ceiling']}, "
            f"run {task['run_id']}{tail}")


def _card_text(card: dict[str, Any]) -> str:
    import json

    family = card["family"] or "unclassified"
    return (f"{card['agent']} wants to call {card['tool']} ({family}) with {json.dumps(card['arguments'])}\n"
            f"  line {card.get('line')}: {card.get('reason')}\n  answers: {' / '.join(card['answers'])}")


class _NoAnswer(Exception):
    """The terminal gave no answer: the end of input at a prompt."""


def _ask(prompt: str) -> str:
    """One line from the terminal; ``_NoAnswer`` at the end of input (never a refusal, nor a permission).
    Ctrl+C stops the wait at once (``KeyboardInterrupt``)."""
    print(prompt, end="", flush=True)
    _until_a_line()
    line = sys.stdin.readline()
    if not line:
        raise _NoAnswer()
    return line


def _until_a_line() -> None:
    """Wait until the terminal has a line for ``readline``, or Ctrl+C (``KeyboardInterrupt``).

    The kernel may hand SIGINT to any thread of the process (the runtime's loop, a database's); its
    handler then only notes it and writes to the wakeup fd, and a ``read`` blocked in this thread would
    never return. Waiting on the terminal and on that fd, the wait ends either way, and the interrupt is
    raised here. Only for a terminal reading whole lines (each ``read`` returns one line, so nothing
    is left buffered after ``readline``); other input is read as it is."""
    import os
    import select
    import signal
    import threading

    try:
        import termios
    except ImportError:  # no terminal of this kind (Windows): readline as it is
        return
    try:
        fd = sys.stdin.fileno()
        if (not os.isatty(fd) or threading.current_thread() is not threading.main_thread()
                or not termios.tcgetattr(fd)[3] & termios.ICANON):
            return
    except (AttributeError, OSError, ValueError, termios.error):
        return
    wake_r, wake_w = os.pipe()
    try:
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        earlier = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    except (OSError, ValueError):
        os.close(wake_r)
        os.close(wake_w)
        return
    try:
        while fd not in select.select([fd, wake_r], [], [])[0]:
            try:
                os.read(wake_r, 512)  # a signal: its handler runs here (Ctrl+C: KeyboardInterrupt)
            except BlockingIOError:
                pass
    finally:
        signal.set_wakeup_fd(earlier)
        os.close(wake_r)
        os.close(wake_w)


def _run(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home
    from apollia_nb.errors import ApolliaError

    with open_home(args) as home, home.runtime() as rt:
        submitted = rt.submit(args.agent, args.goal, watched=not args.unattended, max_steps=args.max_steps,
                              approve_plan=args.approve_plan)
        for warning in submitted["warnings"]:
            print(f"warning: {warning}", file=sys.stderr)
        task_id = submitted["id"]
        answered: set[str] = set()
        try:
            while True:
                task = rt.settle(task_id)
                if task["status"] != "waiting" or args.unattended:
                    break
                if task["awaiting_plan_approval"]:
                    print("plan:\n" + "\n".join(f"  {i + 1}. {s}" for i, s in enumerate(task["plan"])))
                    reply = _ask("approve the plan? [y/N] ").strip().lower()
                    if reply in ("y", "yes"):
                        rt.approve_plan(task_id)
                    else:
                        rt.reject_plan(task_id, "rejected at the terminal")
                    continue
                cards = [c for c in rt.pending() if c.get("task_id") == task_id and c["id"] not in answered]
                if not cards:  # answered, its run not resumed yet: ask again shortly
                    time.sleep(POLL_SECS)
                    continue
                for card in cards:
                    print(_card_text(card))
                    reply = _ask("answer: ").strip()
                    while reply not in card["answers"]:
                        print(f"please answer one of: {', '.join(card['answers'])}")
                        reply = _ask("answer: ").strip()
                    answered.add(card["id"])
                    try:
                        rt.decide(card["id"], reply, reason=None, by=_who(args))
                    except ApolliaError as exc:
                        if exc.code != "CONFLICT":  # answered elsewhere first: that answer stands
                            raise
        except (_NoAnswer, KeyboardInterrupt) as stop:
            return _left_waiting(rt, task_id, "interrupted" if isinstance(stop, KeyboardInterrupt) else "end of input")
        lines = [_task_line(task)]
        if task["result"]:
            lines.append(f"result: {task['result']}")
        if task["status"] == "waiting":
            lines += _waiting_lines(rt, task_id)
        emit(args, task, "\n".join(lines))
        return 0 if task["status"] in ("completed", "waiting") else 1


#: How long an attended run waits before asking again for a task whose answered decision has not resumed yet.
POLL_SECS = 0.2


def _waiting_lines(rt: Any, task_id: str) -> list[str]:
    return [waiting_line(p) for p in rt.pending() if p.get("task_id") == task_id]


def waiting_line(p: dict[str, Any]) -> str:
    """One waiting decision and the command that answers it (a server's question: with its values)."""
    from apollia_nb.federation.mcp_requests import is_elicitation

    values = " --values '{...}'" if is_elicitation(p["tool"]) and p["arguments"].get("mode") != "url" else ""
    return (f"waiting: {p['id']} — {p['tool']} ({p['family'] or 'unclassified'}); "
            f"answer with `apollia-os pending decide {p['id']} {'|'.join(p['answers'])}{values}`")


def _left_waiting(rt: Any, task_id: str, why: str) -> int:
    """No answer came from the terminal: the task goes on unattended, its decision left pending."""
    print()
    task = rt.leave(task_id)
    lines = [f"{why}: no answer given. " + _task_line(task)]
    waiting = _waiting_lines(rt, task_id)
    if waiting:
        lines.append("the decision stays pending; the run resumes when it is answered:")
        lines += waiting
    elif task["status"] not in ("completed", "failed", "cancelled") and not rt.outlives_command:
        lines.append("the task is cancelled as this command ends")
    print("\n".join(lines), file=sys.stderr)
    return 130 if why == "interrupted" else 1


def _agents_list(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home

    with open_home(args, reading=True) as home, home.runtime() as rt:
        agents = rt.agents()
    emit(args, agents, _agents_text(agents))
    return 0


def _agents_text(agents: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"{a['name']:<20} {a['state']:<12} {a['model']:<10} {', '.join(a['warnings'])}" for a in agents
    ) or "no agents registered"


def _agents_register(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home
    from apollia_nb.runtime.manifest import load_manifest

    manifest = load_manifest(args.file)  # errors name the key and line before the home is touched
    with open_home(args) as home, home.runtime() as rt:
        data = rt.register_agent(args.file, manifest, args.keep_consents)
    warn = "".join(f"\nwarning: {w}" for w in data["warnings"])
    emit(args, data, f"registered {data['name']}: {data['state']}{warn}")
    return 0


def _agents_stop(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home

    with open_home(args) as home, home.runtime() as rt:
        data = rt.stop_agent(args.name)
    emit(args, data, f"{data['name']}: {data['state']}")
    return 0


def _runs_list(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home

    with open_home(args, reading=True) as home, home.runtime() as rt:
        runs = rt.runs()
    emit(args, runs, _runs_text(runs))
    return 0


def _runs_text(runs: list[dict[str, Any]]) -> str:
    """One line a run under a header naming the columns (``--json`` gives the rows as they are)."""
    if not runs:
        return "no runs yet"
    row = "{:<18} {:<16} {:<6} {:<10} {:<24}  {}"
    return "\n".join([row.format("RUN", "AGENT", "KIND", "STATUS", "STARTED", "ENTRIES"), *(
        row.format(r["run_id"], r["agent"] or "-", r["kind"] or "-", r["status"], r["started_at"] or "-",
                   f"{r['entries']} entries") for r in runs)])


#: How much of a task's goal a listing shows (its first line, cut here).
GOAL_SHOWN = 60


def _short(text: str, limit: int = GOAL_SHOWN) -> str:
    """The first line of ``text``, ended with "…" when something was left out."""
    lines = text.strip().splitlines()
    first = lines[0] if lines else ""
    if len(first) > limit or len(lines) > 1:
        return first[: limit - 1].rstrip() + "…"
    return first


def _pending_list(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home

    with open_home(args, reading=True) as home, home.runtime() as rt:
        items = rt.pending()
        goals = rt.goals({p["task_id"] for p in items if p.get("task_id")})
    text = "\n".join(_pending_text(p, goals) for p in items) or "nothing is waiting"
    emit(args, items, text)
    return 0


def _pending_text(p: dict[str, Any], goals: dict[str, str]) -> str:
    """A waiting decision: its id and age, whose it is (the task and its goal, else its run), then the card."""
    task_id = p.get("task_id")
    if task_id:
        goal = goals.get(task_id)
        whose = f"task {task_id}" + (f': "{_short(goal)}"' if goal else "")
    else:
        whose = f"run {p['run_id']}"
    card = _card_text(p).replace("\n", "\n  ")
    bound = f"\n  digest: {p['digest']}" if p.get("digest") else ""  # what `pending decide --digest` names
    return f"{p['id']}  {p['created_at']}  {whose}\n  {card}{bound}"


def _json_object(text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object of the form's fields")
    return value


def _pending_decide(args: argparse.Namespace) -> int:
    from apollia_nb.cli.backend import open_home
    from apollia_nb.errors import ApolliaError

    with open_home(args) as home, home.runtime() as rt:
        terms = {k: v for k, v in (("digest", args.digest), ("expires_in", args.expires_in),
                                   ("expires_at", args.expires_at)) if v is not None}
        decided = rt.decide(args.id, args.answer, reason=args.reason, by=_who(args), values=args.values,
                            lasting=args.lasting, terms=terms or None)
        lines = [f"{decided['id']}: {decided['answer']} by {decided['answered_by']}"
                 + (f", the approval ends {decided['expires_at']}" if decided.get("expires_at") else "")]
        data: dict[str, Any] = {"decision": decided}
        task_id = decided.get("task_id")
        if task_id:
            try:
                data["task"] = rt.settle(task_id)
            except ApolliaError as exc:
                if exc.code != "UNKNOWN_TASK":  # a task of a kernel joined to the server: not the home's own
                    raise
            else:
                lines.append(_task_line(data["task"]))
        emit(args, data, "\n".join(lines))
    return 0


def _shipped_notebooks() -> Path:
    """The example notebooks: inside the installed package (a wheel), else the clone's ``notebooks/``."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "notebooks", package.parent / "notebooks"):
        if any(candidate.glob("*.ipynb")):
            return candidate
    from apollia_nb.errors import NotFound

    raise NotFound(f"no example notebooks next to {package}: this installation does not include them")


def _notebooks(args: argparse.Namespace) -> int:
    import shutil

    from apollia_nb.errors import Conflict

    source = _shipped_notebooks()
    files = sorted([*source.glob("*.ipynb"), *source.glob("*.py"), *source.glob("README.md")])
    target: Path = args.dir
    taken = [f.name for f in files if (target / f.name).exists()]
    if taken:
        raise Conflict(f"{target} already holds {', '.join(taken)}; nothing was copied (choose an empty folder)")
    target.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, target / f.name)
    names = [f.name for f in files]
    emit(args, {"dir": str(target), "files": names},
         f"copied {len(names)} files into {target}: {', '.join(names)}\nopen them with: jupyter lab {target}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from apollia_nb.cli.demo import run_demo

    return run_demo(args.home, json_output=args.json)
