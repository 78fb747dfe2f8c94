"""The example notebooks as files: what they carry besides their code, and where the tour sends a reader.

A notebook is saved with its outputs so that it reads well where it is published, and those outputs
must not carry the paths of the machine that ran it (its temporary folders, a home folder, the
clone): ``dev/scrub-notebook-paths.py`` writes temporary folders as nbval's sanitiser does. The
tour's "What next" lists every other notebook, and every link in the tour opens.
"""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
TOUR = NOTEBOOKS / "01-tour.ipynb"
SCRUB = ROOT / "dev" / "scrub-notebook-paths.py"
SANITIZE = NOTEBOOKS / "nbval-sanitize.cfg"
ALL = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
# The start of an absolute temporary or home folder (Linux, macOS, Windows) and the names temporary
# folders are given (Python's tempfile, mktemp, the notebooks' own prefixes).
MACHINE = [
    re.compile(r"(?<![\w.~-])/(tmp|var/tmp|var/folders|private/var|private/tmp|home|root|Users)/"),
    re.compile(r"\b[A-Za-z]:\\(Users|Windows|Temp)"),
    re.compile(r"AppData"),
    re.compile(r"\btmp[a-z0-9_]{8}\b"),
    re.compile(r"\bapollia-[a-z]+-[a-z0-9_]{8}\b"),
    re.compile(r"\bapollia-[a-z]+\.[A-Za-z0-9]{6}\b"),
]


def _joined(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def saved_beside_the_code(nb: dict) -> list[str]:
    """Every string a notebook saves that is not a cell's source: outputs, widget states, metadata."""
    found = _strings(nb.get("metadata", {}))
    for cell in nb["cells"]:
        found += _strings(cell.get("outputs", [])) + _strings(cell.get("metadata", {}))
        found += _strings(cell.get("attachments", {}))
    return found


def machine_paths(nb: dict) -> list[str]:
    mine = [str(ROOT), str(Path.home())] if Path.home() != Path("/") else [str(ROOT)]
    hits = []
    for text in saved_beside_the_code(nb):
        for pattern in MACHINE:
            hits += [text[max(0, m.start() - 30):m.end() + 30] for m in pattern.finditer(text)]
        hits += [text for path in mine if re.search(rf"{re.escape(path)}(?![\w.-])", text)]
    return hits


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_there_are_notebooks_and_the_check_sees_paths_where_they_are():
    assert "01-tour.ipynb" in ALL and len(ALL) >= 8

    def planted(output: str, widget: str) -> dict:
        return {"cells": [{"cell_type": "code", "source": "print(tempfile.mkdtemp(), '/tmp/x')", "metadata": {},
                           "outputs": [{"output_type": "stream", "name": "stdout", "text": [output]}]}],
                "metadata": {"widgets": {"state": {"value": f"<code>{widget}</code>"}}}}

    for path in ("/tmp/tmpk2x9_a1b", "/var/folders/x1/T/apollia-tour-ab12cd34/home", "/home/ann/notes",
                 "/Users/ann/notes", "/root/.apollia", "C:\\Users\\ann\\x", "tmpk2x9_a1b", "apollia-demo.Ab12Cd",
                 "apollia-tour-ab12cd34", str(ROOT), f"{ROOT}/docs"):
        assert machine_paths(planted(f"working in {path}\n", "x")), path
        assert machine_paths(planted("x", path)), path
    assert not machine_paths(planted("working in TMP/apollia-tour\n", "TMP/apollia-tour/home/journal.db"))


@pytest.mark.parametrize("name", ALL)
def test_no_saved_output_holds_a_path_of_the_machine_that_ran_it(name):
    hits = machine_paths(load(NOTEBOOKS / name))
    assert not hits, f"{name}: run `.venv/bin/python dev/scrub-notebook-paths.py notebooks/{name}`: {hits[:5]}"


def _what_next() -> str:
    [cell] = [c for c in load(TOUR)["cells"]
              if c["cell_type"] == "markdown" and _joined(c["source"]).startswith("## What next")]
    return _joined(cell["source"])


def test_the_tours_what_next_lists_every_other_notebook_in_the_folder():
    listed = re.findall(r"\]\(([^)/]+\.ipynb)\)", _what_next())
    assert sorted(listed) == [n for n in ALL if n != TOUR.name]
    assert len(listed) == len(set(listed))


def test_every_link_in_the_tour_opens_from_where_the_tour_is():
    links = [target for cell in load(TOUR)["cells"] if cell["cell_type"] == "markdown"
             for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", _joined(cell["source"]))
             if "://" not in target]
    assert "../docs/index.md" in links and "README.md" in links
    for link in links:
        target = (NOTEBOOKS / link).resolve()
        assert target.is_file() and target.is_relative_to(ROOT), link


def _sanitised(text: str) -> str:
    """A text as nbval compares it: every sanitiser of notebooks/nbval-sanitize.cfg, in order."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(SANITIZE, encoding="utf-8")
    for section in config.sections():
        text = re.sub(config[section]["regex"], config[section]["replace"], text)
    return text


def _scrub(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRUB), *map(str, paths)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


@pytest.mark.parametrize("where", ["/tmp/tmpq1w2e3r4/apollia-tour-k3j4h5g6",
                                   "/var/folders/x1/abc_def/T/apollia-tour-zz_9y8x7"])
def test_scrubbing_a_freshly_saved_tour_gives_the_committed_one_and_nbval_compares_the_same(tmp_path, where):
    committed = TOUR.read_text(encoding="utf-8")
    assert "TMP/apollia-tour" in committed
    # The tour as a machine saves it: its temporary folder in the outputs and the widgets' states.
    fresh = committed.replace("TMP/apollia-tour", where)
    fresh_nb = json.loads(fresh)
    assert any(where in s for c in fresh_nb["cells"] for s in _strings(c.get("outputs", [])))
    assert any(where in s for s in _strings(fresh_nb["metadata"].get("widgets", {})))
    saved = tmp_path / TOUR.name
    saved.write_text(fresh, encoding="utf-8")
    done = _scrub(saved)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(rf"{re.escape(str(saved))}: [1-9]\d* temporary folder\(s\) rewritten\n", done.stdout)
    assert saved.read_text(encoding="utf-8") == committed
    before = [_sanitised(s) for c in fresh_nb["cells"] for s in _strings(c.get("outputs", []))]
    after = [_sanitised(s) for c in load(saved)["cells"] for s in _strings(c.get("outputs", []))]
    assert before == after  # nbval compares exactly what it compared before
    again = _scrub(saved)
    assert again.returncode == 0 and again.stdout.endswith(": 0 temporary folder(s) rewritten\n")
    assert saved.read_text(encoding="utf-8") == committed


def test_scrubbing_names_a_machine_path_it_cannot_rewrite_and_leaves_the_sources_alone(tmp_path):
    nb = load(TOUR)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    code[0]["outputs"][0]["text"] = ["working in /tmp/tmpq1w2e3r4/apollia-tour-k3j4h5g6\n"]
    code[1]["outputs"].append({"output_type": "stream", "name": "stderr", "text": ["see /home/ann/notes.txt\n"]})
    code[2]["source"] = "# /tmp/ stays in a source: it is what the reader typed\n" + _joined(code[2]["source"])
    saved = tmp_path / "mine.ipynb"
    saved.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    done = _scrub(saved)
    assert done.returncode == 1
    assert f"{saved}: an output still holds a machine's path: " in done.stderr and "/home/ann/notes.txt" in done.stderr
    assert "apollia-tour-k3j4h5g6" not in done.stderr and "stays in a source" not in done.stderr  # rewritten; not read
    after = [c for c in load(saved)["cells"] if c["cell_type"] == "code"]
    assert _joined(after[0]["outputs"][0]["text"]) == "working in TMP/apollia-tour\n"
    assert _joined(after[2]["source"]).startswith("# /tmp/ stays in a source")


def test_the_notebooks_readme_says_to_scrub_after_saving():
    readme = (NOTEBOOKS / "README.md").read_text(encoding="utf-8")
    [block] = [b for b in re.findall(r"```bash\n(.*?)```", readme, flags=re.S) if "nbconvert" in b]
    assert block.index("nbconvert") < block.index("dev/scrub-notebook-paths.py notebooks/0*.ipynb")
