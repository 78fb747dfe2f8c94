"""Plans and verdicts in both forms: a JSON schema the answer follows (``structured = "native"``:
chat completions' ``response_format``, the Responses API's ``text.format``) or one tool the
model calls (``structured = "tools"``, and always for Anthropic and the scripted model), read
back into the same plan and verdict values; and only choice 0 of a chat completion is read.

Replies are written from the documented wire formats and served over real HTTP by the fake
server on 127.0.0.1.
"""

from __future__ import annotations

import json

import pytest
from fake_model_servers import (
    Reply,
    error_reply,
    fake_model_server,  # noqa: F401 - fixture
    openai_json,
    openai_stream,
    openai_text_chunks,
    openai_tool_chunks,
    responses_call,
    responses_events,
    responses_json,
    responses_message,
    responses_stream,
    responses_model,
    openai_model as chat_model,
)

from apollia_nb.errors import ManifestInvalid, ModelPermanent
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.models import (
    PLAN_TOOL,
    VERDICT_TOOL,
    Message,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStarted,
    ToolSpec,
    build_model,
    parse_plan,
    parse_verdict,
)
from apollia_nb.runtime.models.base import structured_tool


GOAL = [Message("system", "Plan."), Message("user", "Tidy the notes folder")]
READ = ToolSpec("list_dir", "List a folder", {"type": "object", "properties": {"path": {"type": "string"}}})


def _chunk(delta: dict, finish_reason: str | None = None, index: int = 0) -> dict:
    return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason}]}


# --------------------------------------------------------------------------- native: chat completions


@pytest.mark.anyio
async def test_a_native_plan_over_chat_completions_streams_as_the_plan_call(fake_model_server):
    fake_model_server.reply(openai_stream(openai_text_chunks(['{"steps": ["Read', ' the notes", "File them"]}'])))
    model = chat_model(fake_model_server, structured="native")
    events = [e async for e in model.stream("planner", GOAL, [PLAN_TOOL])]
    assert events[:-1] == [ToolCallStarted("structured-1", "submit_plan"),
                           ToolCallArgumentsDelta("structured-1", '{"steps": ["Read'),
                           ToolCallArgumentsDelta("structured-1", ' the notes", "File them"]}')]
    response = events[-1].response
    assert response.text == "" and parse_plan(response) == ["Read the notes", "File them"]
    body = fake_model_server.requests[0].json()
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "submit_plan", "description": PLAN_TOOL.description, "schema": PLAN_TOOL.parameters,
        "strict": True}}
    assert "tools" not in body and "tool_choice" not in body


@pytest.mark.anyio
async def test_a_native_verdict_from_a_json_completion(fake_model_server):
    fake_model_server.reply(openai_json('{"verdict": "fail", "reasons": ["notes/ is still untidy"]}'))
    response = await chat_model(fake_model_server, structured="native").complete("critic", GOAL, [VERDICT_TOOL])
    assert parse_verdict(response) == ("fail", ["notes/ is still untidy"])
    assert fake_model_server.requests[0].json()["response_format"]["json_schema"]["name"] == "submit_verdict"


@pytest.mark.anyio
async def test_the_chat_default_is_the_tool_form(fake_model_server):
    fake_model_server.reply(openai_stream(openai_tool_chunks([("call_1", "submit_plan", ['{"steps": ["a"]}'])])))
    model = build_model({"provider": "openai", "model": "m", "base_url": f"{fake_model_server.url}/v1",
                         "max_retries": 0}, env={})
    assert model.structured == "tools"
    assert parse_plan(await model.complete("planner", GOAL, [PLAN_TOOL])) == ["a"]
    body = fake_model_server.requests[0].json()
    assert body["tool_choice"] == "required" and body["tools"][0]["function"]["name"] == "submit_plan"
    assert "response_format" not in body


# --------------------------------------------------------------------------- native: the Responses API


@pytest.mark.anyio
@pytest.mark.parametrize("reply", ["stream", "json"])
async def test_responses_plans_and_verdicts_are_native_by_default(fake_model_server, reply):
    def answer(pieces: list[str]) -> Reply:
        items = [responses_message(pieces)]
        return responses_stream(responses_events(items)) if reply == "stream" else responses_json(items)

    fake_model_server.reply(answer(['{"steps": ', '["Read the notes"]}']),
                            answer(['{"verdict": "pass", "reasons": []}']))
    model = build_model({"provider": "openai", "api": "responses", "model": "m",
                         "base_url": f"{fake_model_server.url}/v1", "max_retries": 0}, env={})
    assert parse_plan(await model.complete("planner", GOAL, [PLAN_TOOL])) == ["Read the notes"]
    assert parse_verdict(await model.complete("critic", GOAL, [VERDICT_TOOL])) == ("pass", [])
    plan, verdict = (r.json() for r in fake_model_server.requests)
    assert plan["text"] == {"format": {"type": "json_schema", "name": "submit_plan",
                                       "description": PLAN_TOOL.description, "schema": PLAN_TOOL.parameters,
                                       "strict": True}}
    assert "tools" not in plan and "tool_choice" not in plan
    assert verdict["text"]["format"]["schema"] == VERDICT_TOOL.parameters


@pytest.mark.anyio
async def test_responses_in_the_tool_form_reads_the_plan_call(fake_model_server):
    fake_model_server.reply(responses_stream(responses_events([
        responses_call("call_p", "submit_plan", ['{"steps": ["a", "b"]}'])])))
    model = responses_model(fake_model_server, structured="tools")
    assert parse_plan(await model.complete("planner", GOAL, [PLAN_TOOL])) == ["a", "b"]
    body = fake_model_server.requests[0].json()
    assert "text" not in body and body["tools"][0]["name"] == "submit_plan"


# --------------------------------------------------------------------------- only plans and verdicts are native


def test_only_a_planner_or_critic_offered_its_one_tool_asks_natively():
    assert structured_tool("planner", [PLAN_TOOL]) is PLAN_TOOL
    assert structured_tool("critic", [VERDICT_TOOL]) is VERDICT_TOOL
    assert structured_tool("actor", [PLAN_TOOL]) is None            # an actor's tools are tools
    assert structured_tool("planner", [READ, PLAN_TOOL]) is None    # chat plan-mode: read-only tools beside it
    assert structured_tool("planner", [ToolSpec("submit_plan", "mine", {"type": "object"})]) is None


@pytest.mark.anyio
async def test_plan_mode_with_read_only_tools_stays_in_the_tool_form_when_native(fake_model_server):
    fake_model_server.reply(responses_stream(responses_events([responses_call("c", "list_dir", ["{}"])])),
                            openai_stream(openai_tool_chunks([("c", "list_dir", ["{}"])])))
    await responses_model(fake_model_server).complete("planner", GOAL, [READ, PLAN_TOOL])
    await chat_model(fake_model_server, structured="native").complete("planner", GOAL, [READ, PLAN_TOOL])
    for request in fake_model_server.requests:
        body = request.json()
        assert "text" not in body and "response_format" not in body and len(body["tools"]) == 2


# --------------------------------------------------------------------------- failures of the native form


@pytest.mark.anyio
@pytest.mark.parametrize(("reply", "words"), [
    (openai_json("Here is my plan: read, then file."), "is not a JSON object: 'Here is my plan"),
    (openai_json('["Read the notes"]'), "is not a JSON object"),
    (openai_json('{"steps": ["Read'), "is not a JSON object"),
    (openai_stream(openai_text_chunks(['{"steps": ["Re'], finish_reason="length")), r"\(stopped: length\)"),
    (Reply(headers={"content-type": "application/json"}, body=json.dumps({
        "id": "x", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None,
                                             "refusal": "I can't help with that."},
                     "finish_reason": "stop"}]}).encode()), "I can't help with that"),
])
async def test_a_native_answer_that_is_no_json_object_is_permanent_with_what_the_model_said(
        fake_model_server, reply, words):
    fake_model_server.reply(reply)
    with pytest.raises(ModelPermanent, match=rf"openai: the structured answer for submit_plan {words}|{words}"):
        await chat_model(fake_model_server, structured="native").complete("planner", GOAL, [PLAN_TOOL])


@pytest.mark.anyio
async def test_a_responses_refusal_is_permanent_with_its_text(fake_model_server):
    refusal = {"type": "message", "id": "msg_r", "status": "completed", "role": "assistant",
               "content": [{"type": "refusal", "refusal": "I can't assist with that."}]}
    body = {"id": "r", "object": "response", "status": "completed", "output": [refusal], "usage": None}
    fake_model_server.reply(Reply(headers={"content-type": "application/json"}, body=json.dumps(body).encode()))
    with pytest.raises(ModelPermanent, match="submit_verdict is not a JSON object: \"I can't assist"):
        await responses_model(fake_model_server).complete("critic", GOAL, [VERDICT_TOOL])


@pytest.mark.anyio
async def test_a_server_refusing_json_schema_is_told_how_to_fall_back_and_asked_once(fake_model_server):
    fake_model_server.reply(error_reply(400, {"error": {
        "message": "response_format json_schema is not supported", "type": "invalid_request_error"}}))
    with pytest.raises(ModelPermanent, match=r'HTTP 400: response_format json_schema is not supported; .*'
                                             r'set \[model\] structured = "tools"'):
        await chat_model(fake_model_server, structured="native").complete("planner", GOAL, [PLAN_TOOL])
    assert len(fake_model_server.requests) == 1
    fake_model_server.reply(error_reply(400, {"error": {"message": "bad model"}}))
    with pytest.raises(ModelPermanent) as info:  # the tool form gets no such hint
        await chat_model(fake_model_server).complete("planner", GOAL, [PLAN_TOOL])
    assert "structured" not in info.value.message


def test_the_structured_key_is_checked_per_provider():
    local = {"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:1/v1"}
    assert build_model({**local, "structured": "native"}, env={}).structured == "native"
    assert build_model({**local, "api": "responses", "structured": "tools"}, env={}).structured == "tools"
    with pytest.raises(ManifestInvalid, match=r"model\.structured: must be native or tools"):
        build_model({**local, "structured": "json"}, env={})
    claude = {"provider": "anthropic", "model": "c"}
    env = {"ANTHROPIC_API_KEY": "k"}
    build_model({**claude, "structured": "tools"}, env=env)
    with pytest.raises(ManifestInvalid, match=r"model\.structured: anthropic answers plans and verdicts as tool"):
        build_model({**claude, "structured": "native"}, env=env)
    with pytest.raises(ManifestInvalid, match=r"model\.structured: unknown key"):
        build_model({"provider": "scripted", "structured": "native"})


# --------------------------------------------------------------------------- only choice 0


@pytest.mark.anyio
async def test_only_choice_0_of_a_json_completion_is_read_wherever_it_stands(fake_model_server):
    body = {"id": "x", "object": "chat.completion", "model": "m", "choices": [
        {"index": 1, "message": {"role": "assistant", "content": "second"}, "finish_reason": "stop"},
        {"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}]},
         "finish_reason": "tool_calls"}]}
    fake_model_server.reply(Reply(headers={"content-type": "application/json"}, body=json.dumps(body).encode()))
    response = await chat_model(fake_model_server).complete("actor", GOAL, [READ])
    assert (response.text, [c.id for c in response.tool_calls]) == ("", ["call_0"])


@pytest.mark.anyio
async def test_only_choice_0_of_a_stream_is_read_even_without_indexes(fake_model_server):
    both = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [
        {"delta": {"content": "first "}, "finish_reason": None},
        {"delta": {"content": "second "}, "finish_reason": None}]}
    fake_model_server.reply(openai_stream([
        _chunk({"content": "one "}), _chunk({"content": "two "}, index=1), both,
        _chunk({}, "stop", index=1), _chunk({"content": "three"}), _chunk({}, "stop")]))
    events = [e async for e in chat_model(fake_model_server).stream("actor", GOAL)]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["one ", "first ", "three"]
    assert events[-1].response.text == "one first three"


def test_n_is_not_a_model_key():
    with pytest.raises(ManifestInvalid, match=r"model\.n: unknown key"):
        build_model({"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:1/v1", "n": 2}, env={})


# --------------------------------------------------------------------------- through a governed task


def _agent(url: str, structured: str) -> str:
    return ('name = "planner"\ndescription = "d"\ninstructions = "Tidy."\n\n'
            f'[model]\nprovider = "openai"\nmodel = "m"\nbase_url = "{url}/v1"\nmax_retries = 0\n'
            f'structured = "{structured}"\n')


@pytest.mark.anyio
async def test_a_task_journals_the_same_plan_and_verdict_in_both_forms_and_replays_identical(
        home, fake_model_server):
    structured_turns = {}
    for form in ("native", "tools"):
        if form == "native":
            plan = openai_stream(openai_text_chunks(['{"steps": ["Tidy ', 'the notes"]}']))
            verdict = openai_json('{"verdict": "pass", "reasons": []}')
        else:
            plan = openai_stream(openai_tool_chunks([("call_p", "submit_plan", ['{"steps": ["Tidy the notes"]}'])]))
            verdict = openai_json(None, [("call_v", "submit_verdict", '{"verdict": "pass", "reasons": []}')])
        fake_model_server.reply(plan, openai_stream(openai_text_chunks(["Tidied."])), verdict)
        sent = len(fake_model_server.requests)
        async with Runtime(home) as rt:
            await rt.register_agent(_agent(fake_model_server.url, form).replace('"planner"', f'"p-{form}"', 1))
            task = await (await rt.submit(f"p-{form}", "Tidy the notes"))
            assert task.status == "completed", task.error
            assert task.to_dict()["plan"] == ["Tidy the notes"] and task.result == "Tidied."
            requests = [r.json() for r in fake_model_server.requests[sent:]]
            assert ("response_format" in requests[0]) == (form == "native")
            assert ("response_format" in requests[2]) == (form == "native")
            turns = [json.loads(e.payload) for e in rt.journal.entries(run_id=task.run_id)
                     if e.kind == "model_response"]
            structured_turns[form] = [(t["role"], t["text"], t.get("structured")) for t in turns
                                      if t["role"] != "actor"]
            assert rt.replay(task.run_id).verdict == "identical"
    assert structured_turns["native"] == structured_turns["tools"] == [
        ("planner", "", [{"call_id": "c1-1", "name": "submit_plan", "arguments": {"steps": ["Tidy the notes"]}}]),
        ("critic", "", [{"call_id": "c3-1", "name": "submit_verdict",
                         "arguments": {"verdict": "pass", "reasons": []}}])]
