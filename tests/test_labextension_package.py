"""The JupyterLab panel as a user gets it: prebuilt inside the wheel, found by JupyterLab with no Node.

The wheel is built once per session (``built_wheel``); ``wheel_venv`` installs it into a fresh
virtual environment, where ``jupyter labextension list`` must show the panel enabled and OK.
The front end's own unit tests (Vitest, jsdom) run here too, so the suite runs them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABEXT = ROOT / "labextension"
NAME = json.loads((LABEXT / "package.json").read_text())["name"]
SHARE = f"apollia_nb-0.1.0.data/data/share/jupyter/labextensions/{NAME}/"


def test_the_wheel_ships_the_prebuilt_panel_under_share_jupyter_labextensions(built_wheel):
    names = zipfile.ZipFile(built_wheel).namelist()
    shipped = sorted(n[len(SHARE):] for n in names if n.startswith(SHARE))
    assert "package.json" in shipped and "install.json" in shipped
    assert any(re.fullmatch(r"static/remoteEntry\.[0-9a-f]+\.js", n) for n in shipped), shipped
    assert f"schemas/{NAME}/plugin.json" in shipped
    wheel = zipfile.ZipFile(built_wheel)
    meta = json.loads(wheel.read(SHARE + "package.json"))
    assert meta["name"] == NAME and meta["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")
    assert json.loads(wheel.read(SHARE + "install.json"))["packageName"] == "apollia-nb"
    shortcuts = json.loads(wheel.read(SHARE + f"schemas/{NAME}/plugin.json"))["jupyter.lab.shortcuts"]
    assert shortcuts == [{"command": "apollia:open-panel", "keys": ["Alt Shift P"], "selector": "body"}]
    # Nothing of the Node build's inputs or tools goes into the wheel.
    assert not [n for n in names if "node_modules" in n or n.startswith("labextension/")]


def test_a_second_build_skips_the_node_build_until_a_panel_source_changes(built_wheel, tree_build_lock):
    """What keeps `pip install -e .` (dev/test.sh, dev/lab.sh) from rebuilding the panel every time."""
    import tomllib

    from hatch_jupyter_builder.utils import is_stale

    hook = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["hooks"]["jupyter-builder"]
    kwargs = hook["build-kwargs"]
    assert (kwargs["build_dir"], kwargs["source_dir"]) == ("labextension/prebuilt", "labextension")
    build_dir, source_dir = ROOT / kwargs["build_dir"], ROOT / kwargs["source_dir"]
    assert not is_stale(build_dir, source_dir)  # just built (built_wheel): the next build skips npm
    source = LABEXT / "src" / "index.ts"
    with tree_build_lock():  # no build of this tree in another test sees the panel stale meanwhile
        before = source.stat()
        try:
            os.utime(source, (before.st_atime, time.time() + 60))  # as if edited after the build
            assert is_stale(build_dir, source_dir)
        finally:
            os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert not is_stale(build_dir, source_dir)


def test_the_shortcut_is_no_default_jupyterlab_shortcut():
    import jupyterlab

    schemas = Path(jupyterlab.__file__).parents[3] / "share" / "jupyter" / "lab" / "schemas"
    if not schemas.is_dir():  # a JupyterLab installed elsewhere than this prefix
        schemas = Path(os.sys.prefix) / "share" / "jupyter" / "lab" / "schemas"
    taken = set()
    for schema in schemas.rglob("*.json"):
        for shortcut in json.loads(schema.read_text()).get("jupyter.lab.shortcuts", []):
            taken.add(" ".join(shortcut["keys"]))
    assert len(taken) > 50, schemas  # the defaults were read
    assert "Alt Shift P" not in taken


def test_jupyter_labextension_list_in_a_fresh_venv_shows_the_panel_enabled_ok(wheel_venv, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER") and k != "PYTHONPATH"}
    env.update({"JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
                "PATH": f"{wheel_venv / 'bin'}:/usr/bin:/bin"})  # no Node is needed, nor found, there
    listed = subprocess.run([str(wheel_venv / "bin" / "jupyter"), "labextension", "list"], capture_output=True,
                            text=True, timeout=120, env=env)
    assert listed.returncode == 0, listed.stderr
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    line = next((ln.strip() for ln in text.splitlines() if NAME in ln), None)
    assert line == f"{NAME} v0.1.0 enabled OK (python, apollia-nb)", text
    assert str(wheel_venv / "share" / "jupyter" / "labextensions") in text
    # The panel's files are the wheel's, not this clone's.
    installed = wheel_venv / "share" / "jupyter" / "labextensions" / NAME
    assert (installed / "package.json").is_file() and not (installed / "package.json").is_symlink()


def test_the_panel_unit_tests_pass():
    if not (LABEXT / "node_modules" / ".bin" / "vitest").exists():
        installed = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=LABEXT,
                                   capture_output=True, text=True, timeout=600)
        assert installed.returncode == 0, installed.stderr
    ran = subprocess.run(["npm", "test", "--silent"], cwd=LABEXT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "CI": "true", "NO_COLOR": "1"})
    text = ran.stdout + ran.stderr
    assert ran.returncode == 0, text
    passed = re.search(r"Tests\s+(\d+) passed", text)
    assert passed and int(passed.group(1)) >= 30 and "failed" not in text, text
