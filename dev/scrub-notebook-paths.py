"""Write the temporary folders in saved notebooks' outputs the way nbval's sanitiser writes them.

    .venv/bin/python dev/scrub-notebook-paths.py notebooks/0*.ipynb

A notebook executed on a machine shows that machine's temporary folders in its outputs (and in the
widget states saved beside them), e.g. ``/tmp/tmpab12/apollia-tour-p7do5kq4/home``. This rewrites
them as the ``[temporary folders]`` sanitiser of ``notebooks/nbval-sanitize.cfg`` does
(``TMP/apollia-tour/home``): nbval compares the same text as before, and no machine's paths are
committed. Cell sources are left alone. Exit 1, naming the notebook and the text, when an output
still holds a path of a machine afterwards (a home folder, a temporary folder it cannot rewrite).
"""

from __future__ import annotations

import configparser
import re
import sys
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ROOT / "notebooks" / "nbval-sanitize.cfg"
# Paths no committed output may hold: temporary and home folders on Linux, macOS and Windows (an absolute
# path's start, not a folder of that name inside a rewritten one), and the names temporary folders get.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(tmp|var/folders|private/var|home|root|Users)/|\b[A-Za-z]:\\|AppData"
                          r"|\btmp[a-z0-9_]{8}\b|\bapollia-[a-z]+(-[a-z0-9_]{8}|\.[A-Za-z0-9]{6})\b")


def temporary_folders() -> tuple[re.Pattern[str], str]:
    """The ``[temporary folders]`` sanitiser nbval applies before it compares outputs."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(SANITIZE, encoding="utf-8")
    section = config["temporary folders"]
    return re.compile(section["regex"]), section["replace"]


def _rewrite(value: Any, pattern: re.Pattern[str], replace: str) -> tuple[Any, int]:
    if isinstance(value, str):
        return pattern.subn(replace, value)
    if isinstance(value, list):
        done = [_rewrite(v, pattern, replace) for v in value]
        return [v for v, _ in done], sum(n for _, n in done)
    if isinstance(value, dict):
        done = {k: _rewrite(v, pattern, replace) for k, v in value.items()}
        return type(value)((k, v) for k, (v, _) in done.items()), sum(n for _, n in done.values())
    return value, 0


def saved_text(nb: Any) -> list[str]:
    """Every string a notebook saves beside its sources: outputs, cell and notebook metadata."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    walk(nb.get("metadata", {}))
    for cell in nb.get("cells", []):
        walk(cell.get("outputs", []))
        walk(cell.get("metadata", {}))
        walk(cell.get("attachments", {}))
    return found


def scrub(path: Path) -> tuple[int, list[str]]:
    """Rewrite ``path`` in place; return how many folders were rewritten and what machine paths are left."""
    pattern, replace = temporary_folders()
    nb = nbformat.read(path, as_version=4)
    count = 0
    for cell in nb.cells:
        if "outputs" in cell:
            cell.outputs, n = _rewrite(cell.outputs, pattern, replace)
            count += n
    if "widgets" in nb.metadata:
        nb.metadata.widgets, n = _rewrite(nb.metadata.widgets, pattern, replace)
        count += n
    if count:
        nbformat.write(nb, path)
    left = [m.string[max(0, m.start() - 40):m.end() + 40] for text in saved_text(nb)
            for m in MACHINE_PATH.finditer(text)]
    return count, left


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    status = 0
    for name in argv:
        count, left = scrub(Path(name))
        print(f"{name}: {count} temporary folder(s) rewritten")
        for text in left:
            print(f"{name}: an output still holds a machine's path: {text!r}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
