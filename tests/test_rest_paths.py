"""REST tools cannot leave the operation's path: a host of the test's own on 127.0.0.1 records what
reached it. Dot segments (also percent-encoded) are refused before anything is sent, a document whose
path keys are not paths is refused when loaded, and bodies are read up to a cap (JSON too)."""

from __future__ import annotations

import json

import pytest

from apollia_nb.errors import UnknownTool
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from loopback_host import LoopbackHost, openapi, operation
from runtime_helpers import assert_alive, call, manifest
from test_federation_support import results, write_config

pytestmark = pytest.mark.anyio

PATHS = {
    "/notes/{id}": {"get": operation("getNote", params=("id",))},
    "/notes/{id}/comments": {"post": operation("addComment", params=("id",),
                                               body={"type": "object", "properties": {"text": {"type": "string"}}})},
}
DOTS = ["..", ".", "%2e", "%2E%2E", ".%2e", "%2e.", "%252e%252e", ""]


def configure(home, host, paths=PATHS, **extra):
    doc = home.path / "host.json"
    doc.write_text(openapi(paths))
    write_config(home, hosts={"h": {"base_url": host.url, "openapi": str(doc), **extra}})


async def test_dot_segments_in_path_parameters_never_leave_the_operation(home):
    with LoopbackHost() as host:
        configure(home, host)
        calls = [call("rest:h/addComment", id=value, text="hi") for value in DOTS]
        calls += [call("rest:h/getNote", id=value) for value in DOTS]
        calls += [call("rest:h/getNote", id="a/../b"), call("rest:h/getNote", id="n1")]
        async with Runtime(home, tool_sources=open_sources) as rt:
            await rt.register_agent(manifest(actor=[{"tool_calls": calls}, {"text": "done"}],
                                             required=["rest:h/getNote", "rest:h/addComment"], max_steps=60))
            handle = await rt.submit("clerk", "Comment on the notes")
            while handle.status not in ("completed", "failed", "cancelled"):
                await handle.settled()
                for card in handle.pending:  # the operator allows every write: the tool still refuses
                    if card.waiting:
                        card.answer("once")
            assert handle.status == "completed", handle.error
            got = results(rt, handle.run_id)
            assert [(r["status"], r["error_code"]) for r in got[:-2]] == [("error", "BAD_ARGUMENT")] * (2 * len(DOTS))
            assert got[-2]["status"] == got[-1]["status"] == "ok"
            # only the two calls whose value is one segment reached the host, at the operation's path
            assert [(r["method"], r["path"]) for r in host.requests] == [("GET", "/notes/a%2F..%2Fb"),
                                                                      ("GET", "/notes/n1")]
            await assert_alive(rt)


@pytest.mark.parametrize("key", ["@127.0.0.2:9/x", "//127.0.0.2:9/x", "x/{id}", "/a/../{id}", "/a?{id}"])
async def test_a_path_key_that_is_not_a_path_is_refused_when_the_document_is_loaded(home, monkeypatch, key):
    monkeypatch.setenv("H_TOKEN", "secret-token-1")
    with LoopbackHost() as host:
        configure(home, host, paths={key: {"get": operation("getX", params=("id",))}}, token_env="H_TOKEN")
        async with Runtime(home, tool_sources=open_sources) as rt:
            with pytest.raises(UnknownTool, match="not a path under the base URL"):
                await rt.register_agent(manifest(actor=[{"tool_calls": [call("rest:h/getX", id="1")]}],
                                                 required=["rest:h/getX"]))
            assert host.requests == []
            assert "clerk" not in [a.name for a in rt.agents()]


async def test_a_large_json_body_is_read_up_to_the_cap_and_not_whole(home):
    from apollia_nb.federation.rest import BODY_CAP

    big = json.dumps({"items": ["x" * 1000] * 3000}).encode()  # 3 MB of JSON
    with LoopbackHost(lambda method, path: (200, "application/json", big)) as host:
        configure(home, host)
        async with Runtime(home, tool_sources=open_sources) as rt:
            await rt.register_agent(manifest(actor=[{"tool_calls": [call("rest:h/getNote", id="n1")]},
                                                    {"text": "done"}], required=["rest:h/getNote"]))
            task = await (await rt.submit("clerk", "Read it"))
            assert task.status == "completed", task.error
            [result] = results(rt, task.run_id)
            journaled = result["output"]  # cut by the journal; what the model saw is the whole output
            assert journaled["truncated"] is True and journaled["size"] < 70_000
            assert f'"bytes_read":{BODY_CAP}' in journaled["head"] and BODY_CAP < len(big)
