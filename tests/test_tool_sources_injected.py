"""The federated tool sources are handed to the runtime by whoever opens it, never opened by the runtime itself.

A home whose ``apollia.toml`` names MCP servers or hosts: a ``Runtime`` opened without
``tool_sources`` refuses (``BAD_INPUT`` saying how to open it) and leaves the home free; opened with
``apollia_nb.federation.open_sources`` it has one source per entry, and the surfaces that open a home
(the CLI, a kernel) hand them in.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from apollia_nb.errors import BadInput
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from test_federation_support import write_config

pytestmark = pytest.mark.anyio

HOSTS = {"notes": {"base_url": "http://127.0.0.1:9", "openapi": "/nowhere/openapi.json"}}
SERVERS = {"files": {"command": ["/nowhere/mcp-server"]}}


@pytest.mark.parametrize("config", [{"hosts": HOSTS}, {"servers": SERVERS}], ids=["hosts", "mcp servers"])
async def test_a_runtime_opened_without_the_sources_its_config_names_refuses_and_frees_the_home(home, config):
    async with Runtime(home):  # the home and its apollia.toml made
        pass
    write_config(home, **config)
    with pytest.raises(BadInput) as info:
        async with Runtime(home):
            pass
    assert "tool_sources=apollia_nb.federation.open_sources" in info.value.message
    assert str(home.config_path) in info.value.message
    async with Runtime(home, tool_sources=open_sources) as rt:  # the refusal left nothing locked
        names = [s.name for s in rt.tool_sources]
    expected = ["rest:notes"] if "hosts" in config else ["mcp:files"]
    assert names == expected
    # The surfaces that open a home hand the sources in: the CLI, a kernel.
    listed = subprocess.run([sys.executable, "-m", "apollia_nb", "agents", "list", "--home", str(home.path)],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    probe = ("from apollia_nb.notebook.bridge import KernelRuntime\n"
             f"k = KernelRuntime({str(home.path)!r})\n"
             "print([s.name for s in k.rt.tool_sources])\n"
             "k.close()\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=home.path.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(expected)
