"""A run's token budget (``[budget] max_tokens``): the input and output tokens every model turn
reports, counted against a ceiling, over real HTTP from the fake servers on 127.0.0.1.

Usage as the providers report it: chat completions' last chunk (``stream_options.include_usage``),
Anthropic's ``message_start`` counts replaced by ``message_delta``'s cumulative ones (cache counts
included), the Responses API's ``response.completed`` usage.
"""

from __future__ import annotations

import json

import pytest
from fake_model_servers import (
    FakeModelServer,
    Reply,
    anthropic_model,
    anthropic_stream,
    anthropic_text_events,
    anthropic_tool_events,
    fake_model_server,  # noqa: F401 - fixture
    openai_model,
    openai_stream,
    openai_text_chunks,
    openai_tool_chunks,
    responses_events,
    responses_json,
    responses_message,
    responses_model,
    responses_stream,
)

from apollia_nb.errors import ManifestInvalid
from apollia_nb.notebook.render import budget_words
from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.manifest import parse_manifest
from apollia_nb.runtime.models import Message, collect
from apollia_nb.runtime.models.base import usage_tokens
from apollia_nb.runtime.tools import ToolDef


USER = [Message("user", "hi")]
CHAT_USAGE = {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40,
              "completion_tokens_details": {"reasoning_tokens": 4}}


# --------------------------------------------------------------------------- counting a turn's tokens


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [True, False])
async def test_each_providers_usage_counts_its_input_and_output_tokens(fake_model_server, streamed):
    server: FakeModelServer = fake_model_server
    cached = {"input_tokens": 7, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 2000,
              "output_tokens": 50}
    server.reply(
        openai_stream(openai_text_chunks(["4"], usage=CHAT_USAGE)),
        anthropic_stream(anthropic_text_events(["4"])[:-2] + [
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": cached}),
            ("message_stop", {"type": "message_stop"})]),
        responses_stream(responses_events([responses_message(["4"])])),
        responses_json([responses_message(["4"])]),
    )
    models = [openai_model(server), anthropic_model(server), responses_model(server), responses_model(server)]
    counted = []
    for model in models:
        response = (await collect(model.stream("actor", USER)) if streamed
                    else await model.complete("actor", USER))
        counted.append(usage_tokens(response.usage))
    # chat: prompt + completion (reasoning is inside completion); anthropic: input + both cache counts +
    # output; the Responses API: input (cached inside) + output.
    assert counted == [40, 7 + 100 + 2000 + 50, 36 + 87, 36 + 87]


@pytest.mark.parametrize("usage", [
    None, {}, {"prompt_tokens": 3}, {"input_tokens": 3, "output_tokens": None}, {"prompt_tokens": "3", "completion_tokens": 1},
    {"input_tokens": True, "output_tokens": 1}, {"input_tokens": -1, "output_tokens": 1},
    {"input_tokens": 1, "output_tokens": 1, "cache_read_input_tokens": "x"}, {"total_tokens": 2.5}, ["x"],
])
def test_a_usage_that_cannot_be_counted_is_unknown_never_zero(usage):
    assert usage_tokens(usage) is None


def test_a_usage_with_only_its_total_gives_the_total():
    assert usage_tokens({"total_tokens": 12}) == 12
    assert usage_tokens({"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": None}) == 7


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "true", '"many"'])
def test_the_budgets_max_tokens_is_a_positive_whole_number(value):
    text = f'name = "a"\n\n[budget]\nmax_tokens = {value}\n'
    with pytest.raises(ManifestInvalid, match=r"budget\.max_tokens"):
        parse_manifest(text)
    assert parse_manifest('name = "a"\n\n[budget]\nmax_tokens = 900\n').max_tokens == 900
    assert parse_manifest('name = "a"\n').max_tokens is None


# --------------------------------------------------------------------------- through a governed task

RAN: list[str] = []


def make_note(text: str) -> str:
    """Keeps a note."""
    RAN.append(text)
    return "kept"


def _agent(url: str, budget: int, provider: str = "anthropic") -> str:
    model = (f'provider = "anthropic"\nmodel = "c"\nbase_url = "{url}"\n' if provider == "anthropic"
             else f'provider = "openai"\nmodel = "m"\nbase_url = "{url}/v1"\n')
    return ('name = "noter"\ndescription = "d"\ninstructions = "Note."\n\n'
            f'[model]\n{model}max_retries = 0\n\n[budget]\nmax_tokens = {budget}\n')


def _plan() -> Reply:
    return anthropic_stream(anthropic_tool_events([("p", "submit_plan", ['{"steps": ["Note it"]}'])]))


def _call() -> Reply:
    return anthropic_stream(anthropic_tool_events([("toolu_1", "make_note", ['{"text": "x"}'])]))


def _verdict() -> Reply:
    return anthropic_stream(anthropic_tool_events([("v", "submit_verdict", ['{"verdict": "pass"}'])]))


async def _run(home, url: str, budget: int, provider: str = "anthropic"):
    RAN.clear()
    rt = Runtime(home, tool_sources=open_sources)
    await rt.__aenter__()
    await rt.register_agent(_agent(url, budget, provider), tools=[ToolDef.from_function(make_note, family="read")])
    task = await (await rt.submit("noter", "Note it"))
    return rt, task


def _entries(rt, run_id: str) -> list[tuple[str, dict]]:
    return [(e.kind, json.loads(e.payload)) for e in rt.journal.entries(run_id=run_id)]


@pytest.mark.anyio
async def test_a_run_within_its_token_budget_completes_and_shows_what_it_spent(home, monkeypatch, fake_model_server):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    fake_model_server.reply(_plan(), _call(), anthropic_stream(anthropic_text_events(["Noted."])), _verdict())
    rt, task = await _run(home, fake_model_server.url, 60)  # four turns of 10 in + 5 out
    try:
        assert task.status == "completed", task.error
        assert task.to_dict()["budget"]["tokens"] == {"used": 60, "ceiling": 60, "unmetered_turn": None}
        assert RAN == ["x"]
    finally:
        await rt.__aexit__(None, None, None)


@pytest.mark.anyio
async def test_passing_the_token_budget_stops_the_run_before_its_next_step_journaled_and_shown(
        home, monkeypatch, fake_model_server):
    from apollia_nb.notebook.render import task_html, task_text

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    fake_model_server.reply(_plan(), _call(), anthropic_stream(anthropic_text_events(["Noted."])), _verdict())
    rt, task = await _run(home, fake_model_server.url, 44)  # the third turn brings 45
    try:
        assert task.status == "failed"
        assert task.error["code"] == "BUDGET_EXCEEDED"
        assert "token budget of 44 was passed: 45" in task.error["message"]
        assert RAN == ["x"]  # the call asked within the budget ran; the critic was never asked
        assert len(fake_model_server.requests) == 3
        shown = task.to_dict()
        assert shown["budget"]["tokens"] == {"used": 45, "ceiling": 44, "unmetered_turn": None}
        assert "tokens 45/44" in task_text(shown) and "tokens 45/44" in task_html(shown)
        assert budget_words(shown) == "4/20 steps · tokens 45/44"  # beside the run view's bar
        entries = _entries(rt, task.run_id)
        status = [p for k, p in entries if k == "task_status"][-1]
        assert status["status"] == "failed" and status["error"]["code"] == "BUDGET_EXCEEDED"
        assert [p["usage"] for k, p in entries if k == "model_response"] == [
            {"input_tokens": 10, "output_tokens": 5}] * 3
        assert rt.replay(task.run_id).verdict == "identical"
    finally:
        await rt.__aexit__(None, None, None)


@pytest.mark.anyio
async def test_a_turn_that_passes_the_budget_has_none_of_its_calls_run(home, monkeypatch, fake_model_server):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    fake_model_server.reply(_plan(), _call(), _verdict())
    rt, task = await _run(home, fake_model_server.url, 20)  # the actor's turn brings 30
    try:
        assert task.status == "failed" and task.error["code"] == "BUDGET_EXCEEDED"
        assert RAN == []
        results = [p for k, p in _entries(rt, task.run_id) if k == "tool_result"]
        assert [(r["tool"], r["status"], r["error_code"]) for r in results] == [
            ("make_note", "skipped", "BUDGET_EXCEEDED")]
        assert not [p for k, p in _entries(rt, task.run_id) if k == "tool_call"]
        assert rt.replay(task.run_id).verdict == "identical"
    finally:
        await rt.__aexit__(None, None, None)


@pytest.mark.anyio
async def test_a_provider_that_reports_no_usage_cannot_keep_a_token_budget(home, fake_model_server):
    # A chat-completions server that sends no usage chunk (it ignores stream_options).
    fake_model_server.reply(
        openai_stream(openai_tool_chunks([("p", "submit_plan", ['{"steps": ["Note it"]}'])])),
        openai_stream(openai_tool_chunks([("c", "make_note", ['{"text": "x"}'])])),
    )
    rt, task = await _run(home, fake_model_server.url, 1_000_000, provider="openai")
    try:
        assert task.status == "failed" and task.error["code"] == "BUDGET_EXCEEDED"
        assert "reported no token usage for model turn 1" in task.error["message"]
        assert len(fake_model_server.requests) == 1  # nothing after the unmetered turn
        assert task.to_dict()["budget"]["tokens"] == {"used": 0, "ceiling": 1_000_000, "unmetered_turn": 1}
        assert budget_words(task.to_dict()) == "1/20 steps · tokens 0/1000000 (turn 1 reported none)"
    finally:
        await rt.__aexit__(None, None, None)


@pytest.mark.anyio
async def test_without_a_token_budget_nothing_is_counted_or_refused(home, fake_model_server):
    fake_model_server.reply(
        openai_stream(openai_tool_chunks([("p", "submit_plan", ['{"steps": ["Note it"]}'])])),
        openai_stream(openai_text_chunks(["Noted."])),
        openai_stream(openai_tool_chunks([("v", "submit_verdict", ['{"verdict": "pass"}'])])),
    )
    RAN.clear()
    async with Runtime(home, tool_sources=open_sources) as rt:
        manifest = _agent(fake_model_server.url, 1, "openai").replace("\n[budget]\nmax_tokens = 1\n", "")
        await rt.register_agent(manifest, tools=[ToolDef.from_function(make_note, family="read")])
        task = await (await rt.submit("noter", "Note it"))
        assert task.status == "completed", task.error
        assert "tokens" not in task.to_dict()["budget"]


@pytest.mark.anyio
async def test_an_mcp_servers_model_call_counts_its_tokens_against_the_budget(home, fake_model_server):
    import anyio

    from test_federation_support import EVERYTHING_JS, node, require_peer, write_config

    write_config(home, servers={"everything": {
        "command": node(), "args": [str(require_peer(EVERYTHING_JS)), "stdio"],
        "families": {"trigger-sampling-request": "read"}}})
    tool = "mcp:everything/trigger-sampling-request"
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    fake_model_server.reply(
        openai_stream(openai_tool_chunks([("p", "submit_plan", ['{"steps": ["Ask"]}'])]) + [
            {"id": "u", "object": "chat.completion.chunk", "choices": [], "usage": usage}]),
        openai_stream(openai_tool_chunks([("c", tool, ['{"prompt": "Name a colour", "maxTokens": 20}'])]) + [
            {"id": "u", "object": "chat.completion.chunk", "choices": [], "usage": usage}]),
        # The server's model call: a large one.
        openai_stream(openai_text_chunks(["Ultramarine."], usage={"prompt_tokens": 900, "completion_tokens": 100,
                                                                   "total_tokens": 1000})),
        openai_stream(openai_text_chunks(["Asked."], usage=usage)),
    )
    async with Runtime(home, tool_sources=open_sources) as rt:
        manifest = (f'name = "asker"\ndescription = "d"\ninstructions = "Ask."\n\n[model]\nprovider = "openai"\n'
                    f'model = "m"\nbase_url = "{fake_model_server.url}/v1"\nmax_retries = 0\n\n'
                    f'[tools]\nrequired = ["{tool}"]\n\n[budget]\nmax_tokens = 500\n')
        await rt.register_agent(manifest)
        handle = await rt.submit("asker", "Let the server ask the model")
        with anyio.fail_after(60):
            while not [c for c in handle.pending if c.tool.endswith("/sampling/createMessage")]:
                await handle.settled()
                assert handle.status not in ("completed", "failed"), handle.error
        [card] = [c for c in handle.pending if c.tool.endswith("/sampling/createMessage")]
        card.answer("once")
        task = await handle
        assert task.status == "failed" and task.error["code"] == "BUDGET_EXCEEDED"
        assert task.to_dict()["budget"]["tokens"]["used"] == 15 + 15 + 1000
        assert len(fake_model_server.requests) == 3  # the actor is not asked again
