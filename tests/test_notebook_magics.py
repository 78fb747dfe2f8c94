"""``%load_ext apollia_nb`` and every ``%apollia`` subcommand, against a real IPython shell."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest

from apollia_nb.notebook.handles import AgentInfo, NotebookExchange, NotebookTask, PendingInbox, Report
from apollia_nb.notebook.magics import ApolliaMagicError, ApolliaMagics
from runtime_helpers import call, manifest

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WRITE = [{"tool_calls": [call("write_file", path="a.txt", content="hello")]}, {"text": "Wrote a.txt."}]


@pytest.fixture
def ip(home):
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()  # the module's name is rebound to the shell's once started
    yield shell
    from apollia_nb.notebook.extension import unload_ipython_extension

    unload_ipython_extension(shell)
    shell.extension_manager.loaded.discard("apollia_nb")
    shell.config.pop("ApolliaMagics", None)  # `%config` settings outlive the magics in the shell's config


def load(ip, capsys=None):
    ip.run_line_magic("load_ext", "apollia_nb")
    return capsys.readouterr().out if capsys is not None else None


def magics(ip) -> ApolliaMagics:
    return ip.magics_manager.registry["ApolliaMagics"]


def fails(code: str, fn, *args):
    with pytest.raises(ApolliaMagicError) as info:
        fn(*args)
    assert info.value.code == code, info.value
    assert info.value._render_traceback_() == [f"{code}: {info.value.message}"]
    return info.value


# --- loading --------------------------------------------------------------------------


def test_load_registers_the_magic_and_prints_one_status_line(ip, home, capsys):
    out = load(ip, capsys)
    assert out.count("\n") == 1
    assert out.startswith(f"apollia: home {home.path} · journal ")
    assert "developer mode off" in out and "policy none" in out
    assert "apollia" in ip.magics_manager.magics["line"] and "apollia" in ip.magics_manager.magics["cell"]


def test_the_status_line_names_the_journal_head_and_the_developer_mode(ip, capsys):
    load(ip, capsys)
    ip.run_line_magic("apollia", "devmode on")
    status = ip.run_line_magic("apollia", "status")
    rt = magics(ip).runtime.rt
    seq, digest = rt.journal.head()
    assert seq > 0
    assert f"journal #{seq} {digest.hex()[:12]}" in status.text
    assert "developer mode on" in status.text
    assert status.data["journal_seq"] == seq


def test_on_a_fresh_home_the_status_line_names_every_entry_the_boot_committed(ip, home, capsys):
    """The notebooks' first cell: load and set the user in one cell; the line shows the boot's entries."""
    ip.run_cell('%load_ext apollia_nb\n%config ApolliaMagics.user = "ann"')
    out = capsys.readouterr().out
    runtime = magics(ip).runtime
    seq, digest = runtime.rt.journal.head()
    assert runtime.rt.journal.sql("SELECT kind FROM journal WHERE seq = 1") == [("home_file_created",)]
    assert out == f"apollia: home {home.path} · journal #{seq} {digest.hex()[:12]} · developer mode off · policy none\n"
    assert runtime.user == "ann" and runtime.rt.journal.head() == (seq, digest)  # `%config` reopened nothing


def test_a_refused_policy_shows_in_the_status_line(ip, home, capsys):
    home.policy_path.write_text("[refuse]\nfamilies = ['send']\n")  # deposited, but not signed
    out = load(ip, capsys)
    assert "policy refused (" in out


def test_a_damaged_home_is_one_clear_line_at_load(ip, home, capsys):
    load(ip, capsys)
    ip.run_line_magic("apollia", "devmode on")  # the home now has its files, recorded in the journal
    magics(ip).close_home()
    home.runtime_db.unlink()
    with pytest.raises(ApolliaMagicError) as info:
        magics(ip).open_home()
    assert info.value._render_traceback_() == [f"HOME_FILE_MISSING: {info.value.message}"]
    assert "runtime.db" in info.value.message and "home repair --new-runtime-db" in info.value.message
    assert not home.runtime_db.exists()


def test_a_governance_db_deleted_under_the_kernel_shows_in_the_status_line(ip, home, capsys):
    load(ip, capsys)
    ip.run_line_magic("apollia", "devmode on")
    home.governance_db.unlink()
    status = ip.run_line_magic("apollia", "status")
    assert "governance fail closed (governance.db is missing" in status.text
    assert "home repair --new-governance-db" in status.text
    assert status.data["governance"] == "fail closed"


def test_loading_twice_keeps_the_open_home(ip, capsys):
    load(ip, capsys)
    first = magics(ip).runtime
    ip.run_line_magic("load_ext", "apollia_nb")
    assert magics(ip).runtime is first


def test_a_home_owned_by_another_process_is_one_clear_line(ip, home, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from apollia_nb.home import Home, OwnerLock
            lock = OwnerLock(Home.at({str(home.path)!r})).acquire()
            print("held", flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        error = fails("HOME_LOCKED", ip.run_line_magic, "load_ext", "apollia_nb")
        assert f"process {holder.pid}" in error.message
        ip.run_cell("%load_ext apollia_nb")  # as a cell would: one line, no traceback
        shown = capsys.readouterr()
        text = shown.out + shown.err
        assert "HOME_LOCKED: the home" in text and "Traceback" not in text
        # What to do in a notebook: shut the other kernel down, or give this kernel a home of its own.
        assert "Shut Down Kernel" in error.message and "%config ApolliaMagics.home" in error.message
        fails("HOME_LOCKED", ip.run_line_magic, "apollia", "status")
    finally:
        holder.stdin.close()
        holder.wait(10)
    status = ip.run_line_magic("apollia", "status")  # the holder is gone: the next use opens the home
    assert str(home.path) in status.text


def test_loading_imports_no_widgets_no_pandas(tmp_path):
    code = textwrap.dedent(f"""
        import os, sys
        os.environ["APOLLIA_HOME"] = {str(tmp_path / "home")!r}
        import apollia_nb
        assert "duckdb" not in sys.modules and "ipywidgets" not in sys.modules
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "apollia_nb")
        print(sorted(m for m in ("ipywidgets", "pandas", "httpx", "mcp") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_loading_in_a_kernel_runs_no_widget_code_until_first_use(tmp_path):
    # A shell configured as a kernel's (IPKernelApp) is where DuckDB's first connection imports
    # ipywidgets for its progress bar: the module is found, and runs only when something reads it.
    code = textwrap.dedent(f"""
        import os, sys
        os.environ["APOLLIA_HOME"] = {str(tmp_path / "home")!r}
        from traitlets.config import Config
        from IPython.core.interactiveshell import InteractiveShell
        config = Config()
        config.IPKernelApp.connection_file = "kernel.json"
        shell = InteractiveShell.instance(config=config)
        shell.run_line_magic("load_ext", "apollia_nb")
        import duckdb
        assert duckdb.__jupyter__
        print("widget code ran:", "ipywidgets.widgets" in sys.modules)
        user = duckdb.connect()  # the user's own DuckDB keeps its notebook progress bar
        print("progress bar:", user.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0])
        import ipywidgets
        slider = ipywidgets.IntSlider(value=3)
        print("first use:", type(slider).__name__, slider.value, "ipywidgets.widgets" in sys.modules)
        shell.run_line_magic("unload_ext", "apollia_nb")
        print("finders left:", [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "_OnFirstUse"])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[1:] == [
        "widget code ran: False", "progress bar: True", "first use: IntSlider 3 True", "finders left: []"]


# --- %%apollia agent ------------------------------------------------------------------


def test_agent_registers_and_shows_the_agent(ip, capsys):
    load(ip, capsys)
    agent = ip.run_cell_magic("apollia", "agent", manifest("clerk"))
    assert isinstance(agent, AgentInfo)
    assert agent.state == "active"
    assert {"notebook_get_variable", "notebook_list_variables", "notebook_set_variable"} <= set(agent.data["tools"])
    assert "Agent clerk: active" in repr(agent)
    bundle = agent._repr_mimebundle_()
    assert "clerk" in bundle["text/html"] and "text/plain" in bundle


def test_declaring_an_idle_agent_again_replaces_it(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest("clerk", max_steps=5))
    again = ip.run_cell_magic("apollia", "agent", manifest("clerk", max_steps=7))
    assert again.state == "active" and again.data["max_steps"] == 7


def test_declaring_an_agent_with_work_in_flight_is_a_conflict(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    task = ip.run_cell_magic("apollia", "task clerk", "write")
    task.join(10, settled=True)
    fails("CONFLICT", ip.run_cell_magic, "apollia", "agent", manifest())
    task.pending[0].answer("once")
    assert task.join(10).status == "completed"


def test_a_bad_manifest_is_one_line_with_its_code(ip, capsys):
    load(ip, capsys)
    fails("MANIFEST_INVALID", ip.run_cell_magic, "apollia", "agent", 'name = "clerk"\nflavour = "x"\n')


def test_a_workspace_around_the_home_is_refused_with_its_code(ip, home, capsys, monkeypatch):
    load(ip, capsys)
    monkeypatch.chdir(home.path.parent)  # root "." would then contain the home
    error = fails("WORKSPACE_OVERLAPS_HOME", ip.run_cell_magic, "apollia", "agent", manifest())
    assert "[workspace] root" in error.message
    assert magics(ip).runtime.call(lambda: magics(ip).runtime.rt.agents()) == []


# --- %%apollia task -------------------------------------------------------------------


def test_task_returns_a_handle_at_once_answered_from_code(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    task = ip.run_cell_magic("apollia", "task clerk", "Write a.txt\n")
    assert isinstance(task, NotebookTask)
    assert task.goal == "Write a.txt"
    # The cell returned although the run needs a person: the card waits, the magic did not.
    task.join(10, settled=True)
    assert task.status == "waiting"
    [card] = task.pending
    assert (card.tool, card.family, card.answers) == ("write_file", "write", ("once", "always", "refuse"))
    card.answer("once")
    assert task.join(10).status == "completed"
    assert task.result == "Wrote a.txt."
    assert (magics(ip).runtime.rt.agent("clerk").workspace / "a.txt").read_text() == "hello"
    assert task.decisions()[0]["answer"] == "once"
    assert task.decisions()[0]["answered_by"] == magics(ip).runtime.user


def test_a_task_handle_is_awaitable_from_another_event_loop(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest())
    task = ip.run_cell_magic("apollia", "task clerk", "say done")

    async def main():
        return await task

    assert asyncio.run(main()) is task
    assert task.status == "completed"


def test_unattended_task_suspends_and_is_listed_pending(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    task = ip.run_cell_magic("apollia", "task clerk --unattended", "write")
    task.join(10, settled=True)
    assert task.status == "waiting" and task.to_dict()["status"] == "waiting"
    inbox = ip.run_line_magic("apollia", "pending")
    assert isinstance(inbox, PendingInbox) and len(inbox) == 1
    assert inbox[0].task_id == task.id
    ip.run_cell("inbox = %apollia pending\nfor card in inbox:\n    card.answer('once')")
    assert task.join(10).status == "completed"
    assert len(ip.run_line_magic("apollia", "pending")) == 0


def test_unattended_default_and_watched_override(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest())
    ip.run_line_magic("config", "ApolliaMagics.unattended_default = True")
    rt = magics(ip).runtime.rt
    unattended = ip.run_cell_magic("apollia", "task clerk", "a")
    watched = ip.run_cell_magic("apollia", "task clerk --watched", "b")
    assert rt.task(unattended.id).record["watched"] is False
    assert rt.task(watched.id).record["watched"] is True
    fails("BAD_INPUT", ip.run_cell_magic, "apollia", "task clerk --watched --unattended", "c")
    unattended.join(10), watched.join(10)


def test_max_steps_is_the_ceiling(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest(actor=[{"text": "one"}]))
    task = ip.run_cell_magic("apollia", "task clerk --max-steps 1", "work")
    task.join(10)
    assert task.status == "failed" and task.error["code"] == "BUDGET_EXCEEDED"
    assert task.budget == {"used": 1, "ceiling": 1}


def test_approve_plan_waits_for_approval(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest(planner=[{"steps": ["one", "two"]}]))
    task = ip.run_cell_magic("apollia", "task clerk --approve-plan", "work")
    task.join(10, settled=True)
    assert task.awaiting_plan_approval
    task.approve_plan(["only this"])
    task.join(10)
    assert task.status == "completed" and [s["description"] for s in task.steps] == ["only this"]


@pytest.mark.parametrize("line, code", [
    ("task", "BAD_INPUT"),
    ("task clerk --max-steps many", "BAD_INPUT"),
    ("task clerk --max-steps 0", "BAD_INPUT"),
    ("task nobody", "UNKNOWN_AGENT"),
    ("task clerk --frobnicate", "BAD_INPUT"),
])
def test_task_refusals_are_one_line(ip, capsys, line, code):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest())
    fails(code, ip.run_cell_magic, "apollia", line, "goal")


def test_an_empty_goal_is_refused(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest())
    fails("BAD_INPUT", ip.run_cell_magic, "apollia", "task clerk", "   \n")


def test_task_is_a_cell_magic(ip, capsys):
    load(ip, capsys)
    error = fails("BAD_INPUT", ip.run_line_magic, "apollia", "task clerk")
    assert "cell magic" in error.message


def test_a_task_displays_its_widget_and_both_fallbacks(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest())
    task = ip.run_cell_magic("apollia", "task clerk", "say done").join(10)
    bundle = task._repr_mimebundle_()
    assert WIDGET_MIME in bundle
    assert bundle["text/plain"].startswith(f"Task {task.id} (clerk): completed")
    assert "completed" in bundle["text/html"] and "<" in bundle["text/html"]
    ip.run_line_magic("config", "ApolliaMagics.show_widgets = False")
    bundle = task._repr_mimebundle_()
    assert WIDGET_MIME not in bundle and {"text/plain", "text/html"} <= set(bundle)


# --- %%apollia chat -------------------------------------------------------------------


def test_chat_opens_a_session_for_an_agent_and_continues_it_by_id(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest(actor=[{"text": "Hello there."}, {"text": "Still here."}]))
    first = ip.run_cell_magic("apollia", "chat clerk", "hi")
    assert isinstance(first, NotebookExchange)
    assert first.join(10).reply == "Hello there."
    assert len([e for e in first.events if e["type"] == "text"]) > 1  # streamed
    second = ip.run_cell_magic("apollia", f"chat {first.session.id}", "still there?")
    assert second.join(10).reply == "Still here."
    assert second.session.id == first.session.id
    assert [m["role"] for m in first.session.history] == ["user", "assistant", "user", "assistant"]
    bundle = second._repr_mimebundle_()
    assert WIDGET_MIME in bundle and "Still here." in bundle["text/plain"] and "Still here." in bundle["text/html"]


def test_chat_cards_are_answerable_from_code(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    exchange = ip.run_cell_magic("apollia", "chat clerk", "write a")
    exchange.join(10, settled=True)
    [card] = exchange.pending
    assert card.session_id == exchange.session.id
    card.answer("once")
    assert exchange.join(10).reply == "Wrote a.txt."


def test_chat_plan_mode(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest(planner=[{"steps": ["look", "write"]}], actor=[{"text": "ok"}]))
    exchange = ip.run_cell_magic("apollia", "chat clerk --plan", "tidy the notes")
    exchange.join(10)
    assert exchange.session.pending_plan == ["look", "write"]
    after = exchange.session.approve_plan()
    assert after.join(10).reply == "ok"
    fails("BAD_INPUT", ip.run_cell_magic, "apollia", f"chat {exchange.session.id} --plan", "again")


def test_chat_with_nobody_is_unknown_agent(ip, capsys):
    load(ip, capsys)
    fails("UNKNOWN_AGENT", ip.run_cell_magic, "apollia", "chat nobody", "hi")


# --- line subcommands ------------------------------------------------------------------


def test_agents_and_stop(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest("clerk"))
    ip.run_cell_magic("apollia", "agent", manifest("scribe"))
    agents = ip.run_line_magic("apollia", "agents")
    assert [a["name"] for a in agents.data] == ["clerk", "scribe"]
    assert "clerk" in agents.text and "(2 rows)" in agents.text and "2 rows" in agents.html
    stopped = ip.run_line_magic("apollia", "stop scribe")
    assert stopped.state == "stopped"
    fails("AGENT_UNAVAILABLE", ip.run_cell_magic, "apollia", "task scribe", "work")
    fails("UNKNOWN_AGENT", ip.run_line_magic, "apollia", "stop nobody")
    fails("BAD_INPUT", ip.run_line_magic, "apollia", "stop")


def test_rules_consents_and_devmode(ip, capsys):
    load(ip, capsys)
    rt = magics(ip).runtime.rt
    assert ip.run_line_magic("apollia", "rules").data == []
    magics(ip).runtime.call(rt.governance.add_rule, "bash_executor", "deny", prefix="rm", agent="*", by="test")
    rules = ip.run_line_magic("apollia", "rules")
    assert [(r["tool"], r["prefix"], r["effect"]) for r in rules.data] == [("bash_executor", "rm", "deny")]
    ip.run_cell_magic("apollia", "agent", manifest(actor=WRITE))
    task = ip.run_cell_magic("apollia", "task clerk", "write").join(10, settled=True)
    task.pending[0].answer("always")
    task.join(10)
    consents = ip.run_line_magic("apollia", "consents")
    assert [(c["agent"], c["family"]) for c in consents.data] == [("clerk", "write")]
    assert ip.run_line_magic("apollia", "devmode").data["enabled"] is False
    on = ip.run_line_magic("apollia", "devmode on")
    assert on.data["enabled"] is True and on.text.startswith("developer mode on")
    assert rt.governance.developer_mode() is True
    assert ip.run_line_magic("apollia", "devmode off").data["enabled"] is False
    fails("BAD_INPUT", ip.run_line_magic, "apollia", "devmode maybe")


def test_verify_and_replay(ip, capsys):
    load(ip, capsys)
    ip.run_cell_magic("apollia", "agent", manifest())
    task = ip.run_cell_magic("apollia", "task clerk", "say done").join(10)
    journal = ip.run_line_magic("apollia", "verify")
    assert journal.ok and journal.report["entries"] > 0
    assert "verified:" in journal._text()
    bundle = journal._repr_mimebundle_()
    assert WIDGET_MIME in bundle and "verified" in bundle["text/html"]
    replay = ip.run_line_magic("apollia", f"replay {task.run_id}")
    assert replay.data["verdict"] == "identical" and "identical" in replay.text
    fails("UNKNOWN_RUN", ip.run_line_magic, "apollia", "replay run-nothing")


def test_serve_says_what_is_available(ip, capsys):
    load(ip, capsys)
    assert ip.run_line_magic("apollia", "serve") is None
    out = capsys.readouterr().out
    assert "run `apollia-os serve --home" in out and "joins it" in out and "arrives" not in out


def test_help_and_unknown_subcommands(ip, capsys):
    load(ip, capsys)
    ip.run_line_magic("apollia", "help")
    assert "%%apollia task AGENT" in capsys.readouterr().out
    fails("BAD_INPUT", ip.run_line_magic, "apollia", "dance")
    fails("BAD_INPUT", ip.run_cell_magic, "apollia", "status", "a cell")
    assert isinstance(ip.run_line_magic("apollia", ""), Report)


# --- settings --------------------------------------------------------------------------


def test_home_set_before_loading_is_the_home_opened(ip, tmp_path, capsys):
    ip.run_line_magic("config", f"ApolliaMagics.home = {str(tmp_path / 'chosen')!r}")
    assert f"apollia: home {tmp_path / 'chosen'} " in load(ip, capsys)


def test_kernel_runtime_is_the_open_home(ip, capsys):
    from apollia_nb.errors import Conflict
    from apollia_nb.notebook import kernel_runtime

    with pytest.raises(Conflict):
        kernel_runtime(ip)
    load(ip, capsys)
    kr = kernel_runtime(ip)
    assert kr is magics(ip).runtime
    assert kr.call(lambda: kr.rt.opened) is True


def test_config_lists_and_sets_the_traits(ip, tmp_path, capsys):
    load(ip, capsys)
    ip.run_line_magic("config", "ApolliaMagics")
    listed = capsys.readouterr().out
    for trait in ("home", "unattended_default", "show_widgets", "user"):
        assert f"ApolliaMagics.{trait}" in listed
    ip.run_line_magic("config", "ApolliaMagics.user = 'auditor'")
    assert magics(ip).runtime.user == "auditor"
    other = tmp_path / "other-home"
    ip.run_line_magic("config", f"ApolliaMagics.home = {str(other)!r}")
    assert f"apollia: home {other}" in capsys.readouterr().out
    assert magics(ip).runtime.rt.home.path == other


# --- in-kernel tools --------------------------------------------------------------------


def test_agents_read_and_write_notebook_variables_under_governance(ip, capsys):
    pandas = pytest.importorskip("pandas")
    load(ip, capsys)
    ip.user_ns["sales"] = pandas.DataFrame({"region": ["north", "south"] * 500, "amount": range(1000)})
    actor = [
        {"tool_calls": [call("notebook_list_variables"), {"name": "notebook_get_variable", "arguments": {"name": "sales"}}]},
        {"tool_calls": [{"name": "notebook_set_variable", "arguments": {"name": "summary", "value": {"rows": 1000}}}]},
        {"text": "Summarised."},
    ]
    ip.run_cell_magic("apollia", "agent", manifest(actor=actor))
    task = ip.run_cell_magic("apollia", "task clerk", "summarise sales").join(10, settled=True)
    [card] = task.pending  # reading ran without asking; writing asks
    assert (card.tool, card.family) == ("notebook_set_variable", "write")
    assert "summary" not in ip.user_ns
    card.answer("once")
    assert task.join(10).status == "completed"
    assert ip.user_ns["summary"] == {"rows": 1000}
    rt = magics(ip).runtime.rt
    results = [json.loads(e.payload) for e in rt.journal.entries(run_id=task.run_id, kinds=["tool_result"])]
    got = next(r["output"] for r in results if r["tool"] == "notebook_get_variable")
    assert got["name"] == "sales" and "1000" in json.dumps(got)  # summarised: shape, not 1000 rows
    assert len(json.dumps(got)) < 20_000
    listed = next(r["output"] for r in results if r["tool"] == "notebook_list_variables")
    assert "sales" in [v["name"] for v in listed["variables"]]


def test_a_manifest_listing_tools_gets_only_the_notebook_tools_it_names(ip, capsys):
    load(ip, capsys)
    agent = ip.run_cell_magic("apollia", "agent", manifest(required=["read_file", "notebook_get_variable"]))
    assert set(agent.data["tools"]) == {"read_file", "notebook_get_variable"}


def test_a_chat_plan_whose_step_asks_does_not_block_the_cell(ip, home):
    """Approving a plan returns the exchange at once; its card is answered from code afterwards."""
    from runtime_helpers import call as tool_call, manifest as make_manifest

    ip.run_line_magic("load_ext", "apollia_nb")
    ip.run_cell_magic("apollia", "agent", make_manifest(
        "tidy", planner=[{"steps": ["write the file"]}],
        actor=[{"tool_calls": [tool_call("write_file", path="p.txt", content="x")]}, {"text": "written"}]))
    exchange = ip.run_cell_magic("apollia", "chat tidy --plan", "please write p.txt")
    exchange.join(30)
    session = ip.user_ns.get("_apollia_session") or exchange.session
    run = session.approve_plan()          # must return while the card waits
    import time

    deadline = time.monotonic() + 30
    while not run.pending and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run.pending, "the card should be waiting"
    run.pending[0].answer("once")
    run.join(30)
    assert run.reply == "written"
