"""Re-registering a stopped agent with a manifest that differs in tools, workspace or model shows the
difference and asks the operator to keep or drop its standing consents; the choice is journaled. A real
Runtime, and the CLI as a subprocess on the same home."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from apollia_nb.errors import ConsentsToReview
from apollia_nb.runtime import Runtime
from notebook_fixtures import ip  # noqa: F401  (fixture)
from runtime_helpers import assert_alive, manifest

pytestmark = pytest.mark.anyio


def reviews(rt):
    return [json.loads(e.payload) for e in rt.journal.entries() if e.kind == "consents_review"]


def consents(rt, name="clerk"):
    return sorted(c.family.value for c in rt.governance.consents() if c.agent == name)


async def test_a_wider_manifest_asks_before_keeping_standing_consents(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(required=["read_file"]))
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.stop_agent("clerk")
        wider = manifest(required=["read_file", "write_file", "bash_executor"], workspace="elsewhere")
        with pytest.raises(ConsentsToReview) as info:
            await rt.register_agent(wider)
        assert "tools:" in info.value.message and "workspace:" in info.value.message
        assert "bash_executor" in info.value.message and "write" in info.value.message
        assert rt.agent("clerk").state.state == "stopped" and consents(rt) == ["write"] and reviews(rt) == []

        await rt.register_agent(wider, keep_consents=False)
        assert consents(rt) == [] and rt.agent("clerk").state.state == "active"
        [review] = reviews(rt)
        assert review["choice"] == "dropped" and review["consents"] == ["write"]
        assert set(review["difference"]) == {"tools", "workspace"}
        await assert_alive(rt)


async def test_the_same_manifest_or_no_consents_re_registers_without_asking(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest())
        rt.governance.grant_consent("clerk", "write", by="test")
        await rt.stop_agent("clerk")
        await rt.register_agent(manifest())  # nothing changed: the consents stand
        assert consents(rt) == ["write"] and reviews(rt) == []


def test_the_cli_keeps_consents_when_told_and_journals_the_choice(home, tmp_path):
    import anyio

    async def prepare():
        async with Runtime(home) as rt:
            await rt.register_agent(manifest(required=["read_file"]))
            rt.governance.grant_consent("clerk", "write", by="test")
            await rt.stop_agent("clerk")

    anyio.run(prepare)
    path = tmp_path / "clerk.toml"
    path.write_text(manifest(required=["read_file", "write_file"]))
    env = {**os.environ, "APOLLIA_HOME": str(home.path)}
    cli = [sys.executable, "-m", "apollia_nb", "agents", "register", str(path)]
    asked = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=60)
    assert asked.returncode != 0 and "CONSENTS_TO_REVIEW" in asked.stderr + asked.stdout
    kept = subprocess.run([*cli, "--keep-consents"], capture_output=True, text=True, env=env, timeout=60)
    assert kept.returncode == 0, kept.stderr

    async def check():
        async with Runtime(home) as rt:
            assert consents(rt) == ["write"]
            [review] = reviews(rt)
            assert review["choice"] == "kept" and set(review["difference"]) == {"tools"}

    anyio.run(check)


def test_the_notebook_cell_shows_the_difference_and_takes_the_choice(ip, capsys):
    from apollia_nb.notebook.magics import ApolliaMagicError

    rt = ip.magics_manager.registry["ApolliaMagics"].runtime.rt
    ip.run_cell_magic("apollia", "agent", manifest(required=["read_file"]))
    ip.run_line_magic("apollia", "stop clerk")
    ip.magics_manager.registry["ApolliaMagics"].runtime.call(
        lambda: rt.governance.grant_consent("clerk", "write", by="test"))
    wider = manifest(required=["read_file", "write_file"])
    with pytest.raises(ApolliaMagicError) as info:
        ip.run_cell_magic("apollia", "agent", wider)
    assert info.value.code == "CONSENTS_TO_REVIEW" and "write_file" in info.value.message
    agent = ip.run_cell_magic("apollia", "agent --drop-consents", wider)
    assert agent.data["state"] == "active" and consents(rt) == []
    assert [r["choice"] for r in reviews(rt)] == ["dropped"]
