"""``[python] packages`` cannot drive pip: only requirement specifiers are accepted, pip runs with options
the project chooses (no user configuration, the project's index), and the outcome is journaled. A real
Runtime, real pip, and package indexes of the test's own on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from apollia_nb.errors import ManifestInvalid
from apollia_nb.runtime import Runtime
from loopback_host import LoopbackHost
from runtime_helpers import assert_alive, manifest

pytestmark = pytest.mark.anyio

NOT_REQUIREMENTS = [
    "--log", "--index-url=http://127.0.0.1:9/simple", "-e .", "git+http://127.0.0.1:9/x.git", "./local",
    "/etc", "-r/etc/passwd", "--target=/tmp/x", "pkg @ file:///tmp/x", "pkg @ http://127.0.0.1:9/x.whl",
    "pandas --index-url http://127.0.0.1:9/", "not a valid requirement!!",
]


@pytest.mark.parametrize("entry", NOT_REQUIREMENTS)
async def test_anything_but_a_requirement_specifier_is_manifest_invalid_naming_the_entry(home, tmp_path, entry):
    log = tmp_path / "x.log"
    async with Runtime(home) as rt:
        with pytest.raises(ManifestInvalid) as info:
            await rt.register_agent(manifest(packages=[entry, str(log)] if entry == "--log" else [entry]))
        assert repr(entry) in info.value.message and "python.packages[0]" in info.value.message
        assert not log.exists() and not (home.agents_dir / "clerk" / "venv").exists()
        assert "clerk" not in [a.name for a in rt.agents()]
        await assert_alive(rt)


async def test_pip_uses_the_projects_index_and_ignores_pip_configuration_and_the_outcome_is_journaled(
        home, tmp_path, monkeypatch):
    log = tmp_path / "pip.log"
    config = tmp_path / "pip.conf"
    with LoopbackHost(lambda m, p: (404, "text/plain", b"")) as index, \
            LoopbackHost(lambda m, p: (404, "text/plain", b"")) as other:
        config.write_text(f"[global]\nindex-url = {other.url}/simple\nlog = {log}\n")
        monkeypatch.setenv("APOLLIA_PIP_INDEX_URL", f"{index.url}/simple")
        monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
        monkeypatch.setenv("PIP_INDEX_URL", f"{other.url}/simple")
        monkeypatch.setenv("PIP_LOG", str(log))
        monkeypatch.setenv("PIP_TARGET", str(tmp_path / "target"))
        async with Runtime(home) as rt:
            agent = await rt.register_agent(manifest(packages=["apollia-test-absent[extra]>=1.0"]))
            assert agent.state.state == "degraded"
            assert "installing apollia-test-absent[extra]>=1.0 failed" in agent.warnings[0]
            assert [r["path"] for r in index.requests][:1] == ["/simple/apollia-test-absent/"]
            assert other.requests == [] and not log.exists() and not (tmp_path / "target").exists()
            [entry] = [json.loads(e.payload) for e in rt.journal.entries() if e.kind == "packages_install"]
            assert entry["agent"] == "clerk" and entry["outcome"] == "failed"
            assert entry["packages"] == ["apollia-test-absent[extra]>=1.0"] and "failed" in entry["error"]
            await assert_alive(rt)
