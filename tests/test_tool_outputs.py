"""Tool outputs are data, never a crash: whatever a tool or a host returns is normalised for the
digest, the journal and the model, or becomes a TOOL_PERMANENT result. A real Runtime, a scripted
agent, custom tools and a host of the test's own on 127.0.0.1; the runtime must stay alive."""

from __future__ import annotations

import json
import math
import sys

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apollia_nb.journal.entry import canonical_json
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.breaker import Breakers
from apollia_nb.runtime.tools import ToolDef, invoke
from loopback_host import LoopbackHost, openapi, operation
from runtime_helpers import assert_alive, call, manifest
from test_federation_support import results, write_config

pytestmark = pytest.mark.anyio


class RaisingRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


class RaisingStr(str):
    def __str__(self):
        raise RuntimeError("no str")


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str")


def cycle():
    items: list = [1]
    items.append(items)
    mapping: dict = {"a": items}
    mapping["self"] = mapping
    return mapping


def shared_explosion():
    """A DAG that a naive walk visits 2**40 times."""
    node: list = ["leaf"]
    for _ in range(40):
        node = [node, node]
    return node


def exits():
    sys.exit(3)


def raises(exc):
    def body():
        raise exc
    return body


#: (name, body) of tools whose outputs crashed the runtime or the run.
BAD = [
    ("surrogate", lambda: {"x": "\ud800"}),
    ("surrogate_key", lambda: {"\udfff": 1}),
    ("nan", lambda: {"x": math.nan, "y": [math.inf, -math.inf]}),
    ("huge_int", lambda: {"x": 10 ** 5000}),
    ("cycle", cycle),
    ("explosion", shared_explosion),
    ("bad_repr", lambda: {"x": RaisingRepr()}),
    ("bad_str", lambda: [RaisingStr("a")]),
    ("bad_bytes", lambda: b"\xff\xfe\x00"),
    ("set_mixed", lambda: {1, "1", None, 2.5}),
    ("error_surrogate", raises(ValueError("bad \ud800 value"))),
    ("error_unprintable", raises(Unprintable())),
    ("exits", exits),
]


def ok_json(value) -> None:
    """What the journal, the digest and a model client need of an output."""
    json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    canonical_json({"output": value})


async def test_no_output_a_tool_returns_ends_the_run_or_the_runtime(home):
    tools = [ToolDef.from_function(body, "read", name=name) for name, body in BAD]
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(
            manifest(actor=[{"tool_calls": [call(name) for name, _ in BAD]}, {"text": "done"}],
                     optional=[name for name, _ in BAD]),
            tools=tools)
        task = await (await rt.submit("clerk", "Look at everything"))
        assert task.status == "completed", task.error
        got = {r["tool"]: r for r in results(rt, task.run_id)}
        assert set(got) == {name for name, _ in BAD}
        for name in ("surrogate", "surrogate_key", "nan", "huge_int", "cycle", "explosion", "bad_repr",
                     "bad_str", "bad_bytes", "set_mixed"):
            assert got[name]["status"] == "ok", (name, got[name])
        assert got["surrogate"]["output"] == {"x": "\ufffd"}
        assert got["surrogate_key"]["output"] == {"\ufffd": 1}
        assert got["nan"]["output"] == {"x": "nan", "y": ["inf", "-inf"]}
        assert got["huge_int"]["output"]["x"].startswith("<int of ")
        assert got["cycle"]["output"] == {"a": [1, "<cycle>"], "self": "<cycle>"}
        assert "repr failed" in got["bad_repr"]["output"]["x"]
        assert got["bad_str"]["output"] == ["a"]
        assert got["bad_bytes"]["output"]["type"] == "bytes"
        for name in ("error_surrogate", "error_unprintable", "exits"):
            assert (got[name]["status"], got[name]["error_code"]) == ("error", "TOOL_PERMANENT"), got[name]
        assert "\ufffd" in got["error_surrogate"]["output"]["message"]
        await assert_alive(rt)


async def test_a_host_answering_a_lone_surrogate_does_not_stop_the_runtime(home):
    answers = {"/notes/1": (200, "application/json", b'{"x": "\\ud800", "n": NaN}')}
    with LoopbackHost(lambda method, path: answers.get(path, (404, "text/plain", b"no"))) as host:
        doc = home.path / "host.json"
        doc.write_text(openapi({"/notes/{id}": {"get": operation("getNote", params=("id",))}}))
        write_config(home, hosts={"h": {"base_url": host.url, "openapi": str(doc)}})
        async with Runtime(home, tool_sources=open_sources) as rt:
            await rt.register_agent(manifest(actor=[{"tool_calls": [call("rest:h/getNote", id="1")]},
                                                    {"text": "done"}], required=["rest:h/getNote"]))
            task = await (await rt.submit("clerk", "Read note 1"))
            assert task.status == "completed", task.error
            [result] = results(rt, task.run_id)
            assert result["status"] == "ok" and result["output"] == {"x": "\ufffd", "n": "nan"}
            await assert_alive(rt)


# Arbitrary outputs: text with lone surrogates, every float, ints of any size, bytes, containers.
texts = st.lists(st.characters() | st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]),
                 max_size=8).map("".join)
scalars = (st.none() | st.booleans() | st.floats(allow_nan=True, allow_infinity=True)
           | st.integers() | st.integers(min_value=10 ** 4400, max_value=10 ** 4500)
           | texts | st.binary())
outputs = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(texts | st.integers(), inner, max_size=4)
                   | st.frozensets(st.integers() | st.text(max_size=3), max_size=4)),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=outputs)
def test_invoke_turns_any_output_into_json_the_journal_accepts(value):
    tooldef = ToolDef(name="any", family="read", fn=lambda: value,
                      parameters={"type": "object", "properties": {}})

    async def run():
        return await invoke(tooldef, {}, breakers=Breakers())

    outcome = anyio.run(run)
    assert outcome.status == "ok", outcome.error
    ok_json(outcome.output)
    assert len(outcome.output_digest) == 64
