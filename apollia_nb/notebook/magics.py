"""``%apollia`` / ``%%apollia``: the notebook's one magic and its subcommands.

Cell subcommands (the cell is the input)::

    %%apollia agent                         manifest TOML → registers the agent, shows it
    %%apollia task AGENT [--max-steps N] [--unattended | --watched] [--approve-plan]
                                            goal → a task handle at once (live run view)
    %%apollia chat SESSION_OR_AGENT [--plan]
                                            message → the exchange at once (streaming chat view)
    %%apollia batch AGENT --over VAR [--concurrency N]
                                            goal template → a batch over VAR's items (live progress)
    %%apollia sql                           SQL over the journal's views → a DataFrame (read-only)

Line subcommands: ``status`` (the default), ``agents``, ``stop NAME``,
``pending``, ``rules``, ``consents``, ``devmode [on|off]``, ``verify``,
``replay RUN``, ``serve``, ``help``.

A magic waits only for short operations on the runtime (registering, submitting,
reading); runs go on in the background, so no cell ever waits for a click.
Errors show as one line ``CODE: message`` (the cell fails, without a
traceback). Settings are traits of ``ApolliaMagics`` (``%config ApolliaMagics``).
"""

from __future__ import annotations

import html
import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from traitlets import Bool, Unicode, observe

from apollia_nb.errors import ApolliaError, BadInput, UnknownRun, UnknownSession
from apollia_nb.notebook.arguments import MagicExit as _Exit
from apollia_nb.notebook.arguments import magic_parser as _parser
from apollia_nb.notebook.arguments import magic_words as _words

if TYPE_CHECKING:  # pragma: no cover
    from apollia_nb.notebook.bridge import KernelRuntime

__all__ = ["ApolliaMagics", "ApolliaMagicError", "SERVE_MESSAGE", "HELP"]

SERVE_MESSAGE = (
    "A kernel does not serve the REST API: run `apollia-os serve --home {home}` in a terminal. A kernel "
    "that finds it running when it opens the home joins it (one journal, one set of consents and pending "
    "decisions). This kernel owns the home {home}; while it does, `apollia-os serve` cannot open it: "
    "start the server first, then restart this kernel."
)
SERVE_JOINED = (
    "This kernel is a client of the server `apollia-os serve` runs on the home {home}: its REST API is "
    "that server's (see server.json in the home)."
)

HELP = """\
%apollia [status]                 the status line: home, journal head, developer mode, policy
%apollia agents                   the registered agents and their states (runs: kernel, or server when
                                  this kernel joined `apollia-os serve`)
%apollia stop NAME                stop an agent (drains its in-flight work first)
%apollia pending                  every waiting decision of the home, answerable
%apollia runs                     every run in the journal: agent, kind, status, start, entries
%apollia rules | consents         fine rules | standing consents
%apollia consents grant|revoke AGENT FAMILY [--for 8h]
                                  grant (for 30m, 8h, 7d or until revoked) or revoke a standing
                                  consent (as the kernel's user)
%apollia devmode [on|off]         show or set developer mode
%apollia verify                   verify the journal (chain, hashes, signatures, checkpoints)
%apollia replay RUN               replay a run offline from the journal
%apollia serve                    how this kernel and `apollia-os serve` share the home
%%apollia agent                   cell: a manifest (TOML); registers the agent
%%apollia task AGENT [--max-steps N] [--unattended | --watched] [--approve-plan]
                                  cell: the goal; returns the task handle at once (a server's agent
                                  runs on the server)
%%apollia chat SESSION_OR_AGENT [--plan]
                                  cell: the message; opens a session for an agent or continues a session
%%apollia batch AGENT --over VAR [--concurrency N] [--max-steps N] [--key FIELD]
                                  cell: the goal template; runs the agent over the items of VAR, each
                                  unattended; returns the batch with a live progress widget
%%apollia sql [--timeout SECONDS] cell: one read-only SQL query over journal, decisions, tool_calls, runs"""


class ApolliaMagicError(Exception):
    """A failed ``%apollia``: IPython shows it as the one line ``CODE: message``, not a traceback."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_error(cls, exc: ApolliaError) -> "ApolliaMagicError":
        return cls(exc.code, exc.message)

    def _render_traceback_(self) -> list[str]:
        return [f"{self.code}: {self.message}"]


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@magics_class
class ApolliaMagics(Magics):
    """The ``apollia`` magic. Settings: ``%config ApolliaMagics.<trait> = value``."""

    home = Unicode(
        "", help="The home to open; empty: $APOLLIA_HOME, else ~/.apollia. Changing it reopens the runtime."
    ).tag(config=True)
    unattended_default = Bool(
        False, help="Tasks run unattended unless `--watched` is given (then the first ask suspends them)."
    ).tag(config=True)
    show_widgets = Bool(
        True, help="Display live widgets; when off, results show as HTML and text only."
    ).tag(config=True)
    user = Unicode(
        "", help="The name answers and changes are journaled under; empty: the login name."
    ).tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        self.runtime: KernelRuntime | None = None  # before the config loads: its observers read it
        self.open_error: ApolliaError | None = None  # why the home last failed to open
        super().__init__(shell=shell, **kwargs)
        self._commands: dict[str, Callable[[list[str], str | None], Any]] = {
            "agent": self._agent, "task": self._task, "chat": self._chat, "sql": self._sql,
            "status": self._status, "agents": self._agents, "stop": self._stop, "pending": self._pending,
            "rules": self._rules, "consents": self._consents, "devmode": self._devmode, "verify": self._verify,
            "replay": self._replay, "serve": self._serve, "help": self._help, "runs": self._runs,
        }
        self._commands["batch"] = self._batch

    def _batch(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.batch import batch_magic  # lazy: it and its handles cost ~0.1 s at %load_ext

        return batch_magic(self, args, cell)

    # ------------------------------------------------------------------ the home
    def open_home(self, *, announce: bool = True) -> "KernelRuntime":
        """Open the home for this kernel (once) and print the status line."""
        if self.runtime is not None and not self.runtime.closed:
            return self.runtime
        from apollia_nb.notebook.bridge import KernelRuntime
        from apollia_nb.notebook.render import status_line

        from apollia_nb.notebook.deferred import widgets_on_first_use

        try:
            shell = self.shell
            with widgets_on_first_use():  # DuckDB's first connection in a kernel would import them
                self.runtime = KernelRuntime(self.home or None, ui_loop=_running_loop(), user=self.user or None,
                                             show_widgets=self.show_widgets,
                                             namespace=lambda: shell.user_ns)  # type: ignore[union-attr]  # a magic has its shell
        except ApolliaError as exc:
            self.open_error = exc  # what the side panel says instead of "no home is open"
            from apollia_nb.errors import HomeLocked

            if isinstance(exc, HomeLocked):  # in a notebook: which kernel holds it, and how to free it here
                from apollia_nb.home import Home
                from apollia_nb.notebook.panel import kernel_error

                try:
                    exc = kernel_error(exc, Home.at(self.home or None, create=False))
                except ApolliaError:
                    pass  # the home cannot even be named: the reason as it came
            raise ApolliaMagicError.from_error(exc) from None
        self.open_error = None
        if announce:
            print(status_line(self.runtime.status()))
        return self.runtime

    def close_home(self) -> None:
        if self.runtime is not None:
            runtime, self.runtime = self.runtime, None
            runtime.close()

    @observe("home")
    def _home_changed(self, change: Any) -> None:
        if self.runtime is not None:
            self.close_home()
            self.open_home()

    @observe("show_widgets")
    def _show_widgets_changed(self, change: Any) -> None:
        if self.runtime is not None:
            self.runtime.show_widgets = bool(change.new)

    @observe("user")
    def _user_changed(self, change: Any) -> None:
        if self.runtime is not None:
            from apollia_nb.notebook.bridge import login_name

            self.runtime.user = change.new or login_name()

    # ------------------------------------------------------------------ the magic
    @line_cell_magic
    def apollia(self, line: str = "", cell: str | None = None) -> Any:
        """Governed agents in this kernel. `%apollia help` lists the subcommands."""
        words = _words(line)
        command = words[0] if words else "status"
        handler = self._commands.get(command)
        try:
            if handler is None:
                raise BadInput(f"unknown subcommand {command!r}; `%apollia help` lists them")
            return handler(words[1:], cell)
        except _Exit:
            return None
        except ApolliaError as exc:
            raise ApolliaMagicError.from_error(exc) from None

    def _rt(self) -> "KernelRuntime":
        return self.open_home(announce=False)

    @staticmethod
    def _cell(command: str, cell: str | None) -> str:
        if cell is None:
            raise BadInput(f"`%%apollia {command}` is a cell magic: the cell below the line is its input")
        return cell

    @staticmethod
    def _no_cell(command: str, cell: str | None) -> None:
        if cell is not None and cell.strip():
            raise BadInput(f"`%apollia {command}` takes no cell")

    # ------------------------------------------------------------------ cell subcommands
    def _agent(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import AgentInfo
        from apollia_nb.runtime.manifest import parse_manifest

        parser = _parser("%%apollia agent")
        keep = parser.add_mutually_exclusive_group()
        keep.add_argument("--keep-consents", dest="keep_consents", action="store_true", default=None,
                          help="declared again with other tools, workspace or model: keep its standing consents")
        keep.add_argument("--drop-consents", dest="keep_consents", action="store_false",
                          help="declared again with other tools, workspace or model: revoke its standing consents")
        ns = parser.parse_args(args)
        manifest = parse_manifest(self._cell("agent", cell), source="<cell>")
        runtime = self._rt()
        rt = runtime.rt

        async def declare() -> dict[str, Any]:
            # Declaring again (a re-run cell, or an agent restored from the home) replaces it when idle,
            # as every registration does; the notebook_* built-ins come from the runtime.
            agent = await rt.register_agent(manifest, keep_consents=ns.keep_consents)
            return agent.to_dict()

        return AgentInfo(runtime.block(declare))

    def _task(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import NotebookTask

        parser = _parser("%%apollia task")
        parser.add_argument("agent")
        parser.add_argument("--max-steps", type=int, default=None)
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--unattended", action="store_true", help="nothing prompts: the first ask suspends the run")
        mode.add_argument("--watched", action="store_true", help="cards ask here (overrides unattended_default)")
        parser.add_argument("--approve-plan", action="store_true", help="wait for plan approval before executing")
        ns = parser.parse_args(args)
        goal = self._cell("task", cell).strip()
        unattended = ns.unattended or (self.unattended_default and not ns.watched)
        runtime = self._rt()
        task = runtime.home.submit(ns.agent, goal, watched=not unattended, max_steps=ns.max_steps,
                                   approve_plan=ns.approve_plan)
        return NotebookTask(runtime, task)

    def _chat(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import NotebookExchange, NotebookSession

        parser = _parser("%%apollia chat")
        parser.add_argument("target", metavar="SESSION_OR_AGENT")
        parser.add_argument("--plan", action="store_true", help="plan-mode (when opening a session)")
        ns = parser.parse_args(args)
        message = self._cell("chat", cell).strip()
        runtime = self._rt()
        sessions = runtime.rt.sessions

        def open_and_send() -> tuple[Any, Any]:
            session = None
            try:
                session = sessions.get(ns.target)
            except UnknownSession:
                pass
            if session is not None:
                if ns.plan:
                    raise BadInput("--plan applies when a session is opened, not to an existing session")
            else:
                session = sessions.open(ns.target, plan_mode=ns.plan)
            return session, session.send(message)

        session, exchange = runtime.call(open_and_send)
        return NotebookExchange(runtime, NotebookSession(runtime, session), exchange)

    def _sql(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import SqlRows
        from apollia_nb.notebook.sql import DEFAULT_TIMEOUT, run_query

        parser = _parser("%%apollia sql")
        parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                            help=f"stop the query after this many seconds (default {DEFAULT_TIMEOUT:g})")
        ns = parser.parse_args(args)
        query = self._cell("sql", cell)
        runtime = self._rt()
        result = run_query(runtime.rt.journal, query, timeout=ns.timeout)
        count = len(result.rows)
        print(f"{count} row{'s' if count != 1 else ''}")
        if result.frame is not None:
            return result.frame
        return SqlRows(result.columns, result.rows)

    # ------------------------------------------------------------------ line subcommands
    def _status(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import Report
        from apollia_nb.notebook.render import status_html, status_line

        self._no_cell("status", cell)
        _parser("%apollia status").parse_args(args)
        status = self._rt().status()
        counts = f"{status['agents']} agent(s), {status['pending']} pending decision(s)"
        return Report(f"{status_line(status)}\n{counts}", f"{status_html(status)}<div>{counts}</div>", status)

    def _agents(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import Report

        self._no_cell("agents", cell)
        _parser("%apollia agents").parse_args(args)
        agents = self._rt().home.agents()  # this kernel's, and a served home's server's
        columns = ("name", "runs", "state", "model", "max_steps", "inflight", "tools", "warnings")
        rows = [(a["name"], a["runs"], a["state"], a["model"], a["max_steps"], a["inflight"], ", ".join(a["tools"]),
                 "; ".join(a["warnings"])) for a in agents]
        return Report.table(columns, rows, f"{len(agents)} agent(s)", agents)

    def _stop(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import AgentInfo

        self._no_cell("stop", cell)
        parser = _parser("%apollia stop")
        parser.add_argument("name")
        ns = parser.parse_args(args)
        runtime = self._rt()
        rt = runtime.rt

        async def stop() -> dict[str, Any]:
            return (await rt.stop_agent(ns.name)).to_dict()

        return AgentInfo(runtime.block(stop))

    def _pending(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import PendingInbox

        self._no_cell("pending", cell)
        _parser("%apollia pending").parse_args(args)
        return PendingInbox(self._rt())

    def _runs(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.journal.views import list_runs
        from apollia_nb.notebook.handles import Report

        self._no_cell("runs", cell)
        _parser("%apollia runs").parse_args(args)
        runtime = self._rt()
        runs = runtime.call(lambda: list_runs(runtime.rt.journal))
        columns = ("run_id", "agent", "kind", "status", "started_at", "entries")
        return Report.table(columns, [tuple(r[c] for c in columns) for r in runs], f"{len(runs)} run(s)", runs)

    def _rules(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import Report

        self._no_cell("rules", cell)
        _parser("%apollia rules").parse_args(args)
        runtime = self._rt()
        rules = runtime.call(lambda: [r.to_dict() for r in runtime.rt.governance.rules()])
        columns = ("id", "tool", "prefix", "effect", "agent", "created_by", "created_at")
        return Report.table(columns, [tuple(r[c] for c in columns) for r in rules], f"{len(rules)} rule(s)", rules)

    def _consents(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import Report

        self._no_cell("consents", cell)
        parser = _parser("%apollia consents")
        parser.add_argument("action", nargs="?", choices=("grant", "revoke"))
        parser.add_argument("agent", nargs="?")
        parser.add_argument("family", nargs="?")
        parser.add_argument("--for", dest="lasting", default=None, metavar="LIFETIME",
                            help="grant: how long it lasts (30m, 8h, 7d, or 'until revoked', the default)")
        ns = parser.parse_args(args)
        runtime = self._rt()
        if ns.action is None and ns.lasting is not None:
            raise BadInput("--for goes with %apollia consents grant AGENT FAMILY")
        if ns.action is not None:
            if ns.agent is None or ns.family is None:
                raise BadInput(f"usage: %apollia consents {ns.action} AGENT FAMILY")
            if ns.action == "revoke" and ns.lasting is not None:
                raise BadInput("--for goes with grant: a revocation takes effect at once")
            governance = runtime.rt.governance
            if ns.action == "grant":
                until = _consent_end(runtime.rt, ns.lasting)  # BAD_DURATION before anything changes
                record = runtime.call(lambda: governance.grant_consent(ns.agent, ns.family, by=runtime.user,
                                                                       until=until).to_dict())
            else:
                record = runtime.call(lambda: governance.revoke_consent(ns.agent, ns.family,
                                                                        by=runtime.user).to_dict())
            done = "granted" if ns.action == "grant" else "revoked"
            words = f"{done}: {record['agent']} may {'' if ns.action == 'grant' else 'no longer '}" \
                    f"{record['family']} without asking"
            if ns.action == "grant":
                words += f" until {record['until']}" if record.get("until") else " until revoked"
            return Report(words, f"<div class='apollia-consent'>{html.escape(words)}</div>", record)
        consents = runtime.call(lambda: [c.to_dict() for c in runtime.rt.governance.consents()])
        columns = ("agent", "family", "granted_by", "granted_at", "card", "until")
        return Report.table(columns, [tuple(c[k] for k in columns) for c in consents],
                            f"{len(consents)} standing consent(s)", consents)

    def _devmode(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import Report

        self._no_cell("devmode", cell)
        parser = _parser("%apollia devmode")
        parser.add_argument("state", nargs="?", choices=("on", "off"))
        ns = parser.parse_args(args)
        runtime = self._rt()
        governance = runtime.rt.governance
        if ns.state is None:
            state = runtime.call(lambda: governance.developer_mode_state().to_dict())
        else:
            state = runtime.call(lambda: governance.set_developer_mode(ns.state == "on", by=runtime.user).to_dict())
        words = f"developer mode {'on' if state['enabled'] else 'off'}"
        if state.get("changed_by"):
            words += f" (changed by {state['changed_by']} at {state['changed_at']})"
        return Report(words, f"<div class='apollia-devmode'>{words}</div>", state)

    def _verify(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import JournalReport

        self._no_cell("verify", cell)
        _parser("%apollia verify").parse_args(args)
        return JournalReport(self._rt())

    def _replay(self, args: list[str], cell: str | None) -> Any:
        from apollia_nb.notebook.handles import Report
        from apollia_nb.notebook.render import replay_html, replay_text

        self._no_cell("replay", cell)
        parser = _parser("%apollia replay")
        parser.add_argument("run")
        ns = parser.parse_args(args)
        runtime = self._rt()
        rt = runtime.rt

        def replay() -> dict[str, Any]:
            if not rt.journal.entries(run_id=ns.run, limit=1):
                raise UnknownRun(f"the journal has no entries for run {ns.run!r}")
            return rt.replay(ns.run).to_dict()

        result = runtime.call(replay)
        return Report(replay_text(result), replay_html(result), result)

    def _serve(self, args: list[str], cell: str | None) -> None:
        self._no_cell("serve", cell)
        _parser("%apollia serve").parse_args(args)
        opened = self.runtime is not None and not self.runtime.closed
        home = self.runtime.rt.home.path if opened else (self.home or "$APOLLIA_HOME")  # type: ignore[union-attr]  # opened: a runtime
        joined = opened and getattr(self.runtime.rt, "mode", None) == "client"  # type: ignore[union-attr]  # as above
        print((SERVE_JOINED if joined else SERVE_MESSAGE).format(home=home))

    def _help(self, args: list[str], cell: str | None) -> None:
        print(HELP)


def _consent_end(rt: Any, lasting: str | None) -> Any:
    """When a consent granted ``--for lasting`` ends, by the runtime's clock: None until revoked;
    ``BAD_DURATION`` for a lifetime that does not read (never taken as "forever")."""
    import datetime as _dt
    import time

    from apollia_nb.governance.store import parse_lifetime

    lifetime = parse_lifetime(lasting)
    if lifetime is None:
        return None
    now = getattr(rt, "clock", time.time)()
    return _dt.datetime.fromtimestamp(now, _dt.timezone.utc) + lifetime
