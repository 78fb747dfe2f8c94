"""The modules ``%load_ext apollia_nb`` must not import: a fresh Python process loads the extension into a
real IPython shell (configured as a kernel's) on a home of its own and lists what the load added to
``sys.modules``. What a first cell does not need — the API and its HTTP server, HTTP clients, MCP,
OpenTelemetry, dataframes, the hooks and ACP gateways, and the TOML reader and fuzzy matcher that only a
config file, a policy file, an agent's manifest or a mistake's suggestion need — is imported at its
first use instead. No timing: a named module imported is the failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

#: Never imported by ``%load_ext apollia_nb`` on a home without a config file, a policy or agents.
DENY = (
    # the REST API, its server and schemas; HTTP clients; MCP; telemetry; dataframes
    "fastapi", "starlette", "uvicorn", "pydantic", "httpx", "mcp", "opentelemetry", "pandas",
    # the package's gateways and surfaces no first cell needs
    "apollia_nb.api", "apollia_nb.hooks", "apollia_nb.acp", "apollia_nb.federation", "apollia_nb.cli",
    "apollia_nb.runtime.models",
    # read only with something to read or to suggest: a config file, a policy, a manifest, a mistake
    "tomllib", "difflib", "apollia_nb.runtime.manifest",
)

PROBE = textwrap.dedent("""
    import json, sys
    from traitlets.config import Config
    from IPython.core.interactiveshell import InteractiveShell

    deny = json.loads(sys.argv[1])
    config = Config()
    config.IPKernelApp.connection_file = "kernel.json"  # as in a kernel
    shell = InteractiveShell.instance(config=config)
    before = set(sys.modules)
    error = ""
    try:
        shell.run_line_magic("load_ext", "apollia_nb")
    except Exception as exc:  # a home that does not open: its one-line error
        error = str(exc)
    added = set(sys.modules) - before
    magics = shell.magics_manager.registry["ApolliaMagics"]
    print(json.dumps({
        "opened": magics.runtime is not None,
        "error": error,
        "already": sorted(m for m in deny if m in before),
        "imported": sorted(m for m in added if m in deny or m.split(".")[0] in deny),
    }))
""")


def load_in_fresh_process(home, cwd) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "APOLLIA_HOME"}
    env["APOLLIA_HOME"] = str(home)
    env["IPYTHONDIR"] = str(cwd / "ipython")  # never the user's own profile
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(DENY)], capture_output=True, text=True,
                          timeout=180, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("which", ["new home", "existing home"])
def test_load_imports_nothing_on_the_deny_list(tmp_path, which):
    home = tmp_path / "home"
    if which == "existing home":
        assert load_in_fresh_process(home, tmp_path)["opened"]  # the first load creates the home
    seen = load_in_fresh_process(home, tmp_path)
    assert seen["opened"], seen["error"]  # a load that opened nothing would import little and prove nothing
    assert seen["already"] == []  # the bare shell brought none of them: each name is really checked
    assert seen["imported"] == []


def test_a_config_file_is_still_read_at_load(tmp_path):
    """The TOML reader moved to the first file to read: a home's broken config still refuses the open
    (BAD_INPUT), it is not skipped because its reader was not imported."""
    home = tmp_path / "home"
    assert load_in_fresh_process(home, tmp_path)["opened"]
    (home / "apollia.toml").write_text("[hitl\n", encoding="utf-8")
    seen = load_in_fresh_process(home, tmp_path)
    assert not seen["opened"]
    assert seen["error"].startswith("BAD_INPUT: ") and "apollia.toml" in seen["error"], seen["error"]
