"""The scripted model, build_model, and the structured-output helpers."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apollia_nb.errors import BadInput, ManifestInvalid, ModelPermanent, ModelTransient
from apollia_nb.runtime.models import (
    PLAN_TOOL,
    VERDICT_TOOL,
    Completed,
    Message,
    ModelProvider,
    ModelResponse,
    ScriptedModel,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallRequest,
    ToolCallStarted,
    build_model,
    collect,
    parse_plan,
    parse_verdict,
)
from apollia_nb.runtime.models.anthropic import AnthropicModel
from apollia_nb.runtime.models.base import response_events
from apollia_nb.runtime.models.openai import OpenAIModel


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


MANIFEST = """
name = "clerk"

[model]
provider = "scripted"

[[model.script.planner]]
steps = ["Write the summary file"]

[[model.script.actor]]
tool_calls = [{ name = "write_file", arguments = { path = "summary.txt", content = "ok" } }]

[[model.script.actor]]
text = "Wrote summary.txt."

[[model.script.critic]]
verdict = "fail"
reasons = ["summary.txt says only ok"]
"""

GOAL = [Message("system", "You keep notes."), Message("user", "Summarise the notes")]


def scripted_from_manifest(text: str = MANIFEST) -> ScriptedModel:
    model = build_model(tomllib.loads(text)["model"])
    assert isinstance(model, ScriptedModel)
    return model


# --------------------------------------------------------------------------- queues and defaults


@pytest.mark.anyio
async def test_queues_are_consumed_in_order_per_role_then_the_defaults_answer():
    model = scripted_from_manifest()
    assert [model.remaining(r) for r in ("planner", "actor", "critic")] == [1, 2, 1]

    actor1 = await model.complete("actor", GOAL)  # roles do not share a queue
    assert actor1 == ModelResponse(
        text="",
        tool_calls=(ToolCallRequest("call-actor-1-1", "write_file", {"path": "summary.txt", "content": "ok"}),),
        stop_reason="tool_calls",
    )
    assert parse_plan(await model.complete("planner", GOAL, [PLAN_TOOL])) == ["Write the summary file"]
    assert (await model.complete("actor", GOAL)).text == "Wrote summary.txt."
    assert parse_verdict(await model.complete("critic", GOAL, [VERDICT_TOOL])) == ("fail", ["summary.txt says only ok"])
    assert [model.remaining(r) for r in ("planner", "actor", "critic")] == [0, 0, 0]

    # empty queues: the planner plans the goal, the actor says Done., the critic passes
    plan = await model.complete("planner", GOAL, [PLAN_TOOL])
    assert plan.tool_calls == (ToolCallRequest("call-planner-2-1", "submit_plan", {"steps": ["Summarise the notes"]}),)
    assert await model.complete("actor", GOAL) == ModelResponse(text="Done.", stop_reason="stop")
    verdict = await model.complete("critic", GOAL, [VERDICT_TOOL])
    assert verdict.tool_calls == (ToolCallRequest("call-critic-2-1", "submit_verdict", {"verdict": "pass", "reasons": []}),)


@pytest.mark.anyio
async def test_the_default_planner_takes_the_last_user_message_and_needs_one():
    model = ScriptedModel()
    messages = [Message("user", "old goal"), Message("assistant", "hm"), Message("user", "  new goal \n")]
    assert parse_plan(await model.complete("planner", messages)) == ["new goal"]
    with pytest.raises(ModelPermanent, match="no user message"):
        await model.complete("planner", [Message("system", "only a system prompt")])


@pytest.mark.anyio
async def test_tool_call_ids_are_deterministic_and_an_entry_may_name_its_own():
    def make() -> ScriptedModel:
        return ScriptedModel(actor=[
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "a"}},
                            {"name": "read_file", "arguments": {"path": "b"}, "id": "mine"}]},
            {"tool_calls": [{"name": "list_dir"}], "text": "Listing."},
        ])

    runs = []
    for _ in range(2):
        model = make()
        first, second = await model.complete("actor", GOAL), await model.complete("actor", GOAL)
        runs.append((first, second))
    assert runs[0] == runs[1]
    first, second = runs[0]
    assert [c.id for c in first.tool_calls] == ["call-actor-1-1", "mine"]
    assert second.tool_calls == (ToolCallRequest("call-actor-2-1", "list_dir", {}),)
    assert second.text == "Listing."


@pytest.mark.anyio
async def test_responses_do_not_share_mutable_arguments_with_the_script():
    model = ScriptedModel(actor=[{"tool_calls": [{"name": "w", "arguments": {"nested": {"k": [1]}}}]}])
    response = await model.complete("actor", GOAL)
    response.tool_calls[0].arguments["nested"]["k"].append(2)
    again = ScriptedModel(actor=[{"tool_calls": [{"name": "w", "arguments": {"nested": {"k": [1]}}}]}])
    assert (await again.complete("actor", GOAL)).tool_calls[0].arguments == {"nested": {"k": [1]}}


@pytest.mark.anyio
async def test_ready_model_responses_can_be_queued_from_python():
    canned = ModelResponse(text="canned", stop_reason="stop", usage={"total_tokens": 1})
    model = ScriptedModel(actor=[canned])
    assert await model.complete("actor", GOAL) is canned


@pytest.mark.anyio
@pytest.mark.parametrize(("error", "exc"), [("transient", ModelTransient), ("permanent", ModelPermanent)])
async def test_error_entries_raise_and_are_consumed(error, exc):
    model = ScriptedModel(planner=[{"error": error, "message": "provider down"}, {"steps": ["retry worked"]}])
    with pytest.raises(exc, match="provider down"):
        await model.complete("planner", GOAL)
    assert model.remaining("planner") == 1
    assert parse_plan(await model.complete("planner", GOAL)) == ["retry worked"]
    with pytest.raises(exc, match=f"scripted {error} failure \\(critic turn 1\\)"):
        await ScriptedModel(critic=[{"error": error}]).complete("critic", GOAL)


@pytest.mark.anyio
async def test_an_unknown_role_is_refused():
    model = ScriptedModel()
    with pytest.raises(BadInput, match="model role 'chat'"):
        await model.complete("chat", GOAL)
    with pytest.raises(BadInput):
        model.remaining("chat")


# --------------------------------------------------------------------------- from_function


@pytest.mark.anyio
async def test_from_function_sync_sees_role_messages_and_tools():
    seen = []

    def fn(role, messages, tools):
        seen.append((role, messages, tools))
        if role == "planner":
            return {"steps": [f"do: {messages[-1].content}"]}
        if role == "critic":
            return ModelResponse(text="", tool_calls=(ToolCallRequest("v", "submit_verdict", {"verdict": "fail"}),))
        return None  # the actor's default

    model = ScriptedModel.from_function(fn)
    assert parse_plan(await model.complete("planner", GOAL, [PLAN_TOOL])) == ["do: Summarise the notes"]
    assert parse_verdict(await model.complete("critic", GOAL, [VERDICT_TOOL])) == ("fail", [])
    assert (await model.complete("actor", GOAL)).text == "Done."
    assert [s[0] for s in seen] == ["planner", "critic", "actor"]
    assert seen[0][1] == tuple(GOAL) and seen[0][2] == (PLAN_TOOL,)
    assert model.remaining("actor") == 0


@pytest.mark.anyio
async def test_from_function_async_and_its_ids_count_turns():
    async def fn(role, messages, tools):
        return {"tool_calls": [{"name": "memory_recall", "arguments": {"key": str(len(messages))}}]}

    model = ScriptedModel.from_function(fn)
    one = await model.complete("actor", GOAL)
    two = await model.complete("actor", GOAL[:1])
    assert one.tool_calls == (ToolCallRequest("call-actor-1-1", "memory_recall", {"key": "2"}),)
    assert two.tool_calls == (ToolCallRequest("call-actor-2-1", "memory_recall", {"key": "1"}),)


@pytest.mark.anyio
async def test_the_queue_answers_before_the_function_and_bad_function_results_are_named():
    model = ScriptedModel(actor=[{"text": "queued"}], function=lambda role, m, t: {"text": "from fn"})
    assert (await model.complete("actor", GOAL)).text == "queued"
    assert (await model.complete("actor", GOAL)).text == "from fn"
    bad = ScriptedModel.from_function(lambda role, m, t: {"verdict": "maybe"})
    with pytest.raises(ManifestInvalid, match=r"function result \(critic turn 1\)\.verdict"):
        await bad.complete("critic", GOAL)


# --------------------------------------------------------------------------- streaming


@pytest.mark.anyio
async def test_streaming_splits_text_per_word_then_completes():
    model = ScriptedModel(actor=[{"text": "Wrote summary.txt  for you.\n"}])
    events = [e async for e in model.stream("actor", GOAL)]
    assert events[:-1] == [TextDelta("Wrote "), TextDelta("summary.txt  "), TextDelta("for "), TextDelta("you.\n")]
    assert events[-1] == Completed(ModelResponse(text="Wrote summary.txt  for you.\n", stop_reason="stop"))


@pytest.mark.anyio
async def test_streaming_a_tool_call_and_collecting_it_gives_the_complete_response():
    def make() -> ScriptedModel:
        return ScriptedModel(actor=[{"text": "Saving.", "tool_calls": [{"name": "memory_save", "arguments": {"key": "k", "value": "v"}}]}])

    events = [e async for e in make().stream("actor", GOAL)]
    assert events[:-1] == [
        TextDelta("Saving."),
        ToolCallStarted("call-actor-1-1", "memory_save"),
        ToolCallArgumentsDelta("call-actor-1-1", '{"key": "k", "value": "v"}'),
    ]
    assert await collect(make().stream("actor", GOAL)) == await make().complete("actor", GOAL)


@given(st.text(alphabet=st.sampled_from(list("ab \n\t")), max_size=30))
def test_text_deltas_always_concatenate_to_the_text(text):
    events = response_events(ModelResponse(text=text))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert "".join(deltas) == text
    assert all(deltas)
    assert isinstance(events[-1], Completed)


@pytest.mark.anyio
async def test_collect_refuses_a_stream_without_completed():
    async def stream():
        yield TextDelta("half")

    with pytest.raises(ModelPermanent, match="without a completed response"):
        await collect(stream())


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("script", "key"),
    [
        ({"planner": [{"steps": ["a"], "stpes": ["b"]}]}, "model.script.planner[0].stpes: unknown key"),
        ({"planner": [{}]}, "model.script.planner[0].steps: missing required key"),
        ({"planner": [{"steps": "a"}]}, "model.script.planner[0].steps: must be an array"),
        ({"planner": [{"steps": ["a", 3]}]}, r"model.script.planner[0].steps[1]: must be a string"),
        ({"planner": [{"steps": []}]}, "model.script.planner[0].steps: must be a non-empty list"),
        ({"actor": [{"text": "ok"}, {"txt": "no"}]}, "model.script.actor[1].txt: unknown key"),
        ({"actor": [{}]}, "model.script.actor[0]: an actor entry needs text, tool_calls or error"),
        ({"actor": [{"text": 5}]}, "model.script.actor[0].text: must be a string"),
        ({"actor": [{"tool_calls": [{"arguments": {}}]}]}, "model.script.actor[0].tool_calls[0].name: missing required key"),
        ({"actor": [{"tool_calls": [{"name": "w", "args": {}}]}]}, "model.script.actor[0].tool_calls[0].args: unknown key"),
        ({"actor": [{"tool_calls": [{"name": "w", "arguments": "x"}]}]}, "model.script.actor[0].tool_calls[0].arguments: must be a table"),
        ({"actor": [{"tool_calls": ["w"]}]}, "model.script.actor[0].tool_calls[0]: must be a table"),
        ({"critic": [{"verdict": "ok"}]}, 'model.script.critic[0].verdict: must be "pass" or "fail"'),
        ({"critic": [{"verdict": "fail", "reasons": "bad"}]}, "model.script.critic[0].reasons: must be an array"),
        ({"critic": [{"error": "sometimes"}]}, 'model.script.critic[0].error: must be "transient" or "permanent"'),
        ({"critic": [{"error": "transient", "verdict": "pass"}]}, "model.script.critic[0].verdict: an error entry takes only"),
        ({"actor": [{"text": "x", "message": "m"}]}, "model.script.actor[0].message: only an error entry"),
        ({"judge": [{"verdict": "pass"}]}, "model.script.judge: unknown key"),
        ({"actor": {"text": "x"}}, "model.script.actor: must be an array"),
        ({"actor": ["x"]}, r"model.script.actor[0]: must be a table"),
    ],
)
def test_script_errors_name_the_key(script, key):
    with pytest.raises(ManifestInvalid) as info:
        build_model({"provider": "scripted", "script": script})
    assert key in info.value.message


def test_python_entries_are_validated_too():
    with pytest.raises(ManifestInvalid, match=r"script\.planner\[0\]\.steps: missing required key"):
        ScriptedModel(planner=[{}])
    with pytest.raises(ManifestInvalid, match=r"script\.actor: must be a list"):
        ScriptedModel(actor={"text": "x"})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- build_model


def test_build_model_builds_every_provider_and_refuses_an_unknown_one():
    assert isinstance(build_model({}), ScriptedModel)  # scripted is the default
    assert isinstance(build_model({"provider": "scripted"}), ScriptedModel)
    openai = build_model({"provider": "openai", "model": "llama3.1", "base_url": "http://127.0.0.1:11434/v1"}, env={})
    anthropic = build_model({"provider": "anthropic", "model": "claude"}, env={"ANTHROPIC_API_KEY": "k"})
    assert isinstance(openai, OpenAIModel) and isinstance(anthropic, AnthropicModel)
    for model in (build_model({}), openai, anthropic):
        assert isinstance(model, ModelProvider)
    with pytest.raises(ManifestInvalid, match=r"model\.provider: unknown provider 'gemini'"):
        build_model({"provider": "gemini"})
    with pytest.raises(ManifestInvalid, match=r"model\.base_url: unknown key"):
        build_model({"provider": "scripted", "base_url": "http://x"})
    with pytest.raises(ManifestInvalid, match="model: must be a table"):
        build_model(["scripted"])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- state


@pytest.mark.anyio
async def test_state_and_restore_resume_a_script_where_it_stopped():
    first = scripted_from_manifest()
    await first.complete("planner", GOAL)
    await first.complete("actor", GOAL)
    state = first.state()
    assert state == {"turns": {"planner": 1, "actor": 1, "critic": 0}}

    second = scripted_from_manifest()
    second.restore(state)
    assert [second.remaining(r) for r in ("planner", "actor", "critic")] == [0, 1, 1]
    response = await second.complete("actor", GOAL)
    assert response.text == "Wrote summary.txt."
    assert (await second.complete("planner", GOAL)).tool_calls[0].id == "call-planner-2-1"
    with pytest.raises(BadInput, match="has not answered yet"):
        second.restore(state)
    with pytest.raises(BadInput, match=r"turns\.actor must be a count"):
        scripted_from_manifest().restore({"turns": {"actor": -1}})


# --------------------------------------------------------------------------- structured outputs and values


def _call(name: str, arguments: dict) -> ModelResponse:
    return ModelResponse(text="", tool_calls=(ToolCallRequest("c", name, arguments),))


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (ModelResponse(text="Step one: ..."), "expected a call to submit_plan, the model called no tool"),
        (_call("write_file", {}), "the model called write_file"),
        (_call("submit_plan", {}), "steps must be a non-empty list"),
        (_call("submit_plan", {"steps": []}), "steps must be a non-empty list"),
        (_call("submit_plan", {"steps": ["a", ""]}), r"steps\[1\] must be a non-empty string"),
        (_call("submit_plan", {"steps": ["a", {"b": 1}]}), r"steps\[1\] must be a non-empty string"),
    ],
)
def test_parse_plan_refuses_malformed_plans(response, message):
    with pytest.raises(ModelPermanent, match=message):
        parse_plan(response)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "verdict must be"),
        ({"verdict": "PASS"}, "verdict must be"),
        ({"verdict": "fail", "reasons": "too short"}, "reasons must be a list of strings"),
        ({"verdict": "fail", "reasons": [1]}, "reasons must be a list of strings"),
    ],
)
def test_parse_verdict_refuses_malformed_verdicts(arguments, message):
    with pytest.raises(ModelPermanent, match=message):
        parse_verdict(_call("submit_verdict", arguments))


def test_the_structured_tools_are_json_schema_objects():
    assert PLAN_TOOL.name == "submit_plan" and VERDICT_TOOL.name == "submit_verdict"
    assert PLAN_TOOL.parameters["required"] == ["steps"]
    assert VERDICT_TOOL.parameters["properties"]["verdict"]["enum"] == ["pass", "fail"]


def test_messages_are_checked_on_construction():
    with pytest.raises(BadInput, match="message role 'bot'"):
        Message("bot", "hi")  # type: ignore[arg-type]
    with pytest.raises(BadInput, match="a user message cannot carry tool calls"):
        Message("user", "hi", tool_calls=(ToolCallRequest("c", "x", {}),))
    with pytest.raises(BadInput, match="tool_call_id"):
        Message("tool", "result")
    with pytest.raises(BadInput, match="arguments must be an object"):
        ToolCallRequest("c", "x", ["a"])  # type: ignore[arg-type]
    assert Message("assistant", tool_calls=[ToolCallRequest("c", "x", {})]).tool_calls == (ToolCallRequest("c", "x", {}),)  # type: ignore[arg-type]
