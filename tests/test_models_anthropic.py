"""The anthropic provider against a fake Messages API server on 127.0.0.1."""

from __future__ import annotations

import pytest
from fake_model_servers import (
    Reply,
    anthropic_message,
    anthropic_stream,
    anthropic_text_events,
    anthropic_tool_events,
    error_reply,
    fake_model_server,  # noqa: F401 - fixture
    anthropic_model,
)

from apollia_nb.errors import ManifestInvalid, ModelPermanent, ModelTransient
from apollia_nb.runtime.models import (
    VERDICT_TOOL,
    Completed,
    Message,
    RetryPolicy,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallRequest,
    ToolCallStarted,
    ToolSpec,
    build_model,
    parse_verdict,
)
from apollia_nb.runtime.models.anthropic import AnthropicModel, to_anthropic_messages


USER = [Message("user", "Say hello")]
READ_TOOL = ToolSpec("read_file", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}})


model_for = anthropic_model


async def events_of(model: AnthropicModel, role: str = "actor", messages=USER, tools=()) -> list:
    return [e async for e in model.stream(role, messages, tools)]


# --------------------------------------------------------------------------- streaming


@pytest.mark.anyio
async def test_streamed_text_arrives_as_deltas_in_order_then_the_whole_reply(fake_model_server):
    fake_model_server.reply(anthropic_stream(anthropic_text_events(["Hel", "lo ", "world"])))
    events = await events_of(model_for(fake_model_server))
    assert events[:-1] == [TextDelta("Hel"), TextDelta("lo "), TextDelta("world")]
    response = events[-1].response
    assert isinstance(events[-1], Completed)
    assert response.text == "Hello world"
    assert response.stop_reason == "end_turn"
    assert response.usage == {"input_tokens": 10, "output_tokens": 5}


@pytest.mark.anyio
async def test_a_tool_use_whose_input_arrives_in_fragments(fake_model_server):
    fragments = ["", '{"path', '": "notes/', 'a.txt"}']
    fake_model_server.reply(
        anthropic_stream(anthropic_tool_events([("toolu_1", "read_file", fragments)], text=["Let me ", "look."]))
    )
    events = await events_of(model_for(fake_model_server), tools=[READ_TOOL])
    assert events[:-1] == [
        TextDelta("Let me "),
        TextDelta("look."),
        ToolCallStarted("toolu_1", "read_file"),
        *[ToolCallArgumentsDelta("toolu_1", f) for f in fragments if f],
    ]
    response = events[-1].response
    assert response.text == "Let me look."
    assert response.tool_calls == (ToolCallRequest("toolu_1", "read_file", {"path": "notes/a.txt"}),)
    assert response.stop_reason == "tool_use"


@pytest.mark.anyio
async def test_two_tool_uses_in_one_turn(fake_model_server):
    calls = [("toolu_a", "read_file", ['{"path": ', '"a"}']), ("toolu_b", "list_dir", ["", '{"path": "."}'])]
    fake_model_server.reply(anthropic_stream(anthropic_tool_events(calls)))
    response = await model_for(fake_model_server).complete("actor", USER, [READ_TOOL])
    assert response.tool_calls == (
        ToolCallRequest("toolu_a", "read_file", {"path": "a"}),
        ToolCallRequest("toolu_b", "list_dir", {"path": "."}),
    )


@pytest.mark.anyio
async def test_a_tool_use_without_input_has_empty_arguments(fake_model_server):
    fake_model_server.reply(anthropic_stream(anthropic_tool_events([("toolu_1", "notebook_list_variables", [])])))
    response = await model_for(fake_model_server).complete("actor", USER)
    assert response.tool_calls == (ToolCallRequest("toolu_1", "notebook_list_variables", {}),)


@pytest.mark.anyio
async def test_a_non_streamed_message_is_accepted(fake_model_server):
    fake_model_server.reply(
        anthropic_message(
            [{"type": "text", "text": "Checked."},
             {"type": "tool_use", "id": "toolu_v", "name": "submit_verdict",
              "input": {"verdict": "fail", "reasons": ["summary.txt is empty"]}}],
            stop_reason="tool_use",
        )
    )
    response = await model_for(fake_model_server).complete("critic", USER, [VERDICT_TOOL])
    assert response.text == "Checked."
    assert parse_verdict(response) == ("fail", ["summary.txt is empty"])
    assert response.usage == {"input_tokens": 3, "output_tokens": 4}


@pytest.mark.anyio
async def test_unknown_events_and_thinking_deltas_are_ignored(fake_model_server):
    events = anthropic_text_events(["ok"])
    extra = [
        ("content_block_start", {"type": "content_block_start", "index": 5, "content_block": {"type": "thinking", "thinking": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 5, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
        ("future_event", {"type": "future_event", "anything": 1}),
    ]
    fake_model_server.reply(anthropic_stream(events[:2] + extra + events[2:]))
    response = await model_for(fake_model_server).complete("actor", USER)
    assert response.text == "ok"


# --------------------------------------------------------------------------- request shape


@pytest.mark.anyio
async def test_the_request_separates_system_and_merges_tool_results(fake_model_server):
    fake_model_server.reply(anthropic_stream(anthropic_text_events(["ok"])))
    model = build_model(
        {"provider": "anthropic", "model": "claude-x", "base_url": fake_model_server.url, "max_tokens": 512,
         "temperature": 0.0, "max_retries": 0},
        env={"ANTHROPIC_API_KEY": "sk-ant-secret"},
    )
    history = [
        Message("system", "You keep notes."),
        Message("system", "Be brief."),
        Message("user", "Read a and b"),
        Message("assistant", "Reading.", tool_calls=(
            ToolCallRequest("toolu_a", "read_file", {"path": "a"}),
            ToolCallRequest("toolu_b", "read_file", {"path": "b"}))),
        Message("tool", "A", tool_call_id="toolu_a", name="read_file"),
        Message("tool", "B", tool_call_id="toolu_b", name="read_file"),
        Message("user", "And summarise."),
        Message("assistant", "Both say hello."),
    ]
    await model.complete("actor", history, [READ_TOOL])
    (request,) = fake_model_server.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-secret"
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert request.headers["content-type"] == "application/json"
    assert "authorization" not in request.headers
    body = request.json()
    assert body["model"] == "claude-x"
    assert body["max_tokens"] == 512
    assert body["temperature"] == 0.0
    assert body["stream"] is True
    assert body["system"] == "You keep notes.\n\nBe brief."
    assert body["tools"] == [{"name": "read_file", "description": "Read a file", "input_schema": READ_TOOL.parameters}]
    assert "tool_choice" not in body
    assert body["messages"] == [
        {"role": "user", "content": "Read a and b"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a"}},
            {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {"path": "b"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "A"},
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": "B"},
            {"type": "text", "text": "And summarise."}]},
        {"role": "assistant", "content": "Both say hello."},
    ]


@pytest.mark.anyio
async def test_the_critic_offered_one_tool_must_call_it_and_defaults_apply(fake_model_server):
    fake_model_server.reply(
        anthropic_stream(anthropic_tool_events([("t", "submit_verdict", ['{"verdict": "pass", "reasons": []}'])]))
    )
    response = await model_for(fake_model_server).complete("critic", USER, [VERDICT_TOOL])
    assert parse_verdict(response) == ("pass", [])
    body = fake_model_server.requests[0].json()
    assert body["tool_choice"] == {"type": "any"}
    assert body["max_tokens"] == 4096
    assert "system" not in body and "temperature" not in body


def test_tool_results_after_an_assistant_turn_open_a_new_user_message():
    system, messages = to_anthropic_messages([
        Message("user", "go"),
        Message("assistant", "", tool_calls=(ToolCallRequest("t1", "x", {}),)),
        Message("tool", "r1", tool_call_id="t1"),
        Message("assistant", "", tool_calls=(ToolCallRequest("t2", "x", {}),)),
        Message("tool", "r2", tool_call_id="t2"),
        Message("assistant", ""),  # empty turns are refused by the API: left out
    ])
    assert system is None
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"] == [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]
    assert messages[4]["content"] == [{"type": "tool_result", "tool_use_id": "t2", "content": "r2"}]


# --------------------------------------------------------------------------- errors


@pytest.mark.anyio
@pytest.mark.parametrize("status", [429, 500, 503, 529])
async def test_rate_limits_overload_and_server_errors_are_transient(fake_model_server, status):
    fake_model_server.reply(error_reply(status, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    with pytest.raises(ModelTransient, match=f"HTTP {status}: Overloaded"):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "kind", "message"),
    [(400, "invalid_request_error", "max_tokens: must be positive"),
     (401, "authentication_error", "invalid x-api-key")],
)
async def test_other_client_errors_are_permanent_with_the_servers_message(fake_model_server, status, kind, message):
    fake_model_server.reply(error_reply(status, {"type": "error", "error": {"type": kind, "message": message}}))
    with pytest.raises(ModelPermanent, match=message):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "error"), [("overloaded_error", ModelTransient), ("invalid_request_error", ModelPermanent)])
async def test_an_error_event_in_the_stream_is_classified(fake_model_server, kind, error):
    events = anthropic_text_events(["par", "tial"])[:4]
    events.append(("error", {"type": "error", "error": {"type": kind, "message": "stream broke"}}))
    fake_model_server.reply(anthropic_stream(events))
    seen = []
    with pytest.raises(error, match=f"{kind}: stream broke"):
        async for event in model_for(fake_model_server).stream("actor", USER):
            seen.append(event)
    assert seen == [TextDelta("par")]


@pytest.mark.anyio
async def test_a_server_that_hangs_is_a_transient_timeout(fake_model_server):
    fake_model_server.reply(Reply(hang_before=True))
    with pytest.raises(ModelTransient, match=r"no answer within 0\.3 s"):
        await model_for(fake_model_server, timeout_secs=0.3).complete("actor", USER)


@pytest.mark.anyio
async def test_a_stream_cut_before_message_stop_is_transient(fake_model_server):
    fake_model_server.reply(anthropic_stream(anthropic_text_events(["a"])[:-1]))
    with pytest.raises(ModelTransient, match="ended before message_stop"):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
async def test_malformed_event_data_is_permanent(fake_model_server):
    events = anthropic_text_events(["a"])
    events.insert(3, ("content_block_delta", '{"type": "content_block_delta", "index": 0, "delta": {"type": "text_de'))
    fake_model_server.reply(anthropic_stream(events))
    with pytest.raises(ModelPermanent, match="malformed JSON"):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
async def test_an_event_missing_its_fields_is_permanent(fake_model_server):
    events = anthropic_text_events(["a"])
    events.insert(3, ("content_block_delta", {"type": "content_block_delta", "index": 0}))
    fake_model_server.reply(anthropic_stream(events))
    with pytest.raises(ModelPermanent, match="malformed content_block_delta event"):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
async def test_malformed_tool_input_is_permanent(fake_model_server):
    fake_model_server.reply(anthropic_stream(anthropic_tool_events([("t", "read_file", ['{"path": '])])))
    with pytest.raises(ModelPermanent, match="malformed JSON arguments for tool read_file"):
        await model_for(fake_model_server).complete("actor", USER)


@pytest.mark.anyio
async def test_an_overloaded_server_is_retried_then_answers(fake_model_server):
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)

    fake_model_server.reply(
        error_reply(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
                    {"retry-after": "2"}),
        anthropic_stream(anthropic_text_events(["back"])),
    )
    model = model_for(fake_model_server, retry=RetryPolicy(max_retries=1, sleep=sleep))
    assert (await model.complete("actor", USER)).text == "back"
    assert delays == [2.0]


# --------------------------------------------------------------------------- construction


def test_build_model_checks_the_anthropic_table():
    with pytest.raises(ManifestInvalid, match=r"model\.api_key_env: environment variable ANTHROPIC_API_KEY is not set"):
        build_model({"provider": "anthropic", "model": "claude"}, env={})
    with pytest.raises(ManifestInvalid, match=r"model\.max_tokens: must be positive"):
        build_model({"provider": "anthropic", "model": "claude", "max_tokens": 0}, env={"ANTHROPIC_API_KEY": "k"})
    with pytest.raises(ManifestInvalid, match=r"model\.stream: unknown key"):
        build_model({"provider": "anthropic", "model": "claude", "stream": False}, env={"ANTHROPIC_API_KEY": "k"})
    model = build_model({"provider": "anthropic", "model": "claude", "api_key_env": "K"}, env={"K": "secret"})
    assert isinstance(model, AnthropicModel)
    assert (model.name, model.api_key, model.base_url, model.max_tokens) == (
        "anthropic:claude", "secret", "https://api.anthropic.com", 4096)
