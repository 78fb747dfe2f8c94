"""A write that lands where the process running the tools imports or runs code is asked every time.

``decide()`` compares a file tool's resolved names with the process's code places
(``Call.code_places``, worked out at the edge by ``runtime.paths.code_places``): a
standing consent or a run grant never allows it, and ``always`` is never offered."""

from __future__ import annotations

import json
import os
import sys

import pytest

from apollia_nb.errors import BadAnswer
from apollia_nb.governance.code_places import CodePlace, CodePlaces, code_place_reason
from apollia_nb.governance.decision import Call, GovernanceView, Rule, decide
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.paths import code_places, resolve_tool_path
from notebook_fixtures import ip  # noqa: F401 - the fixture
from runtime_helpers import call, manifest

PLACES = CodePlaces.of([
    ("/k", "import", "the working folder"),
    ("/k/lib", "import", "the sys.path entry"),
    ("/opt/py.zip", "import", "the sys.path entry"),
    ("/venv/lib/site-packages", "code", "the Python installation's module folder"),
    ("/home/me/.ipython", "code", "the IPython folder"),
    ("/home/me/.jupyter", "code", "a Jupyter configuration folder"),
    ("/home/me/.local/share/jupyter", "code", "a Jupyter data folder"),
    ("/venv/pyvenv.cfg", "file", "the virtual environment's configuration"),
    ("/home/me/.pythonrc", "file", "the PYTHONSTARTUP file"),
])

CONSENT = GovernanceView(consents={("clerk", "write")})


def write(*paths: str, family: str = "write", places: CodePlaces | None = PLACES, grants=frozenset()) -> Call:
    return Call(agent="clerk", tool="write_file", family=family, arguments={"path": paths[0], "content": "x"},
                paths=paths, code_places=places, run_grants=grants)


ASKED = [
    "/k/pandas.py", "/k/colorsys.py", "/k/pandas/__init__.py", "/k/pandas/core/frame.py",
    "/k/fast.cpython-311-x86_64-linux-gnu.so", "/k/fast.abi3.so", "/k/fast.pyd", "/k/old.pyc", "/k/gui.pyw",
    "/k/legacy.pyo", "/k/evil.pth", "/k/sitecustomize.py", "/k/usercustomize.py",
    "/k/__pycache__/colorsys.cpython-311.pyc", "/k/pkg/__pycache__/anything", "/k/__PYCACHE__/x",
    "/k/Pandas.PY", "/k/pandas.Py", "/k/pandas.py.", "/k/pandas.py ", "/k/pandas.py. . ",
    "/k/pandas\uff0e\uff50\uff59",  # fullwidth ".py": NFKC folds it
    "/k/evil-1.0.dist-info/entry_points.txt", "/k/evil.egg-info/entry_points.txt", "/k/evil.egg-link",
    "/k/lib/helper.py", "/opt/py.zip",
    "/venv/lib/site-packages/anything.txt", "/venv/lib/site-packages/pandas/__init__.py",
    "/home/me/.ipython/profile_default/startup/00-run.py", "/home/me/.ipython/profile_default/startup/x.ipy",
    "/home/me/.ipython/profile_default/ipython_config.py",
    "/home/me/.ipython/profile_x/ipython_kernel_config.py",
    "/home/me/.jupyter/jupyter_server_config.json", "/home/me/.jupyter/jupyter_notebook_config.py",
    "/home/me/.local/share/jupyter/kernels/python3/kernel.json",
    "/venv/pyvenv.cfg", "/home/me/.pythonrc",
    "//k/pandas.py",  # two leading slashes are one
]

ALLOWED = [
    "/k/summary.txt", "/k/notes/a.md", "/k/data.csv", "/k/pandas.pyi", "/k/pandas.py.txt", "/k/notes.pyx",
    "/k/pandas.\u0440y",  # a Cyrillic "р": another file, which Python never imports
    "/k/data.zip",  # a zip is imported only when the path names it
    "/elsewhere/pandas.py", "/venv/other.cfg", "/home/me/.pythonrc2", "/opt/py.zip.bak",
    "/home/me/notes.py",
]


@pytest.mark.parametrize("path", ASKED)
def test_a_write_where_code_is_imported_or_run_is_asked_once_or_refuse_despite_a_consent(path):
    d = decide(write("pandas.py", path), CONSENT)
    assert (d.outcome.value, d.line, [a.value for a in d.answers]) == ("ask", 5, ["once", "refuse"]), d.reason
    assert "asked every time" in d.reason and "where this process imports or runs code" in d.reason


@pytest.mark.parametrize("path", ALLOWED)
def test_other_writes_keep_their_consent(path):
    d = decide(write("x", path), CONSENT)
    assert (d.outcome.value, d.line) == ("allow", 5), d.reason


@pytest.mark.parametrize("path", ASKED[:8])
def test_a_run_grant_does_not_allow_it_either_and_without_either_always_is_not_offered(path):
    granted = decide(write("x", path, grants=frozenset({"write"})), GovernanceView())
    bare = decide(write("x", path), GovernanceView())
    for d in (granted, bare):
        assert (d.outcome.value, d.line, [a.value for a in d.answers]) == ("ask", 5, ["once", "refuse"])


def test_the_reason_names_what_is_written_and_the_place():
    reason = decide(write("x", "/k/lib/pkg/__init__.py"), CONSENT).reason
    assert reason == ("writes a Python module (pkg/__init__.py) where this process imports or runs code "
                      "(the sys.path entry /k/lib), which would run with the person's rights: asked every time")
    assert "(the working folder /k)" in decide(write("x", "/k/evil.pth"), CONSENT).reason
    assert ".pth file" in decide(write("x", "/k/evil.pth"), CONSENT).reason
    assert "the IPython folder /home/me/.ipython" in decide(
        write("x", "/home/me/.ipython/profile_default/startup/a.py"), CONSENT).reason


def test_any_of_the_names_of_the_file_counts():
    # The link's own name (what delete_file removes) or the file it resolves to.
    d = decide(write("notes.txt", "notes.txt", "/k/notes.txt", "/k/colorsys.py"), CONSENT)
    assert (d.outcome.value, d.line) == ("ask", 5)


def test_only_absolute_names_are_compared():
    assert decide(write("pandas.py", "pandas.py", "./pandas.py"), CONSENT).outcome.value == "allow"


def test_places_that_could_not_be_worked_out_ask_every_write_of_a_file_tool():
    d = decide(write("x", "/k/summary.txt", places=CodePlaces(unknown="FileNotFoundError: no cwd")), CONSENT)
    assert (d.outcome.value, d.line, [a.value for a in d.answers]) == ("ask", 5, ["once", "refuse"])
    assert "cannot tell where this process imports or runs code (FileNotFoundError: no cwd)" in d.reason


def test_without_places_nothing_is_compared_and_other_lines_come_first():
    assert decide(write("x", "/k/pandas.py", places=None), CONSENT).outcome.value == "allow"
    # Reading is line 3; a deny rule is line 2; an unreadable view refuses with line 0.
    assert decide(write("x", "/k/pandas.py", family="read"), GovernanceView()).line == 3
    denied = GovernanceView(rules=(Rule("write_file", prefix="/k/"),), consents={("clerk", "write")})
    assert (decide(write("x", "/k/pandas.py"), denied).outcome.value, decide(write("x", "/k/pandas.py"), denied).line) == ("refuse", 2)
    closed = GovernanceView(consents={("clerk", "write")}, readable=False)
    assert decide(write("x", "/k/pandas.py"), closed).line == 0


def test_the_values_are_checked():
    with pytest.raises(TypeError):
        Call(agent="a", tool="t", code_places=("/k",))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        CodePlace("relative/folder", "import", "x")
    with pytest.raises(ValueError):
        CodePlace("/k", "everything", "x")
    assert code_place_reason(["/k/a.py"], CodePlaces()) is None


# --- the edge: this process's places, worked out when they change --------------------------------


def names(workspace, path, home):
    return resolve_tool_path(workspace, path, home=home).names


def reason(workspace, path, home) -> str | None:
    return code_place_reason(names(workspace, path, home), code_places())


def test_the_working_folder_is_an_import_folder(home):
    cwd = os.getcwd()
    assert reason(cwd, "colorsys.py", home.path) is not None
    assert reason(cwd, "pkg/sub/__init__.py", home.path) is not None
    assert reason(cwd, "notes/../pandas.py", home.path) is not None
    assert reason(cwd, "summary.txt", home.path) is None


def test_a_later_sys_path_insert_counts_from_the_next_call(home, tmp_path, monkeypatch):
    workspace = tmp_path / "ws"
    (workspace / "lib").mkdir(parents=True)
    assert reason(workspace, "lib/helper.py", home.path) is None
    monkeypatch.syspath_prepend(str(workspace / "lib"))
    assert "the sys.path entry" in reason(workspace, "lib/helper.py", home.path)
    assert reason(workspace, "lib/notes.txt", home.path) is None
    monkeypatch.undo()  # gone from the path again: a plain file again
    monkeypatch.chdir(tmp_path / "work")
    assert reason(workspace, "lib/helper.py", home.path) is None


def test_a_relative_sys_path_entry_is_read_from_the_working_folder(home, tmp_path, monkeypatch):
    (tmp_path / "work" / "src").mkdir()
    monkeypatch.syspath_prepend("src")
    places = code_places()
    assert any(p.path == str(tmp_path / "work" / "src") and p.kind.value == "import" for p in places.places)


def test_symbolic_links_on_either_side(home, tmp_path, monkeypatch):
    workspace = tmp_path / "ws"
    (workspace / "code").mkdir(parents=True)
    (workspace / "alias").symlink_to("code")
    # A path through a link to a folder on the path ...
    monkeypatch.syspath_prepend(str(workspace / "code"))
    assert reason(workspace, "alias/x.py", home.path) is not None
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path / "work")
    # ... and a path entry written through the link.
    monkeypatch.syspath_prepend(str(workspace / "alias"))
    assert reason(workspace, "code/x.py", home.path) is not None
    # A module-named link to a plain file: its own name is what Python imports.
    (workspace / "notes.txt").write_text("x")
    (workspace / "alias" / "linked.py").symlink_to(workspace / "notes.txt")
    assert reason(workspace, "code/linked.py", home.path) is not None


def test_ipython_jupyter_startup_and_path_folders_from_the_environment(home, tmp_path, monkeypatch):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    monkeypatch.setenv("IPYTHONDIR", str(workspace / "ipy"))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(workspace / "jcfg"))
    monkeypatch.setenv("JUPYTER_PATH", str(workspace / "jdata"))
    monkeypatch.setenv("PYTHONSTARTUP", str(workspace / "startup.py"))
    monkeypatch.setenv("PATH", f"{workspace / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for path, words in [("ipy/profile_default/startup/00.py", "IPython folder"),
                        ("ipy/profile_default/ipython_kernel_config.py", "IPython folder"),
                        ("jcfg/jupyter_server_config.json", "Jupyter configuration folder"),
                        ("jdata/kernels/evil/kernel.json", "Jupyter data folder"),
                        ("startup.py", "PYTHONSTARTUP"),
                        ("bin/jupyter", "PATH folder")]:
        assert words in (reason(workspace, path, home.path) or ""), path
    assert reason(workspace, "notes/startup.txt", home.path) is None


def test_the_folder_of_an_imported_module_counts_though_it_is_not_on_sys_path(home, tmp_path, monkeypatch):
    workspace = tmp_path / "ws"
    (workspace / "mypkg").mkdir(parents=True)
    (workspace / "mypkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(workspace))
    import importlib

    importlib.import_module("mypkg")
    monkeypatch.undo()  # off the path, as an editable install's finder leaves it
    monkeypatch.setitem(sys.modules, "mypkg", sys.modules["mypkg"])
    monkeypatch.chdir(tmp_path / "work")
    assert "the folder the module 'mypkg' came from" in reason(workspace, "mypkg/core.py", home.path)


def test_a_working_folder_that_cannot_be_read_fails_closed(home, tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    places = code_places()
    assert places.unknown
    d = decide(write("x", "/anywhere/summary.txt", places=places), CONSENT)
    assert (d.outcome.value, d.line) == ("ask", 5)


# --- end to end: a real Runtime whose workspace is the working folder ------------------------


def decisions(rt, run_id):
    return [json.loads(e.payload) for e in rt.journal.entries(run_id=run_id) if e.kind == "decision"]


@pytest.mark.anyio
@pytest.mark.parametrize("target", ["colorsys.py", "pandas/__init__.py", "Colorsys.PY", "evil.pth",
                                    "__pycache__/colorsys.cpython-311.pyc", "notes/../colorsys.py",
                                    "fast.cpython-311-x86_64-linux-gnu.so"])
async def test_a_standing_write_consent_does_not_write_a_module_into_the_working_folder(home, target):
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.register_agent(manifest(actor=[
            {"tool_calls": [call("write_file", path=target, content="open('MARKER', 'w').close()\n")]},
            {"text": "done"}]))
        workspace = rt.agent("clerk").workspace
        assert os.path.realpath(workspace) == os.path.realpath(os.getcwd())
        handle = await rt.submit("clerk", "Write a helper")
        await handle.settled()
        assert handle.status == "waiting"
        [card] = handle.pending
        assert (card.tool, card.line, card.answers) == ("write_file", 5, ("once", "refuse"))
        assert "where this process imports or runs code" in card.reason
        written = workspace / os.path.normpath(target)
        assert not written.exists()
        with pytest.raises(BadAnswer):
            rt.answer(card.id, "always", by="test")
        card.answer("refuse")
        await handle.settled()
        assert not written.exists()
        assert rt.governance.view().consents == {("clerk", "write")}  # nothing new was consented


@pytest.mark.anyio
async def test_answered_once_it_is_written_and_plain_files_keep_the_consent(home):
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.register_agent(manifest(actor=[
            {"tool_calls": [call("write_file", path="summary.txt", content="ok")]},
            {"tool_calls": [call("write_file", path="helper.py", content="X = 1\n")]},
            {"tool_calls": [call("delete_file", path="helper.py")]},
            {"text": "done"}]))
        workspace = rt.agent("clerk").workspace
        handle = await rt.submit("clerk", "Write")
        await handle.settled()
        assert (workspace / "summary.txt").read_text() == "ok"  # the consent allowed it at once
        [card] = handle.pending
        assert card.tool == "write_file" and not (workspace / "helper.py").exists()
        card.answer("once")
        await handle.settled()
        assert (workspace / "helper.py").read_text() == "X = 1\n"
        [card] = handle.pending  # a delete there is asked too: it can un-shadow another module
        assert (card.tool, card.line) == ("delete_file", 5)
        card.answer("once")
        task = await handle
        assert task.status == "completed", task.error
        assert not (workspace / "helper.py").exists()
        assert [(d["outcome"], d["line"]) for d in decisions(rt, task.run_id)] == [
            ("allow", 5), ("ask", 5), ("ask", 5)]


@pytest.mark.anyio
async def test_a_workspace_registered_from_its_working_folder_stays_an_import_folder_elsewhere(
        home, tmp_path, monkeypatch):
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.register_agent(manifest(actor=[
            {"tool_calls": [call("write_file", path="colorsys.py", content="X = 1\n")]},
            {"text": "done"}]))  # [workspace] root = ".": the notebook's folder
        workspace = rt.agent("clerk").workspace
        (tmp_path / "other").mkdir()
        monkeypatch.chdir(tmp_path / "other")  # the tools now run in a process working elsewhere
        handle = await rt.submit("clerk", "Write")
        await handle.settled()
        [card] = handle.pending
        assert "(the folder the agent was registered from " in card.reason
        assert not (workspace / "colorsys.py").exists()


@pytest.mark.anyio
async def test_a_module_in_a_workspace_away_from_the_import_path_keeps_the_consent(home, tmp_path):
    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.register_agent(manifest(actor=[
            {"tool_calls": [call("write_file", path="script.py", content="print(1)\n")]},
            {"text": "done"}], workspace=str(tmp_path / "elsewhere")))
        task = await (await rt.submit("clerk", "Write"))
        assert task.status == "completed", task.error
        assert (tmp_path / "elsewhere" / "script.py").exists()


def test_in_a_kernel_the_next_import_does_not_run_what_an_agent_wrote(ip, tmp_path):  # noqa: F811
    ip.run_line_magic("apollia", "consents grant clerk write")
    ip.run_cell_magic("apollia", "agent", manifest(actor=[
        {"tool_calls": [call("write_file", path="colorsys.py", content="open('MARKER', 'w').close()\n")]},
        {"tool_calls": [call("write_file", path="summary.txt", content="ok")]},
        {"text": "done"}]))
    task = ip.run_cell_magic("apollia", "task clerk", "Tidy up").join(10, settled=True)
    [card] = task.pending
    assert (card.line, list(card.answers)) == (5, ["once", "refuse"])
    assert not os.path.exists("colorsys.py")
    card.answer("refuse")
    task.join(10)
    assert task.status == "failed"
    sys.modules.pop("colorsys", None)
    ip.run_cell("import colorsys")
    assert not os.path.exists("MARKER")
    assert not sys.modules["colorsys"].__file__.startswith(os.getcwd())


def test_the_example_in_the_docs_runs_as_written():
    import pathlib
    import re

    text = (pathlib.Path(__file__).parent.parent / "docs" / "governance.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "CodePlaces" in b]
    scope: dict = {"Call": Call, "GovernanceView": GovernanceView, "decide": decide}
    exec(block.replace("decide(call, GovernanceView", "d = decide(call, GovernanceView"), scope)
    d = scope["d"]
    assert (d.outcome.value, d.line, tuple(a.value for a in d.answers)) == ("ask", 5, ("once", "refuse"))
    assert "the working folder /home/me/analysis" in d.reason
    docs = (pathlib.Path(__file__).parent.parent / "docs" / "agents-and-tools.md").read_text(encoding="utf-8")
    assert d.reason in " ".join(docs.split())  # the card's words, as the guide quotes them


@pytest.mark.anyio
async def test_apollia_os_run_asks_for_a_module_in_its_own_working_folder(home, tmp_path):
    import subprocess

    async with Runtime(home) as rt:
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.register_agent(manifest(actor=[
            {"tool_calls": [call("write_file", path="colorsys.py", content="X = 1\n")]}, {"text": "done"}]))
    work = os.getcwd()
    env = {**os.environ, "APOLLIA_HOME": str(home.path)}
    done = subprocess.run([sys.executable, "-m", "apollia_nb", "run", "clerk", "Write", "--unattended"],
                          capture_output=True, text=True, timeout=120, cwd=work, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "once|refuse" in done.stdout and "always" not in done.stdout
    assert not os.path.exists(os.path.join(work, "colorsys.py"))
    listed = subprocess.run([sys.executable, "-m", "apollia_nb", "pending", "list", "--json"],
                            capture_output=True, text=True, timeout=120, cwd=work, env=env)
    [pending] = json.loads(listed.stdout)
    assert (pending["tool"], pending["answers"]) == ("write_file", ["once", "refuse"])


@pytest.mark.anyio
@pytest.mark.parametrize("swapped_to", ["colorsys.py", "pkg/__init__.py", ".git/config"])
async def test_a_link_swapped_while_the_card_waits_does_not_carry_the_answer_to_a_code_place(home, swapped_to):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(actor=[
            {"tool_calls": [call("write_file", path="notes.txt", content="X = 1\n")]}, {"text": "done"}]))
        workspace = rt.agent("clerk").workspace
        handle = await rt.submit("clerk", "Write notes")
        await handle.settled()
        [card] = handle.pending
        assert (card.line, card.answers) == (6, ("once", "always", "refuse"))  # no consent: a plain file
        target = workspace / swapped_to
        target.parent.mkdir(parents=True, exist_ok=True)
        (workspace / "notes.txt").symlink_to(target)  # now names a file where code runs
        card.answer("once")
        task = await handle
        assert task.status == "failed" and task.error["code"] == "REFUSED"
        assert not target.exists()
        results = [json.loads(e.payload) for e in rt.journal.entries(run_id=task.run_id) if e.kind == "tool_result"]
        assert [r["status"] for r in results] == ["refused"]
