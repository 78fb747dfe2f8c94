"""Secrets stay out of the signed journal and the model's view: notebook reads refuse what listing
hides and setting refuses, run no code of the notebook's, and a host's configured token is redacted by
value wherever it could appear. A real IPython with the extension; a host of the test's own on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from loopback_host import LoopbackHost, openapi, operation
from notebook_fixtures import ip  # noqa: F401  (fixture)
from runtime_helpers import assert_alive, call, manifest
from test_federation_support import results, write_config

TOKEN = "tok-7f3a9c-very-secret"
REFUSED_READS = ["In", "Out", "_", "_ih", "_oh", "_i1", "__builtins__", "get_ipython", "env", "environ_alias",
                 "os", "probe_fn", "Probe", "runtime_handle"]
CELL = f"""
import os
os.environ["H_TOKEN"] = "{TOKEN}"
env = os.environ
environ_alias = env
leak = "the token is {TOKEN}"
numbers = [1, 2.5, None, "three", b"four"]

class Probe:
    def __repr__(self):
        open("PROBE_RAN", "w").close()
        return "probe"
    def __getattr__(self, name):
        open("PROBE_RAN", "w").close()
        raise AttributeError(name)
    def __len__(self):
        open("PROBE_RAN", "w").close()
        return 1

probe = Probe()
probe_fn = lambda: 1
"""


def journal_bytes(rt) -> bytes:
    return b"\n".join(bytes(e.payload) for e in rt.journal.entries())


@pytest.fixture
def host_configured(home, monkeypatch):
    """A host whose token is H_TOKEN, configured before the extension loads."""
    monkeypatch.delenv("H_TOKEN", raising=False)
    write_config(home, hosts={"h": {"base_url": "http://127.0.0.1:9", "openapi": "h.json", "token_env": "H_TOKEN"}})


def test_notebook_reads_refuse_history_environment_modules_and_callables_and_run_no_user_code(host_configured, ip):
    assert ip.run_cell(CELL).success
    rt = ip.magics_manager.registry["ApolliaMagics"].runtime.rt
    ip.user_ns["runtime_handle"] = rt
    reads = [{"name": "notebook_get_variable", "arguments": {"name": n}}
             for n in [*REFUSED_READS, "probe", "leak", "numbers"]]
    sets = [{"name": "notebook_set_variable", "arguments": {"name": n, "value": 1}}
            for n in ("print", "open", "len", "display", "env", "os")]
    actor = [{"tool_calls": [*reads, call("notebook_list_variables"), *sets]}, {"text": "done"}]
    ip.run_cell_magic("apollia", "agent", manifest(actor=actor, max_steps=60))
    task = ip.run_cell_magic("apollia", "task clerk", "look around").join(20, settled=True)
    while task.status not in ("completed", "failed"):
        for card in task.pending:
            if card.waiting:
                card.answer("once")  # the operator allows every write: the tool still refuses
        task = task.join(20, settled=True)
    assert task.status == "completed", task.error
    got = results(rt, task.run_id)
    by_call = {r["call_id"]: r for r in got}
    ordered = [by_call[k] for k in sorted(by_call, key=lambda c: int(c.rsplit("-", 1)[1]))]
    refused = ordered[:len(REFUSED_READS)]
    assert [r["error_code"] for r in refused] == ["BAD_ARGUMENT"] * len(REFUSED_READS), refused
    probe, leak, numbers, listed = (r["output"] for r in ordered[len(REFUSED_READS):len(REFUSED_READS) + 4])
    assert probe == {"name": "probe", "type": "__main__.Probe", "note": probe["note"]} and "not shown" in probe["note"]
    assert not (Path(ip.user_ns["os"].getcwd()) / "PROBE_RAN").exists() and not Path("PROBE_RAN").exists()
    assert leak["value"] == "the token is [redacted: H_TOKEN]"
    assert numbers["value"] == [1, 2.5, None, "three", "four"]
    names = {v["name"] for v in listed["variables"]}
    assert {"leak", "numbers", "probe"} <= names and not names & set(REFUSED_READS)
    assert next(v for v in listed["variables"] if v["name"] == "probe")["summary"] == "<__main__.Probe>"
    setting = ordered[len(REFUSED_READS) + 4:]
    assert [r["error_code"] for r in setting] == ["BAD_ARGUMENT"] * 6, setting
    assert ip.user_ns["env"] is ip.user_ns["os"].environ and "print" not in ip.user_ns and "len" not in ip.user_ns
    assert TOKEN.encode() not in journal_bytes(rt)
    assert ip.run_cell("print('still here')").success


@pytest.mark.anyio
async def test_a_host_echoing_the_token_in_an_error_body_does_not_put_it_in_the_journal(home, monkeypatch):
    monkeypatch.setenv("H_TOKEN", TOKEN)
    host = LoopbackHost()
    host.answer = lambda method, path: (400, "application/json", json.dumps(
        {"error": "bad request", "auth": host.requests[-1]["headers"].get("Authorization")}).encode())
    with host:
        doc = home.path / "host.json"
        doc.write_text(openapi({"/notes/{id}": {"get": operation("getNote", params=("id",))}}))
        write_config(home, hosts={"h": {"base_url": host.url, "openapi": str(doc), "token_env": "H_TOKEN"}})
        async with Runtime(home, tool_sources=open_sources) as rt:
            await rt.register_agent(manifest(actor=[{"tool_calls": [call("rest:h/getNote", id="n1")]},
                                                    {"text": "done"}], required=["rest:h/getNote"]))
            task = await (await rt.submit("clerk", "Read note n1"))
            assert task.status == "completed", task.error
            assert host.requests[0]["headers"]["Authorization"] == f"Bearer {TOKEN}"  # the host did get it
            [result] = results(rt, task.run_id)
            assert result["error_code"] == "TOOL_PERMANENT"
            assert "[redacted: H_TOKEN]" in result["output"]["message"]
            assert TOKEN.encode() not in journal_bytes(rt)
            await assert_alive(rt)
