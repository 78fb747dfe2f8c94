"""The openai provider against a fake chat-completions server on 127.0.0.1."""

from __future__ import annotations

import json
import socket

import anyio
import pytest
from fake_model_servers import (
    FakeModelServer,
    Reply,
    error_reply,
    fake_model_server,  # noqa: F401 - fixture
    openai_json,
    openai_stream,
    openai_text_chunks,
    openai_tool_chunks,
    openai_model,
)

from apollia_nb.errors import BadInput, ManifestInvalid, ModelPermanent, ModelTransient
from apollia_nb.runtime.models import (
    PLAN_TOOL,
    Completed,
    Message,
    RetryPolicy,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallRequest,
    ToolCallStarted,
    ToolSpec,
    build_model,
    parse_plan,
)
from apollia_nb.runtime.models.openai import OpenAIModel, OpenAIStreamParser


NO_RETRY = RetryPolicy(max_retries=0)
USER = [Message("user", "Say hello")]
WRITE_TOOL = ToolSpec(
    "write_file",
    "Write a file",
    {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path"]},
)


def model_for(server: FakeModelServer, **kw: object) -> OpenAIModel:
    return openai_model(server, model="llama3.1", **kw)


async def events_of(model: OpenAIModel, role: str = "actor", messages=USER, tools=()) -> list:
    return [e async for e in model.stream(role, messages, tools)]


# --------------------------------------------------------------------------- streaming


@pytest.mark.anyio
async def test_streamed_text_arrives_as_deltas_in_order_then_the_whole_reply(fake_model_server):
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    fake_model_server.reply(openai_stream(openai_text_chunks(["Hel", "lo ", "world"], usage=usage)))
    events = await events_of(model_for(fake_model_server))
    assert events[:-1] == [TextDelta("Hel"), TextDelta("lo "), TextDelta("world")]
    assert isinstance(events[-1], Completed)
    response = events[-1].response
    assert response.text == "Hello world"
    assert response.tool_calls == ()
    assert response.stop_reason == "stop"
    assert response.usage == usage


@pytest.mark.anyio
async def test_a_tool_call_whose_arguments_arrive_in_fragments(fake_model_server):
    fragments = ['{"pa', 'th": "notes/a', '.txt", "content"', ': "hi"}']
    fake_model_server.reply(openai_stream(openai_tool_chunks([("call_1", "write_file", fragments)])))
    events = await events_of(model_for(fake_model_server), tools=[WRITE_TOOL])
    assert events[0] == ToolCallStarted("call_1", "write_file")
    assert events[1:-1] == [ToolCallArgumentsDelta("call_1", f) for f in fragments]
    response = events[-1].response
    assert response.tool_calls == (ToolCallRequest("call_1", "write_file", {"path": "notes/a.txt", "content": "hi"}),)
    assert response.stop_reason == "tool_calls"
    assert response.text == ""


@pytest.mark.anyio
async def test_two_parallel_tool_calls_with_interleaved_fragments(fake_model_server):
    calls = [("call_a", "read_file", ['{"path":', ' "a.txt"}']), ("call_b", "list_dir", ['{"pa', 'th": "."', "}"])]
    fake_model_server.reply(openai_stream(openai_tool_chunks(calls, interleave=True)))
    events = await events_of(model_for(fake_model_server))
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert started == [ToolCallStarted("call_a", "read_file"), ToolCallStarted("call_b", "list_dir")]
    by_call = {cid: "".join(e.fragment for e in events if isinstance(e, ToolCallArgumentsDelta) and e.id == cid)
               for cid in ("call_a", "call_b")}
    assert by_call == {"call_a": '{"path": "a.txt"}', "call_b": '{"path": "."}'}
    assert events[-1].response.tool_calls == (
        ToolCallRequest("call_a", "read_file", {"path": "a.txt"}),
        ToolCallRequest("call_b", "list_dir", {"path": "."}),
    )


@pytest.mark.anyio
async def test_complete_returns_what_the_stream_completes_with(fake_model_server):
    fake_model_server.reply(openai_stream(openai_text_chunks(["Hi", " there"])))
    response = await model_for(fake_model_server).complete("actor", USER)
    assert response.text == "Hi there"


@pytest.mark.anyio
async def test_a_non_streamed_json_response_is_accepted(fake_model_server):
    fake_model_server.reply(
        openai_json("Planning.", [("call_9", "submit_plan", '{"steps": ["a", "b"]}')], usage={"total_tokens": 4})
    )
    model = model_for(fake_model_server)
    response = await model.complete("planner", USER, [PLAN_TOOL])
    assert response.text == "Planning."
    assert parse_plan(response) == ["a", "b"]
    assert response.usage == {"total_tokens": 4}
    fake_model_server.reply(openai_json("Just text"))
    events = await events_of(model)
    assert events == [TextDelta("Just text"), Completed(events[-1].response)]
    assert events[-1].response.stop_reason == "stop"


@pytest.mark.anyio
async def test_an_ollama_style_tool_call_sent_whole_in_one_chunk(fake_model_server):
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"id": "call_x", "function": {"name": "read_file", "arguments": {"path": "a"}}}]}, "finish_reason": None}]}
    fake_model_server.reply(openai_stream([chunk, {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]))
    response = await model_for(fake_model_server).complete("actor", USER)
    assert response.tool_calls == (ToolCallRequest("call_x", "read_file", {"path": "a"}),)


# --------------------------------------------------------------------------- request shape


@pytest.mark.anyio
async def test_the_request_translates_messages_and_tools_and_sends_the_key(fake_model_server):
    fake_model_server.reply(openai_stream(openai_text_chunks(["ok"])))
    model = build_model(
        {"provider": "openai", "base_url": f"{fake_model_server.url}/v1/", "model": "gpt-test",
         "api_key_env": "MY_KEY", "temperature": 0.2, "max_tokens": 99, "max_retries": 0},
        env={"MY_KEY": "sk-secret"},
    )
    history = [
        Message("system", "You keep notes."),
        Message("user", "Write a.txt"),
        Message("assistant", "", tool_calls=(ToolCallRequest("call_1", "write_file", {"path": "a.txt"}),)),
        Message("tool", "wrote 0 bytes", tool_call_id="call_1", name="write_file"),
        Message("assistant", "Wrote it."),
    ]
    await model.complete("actor", history, [WRITE_TOOL])
    (request,) = fake_model_server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-secret"
    body = request.json()
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["temperature"] == 0.2
    assert body["max_tokens"] == 99
    assert "tool_choice" not in body
    assert body["tools"] == [{"type": "function", "function": {
        "name": "write_file", "description": "Write a file", "parameters": WRITE_TOOL.parameters}}]
    assert body["messages"] == [
        {"role": "system", "content": "You keep notes."},
        {"role": "user", "content": "Write a.txt"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": '{"path": "a.txt"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "wrote 0 bytes"},
        {"role": "assistant", "content": "Wrote it."},
    ]


@pytest.mark.anyio
async def test_without_a_key_there_is_no_authorization_header_and_the_planner_must_call_its_tool(fake_model_server):
    fake_model_server.reply(openai_stream(openai_tool_chunks([("c", "submit_plan", ['{"steps": ["x"]}'])])))
    model = model_for(fake_model_server)
    response = await model.complete("planner", USER, [PLAN_TOOL])
    assert parse_plan(response) == ["x"]
    (request,) = fake_model_server.requests
    assert "authorization" not in request.headers
    body = request.json()
    assert body["tool_choice"] == "required"
    assert "temperature" not in body and "max_tokens" not in body
    fake_model_server.reply(openai_stream(openai_text_chunks(["ok"])))
    await OpenAIModel(model="m", base_url=f"{fake_model_server.url}/v1", force_tools=False, retry=NO_RETRY).complete(
        "planner", USER, [PLAN_TOOL])
    assert "tool_choice" not in fake_model_server.requests[1].json()


# --------------------------------------------------------------------------- errors


@pytest.mark.anyio
@pytest.mark.parametrize("status", [429, 500, 503])
async def test_rate_limits_and_server_errors_are_transient(fake_model_server, status):
    fake_model_server.reply(error_reply(status, {"error": {"message": "slow down please", "type": "x"}}))
    with pytest.raises(ModelTransient, match="slow down please") as info:
        await model_for(fake_model_server).complete("actor", USER)
    assert f"HTTP {status}" in info.value.message


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (400, {"error": {"message": "messages: bad role", "type": "invalid_request_error"}}, "messages: bad role"),
        (401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}, "Incorrect API key"),
        (404, {"error": "model 'llama9' not found, try pulling it first"}, "model 'llama9' not found"),
        (422, {"object": "error", "message": "vLLM says no", "type": "BadRequestError"}, "vLLM says no"),
    ],
)
async def test_other_client_errors_are_permanent_with_the_servers_message(fake_model_server, status, body, message):
    fake_model_server.reply(error_reply(status, body))
    with pytest.raises(ModelPermanent, match=message):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
async def test_a_server_that_hangs_before_answering_is_a_transient_timeout(fake_model_server):
    fake_model_server.reply(Reply(hang_before=True))
    with pytest.raises(ModelTransient, match=r"no answer within 0\.3 s"):
        await model_for(fake_model_server, timeout_secs=0.3).complete("actor", USER)


@pytest.mark.anyio
async def test_a_stream_that_stalls_midway_is_a_transient_timeout(fake_model_server):
    fake_model_server.reply(openai_stream(openai_text_chunks(["Hel", "lo"]), hang_after=2))
    seen = []
    with pytest.raises(ModelTransient):
        async for event in model_for(fake_model_server, timeout_secs=0.3).stream("actor", USER):
            seen.append(event)
    assert seen == [TextDelta("Hel")]


@pytest.mark.anyio
async def test_cancelling_a_stream_in_flight_stops_it_at_once(fake_model_server):
    fake_model_server.reply(openai_stream(openai_text_chunks(["Hel", "lo"]), hang_after=2))
    seen = []
    with anyio.CancelScope() as scope:
        async for event in model_for(fake_model_server, timeout_secs=30).stream("actor", USER):
            seen.append(event)
            scope.cancel()
    assert scope.cancelled_caught
    assert seen == [TextDelta("Hel")]


@pytest.mark.anyio
async def test_a_connection_refused_is_transient():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAIModel(model="m", base_url=f"http://127.0.0.1:{port}/v1", retry=NO_RETRY)
    with pytest.raises(ModelTransient, match="cannot reach"):
        await model.complete("actor", USER)


@pytest.mark.anyio
async def test_a_dropped_connection_mid_stream_is_transient(fake_model_server):
    fake_model_server.reply(openai_stream(openai_text_chunks(["a", "b", "c"]), drop_after=2))
    with pytest.raises(ModelTransient):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
async def test_a_stream_that_ends_without_done_or_finish_reason_is_transient(fake_model_server):
    chunks = openai_text_chunks(["a"])[:-1]
    fake_model_server.reply(openai_stream(chunks, done=False))
    with pytest.raises(ModelTransient, match="ended before the reply was complete"):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
async def test_malformed_json_in_the_stream_is_permanent(fake_model_server):
    fake_model_server.reply(openai_stream([openai_text_chunks(["a"])[1], '{"choices": [{"delta": {"content": "b"']))
    with pytest.raises(ModelPermanent, match="malformed JSON"):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
async def test_malformed_tool_arguments_are_permanent(fake_model_server):
    fake_model_server.reply(openai_stream(openai_tool_chunks([("c1", "write_file", ['{"path": "a', "txt"])])))
    with pytest.raises(ModelPermanent, match="malformed JSON arguments for tool write_file"):
        await model_for(fake_model_server).complete("actor", USER)
    fake_model_server.reply(openai_stream(openai_tool_chunks([("c1", "write_file", ['["a"]'])])))
    with pytest.raises(ModelPermanent, match="not a JSON object"):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "error"), [("server_error", ModelTransient), ("invalid_request_error", ModelPermanent)])
async def test_an_error_object_inside_the_stream_is_classified(fake_model_server, kind, error):
    fake_model_server.reply(openai_stream([{"error": {"message": "boom inside", "type": kind}}]))
    with pytest.raises(error, match="boom inside"):
        await model_for(fake_model_server).complete("actor", USER)


# --------------------------------------------------------------------------- retries


class RecordingSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@pytest.mark.anyio
async def test_transient_failures_are_retried_honouring_retry_after_up_to_a_cap(fake_model_server):
    sleep = RecordingSleep()
    fake_model_server.reply(
        error_reply(503, {"error": {"message": "busy"}}, {"retry-after": "7"}),
        error_reply(429, {"error": {"message": "later"}}, {"retry-after": "1000"}),
        openai_stream(openai_text_chunks(["finally"])),
    )
    model = model_for(fake_model_server, retry=RetryPolicy(max_retries=2, max_delay_secs=30, sleep=sleep))
    response = await model.complete("actor", USER)
    assert response.text == "finally"
    assert sleep.delays == [7.0, 30.0]
    assert len(fake_model_server.requests) == 3


@pytest.mark.anyio
async def test_retries_back_off_exponentially_and_give_up_after_max_retries(fake_model_server):
    sleep = RecordingSleep()
    fake_model_server.reply(*[error_reply(502, {"error": {"message": f"bad gateway {i}"}}) for i in range(3)])
    model = model_for(fake_model_server, retry=RetryPolicy(max_retries=2, backoff_base_secs=0.5, sleep=sleep))
    with pytest.raises(ModelTransient, match="bad gateway 2"):
        await model.complete("actor", USER)
    assert sleep.delays == [0.5, 1.0]
    assert len(fake_model_server.requests) == 3


@pytest.mark.anyio
async def test_permanent_errors_and_half_delivered_streams_are_not_retried(fake_model_server):
    sleep = RecordingSleep()
    model = model_for(fake_model_server, retry=RetryPolicy(max_retries=3, sleep=sleep))
    fake_model_server.reply(error_reply(400, {"error": {"message": "nope"}}))
    with pytest.raises(ModelPermanent):
        await model.complete("actor", USER)
    fake_model_server.reply(openai_stream(openai_text_chunks(["a", "b", "c"]), drop_after=3))
    seen = []
    with pytest.raises(ModelTransient):
        async for event in model.stream("actor", USER):
            seen.append(event)
    assert seen == [TextDelta("a"), TextDelta("b")]
    assert sleep.delays == []
    assert len(fake_model_server.requests) == 2


# --------------------------------------------------------------------------- construction and the pure parser


def test_build_model_checks_the_openai_table():
    with pytest.raises(ManifestInvalid, match=r"model\.model: missing required key"):
        build_model({"provider": "openai", "base_url": "http://127.0.0.1:1/v1"}, env={})
    with pytest.raises(ManifestInvalid, match=r"model\.api_kee: unknown key"):
        build_model({"provider": "openai", "model": "m", "api_kee": "X"}, env={})
    with pytest.raises(ManifestInvalid, match=r"model\.api_key_env: environment variable NOPE is not set"):
        build_model({"provider": "openai", "model": "m", "api_key_env": "NOPE"}, env={})
    with pytest.raises(ManifestInvalid, match=r"model\.timeout_secs: must be a number"):
        build_model({"provider": "openai", "model": "m", "timeout_secs": "5"}, env={})
    with pytest.raises(ManifestInvalid, match=r"model\.timeout_secs: must be positive"):
        build_model({"provider": "openai", "model": "m", "timeout_secs": 0}, env={})
    with pytest.raises(ManifestInvalid, match=r"model\.max_retries: must be an integer"):
        build_model({"provider": "openai", "model": "m", "max_retries": True}, env={})
    model = build_model({"provider": "openai", "model": "qwen", "base_url": "http://127.0.0.1:11434/v1"}, env={})
    assert isinstance(model, OpenAIModel)
    assert model.name == "openai:qwen"
    assert model.api_key is None and model.retry.max_retries == 2


@pytest.mark.anyio
async def test_an_unknown_role_is_refused_before_any_request(fake_model_server):
    with pytest.raises(BadInput, match="model role 'judge'"):
        await model_for(fake_model_server).complete("judge", USER)
    assert fake_model_server.requests == []


def test_the_parser_reassembles_any_split_of_the_argument_json():
    arguments = {"path": "dir/ä.txt", "content": "line\n\"quoted\"", "n": [1, 2]}
    text = json.dumps(arguments)
    for cut in range(len(text) + 1):
        parser = OpenAIStreamParser()
        for fragment in ({"index": 0, "id": "c", "function": {"name": "w", "arguments": text[:cut]}},
                         {"index": 0, "function": {"arguments": text[cut:]}}):
            parser.feed_sse(None, json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [fragment]}}]}))
        parser.feed_sse(None, "[DONE]")
        assert parser.finish().tool_calls == (ToolCallRequest("c", "w", arguments),)
