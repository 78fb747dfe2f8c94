"""The example notebooks run offline and reproduce their saved outputs (nbval), and are saved executed.

nbval runs every notebook in ``notebooks/`` top to bottom in a fresh kernel of this
interpreter and compares each cell's outputs with the saved ones, after the
sanitisers of ``notebooks/nbval-sanitize.cfg`` (times, ids, hashes, temporary
paths). It runs as a subprocess so its kernels, its collection and its options stay
apart from this suite's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SANITIZE = NOTEBOOKS / "nbval-sanitize.cfg"
EXPECTED = ["01-tour", "02-governance-six-lines", "03-orchestrated-task", "04-chat-plan-mode",
            "05-audit-with-sql", "06-replay", "07-federation", "08-batch"]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
IGNORE_TAG = "nbval-ignore-output"
# Live views are displayed when a run starts and change as it runs; only they may skip comparison.
LIVE_VIEW_CELL = re.compile(r"^%%apollia (task|chat|batch) ")
# Code cells between the fresh home and `%load_ext`: they prepare what the home's apollia.toml points at.
PREPARING_CELLS = {"07-federation": 3}


def load(name: str) -> dict:
    return json.loads((NOTEBOOKS / f"{name}.ipynb").read_text(encoding="utf-8"))


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def joined(value: str | list[str]) -> str:
    """A notebook's multiline string: saved as one string or as a list of lines."""
    return "".join(value) if isinstance(value, list) else value


def source(cell: dict) -> str:
    return joined(cell["source"])


def test_the_notebooks_are_there():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_a_notebook_is_saved_executed_in_order_without_errors(name):
    nb = load(name)
    counts = [c["execution_count"] for c in code_cells(nb)]
    assert counts == list(range(1, len(counts) + 1)), f"{name}: re-execute it top to bottom and save it"
    for cell in code_cells(nb):
        assert all(o["output_type"] != "error" for o in cell["outputs"]), source(cell)
        assert "NBVAL_" not in source(cell), "mark cells with tags, not comments"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("name", EXPECTED)
def test_only_live_views_skip_the_comparison(name):
    for cell in code_cells(load(name)):
        tags = cell.get("metadata", {}).get("tags", [])
        assert set(tags) <= {IGNORE_TAG}, tags
        if IGNORE_TAG in tags:
            assert LIVE_VIEW_CELL.match(source(cell)), f"{name}: a checked cell must not skip: {source(cell)!r}"


@pytest.mark.parametrize("name", [n for n in EXPECTED if n != "02-governance-six-lines"])
def test_a_notebook_makes_its_own_fresh_home_before_loading_the_extension(name):
    first, *rest = [source(c) for c in code_cells(load(name))]
    assert "tempfile.mkdtemp(" in first and 'os.environ["APOLLIA_HOME"]' in first
    preparing = PREPARING_CELLS.get(name, 0)
    assert rest[preparing].startswith("%load_ext apollia_nb")
    assert not any("apollia_nb" in cell or "%apollia" in cell for cell in rest[:preparing]), rest[:preparing]


def test_the_saved_tour_shows_widgets_a_card_and_a_completed_verified_task():
    cells = code_cells(load("01-tour"))

    def shown(cell: dict) -> list[dict]:
        return [o["data"] for o in cell["outputs"] if o["output_type"] in ("display_data", "execute_result")]

    def text(cell: dict) -> str:
        return "".join(joined(o.get("text", "")) for o in cell["outputs"] if o["output_type"] == "stream") + "".join(
            joined(d.get("text/plain", "")) for d in shown(cell))

    by_start = {source(c).splitlines()[0]: c for c in cells}
    [task_view] = shown(by_start["%%apollia task clerk"])
    assert WIDGET_MIME in task_view and {"text/plain", "text/html"} <= set(task_view)
    assert "Consent card pd-" in text(by_start["[card] = task.cards"])
    assert "waiting (answers: once/always/refuse)" in text(by_start["[card] = task.cards"])
    [answered] = shown(by_start['card.answer("once")'])
    assert WIDGET_MIME in answered and "answered once by ann" in joined(answered["text/plain"])
    assert text(by_start["task.status, task.result, task.budget"]).startswith("('completed'")
    assert "verified:" in text(by_start["%apollia verify"])
    assert "identical" in text(by_start["%apollia replay {task.run_id}"])


def outputs_text(cell: dict) -> str:
    """A cell's printed text and the text/plain of what it displayed."""
    return "".join(
        joined(o.get("text", "")) if o["output_type"] == "stream" else joined(o.get("data", {}).get("text/plain", ""))
        for o in cell["outputs"])


def test_the_saved_federation_notebook_shows_both_paths_governed_and_stops_its_host():
    cells = code_cells(load("07-federation"))
    shown = "\n".join(outputs_text(c) for c in cells)

    def out(start: str) -> str:
        [cell] = [c for c in cells if source(c).startswith(start)]
        return outputs_text(cell)

    for line in ("[mcp.servers.notes]", 'families = { search = "read" }', "[hosts.notes]", 'token_env = "NOTES_TOKEN"'):
        assert line in out("config = ")
    assert re.search(r"mcp:notes/search\n  family read · connection notes\n  hints \{'readOnlyHint': True", shown)
    assert re.search(r"rest:notes/createSummary\n  family write · connection notes\n  hints \{'method': 'POST'", shown)
    card = out("[card] = task.pending")
    assert "rest:notes/createSummary (write)" in card and "asked by line 6" in card
    assert 'hints (not trusted): {"method": "POST", "url": "http://127.0.0.1:' in card
    assert "answered once by ann" in out('card.answer("once")')
    assert out("task = await task").startswith("('completed'")
    assert "'note_ids': ['n1', 'n2']" in out("stored = httpx.get(")
    assert re.search(r"mcp:notes/search\s+notes\s+read\s+allow\s+3\s", shown)
    assert re.search(r"rest:notes/createSummary\s+notes\s+write\s+ask\s+6\s+once\s+ann", shown)
    assert re.search(r"mcp:notes/search\s+ok\s", shown) and re.search(r"rest:notes/createSummary\s+ok\s", shown)
    assert "0 of them mention the token" in shown and "verified:" in out("%apollia verify")
    assert "host.terminate()" in source(cells[-1]) and outputs_text(cells[-1]).endswith("has stopped: True\n")


def hosts_left_running(tmp_path: Path) -> list[int]:
    """Notes hosts a notebook started under this run (its TMPDIR in their environment) that still run."""
    left = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"examples.host_notes" in cmdline and f"TMPDIR={tmp_path}".encode() in environ:
            left.append(int(proc.name))
    return left


def test_the_notebooks_reproduce_their_saved_outputs_under_nbval(tmp_path):
    """Every cell of every notebook runs in a fresh kernel and matches its saved outputs."""
    expected_cells = sum(len(code_cells(load(n))) for n in EXPECTED)
    env = {
        **os.environ,
        "APOLLIA_HOME": str(tmp_path / "unused-home"),  # each notebook makes its own; never the user's
        "TMPDIR": str(tmp_path),                          # the notebooks' temporary folders land here
        "IPYTHONDIR": str(tmp_path / "ipython"),          # no profile or startup file of the user's
        "MPLCONFIGDIR": str(tmp_path / "matplotlib"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    # Matplotlib builds its font cache on first use and says so when that is slow: not in a cell.
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], env=env, check=True, timeout=120)
    command = [sys.executable, "-m", "pytest", "--nbval", str(NOTEBOOKS), "--nbval-sanitize-with", str(SANITIZE),
               "--nbval-current-env", "--nbval-cell-timeout", "120", "-p", "no:cacheprovider", "-q",
               "-o", "addopts=", "--rootdir", str(ROOT)]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    finally:
        left = hosts_left_running(tmp_path)  # a notebook that starts a host stops it in its last cell
        for pid in left:
            os.kill(pid, signal.SIGTERM)
    elapsed = time.monotonic() - started
    report = done.stdout + done.stderr
    assert not left, f"hosts still running after the notebooks: {left}"
    assert done.returncode == 0, report
    assert re.search(rf"\b{expected_cells} passed\b", report), report
    assert not re.search(r"\b(failed|skipped|xfailed|error)\b", report.splitlines()[-1]), report
    print(f"nbval: {expected_cells} cells of {len(EXPECTED)} notebooks in {elapsed:.1f} s")


# --- the governance notebook's decision explorer (notebooks/decision_explorer.py) -------------------------


@pytest.fixture(scope="module")
def explorer_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("decision_explorer", NOTEBOOKS / "decision_explorer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_explorer_rules_are_read_one_per_line(explorer_module):
    rules = explorer_module.parse_rules('deny write_file secrets/\n\n# a comment\nallow bash_executor "git status" clerk')
    assert [(r.effect, r.tool, r.prefix, r.agent) for r in rules] == [
        ("deny", "write_file", "secrets/", "*"), ("allow", "bash_executor", "git status", "clerk")]
    for bad in ("permit write_file", "deny", "deny a b c d"):
        with pytest.raises(ValueError, match="rule line 1"):
            explorer_module.parse_rules(bad)


def test_explorer_explains_the_deciding_line_and_says_why_it_cannot_decide(explorer_module):
    Setting = explorer_module.Setting
    refused = Setting(rules="deny write_file secrets/", arguments='{"path": "secrets/key"}', consents=("write",))
    text = explorer_module.explain_text(refused)
    assert "decision: refuse by line 2 · answers —" in text
    html = explorer_module.explain_html(refused)
    assert "2. a fine deny rule matches → refuse ← decided" in html and "1. " in html and "did not apply" in html
    assert "cannot decide: the arguments are not JSON" in explorer_module.explain_text(Setting(arguments="{nope"))
    assert "cannot decide: rule line 1" in explorer_module.explain_text(Setting(rules="maybe write_file"))
    broken = Setting(readable=False, consents=("write",))
    assert "decision: refuse by line 0" in explorer_module.explain_text(broken)


def test_explorer_follows_its_form(explorer_module):
    explorer = explorer_module.DecisionExplorer()
    assert (explorer.decision.outcome, explorer.decision.line) == ("ask", 6)
    explorer.consents.value = ("write",)  # as a click in the form would
    assert (explorer.decision.outcome, explorer.decision.line) == ("allow", 5)
    assert "allow</b> by line 5" in explorer.result.value
    explorer.set(tool="read_file")  # a built-in tool brings its family and example arguments
    assert explorer.family.value == "read" and "meeting.txt" in explorer.arguments.value
    assert explorer.decision.line == 3
    explorer.set(family=None)
    assert explorer.decision.answers == ("once", "refuse")  # unclassified: never always
    bundle = explorer._repr_mimebundle_()
    assert {WIDGET_MIME, "text/plain", "text/html"} <= set(bundle)
    assert bundle["text/plain"] == explorer_module.explain_text(explorer.setting)
