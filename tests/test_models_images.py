"""Images in tool results: described by a digest in the journal, given to models that read images.

A tool that returns an image (PNG/JPEG/GIF/WebP bytes, a matplotlib figure, an object that
renders itself as PNG such as a PIL image) has as its output a descriptor
``{"type": "image", "mime_type", "width", "height", "bytes", "sha256"}``: that is what is
journaled and replayed. With ``[model] images = true`` the provider sends the image itself
with the tool result, in its own shape (chat completions: ``image_url`` parts of a user message
after the tool messages; Anthropic: ``image`` blocks inside ``tool_result``; the Responses API:
``input_image`` parts of ``function_call_output``), checked here on the fake servers' requests.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json

import matplotlib
import pytest
from fake_model_servers import (
    image_sent,
    task_replies,
    anthropic_model,
    anthropic_stream,
    anthropic_text_events,
    fake_model_server,  # noqa: F401 - fixture
    openai_model,
    openai_stream,
    openai_text_chunks,
    responses_events,
    responses_message,
    responses_model,
    responses_stream,
)
from PIL import Image

from apollia_nb.runtime import Runtime
from apollia_nb.runtime.models import Message, ToolCallRequest, build_model
from apollia_nb.runtime.outputs import IMAGE_MAX_BYTES, image_bytes, json_value
from apollia_nb.runtime.tools import ToolDef, canonical_json

matplotlib.use("Agg")




def png(width: int = 8, height: int = 6, colour: str = "red") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


# --------------------------------------------------------------------------- what an image becomes


def test_image_values_become_descriptors_that_name_their_bytes_by_digest():
    data = png(8, 6)
    descriptor = json_value(data)
    assert descriptor == {"type": "image", "mime_type": "image/png", "width": 8, "height": 6,
                          "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert image_bytes(descriptor) == data
    assert json_value(Image.new("RGB", (3, 2)))["width"] == 3  # renders itself with _repr_png_
    for fmt, mime in (("JPEG", "image/jpeg"), ("GIF", "image/gif"), ("WEBP", "image/webp")):
        out = io.BytesIO()
        Image.new("RGB", (5, 4)).save(out, fmt)
        assert {k: json_value(out.getvalue())[k] for k in ("mime_type", "width", "height")} == \
            {"mime_type": mime, "width": 5, "height": 4}

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3), dpi=20)
    ax.plot([1, 3, 2])
    output = json_value({"chart": fig, "note": "sales"})
    plt.close(fig)
    assert output["note"] == "sales"
    assert {k: output["chart"][k] for k in ("type", "mime_type", "width", "height")} == \
        {"type": "image", "mime_type": "image/png", "width": 80, "height": 60}
    assert image_bytes(output["chart"]).startswith(b"\x89PNG")
    assert "base64" not in canonical_json(output) and len(canonical_json(output)) < 400


def test_what_is_no_image_or_cannot_be_drawn_stays_as_it_was():
    assert json_value(b"\x89PNG but not really")["type"] == "bytes"  # too short for its header
    assert json_value(b"plain text") == "plain text"

    class Broken:
        def _repr_png_(self):
            raise RuntimeError("no backend")

        def __repr__(self):
            return "<Broken>"

    class Lying:
        def _repr_png_(self):
            return b"not an image"

        def __repr__(self):
            return "<Lying>"

    assert json_value(Broken()) == "<Broken>" and json_value(Lying()) == "<Lying>"


def test_a_descriptor_finds_only_bytes_held_under_its_digest_and_type():
    data = png(4, 4, "blue")
    real = json_value(data)
    assert image_bytes(dict(real, sha256="0" * 64)) is None          # a digest nothing was held under
    assert image_bytes(dict(real, mime_type="image/jpeg")) is None  # the bytes are not of that type
    assert image_bytes({"type": "image", "mime_type": "image/png"}) is None
    big = png(1, 1)[:-12] + b"\0" * (IMAGE_MAX_BYTES + 1)  # a header, then too many bytes to hold
    described = json_value(big)
    assert described["type"] == "image" and image_bytes(described) is None


# --------------------------------------------------------------------------- each provider's shape


def _history(content: str, call_id: str = "call_1") -> list[Message]:
    return [Message("user", "Plot the sales."),
            Message("assistant", "", tool_calls=(ToolCallRequest(call_id, "plot", {}),)),
            Message("tool", content, tool_call_id=call_id, name="plot")]


@pytest.mark.anyio
async def test_chat_completions_carry_images_in_a_user_message_after_the_tool_messages(fake_model_server):
    data, other = png(8, 6), png(2, 2, "green")
    first, second = json_value({"chart": data}), json_value([other, "caption"])
    history = [Message("user", "Plot."),
               Message("assistant", "", tool_calls=(ToolCallRequest("c1", "plot", {}),
                                                    ToolCallRequest("c2", "plot", {}))),
               Message("tool", json.dumps(first), tool_call_id="c1", name="plot"),
               Message("tool", json.dumps(second), tool_call_id="c2", name="plot"),
               Message("user", "And now?")]
    fake_model_server.reply(openai_stream(openai_text_chunks(["ok"])), openai_stream(openai_text_chunks(["ok"])))
    model = openai_model(fake_model_server, images=True)
    await model.complete("actor", history)
    sent = fake_model_server.requests[0].json()["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user", "user"]
    assert sent[2]["content"] == json.dumps(first)  # the result itself stays text
    assert sent[4] == {"role": "user", "content": [
        {"type": "text", "text": "The image of the result of tool call c1 (plot):"},
        {"type": "image_url", "image_url": {"url": data_url(data)}},
        {"type": "text", "text": "The image of the result of tool call c2 (plot):"},
        {"type": "image_url", "image_url": {"url": data_url(other)}}]}
    assert sent[5] == {"role": "user", "content": "And now?"}

    await openai_model(fake_model_server).complete("actor", history)
    plain = fake_model_server.requests[1].json()["messages"]
    assert [m["role"] for m in plain] == ["user", "assistant", "tool", "tool", "user"]
    assert "data:image" not in fake_model_server.requests[1].body.decode()


@pytest.mark.anyio
async def test_anthropic_carries_images_inside_the_tool_result(fake_model_server):
    data = png(8, 6)
    content = json.dumps(json_value(data))
    fake_model_server.reply(anthropic_stream(anthropic_text_events(["ok"])))
    model = anthropic_model(fake_model_server, model="c", api_key="k", images=True)
    await model.complete("actor", _history(content))
    result = fake_model_server.requests[0].json()["messages"][2]["content"][0]
    assert result == {"type": "tool_result", "tool_use_id": "call_1", "content": [
        {"type": "text", "text": content},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(data).decode("ascii")}}]}


@pytest.mark.anyio
async def test_the_responses_api_carries_images_as_input_image_parts_of_the_output(fake_model_server):
    data = png(8, 6)
    content = json.dumps({"chart": json_value(data)})
    fake_model_server.reply(responses_stream(responses_events([responses_message(["ok"])])),
                            responses_stream(responses_events([responses_message(["ok"])])))
    await responses_model(fake_model_server,
                         images=True).complete("actor", _history(content))
    output = fake_model_server.requests[0].json()["input"][-1]
    assert output == {"type": "function_call_output", "call_id": "call_1", "output": [
        {"type": "input_text", "text": content},
        {"type": "input_image", "image_url": data_url(data), "detail": "auto"}]}
    forged = json.dumps({"type": "image", "mime_type": "image/png", "sha256": "f" * 64})
    await responses_model(fake_model_server,
                         images=True).complete("actor", _history(forged))
    assert fake_model_server.requests[1].json()["input"][-1]["output"] == forged  # nothing held under it


def test_images_is_a_model_key_of_the_http_providers():
    local = {"provider": "openai", "model": "m", "base_url": "http://127.0.0.1:1/v1"}
    assert build_model({**local, "images": True}, env={}).images is True
    assert build_model({**local, "api": "responses", "images": True}, env={}).images is True
    assert build_model({"provider": "anthropic", "model": "c", "images": True}, env={"ANTHROPIC_API_KEY": "k"}).images
    assert build_model(local, env={}).images is False
    from apollia_nb.errors import ManifestInvalid

    with pytest.raises(ManifestInvalid, match=r"model\.images: must be true or false"):
        build_model({**local, "images": "yes"}, env={})


# --------------------------------------------------------------------------- through a governed task

CHART = png(16, 12, "purple")


def plot() -> bytes:
    """Draws the sales chart."""
    return CHART


def _agent(provider_lines: str) -> str:
    return ('name = "plotter"\ndescription = "d"\ninstructions = "Plot."\n\n'
            f'[model]\n{provider_lines}max_retries = 0\nimages = true\n')


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["chat", "anthropic", "responses"])
async def test_an_image_from_a_governed_tool_reaches_the_model_and_the_journal_keeps_its_digest(
        home, monkeypatch, fake_model_server, kind):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    lines, replies = task_replies(kind, fake_model_server, "plot", ["{}"], "A rising line.")
    fake_model_server.reply(*replies)
    async with Runtime(home) as rt:
        await rt.register_agent(_agent(lines), tools=[ToolDef.from_function(plot, family="read")])
        task = await (await rt.submit("plotter", "Plot the sales"))
        assert task.status == "completed", task.error
        assert task.result == "A rising line."
        second_actor = fake_model_server.requests[2].json()
        assert image_sent(kind, second_actor) == data_url(CHART)

        entries = rt.journal.entries(run_id=task.run_id)
        result = next(json.loads(e.payload) for e in entries if e.kind == "tool_result")
        assert result["status"] == "ok"
        assert result["output"] == {"type": "image", "mime_type": "image/png", "width": 16, "height": 12,
                                    "bytes": len(CHART), "sha256": hashlib.sha256(CHART).hexdigest()}
        encoded = base64.b64encode(CHART).decode("ascii")
        payloads = [e.payload if isinstance(e.payload, str) else bytes(e.payload).decode() for e in entries]
        assert len(payloads) > 5 and not any(encoded[:40] in p for p in payloads)
        assert rt.replay(task.run_id).verdict == "identical"


@pytest.mark.anyio
async def test_without_images_the_model_reads_the_image_described(home, fake_model_server):
    lines, replies = task_replies("chat", fake_model_server, "plot", ["{}"], "A rising line.")
    fake_model_server.reply(*replies)
    async with Runtime(home) as rt:
        await rt.register_agent(_agent(lines).replace("images = true\n", ""),
                                tools=[ToolDef.from_function(plot, family="read")])
        task = await (await rt.submit("plotter", "Plot the sales"))
        assert task.status == "completed", task.error
        sent = fake_model_server.requests[2].json()["messages"]
        assert sent[-1]["role"] == "tool"
        assert json.loads(sent[-1]["content"]) == {
            "type": "image", "mime_type": "image/png", "width": 16, "height": 12, "bytes": len(CHART),
            "sha256": hashlib.sha256(CHART).hexdigest()}
        assert "data:image" not in fake_model_server.requests[2].body.decode()
