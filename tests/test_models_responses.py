"""The OpenAI Responses API provider (``[model] provider = "openai"``, ``api = "responses"``).

Replies are written from the API reference's item and event types (messages with
``output_text`` parts, ``function_call`` items with ``call_id``, ``reasoning`` items
with ``summary`` and ``encrypted_content``, the typed stream events ending with
``response.completed`` / ``.incomplete`` / ``.failed``) and served over real HTTP by
the fake server on 127.0.0.1.
"""

from __future__ import annotations

import json

import pytest
from fake_model_servers import (
    RESPONSES_USAGE,
    FakeModelServer,
    error_reply,
    fake_model_server,  # noqa: F401 - fixture
    responses_call,
    responses_events,
    responses_json,
    responses_message,
    responses_reasoning,
    responses_stream,
)

from apollia_nb.errors import ManifestInvalid, ModelKeyMissing, ModelPermanent, ModelTransient
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.models import (
    PLAN_TOOL,
    Message,
    ReasoningDelta,
    RetryPolicy,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallRequest,
    ToolCallStarted,
    ToolSpec,
    build_model,
)
from apollia_nb.runtime.models.base import ReasoningPart
from apollia_nb.runtime.models.responses import ResponsesModel


USER = [Message("system", "Be brief."), Message("user", "What is in the folder?")]
LIST_TOOL = ToolSpec("list_dir", "List a folder", {"type": "object", "properties": {"path": {"type": "string"}}})
ENCRYPTED = "gAAAAABoXr3Q1kLwVYk9hxG2zXWmQYkq3uXx7Qn4Nwzv3TL0p4ZcFAKE"


def model_at(server: FakeModelServer, **kw: object) -> ResponsesModel:
    kw.setdefault("retry", RetryPolicy(max_retries=0))
    return ResponsesModel(model="gpt-test", base_url=f"{server.url}/v1", api_key="sk-test", **kw)  # type: ignore[arg-type]


async def events_of(model, messages=USER, tools=(), role: str = "actor") -> list:
    return [e async for e in model.stream(role, messages, tools)]


# --------------------------------------------------------------------------- text, usage, the request


@pytest.mark.anyio
async def test_a_streamed_text_reply_and_the_request_it_answers(fake_model_server):
    fake_model_server.reply(responses_stream(responses_events([responses_message(["Two ", "files."])])))
    events = await events_of(model_at(fake_model_server, max_tokens=300, temperature=0.2))
    assert events[:-1] == [TextDelta("Two "), TextDelta("files.")]
    response = events[-1].response
    assert (response.text, response.tool_calls, response.stop_reason) == ("Two files.", (), "stop")
    assert response.usage == RESPONSES_USAGE
    request = fake_model_server.requests[0]
    assert request.path == "/v1/responses" and request.headers["authorization"] == "Bearer sk-test"
    assert request.json() == {
        "model": "gpt-test", "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
        "input": [{"type": "message", "role": "system", "content": "Be brief."},
                  {"type": "message", "role": "user", "content": "What is in the folder?"}],
        "temperature": 0.2, "max_output_tokens": 300}


@pytest.mark.anyio
async def test_a_json_reply_gives_what_the_stream_gives(fake_model_server):
    items = [responses_reasoning(["Look."], ENCRYPTED), responses_message(["Two files."])]
    fake_model_server.reply(responses_stream(responses_events(items)), responses_json(items))
    model = model_at(fake_model_server)
    streamed = await events_of(model)
    whole = await events_of(model)
    assert whole == streamed
    assert whole[:-1] == [ReasoningDelta("Look."), TextDelta("Two files.")]


# --------------------------------------------------------------------------- tool calls, reasoning items


@pytest.mark.anyio
async def test_a_function_call_round_trip_keeps_its_call_id_and_sends_the_reasoning_item_back(fake_model_server):
    fake_model_server.reply(
        responses_stream(responses_events([
            responses_reasoning(["I should ", "list it."], ENCRYPTED),
            responses_call("call_abc", "list_dir", ['{"pa', 'th": "."}'])])),
        responses_stream(responses_events([responses_message(["a.txt and b.txt"])])),
    )
    model = model_at(fake_model_server, reasoning_effort="high")
    events = await events_of(model, tools=[LIST_TOOL])
    assert events[:-1] == [
        ReasoningDelta("I should "), ReasoningDelta("list it."),
        ToolCallStarted("call_abc", "list_dir"),
        ToolCallArgumentsDelta("call_abc", '{"pa'), ToolCallArgumentsDelta("call_abc", 'th": "."}')]
    first = events[-1].response
    assert first.tool_calls == (ToolCallRequest("call_abc", "list_dir", {"path": "."}),)
    assert first.stop_reason == "tool_calls"
    item = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I should list it."}],
            "encrypted_content": ENCRYPTED}
    assert first.reasoning == (ReasoningPart("I should list it.", redacted=ENCRYPTED, source="reasoning_item",
                                             detail=item),)

    history = [*USER, Message("assistant", "", tool_calls=first.tool_calls, reasoning=first.reasoning),
               Message("tool", '["a.txt", "b.txt"]', tool_call_id="call_abc", name="list_dir")]
    assert (await model.complete("actor", history, [LIST_TOOL])).text == "a.txt and b.txt"
    body = fake_model_server.requests[1].json()
    assert body["input"][2:] == [
        item,
        {"type": "function_call", "call_id": "call_abc", "name": "list_dir", "arguments": '{"path": "."}'},
        {"type": "function_call_output", "call_id": "call_abc", "output": '["a.txt", "b.txt"]'}]
    assert body["tools"] == [{"type": "function", "name": "list_dir", "description": "List a folder",
                              "parameters": LIST_TOOL.parameters, "strict": False}]
    assert body["reasoning"] == {"effort": "high"} and "tool_choice" not in body


@pytest.mark.anyio
async def test_arguments_given_whole_at_done_and_several_calls_in_one_turn(fake_model_server):
    events = responses_events([responses_call("call_1", "list_dir", ['{"path": "a"}']),
                               responses_call("call_2", "list_dir", ['{"path": "b"}'])])
    events = [e for e in events if e["type"] != "response.function_call_arguments.delta"]
    fake_model_server.reply(responses_stream(events))
    got = await events_of(model_at(fake_model_server), tools=[LIST_TOOL])
    assert got[:-1] == [ToolCallStarted("call_1", "list_dir"), ToolCallArgumentsDelta("call_1", '{"path": "a"}'),
                        ToolCallStarted("call_2", "list_dir"), ToolCallArgumentsDelta("call_2", '{"path": "b"}')]
    assert [c.arguments for c in got[-1].response.tool_calls] == [{"path": "a"}, {"path": "b"}]


@pytest.mark.anyio
async def test_stored_responses_ask_for_no_encrypted_reasoning_and_a_forced_planner_in_tool_form(fake_model_server):
    fake_model_server.reply(responses_stream(responses_events([
        responses_call("call_p", "submit_plan", ['{"steps": ["List"]}'])])))
    await model_at(fake_model_server, store=True, structured="tools", reasoning_summary="auto").complete(
        "planner", USER, [PLAN_TOOL])
    body = fake_model_server.requests[0].json()
    assert body["store"] is True and "include" not in body
    assert body["tool_choice"] == "required" and body["reasoning"] == {"summary": "auto"}


# --------------------------------------------------------------------------- how a response ends


@pytest.mark.anyio
@pytest.mark.parametrize("reply", ["stream", "json"])
async def test_an_incomplete_response_at_max_output_tokens_stops_for_length(fake_model_server, reply):
    items = [responses_message(["It is"])]
    build = responses_stream(responses_events(items, status="incomplete", incomplete_reason="max_output_tokens")) \
        if reply == "stream" else responses_json(items, status="incomplete", incomplete_reason="max_output_tokens")
    fake_model_server.reply(build)
    response = await model_at(fake_model_server).complete("actor", USER)
    assert (response.text, response.stop_reason) == ("It is", "length")


@pytest.mark.anyio
@pytest.mark.parametrize(("event", "error"), [
    ({"type": "response.failed", "response": {"status": "failed", "output": [],
                                              "error": {"code": "server_error", "message": "try later"}}},
     ModelTransient),
    ({"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": None}, ModelTransient),
    ({"type": "response.failed", "response": {"status": "failed", "output": [],
                                              "error": {"code": "invalid_prompt", "message": "flagged"}}},
     ModelPermanent),
    ({"type": "error", "code": "invalid_image", "message": "cannot read the image", "param": None}, ModelPermanent),
])
async def test_failures_inside_a_stream_are_coded_like_the_chat_providers(fake_model_server, event, error):
    events = responses_events([responses_message(["x"])])[:2] + [dict(event, sequence_number=2)]
    fake_model_server.reply(responses_stream(events))
    with pytest.raises(error, match=r"openai: .*(try later|slow down|flagged|cannot read the image)") as info:
        await model_at(fake_model_server).complete("actor", USER)
    assert type(info.value) is error


@pytest.mark.anyio
async def test_a_stream_cut_before_its_terminal_event_is_transient_and_http_errors_are_shared(fake_model_server):
    cut = responses_events([responses_message(["Two ", "files."])])[:-1]
    fake_model_server.reply(responses_stream(cut))
    with pytest.raises(ModelTransient, match="the stream ended before the response was complete"):
        await model_at(fake_model_server).complete("actor", USER)
    fake_model_server.reply(error_reply(400, {"error": {"message": "Unsupported parameter: 'temperature'",
                                                        "type": "invalid_request_error"}}))
    with pytest.raises(ModelPermanent, match="openai: HTTP 400: Unsupported parameter: 'temperature'"):
        await model_at(fake_model_server).complete("actor", USER)
    waits: list[float] = []

    async def sleep(secs: float) -> None:
        waits.append(secs)

    fake_model_server.reply(error_reply(429, {"error": {"message": "busy"}}, {"retry-after-ms": "250"}),
                            responses_stream(responses_events([responses_message(["ok"])])))
    model = model_at(fake_model_server, retry=RetryPolicy(max_retries=1, sleep=sleep))
    assert (await model.complete("actor", USER)).text == "ok" and waits == [0.25]


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [
    [{"type": "response.function_call_arguments.delta", "output_index": 0, "item_id": "fc", "delta": "{}"}],
    [{"type": "response.output_item.added", "output_index": 0,
      "item": {"type": "function_call", "call_id": "c", "name": "", "arguments": ""}}],
    [{"type": "response.output_item.added", "output_index": 0,
      "item": {"type": "function_call", "call_id": "c", "name": "list_dir", "arguments": "[1]"}},
     {"type": "response.completed", "response": {"status": "completed", "output": []}}],
    [{"type": "response.output_text.delta", "output_index": 0, "item_id": "m", "delta": 7}],
    ["not json"],
])
async def test_malformed_items_and_events_are_permanent(fake_model_server, bad):
    fake_model_server.reply(responses_stream(bad))
    with pytest.raises(ModelPermanent, match="openai: "):
        await model_at(fake_model_server).complete("actor", USER, [LIST_TOOL])


# --------------------------------------------------------------------------- the manifest


def test_the_manifest_picks_the_responses_api_and_checks_its_keys():
    local = {"provider": "openai", "api": "responses", "model": "m", "base_url": "http://127.0.0.1:1/v1"}
    model = build_model({**local, "reasoning_effort": "low", "reasoning_summary": "detailed", "store": True,
                         "max_tokens": 64}, env={})
    assert isinstance(model, ResponsesModel) and model.name == "openai:m"
    assert (model.reasoning_effort, model.reasoning_summary, model.store, model.structured) == \
        ("low", "detailed", True, "native")
    for bad, match in [({"api": "assistants"}, r"model\.api: must be chat or responses"),
                       ({"stream_usage": False}, r"model\.stream_usage: unknown key"),
                       ({"reasoning_summary": "long"}, r"model\.reasoning_summary: must be one of"),
                       ({"store": "no"}, r"model\.store: must be true or false"),
                       ({"structured": "json"}, r"model\.structured: must be native or tools")]:
        with pytest.raises(ManifestInvalid, match=match):
            build_model({**local, **bad}, env={})
    with pytest.raises(ManifestInvalid, match=r"model\.store: unknown key"):
        build_model({**local, "api": "chat", "store": True}, env={})
    with pytest.raises(ModelKeyMissing, match="OPENAI_API_KEY"):
        build_model({"provider": "openai", "api": "responses", "model": "gpt-5"}, env={})


# --------------------------------------------------------------------------- a governed task


def _agent(url: str) -> str:
    return ('name = "responder"\ndescription = "d"\ninstructions = "List the folder."\n\n'
            f'[model]\nprovider = "openai"\napi = "responses"\nmodel = "gpt-test"\nbase_url = "{url}/v1"\n'
            'api_key_env = "TEST_OPENAI_KEY"\nmax_retries = 0\n\n[tools]\nrequired = ["list_dir"]\n')


@pytest.mark.anyio
async def test_a_task_over_the_responses_api_round_trips_calls_and_reasoning_and_replays_identical(
        home, monkeypatch, fake_model_server):
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-test")
    fake_model_server.reply(
        responses_stream(responses_events([responses_message(['{"steps": ', '["List the folder"]}'])])),
        responses_stream(responses_events([responses_reasoning(["List it."], ENCRYPTED),
                                           responses_call("call_x", "list_dir", ['{"path": "."}'])])),
        responses_stream(responses_events([responses_message(["The folder is empty."])])),
        responses_stream(responses_events([responses_message(['{"verdict": "pass", "reasons": []}'])])),
    )
    async with Runtime(home) as rt:
        await rt.register_agent(_agent(fake_model_server.url))
        task = await (await rt.submit("responder", "List the folder"))
        assert task.status == "completed", task.error
        assert task.result == "The folder is empty."
        planner, actor1, actor2, critic = (r.json() for r in fake_model_server.requests)
        assert planner["text"]["format"]["name"] == "submit_plan" and "tools" not in planner
        assert actor1["tools"][0]["name"] == "list_dir"
        kinds = [(i["type"], i.get("role")) for i in actor2["input"]]
        assert kinds[-3:] == [("reasoning", None), ("function_call", None), ("function_call_output", None)]
        call, output = actor2["input"][-2:]
        assert call["call_id"] == output["call_id"] and actor2["input"][-3]["encrypted_content"] == ENCRYPTED
        assert critic["text"]["format"]["name"] == "submit_verdict"

        turns = [json.loads(e.payload) for e in rt.journal.entries(run_id=task.run_id) if e.kind == "model_response"]
        assert turns[0]["structured"][0]["arguments"] == {"steps": ["List the folder"]}
        assert turns[1]["reasoning"][0]["redacted"] == ENCRYPTED and turns[1]["usage"] == RESPONSES_USAGE
        assert rt.replay(task.run_id).verdict == "identical"
