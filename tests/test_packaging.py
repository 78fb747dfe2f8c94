"""pyproject.toml: the runtime dependencies are what apollia_nb imports; test tools are in the `test` extra."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# An import name -> the distribution that provides it, where the two differ.
DISTRIBUTION = {"nacl": "pynacl", "IPython": "ipython", "yaml": "pyyaml", "ed25519_zebra": "py-ed25519-zebra-bindings"}
PROVIDED_BY = {"starlette": "fastapi", "mcp_types": "mcp", "httpx2": "mcp", "comm": "ipykernel"}  # installed with (and pinned by) another dependency
# An import name -> the optional extra (not `test`) that installs it: imported only where that feature runs.
#: (the extra, a distribution of it that provides the module)
EXTRA = {"distributed": ("dask", "dask"), "dask": ("dask", "dask"), "opentelemetry": ("otel", "opentelemetry-sdk"),
         "grpc": ("otel", "grpcio")}
# CPython's own modules that another supported Python names otherwise (sys.stdlib_module_names is the
# running interpreter's): its built-in SHA-256 is `_sha2` from 3.12, `_sha256` before. Not dependencies;
# each import of one must fall back when the running Python lacks it (checked below).
STDLIB_OF_OTHER_PYTHONS = {"_sha2", "_sha256", "_sha512"}


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def imported_top_level_modules() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "apollia_nb").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - STDLIB_OF_OTHER_PYTHONS - {"apollia_nb", "__future__"}


def unguarded_private_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` of each import of a private top-level module (``_name``) that no
    ``try: … except ImportError`` around it catches: a CPython internal may be gone in the next Python."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h.type) for h in node.handlers):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module.split(".")[0]]
        else:
            continue
        found += [(node.lineno, m) for m in modules if m.startswith("_") and m != "__future__" and id(node) not in guarded]
    return found


def _catches_import_error(handler: ast.expr | None) -> bool:
    names = handler.elts if isinstance(handler, ast.Tuple) else [handler]
    return any(n is None or (isinstance(n, ast.Name) and n.id in {"ImportError", "ModuleNotFoundError", "Exception",
                                                                  "BaseException"}) for n in names)


def test_test_tools_are_not_runtime_dependencies_and_nothing_imports_them():
    runtime = names(PROJECT["dependencies"])
    assert not runtime & {"pytest", "nbval", "hypothesis", "schemathesis", "nbclient", "pytest-timeout"}
    assert {"pytest", "nbval", "nbclient", "pytest-timeout"} <= names(PROJECT["optional-dependencies"]["test"])
    assert not imported_top_level_modules() & {"pytest", "nbval", "hypothesis", "schemathesis", "nbclient"}


def test_every_module_the_runtime_imports_is_a_dependency():
    runtime = names(PROJECT["dependencies"])
    for module in imported_top_level_modules():
        if module in EXTRA:
            extra, dist = EXTRA[module]
            assert extra != "test" and dist in names(PROJECT["optional-dependencies"][extra]), (module, extra)
            continue
        dist = PROVIDED_BY.get(module) or DISTRIBUTION.get(module, module).lower()
        assert dist in runtime, f"apollia_nb imports {module!r}: add {dist!r} to [project] dependencies"


def test_a_private_module_of_cpython_is_imported_with_a_fallback():
    for path in (ROOT / "apollia_nb").rglob("*.py"):
        assert unguarded_private_imports(ast.parse(path.read_text(), str(path))) == [], path
    # the check itself: a bare import, one caught by the wrong handler, and the guarded pair the journal uses
    bare = ast.parse("import _sha2\nfrom _sha256 import sha256\n")
    assert unguarded_private_imports(bare) == [(1, "_sha2"), (2, "_sha256")]
    wrong = ast.parse("try:\n    from _sha2 import sha256\nexcept KeyError:\n    pass\n")
    assert unguarded_private_imports(wrong) == [(2, "_sha2")]
    guarded = ast.parse("try:\n    from _sha2 import sha256\nexcept ImportError:\n    try:\n"
                        "        from _sha256 import sha256\n    except (ImportError, OSError):\n"
                        "        sha256 = None\n")
    assert unguarded_private_imports(guarded) == []


def test_lower_bounds_are_the_versions_the_suite_runs_with_at_least_for_the_core():
    from importlib.metadata import version

    bounds = {re.split(r"[<>=]", r)[0].lower(): r.split(">=")[1] for r in PROJECT["dependencies"] if ">=" in r}
    assert bounds["mcp"] == "2.3" and bounds["duckdb"] == "2.0"
    for dist, lower in bounds.items():
        installed = tuple(int(p) for p in re.findall(r"\d+", version(dist))[:2])
        assert installed >= tuple(int(p) for p in lower.split(".")[:2]), (dist, lower, version(dist))


def test_dev_test_sh_names_a_missing_node_in_one_line_before_installing_anything(tmp_path):
    import shutil
    import subprocess

    bin_dir = tmp_path / "bin"  # a PATH with Python and the shell tools, but no node or npm
    bin_dir.mkdir()
    for tool in ("python3", "dirname", "bash", "env"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    out = subprocess.run(["bash", str(ROOT / "dev" / "test.sh")], capture_output=True, text=True, timeout=60,
                         env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "dev/test.sh: 'node' is not on PATH: the suite needs Python 3.11+, Node.js and npm (see README, Set up)"]
    assert out.stdout == ""


def test_the_wheel_ships_the_notebooks_and_apollia_os_notebooks_copies_them_for_a_pip_user(tmp_path, built_wheel):
    import os
    import subprocess
    import zipfile

    wheel = built_wheel  # built once per session (conftest.py)
    shipped = sorted(n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("apollia_nb/notebooks/"))
    expected = sorted(f"apollia_nb/notebooks/{p.name}" for p in (ROOT / "notebooks").iterdir() if p.is_file())
    assert shipped == expected and "apollia_nb/notebooks/01-tour.ipynb" in shipped
    assert "apollia_nb/notebooks/decision_explorer.py" in shipped

    site = tmp_path / "site"  # the wheel as pip lays it out, away from this clone
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}

    def notebooks(target):
        return subprocess.run([sys.executable, "-m", "apollia_nb", "notebooks", str(target)], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=60)

    out = notebooks(tmp_path / "mine")
    assert out.returncode == 0, out.stderr
    copied = sorted(p.name for p in (tmp_path / "mine").iterdir())
    assert "01-tour.ipynb" in copied and "decision_explorer.py" in copied and "README.md" in copied
    assert (tmp_path / "mine" / "01-tour.ipynb").read_bytes() == (ROOT / "notebooks" / "01-tour.ipynb").read_bytes()
    (tmp_path / "mine" / "01-tour.ipynb").write_text("mine")
    again = notebooks(tmp_path / "mine")
    assert again.returncode == 3 and "CONFLICT" in again.stderr and "nothing was copied" in again.stderr
    assert (tmp_path / "mine" / "01-tour.ipynb").read_text() == "mine"  # nothing overwritten
