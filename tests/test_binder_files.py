"""``binder/`` builds an environment that runs the tour, as mybinder.org (repo2docker) would build it.

repo2docker picks the Python of ``binder/runtime.txt``, makes a virtual environment,
runs ``pip install -r binder/requirements.txt`` from the repository's root, then
``binder/postBuild``. The slow test does the same into a fresh virtual environment
(pip's wheel cache is reused, nothing else of this one), then imports the package,
runs ``apollia-os --help`` and the tour notebook under nbval there, and checks that
the server configuration postBuild wrote opens JupyterLab on the tour.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
TOUR_URL = "/lab/tree/notebooks/01-tour.ipynb"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_binder_pins_a_python_the_project_supports():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+\.\d+)", runtime)
    assert match, runtime
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires.startswith(">="), requires
    assert _version(match.group(1)) >= _version(requires[2:])


def test_binder_installs_the_project_from_the_root_and_what_the_notebooks_import():
    lines = [line.strip() for line in (BINDER / "requirements.txt").read_text().splitlines()]
    wanted = [line for line in lines if line and not line.startswith("#")]
    assert "." in wanted  # the repository itself: repo2docker runs pip from its root
    names = {re.split(r"[<>=!~ ]", line)[0].lower() for line in wanted if line != "."}
    assert {"pandas", "matplotlib"} <= names  # %%apollia sql's DataFrames, the audit charts
    assert os.access(BINDER / "postBuild", os.X_OK)


def test_the_readme_and_the_notebooks_readme_say_how_to_launch_it():
    readme = (ROOT / "notebooks" / "README.md").read_text()
    assert f"?urlpath={TOUR_URL.lstrip('/')}" in readme
    assert "binder" in readme.lower()


@pytest.mark.slow
def test_a_fresh_environment_built_from_binder_runs_the_tour(tmp_path, tree_build_lock):
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
           and not k.startswith("JUPYTER")}
    env.update({"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "TMPDIR": str(tmp_path),
                "IPYTHONDIR": str(tmp_path / "ipython"), "MPLCONFIGDIR": str(tmp_path / "matplotlib"),
                "JUPYTER_PLATFORM_DIRS": "1", "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
                "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
                "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"), "APOLLIA_HOME": str(tmp_path / "unused-home")})

    def run(*command: str | Path, cwd: Path = ROOT, timeout: float = 300) -> str:
        done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    # As repo2docker: from the repository's root, the requirements file, then postBuild.
    with tree_build_lock():  # `.` builds this tree: never beside another build of it
        run(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", BINDER / "requirements.txt")
    assert run("bash", "-c", "command -v python").strip() == str(python)  # postBuild's `python` is the venv's
    run("bash", BINDER / "postBuild")
    assert (venv / "etc" / "jupyter" / "jupyter_server_config.json").exists()

    # Away from the checkout, so that the installed package is the one imported.
    where = run(python, "-c", "import apollia_nb, apollia_nb.notebook, sys; print(apollia_nb.__file__, sys.prefix)",
                cwd=tmp_path)
    module_file, prefix = where.split()
    assert Path(prefix) == venv and Path(module_file).is_relative_to(venv)  # installed there, not this tree
    assert "usage: apollia-os" in run(venv / "bin" / "apollia-os", "--help")
    run(python, "-c", "import pandas, matplotlib, ipywidgets, jupyterlab, nbval", cwd=tmp_path)

    config = json.loads(run(venv / "bin" / "jupyter", "server", "--show-config-json"))
    assert config["ServerApp"]["default_url"] == TOUR_URL

    out = run(python, "-m", "pytest", "--nbval", ROOT / "notebooks" / "01-tour.ipynb", "--nbval-current-env",
              "--nbval-sanitize-with", ROOT / "notebooks" / "nbval-sanitize.cfg", "-p", "no:cacheprovider", "-q",
              "-o", "addopts=", "--rootdir", ROOT)
    assert re.search(r"\b\d+ passed\b", out) and "failed" not in out, out
