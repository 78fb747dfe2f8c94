"""``http_request`` goes through no proxy the card does not show: the proxy environment variables are
ignored, and a proxy configured in ``[tools.http_request]`` is used and named on the card. A target and a
proxy of the test's own on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from apollia_nb.runtime import Runtime
from loopback_host import LoopbackHost
from runtime_helpers import assert_alive, call, manifest

pytestmark = pytest.mark.anyio


def ok(method, path):
    return (200, "text/plain", b"hello")


async def test_proxy_environment_variables_are_ignored(home, monkeypatch):
    with LoopbackHost(ok) as target, LoopbackHost(ok) as proxy:
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(name, proxy.url)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        async with Runtime(home) as rt:
            rt.governance.grant_consent("clerk", "send", by="test")
            await rt.register_agent(manifest(actor=[{"tool_calls": [call("http_request", url=f"{target.url}/x",
                                                                         method="POST", body="private")]},
                                                    {"text": "sent"}]))
            task = await (await rt.submit("clerk", "Send it"))
            assert task.status == "completed", task.error
            assert proxy.requests == []  # the proxy the card never mentioned saw nothing
            assert [(r["path"], r["body"]) for r in target.requests] == [("/x", b"private")]
            await assert_alive(rt)


async def test_a_configured_proxy_is_used_and_shown_on_the_card(home, monkeypatch):
    with LoopbackHost(ok) as proxy:
        monkeypatch.delenv("HTTP_PROXY", raising=False)
        home.config_path.write_text(f'[tools.http_request]\nproxy = "{proxy.url}"\n')
        async with Runtime(home) as rt:
            await rt.register_agent(manifest(actor=[{"tool_calls": [call("http_request",
                                                                         url="http://127.0.0.1:9/y")]},
                                                    {"text": "sent"}]))
            handle = await rt.submit("clerk", "Fetch it")
            await handle.settled()
            [card] = handle.pending
            assert card.hints == {"proxy": proxy.url}
            card.answer("once")
            await handle.settled()
            assert handle.status == "completed", handle.error
            assert [r["path"] for r in proxy.requests] == ["http://127.0.0.1:9/y"]  # a proxy request
            results = [json.loads(e.payload) for e in rt.journal.entries(run_id=handle.run_id)
                       if e.kind == "tool_result"]
            assert results[0]["output"]["status"] == 200
