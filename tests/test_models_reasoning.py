"""Models as real providers send them: content parts, reasoning, usage on streams, pause_turn, keys.

The replies are written from the providers' documented wire formats (OpenAI chat
completions with ``stream_options.include_usage``, DeepSeek ``reasoning_content``,
OpenRouter ``reasoning`` / ``reasoning_details``, Mistral thinking content parts,
Anthropic extended thinking with tool use, ``redacted_thinking`` and ``pause_turn``)
and served over real HTTP by the fake servers on 127.0.0.1.
"""

from __future__ import annotations

import json

import pytest
from fake_model_servers import (
    Reply,
    anthropic_blocks_events,
    anthropic_stream,
    anthropic_text_events,
    fake_model_server,  # noqa: F401 - fixture
    openai_stream,
    openai_text_chunks,
    redacted_block,
    text_block,
    thinking_block,
    tool_block,
    anthropic_model,
    openai_model,
)

from apollia_nb.errors import ManifestInvalid, ModelKeyMissing, ModelPermanent
from apollia_nb.journal.replay import replay_entries
from apollia_nb.notebook.panel import latest_reasoning, run_summary
from apollia_nb.notebook.render import exchange_body_html, timeline_html
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.models import (
    Completed,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    ToolSpec,
    build_model,
)
from apollia_nb.runtime.models.anthropic import MAX_PAUSES
from apollia_nb.runtime.models.base import ReasoningPart
from apollia_nb.runtime.models.openai import OpenAIStreamParser, ThinkSplitter
from apollia_nb.wire.schemas import Task


USER = [Message("user", "What is 2+2?")]
LIST_TOOL = ToolSpec("list_dir", "List a folder", {"type": "object", "properties": {"path": {"type": "string"}}})
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB5URj"


def _chunk(delta: dict, finish_reason: str | None = None) -> dict:
    return {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def _usage_chunk(usage: dict) -> dict:
    """The last chunk of a stream asked with include_usage: no choices, the whole request's usage."""
    return {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
            "usage": usage}


async def events_of(model, messages=USER, tools=(), role: str = "actor") -> list:
    return [e async for e in model.stream(role, messages, tools)]


# --------------------------------------------------------------------------- content as a list of parts


MISTRAL_PARTS = [
    {"type": "thinking", "thinking": [{"type": "text", "text": "Two and two make four."}]},
    {"type": "text", "text": "4"},
]


@pytest.mark.anyio
async def test_a_json_reply_whose_content_is_a_list_of_parts_keeps_its_answer(fake_model_server):
    body = {"id": "x", "object": "chat.completion", "model": "magistral-medium-latest",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": MISTRAL_PARTS},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}}
    fake_model_server.reply(Reply(headers={"content-type": "application/json"}, body=json.dumps(body).encode()))
    events = await events_of(openai_model(fake_model_server))
    assert events[:-1] == [ReasoningDelta("Two and two make four."), TextDelta("4")]
    response = events[-1].response
    assert (response.text, response.stop_reason) == ("4", "stop")
    assert response.reasoning == (ReasoningPart("Two and two make four.", source="content"),)
    assert response.usage["total_tokens"] == 42


@pytest.mark.anyio
async def test_streamed_content_parts_split_into_reasoning_and_answer(fake_model_server):
    chunks = [
        _chunk({"role": "assistant", "content": [{"type": "thinking", "thinking": [{"type": "text", "text": "Two "}]}]}),
        _chunk({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "and two."}]}]}),
        _chunk({"content": [{"type": "text", "text": "It is "}]}),
        _chunk({"content": "4."}),  # the answer goes on as a plain string
        _chunk({}, "stop"),
    ]
    fake_model_server.reply(openai_stream(chunks))
    events = await events_of(openai_model(fake_model_server))
    assert events[:-1] == [ReasoningDelta("Two "), ReasoningDelta("and two."), TextDelta("It is "), TextDelta("4.")]
    response = events[-1].response
    assert response.text == "It is 4."
    assert [p.text for p in response.reasoning] == ["Two and two."]


@pytest.mark.anyio
@pytest.mark.parametrize("content", [
    {"type": "text", "text": "4"},                                   # an object, not a list
    [{"type": "text"}],                                              # a text part without text
    [{"type": "thinking", "thinking": [{"type": "image_url"}]}],     # thinking that is not text
    [7],
])
async def test_content_that_is_neither_text_nor_parts_is_permanent(fake_model_server, content):
    fake_model_server.reply(openai_stream([_chunk({"content": content}), _chunk({}, "stop")]))
    with pytest.raises(ModelPermanent, match="openai: "):
        await openai_model(fake_model_server).complete("actor", USER)


# --------------------------------------------------------------------------- reasoning on OpenAI-compatible servers


@pytest.mark.anyio
async def test_deepseek_reasoning_content_is_reasoning_and_goes_back_with_the_tool_call(fake_model_server):
    call = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "list_dir", "arguments": '{"path": "."}'}}
    fake_model_server.reply(openai_stream([
        _chunk({"role": "assistant", "content": None, "reasoning_content": "I should look "}),
        _chunk({"content": None, "reasoning_content": "at the folder."}),
        _chunk({"tool_calls": [call]}),
        _chunk({}, "tool_calls"),
    ]), openai_stream(openai_text_chunks(["Two files."])))
    model = openai_model(fake_model_server)
    events = await events_of(model, tools=[LIST_TOOL])
    assert events[:2] == [ReasoningDelta("I should look "), ReasoningDelta("at the folder.")]
    first = events[-1].response
    assert first.text == "" and first.tool_calls == (ToolCallRequest("call_0", "list_dir", {"path": "."}),)
    assert first.reasoning == (ReasoningPart("I should look at the folder.", source="reasoning_content"),)
    history = [*USER, Message("assistant", "", tool_calls=first.tool_calls, reasoning=first.reasoning),
               Message("tool", "a.txt b.txt", tool_call_id="call_0", name="list_dir")]
    assert (await model.complete("actor", history, [LIST_TOOL])).text == "Two files."
    sent = fake_model_server.requests[1].json()["messages"][1]
    assert sent["reasoning_content"] == "I should look at the folder."
    assert sent["tool_calls"][0]["id"] == "call_0"


@pytest.mark.anyio
async def test_openrouter_reasoning_is_not_doubled_and_its_details_go_back_whole(fake_model_server):
    def piece(text: str, **more) -> dict:
        return {"type": "reasoning.text", "text": text, "format": "anthropic-claude-v1", "index": 0, **more}

    call = {"index": 0, "id": "toolu_1", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}
    fake_model_server.reply(openai_stream([
        _chunk({"role": "assistant", "content": "", "reasoning": "Look ", "reasoning_details": [piece("Look ")]}),
        _chunk({"content": "", "reasoning": "first.", "reasoning_details": [piece("first.")]}),
        _chunk({"content": "", "reasoning": None, "reasoning_details": [piece("", signature=SIGNATURE)]}),
        _chunk({"content": "", "reasoning_details": [
            {"type": "reasoning.encrypted", "data": REDACTED, "format": "anthropic-claude-v1", "index": 1}]}),
        _chunk({"tool_calls": [call]}),
        _chunk({}, "tool_calls"),
    ]), openai_stream(openai_text_chunks(["ok"])))
    model = openai_model(fake_model_server)
    events = await events_of(model, tools=[LIST_TOOL])
    assert [e.text for e in events if isinstance(e, ReasoningDelta)] == ["Look ", "first."]
    first = events[-1].response
    assert [(p.text, p.signature, p.redacted, p.source) for p in first.reasoning] == [
        ("Look first.", SIGNATURE, None, "reasoning_details"),
        ("", None, REDACTED, "reasoning_details")]
    history = [*USER, Message("assistant", "", tool_calls=first.tool_calls, reasoning=first.reasoning),
               Message("tool", "[]", tool_call_id="toolu_1", name="list_dir")]
    await model.complete("actor", history, [LIST_TOOL])
    sent = fake_model_server.requests[1].json()["messages"][1]
    assert sent["reasoning_details"] == [
        {"type": "reasoning.text", "text": "Look first.", "format": "anthropic-claude-v1", "index": 0,
         "signature": SIGNATURE},
        {"type": "reasoning.encrypted", "data": REDACTED, "format": "anthropic-claude-v1", "index": 1}]
    assert "reasoning" not in sent and "reasoning_content" not in sent


@pytest.mark.anyio
async def test_a_server_sending_reasoning_in_two_fields_at_once_gives_it_once(fake_model_server):
    # vLLM while it renamed reasoning_content to reasoning sent both, the same text
    fake_model_server.reply(openai_stream([
        _chunk({"role": "assistant", "reasoning_content": "hm", "reasoning": "hm"}),
        _chunk({"content": "yes"}), _chunk({}, "stop")]))
    response = await openai_model(fake_model_server).complete("actor", USER)
    assert response.reasoning == (ReasoningPart("hm", source="reasoning_content"),)
    assert response.text == "yes"
    # a final answer's reasoning does not go back: only a tool-calling turn's does
    fake_model_server.reply(openai_stream(openai_text_chunks(["ok"])))
    await openai_model(fake_model_server).complete(
        "actor", [*USER, Message("assistant", "yes", reasoning=response.reasoning), Message("user", "sure?")])
    assert fake_model_server.requests[1].json()["messages"][1] == {"role": "assistant", "content": "yes"}


@pytest.mark.anyio
async def test_think_tags_cut_across_deltas_are_split_from_the_answer(fake_model_server):
    pieces = ["<thi", "nk>\nThe user", " wants 4.</th", "ink>\n\n", "The answer", " is 4. <think> stays"]
    fake_model_server.reply(openai_stream(openai_text_chunks(pieces)))
    events = await events_of(openai_model(fake_model_server))
    response = events[-1].response
    assert response.text == "The answer is 4. <think> stays"
    assert response.reasoning == (ReasoningPart("\nThe user wants 4.", source="content"),)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == response.text
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "\nThe user wants 4."


def test_the_think_splitter_gives_the_same_split_for_every_cut():
    text = "  <think>a < b, and </thin is not the end</think>\n\nB is <think>bigger</think>."
    for cut in range(len(text) + 1):
        for cut2 in range(cut, len(text) + 1):
            splitter = ThinkSplitter()
            out = []
            for piece in (text[:cut], text[cut:cut2], text[cut2:]):
                out += splitter.feed(piece)
            out += splitter.finish()
            assert "".join(t for k, t in out if k == "reasoning") == "a < b, and </thin is not the end"
            assert "".join(t for k, t in out if k == "text") == "B is <think>bigger</think>."
    splitter = ThinkSplitter()  # an answer that merely begins like the tag is all answer
    assert splitter.feed("<th") == [] and splitter.feed("ree>") == [("text", "<three>")]
    splitter = ThinkSplitter()
    assert splitter.feed("<think>cut off") == [("reasoning", "cut off")] and splitter.finish() == []
    # a reply so short the splitter held it back still streams, once its content ends
    parser = OpenAIStreamParser()
    events = parser.feed_sse(None, json.dumps(_chunk({"content": "<"})))
    events += parser.feed_sse(None, json.dumps(_chunk({}, "stop")))
    events += parser.feed_sse(None, "[DONE]")
    assert events == [TextDelta("<")] and parser.finish().text == "<"


# --------------------------------------------------------------------------- usage on real streams, request keys


@pytest.mark.anyio
async def test_streams_ask_for_usage_and_read_it_from_the_last_chunk(fake_model_server):
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11,
             "completion_tokens_details": {"reasoning_tokens": 0}}
    fake_model_server.reply(openai_stream([*openai_text_chunks(["4"]), _usage_chunk(usage)]))
    response = await openai_model(fake_model_server).complete("actor", USER)
    assert response.usage == usage
    assert fake_model_server.requests[0].json()["stream_options"] == {"include_usage": True}
    fake_model_server.reply(openai_stream(openai_text_chunks(["4"])))
    model = build_model({"provider": "openai", "model": "m", "base_url": f"{fake_model_server.url}/v1",
                         "stream_usage": False, "reasoning_effort": "high", "max_retries": 0}, env={})
    await model.complete("actor", USER)
    body = fake_model_server.requests[1].json()
    assert "stream_options" not in body and body["reasoning_effort"] == "high"


def test_the_new_model_keys_are_checked():
    local = {"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:1/v1"}
    with pytest.raises(ManifestInvalid, match=r"model\.reasoning_effort: must be one of low, medium, high"):
        build_model({**local, "reasoning_effort": "max"}, env={})
    with pytest.raises(ManifestInvalid, match=r"model\.stream_usage: must be true or false"):
        build_model({**local, "stream_usage": "no"}, env={})
    with pytest.raises(ManifestInvalid, match=r"model\.thinking: unknown key"):
        build_model({**local, "thinking": True}, env={})
    claude = {"provider": "anthropic", "model": "c"}
    env = {"ANTHROPIC_API_KEY": "k"}
    with pytest.raises(ManifestInvalid, match=r"model\.reasoning_effort: unknown key"):
        build_model({**claude, "reasoning_effort": "low"}, env=env)
    for bad, words in [("yes", "true, false or a budget"), (1.5, "true, false or a budget"),
                       (512, "at least 1024"), (4096, r"less than max_tokens \(4096\)")]:
        with pytest.raises(ManifestInvalid, match=rf"model\.thinking: .*{words}"):
            build_model({**claude, "thinking": bad}, env=env)
    with pytest.raises(ManifestInvalid, match=r"model\.thinking: the API refuses a temperature"):
        build_model({**claude, "thinking": True, "temperature": 0.2}, env=env)
    assert build_model({**claude, "thinking": True}, env=env).thinking_budget == 2048
    assert build_model({**claude, "thinking": 8000, "max_tokens": 16000}, env=env).thinking_budget == 8000
    assert build_model({**claude, "thinking": False}, env=env).thinking_budget is None


def test_openais_own_endpoint_reads_its_key_from_openai_api_key_by_default():
    with pytest.raises(ModelKeyMissing, match=r"model\.api_key_env: environment variable OPENAI_API_KEY is not set") as info:
        build_model({"provider": "openai", "model": "gpt-4o-mini"}, env={})
    assert info.value.code == "MODEL_KEY_MISSING"
    with pytest.raises(ModelKeyMissing, match="OPENAI_API_KEY"):
        build_model({"provider": "openai", "model": "m", "base_url": "https://api.openai.com/v1/"}, env={})
    model = build_model({"provider": "openai", "model": "gpt-4o-mini"}, env={"OPENAI_API_KEY": "sk-1"})
    assert model.api_key == "sk-1" and model.request_headers()["authorization"] == "Bearer sk-1"
    with pytest.raises(ModelKeyMissing, match="ANTHROPIC_API_KEY") as info:
        build_model({"provider": "anthropic", "model": "c"}, env={})
    assert info.value.code == "MODEL_KEY_MISSING"
    assert build_model({"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:11434/v1"},
                       env={}).api_key is None


@pytest.mark.anyio
async def test_registering_an_agent_whose_key_is_unset_fails_with_its_code(home, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    text = ('name = "gpt"\ndescription = "d"\ninstructions = "i"\n\n[model]\nprovider = "openai"\n'
            'model = "gpt-4o-mini"\n')
    async with Runtime(home) as rt:
        with pytest.raises(ModelKeyMissing) as info:
            await rt.register_agent(text)
        assert info.value.code == "MODEL_KEY_MISSING" and "OPENAI_API_KEY" in info.value.message
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        agent = await rt.register_agent(text)
        assert agent.model.api_key == "sk-test"


# --------------------------------------------------------------------------- Anthropic thinking, pause_turn, usage


@pytest.mark.anyio
async def test_anthropic_thinking_and_redacted_thinking_are_kept_and_go_back_before_the_tool_use(fake_model_server):
    fake_model_server.reply(
        anthropic_stream(anthropic_blocks_events([
            thinking_block(["Let me list ", "the folder."], SIGNATURE), redacted_block(REDACTED),
            tool_block("toolu_01", "list_dir", ['{"path": "."}'])], "tool_use")),
        anthropic_stream(anthropic_text_events(["Two files."])),
    )
    model = anthropic_model(fake_model_server, thinking_budget=2048)
    events = await events_of(model, tools=[LIST_TOOL])
    assert events[:2] == [ReasoningDelta("Let me list "), ReasoningDelta("the folder.")]
    first = events[-1].response
    assert first.text == ""
    assert first.reasoning == (ReasoningPart("Let me list the folder.", signature=SIGNATURE, source="thinking"),
                               ReasoningPart(redacted=REDACTED, source="redacted_thinking"))
    history = [*USER, Message("assistant", first.text, tool_calls=first.tool_calls, reasoning=first.reasoning),
               Message("tool", "a.txt", tool_call_id="toolu_01", name="list_dir")]
    assert (await model.complete("actor", history, [LIST_TOOL])).text == "Two files."
    body = fake_model_server.requests[1].json()
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["messages"][1] == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Let me list the folder.", "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": REDACTED},
        {"type": "tool_use", "id": "toolu_01", "name": "list_dir", "input": {"path": "."}}]}


@pytest.mark.anyio
async def test_with_thinking_on_a_planner_is_not_forced_to_call_its_tool(fake_model_server):
    from apollia_nb.runtime.models import PLAN_TOOL

    fake_model_server.reply(anthropic_stream(anthropic_blocks_events([
        thinking_block(["Plan."], SIGNATURE), tool_block("toolu_p", "submit_plan", ['{"steps": ["a"]}'])],
        "tool_use")))
    await anthropic_model(fake_model_server, thinking_budget=1024).complete("planner", USER, [PLAN_TOOL])
    assert "tool_choice" not in fake_model_server.requests[0].json()


@pytest.mark.anyio
async def test_a_paused_turn_is_continued_with_its_content_sent_back(fake_model_server):
    search = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    result = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}

    def server_blocks(index: int) -> list:
        out = [("content_block_start", {"type": "content_block_start", "index": index, "content_block": search}),
               ("content_block_delta", {"type": "content_block_delta", "index": index,
                                        "delta": {"type": "input_json_delta", "partial_json": '{"query": "4"}'}}),
               ("content_block_stop", {"type": "content_block_stop", "index": index})]
        return out + [("content_block_start", {"type": "content_block_start", "index": index + 1,
                                               "content_block": result}),
                      ("content_block_stop", {"type": "content_block_stop", "index": index + 1})]

    paused = anthropic_blocks_events([thinking_block(["Search."], SIGNATURE), text_block(["Searching. "])],
                                     "pause_turn", end_usage={"input_tokens": 40, "output_tokens": 7})
    paused[-2:-2] = server_blocks(2)
    fake_model_server.reply(anthropic_stream(paused), anthropic_stream(anthropic_text_events(["It is 4."])))
    events = await events_of(anthropic_model(fake_model_server))
    assert [e for e in events if isinstance(e, TextDelta)] == [TextDelta("Searching. "), TextDelta("It is 4.")]
    assert sum(isinstance(e, Completed) for e in events) == 1
    response = events[-1].response
    assert (response.text, response.stop_reason) == ("Searching. It is 4.", "end_turn")
    assert [p.text for p in response.reasoning] == ["Search."]
    assert response.usage == {"input_tokens": 50, "output_tokens": 12}
    first, second = (r.json() for r in fake_model_server.requests)
    assert second["messages"] == [*first["messages"], {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Search.", "signature": SIGNATURE},
        {"type": "text", "text": "Searching. "},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "4"}},
        result]}]


@pytest.mark.anyio
async def test_a_turn_paused_without_end_is_given_up_after_a_bound(fake_model_server):
    paused = anthropic_stream(anthropic_text_events(["more "], stop_reason="pause_turn"))
    fake_model_server.reply(*[paused] * (MAX_PAUSES + 2))
    with pytest.raises(ModelPermanent, match=f"paused its turn {MAX_PAUSES + 1} times"):
        await anthropic_model(fake_model_server).complete("actor", USER)
    assert len(fake_model_server.requests) == MAX_PAUSES + 1
    last = fake_model_server.requests[-1].json()["messages"][-1]
    assert last == {"role": "assistant", "content": [{"type": "text", "text": "more "}] * MAX_PAUSES}


@pytest.mark.anyio
async def test_usage_of_message_delta_is_cumulative_and_a_null_count_erases_nothing(fake_model_server):
    end = {"input_tokens": 2679, "cache_creation_input_tokens": None, "cache_read_input_tokens": 0,
           "output_tokens": 931, "server_tool_use": {"web_search_requests": 1}}
    fake_model_server.reply(anthropic_stream(anthropic_blocks_events(
        [text_block(["4"])], "end_turn", input_tokens=12, end_usage=end)))
    response = await anthropic_model(fake_model_server).complete("actor", USER)
    assert response.usage == {"input_tokens": 2679, "output_tokens": 931, "cache_read_input_tokens": 0,
                              "server_tool_use": {"web_search_requests": 1}}


# --------------------------------------------------------------------------- through a governed Runtime task


def _thinker(url: str) -> str:
    return ('name = "thinker"\ndescription = "thinks"\ninstructions = "List the folder."\n\n'
            f'[model]\nprovider = "anthropic"\nmodel = "claude-test"\nbase_url = "{url}"\n'
            'max_retries = 0\nthinking = 2048\n\n[tools]\nrequired = ["list_dir"]\n')


@pytest.mark.anyio
async def test_a_task_keeps_reasoning_apart_sends_the_signed_thinking_back_and_replays_identical(
        home, monkeypatch, fake_model_server):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    fake_model_server.reply(
        anthropic_stream(anthropic_blocks_events(
            [tool_block("toolu_p", "submit_plan", ['{"steps": ["List the folder"]}'])], "tool_use")),
        anthropic_stream(anthropic_blocks_events([
            thinking_block(["I will list ", "the folder."], SIGNATURE), redacted_block(REDACTED),
            tool_block("toolu_a", "list_dir", ['{"path": "."}'])], "tool_use",
            end_usage={"output_tokens": 77})),
        anthropic_stream(anthropic_blocks_events([
            thinking_block(["It is empty."], SIGNATURE + "2"), text_block(["The folder is empty."])], "end_turn")),
        anthropic_stream(anthropic_blocks_events(
            [tool_block("toolu_v", "submit_verdict", ['{"verdict": "pass", "reasons": []}'])], "tool_use")),
    )
    async with Runtime(home) as rt:
        await rt.register_agent(_thinker(fake_model_server.url))
        task = await (await rt.submit("thinker", "List the folder"))
        assert task.status == "completed", task.error
        assert task.result == "The folder is empty."
        step = task.to_dict()["steps"][0]
        # The redacted block is shown as such, never its bytes: in the cell, the side panel and over REST.
        assert step["reasoning"] == ["I will list the folder.\n\n[redacted reasoning]", "It is empty."]
        cell = timeline_html(task.to_dict())
        assert "I will list the folder." in cell and "[redacted reasoning]" in cell and REDACTED not in cell
        assert "<details" in cell  # folded
        row = run_summary(task.to_dict())
        whole = "I will list the folder.\n\n[redacted reasoning]\n\nIt is empty."
        assert row["reasoning"] == {"step": 1, "text": whole, "chars": len(whole)}
        over_rest = Task.model_validate(task.to_dict()).model_dump(mode="json")
        assert over_rest["steps"][0]["reasoning"] == step["reasoning"]
        assert REDACTED not in json.dumps(over_rest) and REDACTED not in json.dumps(row)

        actor2 = fake_model_server.requests[2].json()
        assistant = actor2["messages"][1]
        assert assistant["role"] == "assistant"
        assert assistant["content"][:2] == [
            {"type": "thinking", "thinking": "I will list the folder.", "signature": SIGNATURE},
            {"type": "redacted_thinking", "data": REDACTED}]
        assert assistant["content"][2]["type"] == "tool_use"
        assert actor2["messages"][2]["content"][0]["type"] == "tool_result"

        entries = rt.journal.entries(run_id=task.run_id)
        turns = [json.loads(e.payload) for e in entries if e.kind == "model_response"]
        acting = [t for t in turns if t["role"] == "actor"]
        assert acting[0]["text"] == "" and acting[0]["usage"] == {"input_tokens": 10, "output_tokens": 77}
        assert acting[0]["reasoning"] == [
            {"source": "thinking", "text": "I will list the folder.", "signature": SIGNATURE},
            {"source": "redacted_thinking", "text": "", "redacted": REDACTED}]
        assert acting[1]["text"] == "The folder is empty."
        assert "reasoning" not in turns[0] and "usage" in turns[0]
        assert rt.replay(task.run_id).verdict == "identical"

        tampered = []
        for e in entries:
            if e.kind == "model_response" and json.loads(e.payload).get("reasoning"):
                payload = json.loads(e.payload)
                payload["reasoning"][0]["text"] = "I will delete the folder."
                e = type("E", (), {"seq": e.seq, "kind": e.kind, "payload": payload})()
            tampered.append(e)
        result = replay_entries(task.run_id, tampered)
        assert result.verdict == "diverged"
        assert {d.kind for d in result.divergences} == {"reasoning_digest"}


@pytest.mark.anyio
async def test_a_chat_turn_streams_reasoning_apart_and_sends_the_thinking_back(home, monkeypatch, fake_model_server):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    fake_model_server.reply(
        anthropic_stream(anthropic_blocks_events([
            thinking_block(["Look first."], SIGNATURE), tool_block("toolu_c", "list_dir", ['{"path": "."}'])],
            "tool_use")),
        anthropic_stream(anthropic_blocks_events([redacted_block(REDACTED), text_block(["Nothing there."])],
                                                 "end_turn")),
    )
    async with Runtime(home) as rt:
        await rt.register_agent(_thinker(fake_model_server.url))
        session = rt.sessions.open("thinker")
        exchange = session.send("What is in the folder?")
        assert (await exchange).reply == "Nothing there."
        # The second turn's redacted thinking is shown as such, never its data.
        assert [e["text"] for e in exchange.events if e["type"] == "reasoning"] == [
            "Look first.", "\n\n[redacted reasoning]"]
        shown = exchange_body_html("thinker", "What is in the folder?", exchange.events)
        assert "Look first." in shown and "[redacted reasoning]" in shown and REDACTED not in shown
        second = fake_model_server.requests[1].json()["messages"]
        assert second[1]["content"][0] == {"type": "thinking", "thinking": "Look first.", "signature": SIGNATURE}


def test_reasoning_past_the_output_cap_is_cut_in_the_journal_with_the_whole_ones_digest():
    from apollia_nb.runtime.governed import OUTPUT_CAP
    from apollia_nb.runtime.models import ModelResponse
    from apollia_nb.runtime.tasks import turn_extras
    from apollia_nb.runtime.tools import output_digest

    long = ReasoningPart("x" * (OUTPUT_CAP + 10), signature=SIGNATURE, source="thinking")
    extras = turn_extras(ModelResponse("4", reasoning=(long,), usage={"output_tokens": 5000}))
    assert extras["reasoning"]["truncated"] is True and extras["reasoning"]["size"] > OUTPUT_CAP
    assert extras["reasoning_digest"] == output_digest([long.to_json()])
    assert extras["usage"] == {"output_tokens": 5000}
    assert turn_extras(ModelResponse("4")) == {}

    def entry(seq, kind, payload):
        return type("E", (), {"seq": seq, "kind": kind, "payload": payload})()

    trace = [entry(1, "run_open", {"run_kind": "task"}),
             entry(2, "model_response", {"role": "actor", "turn": 1, "text": "4", "tool_calls": [], **extras}),
             entry(3, "run_seal", {"status": "completed", "entries": 2})]
    assert replay_entries("r", trace).verdict == "identical"
    del trace[1].payload["reasoning_digest"]  # reasoning cut without the digest of the whole
    assert [d.kind for d in replay_entries("r", trace).divergences] == ["reasoning_digest"]


def test_the_panel_folds_the_last_steps_reasoning_cut_to_its_limit_and_only_text():
    from apollia_nb.notebook.panel import REASONING_SHOWN
    from apollia_nb.runtime.models.base import reasoning_text

    assert latest_reasoning([{"index": 0, "reasoning": []}]) is None
    long = "y" * (REASONING_SHOWN + 50)
    steps = [{"index": 0, "reasoning": ["first"]}, {"index": 1, "reasoning": [long]}, {"index": 2}]
    assert latest_reasoning(steps) == {"step": 2, "text": long[:REASONING_SHOWN], "chars": len(long)}
    # Opaque parts of every provider read as redacted; an empty part without data is left out.
    parts = (ReasoningPart("", redacted=REDACTED, source="redacted_thinking"),
             ReasoningPart("", redacted="gAAAAB-encrypted", source="reasoning_item", detail={"type": "reasoning"}),
             ReasoningPart("", signature=SIGNATURE, source="thinking"),
             ReasoningPart("summary", redacted="gAAAAB-encrypted", source="reasoning_item"))
    assert reasoning_text(parts) == "[redacted reasoning]\n\n[redacted reasoning]\n\nsummary"
