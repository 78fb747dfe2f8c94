"""Images made by the agent's own code: the matplotlib figures of a ``python_executor`` run become
image descriptors of its result, given to a model that reads images (``[model] images = true``) and
journaled by digest; a model that does not read images reads the descriptor.

The model replies are the providers' wire formats from the fake servers on 127.0.0.1; the program
runs in a real interpreter, with matplotlib, in the agent's workspace.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path

import pytest
from fake_model_servers import (
    image_sent,
    task_replies,
    fake_model_server,  # noqa: F401 - fixture
    openai_stream,
    openai_text_chunks,
    openai_tool_chunks,
)

from apollia_nb.federation import open_sources
from apollia_nb.runtime import Runtime
from apollia_nb.runtime.builtins import FIGURE_CAP, builtin_tools
from apollia_nb.runtime.outputs import image_bytes, json_value


async def run_python(workspace: Path, code: str) -> dict:
    [tool] = [t for t in builtin_tools(workspace, python=sys.executable) if t.name == "python_executor"]
    return await tool.fn(code=code)


PLOT = """\
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [3, 1, 2])
plt.title("sales")
plt.show()
plt.close("all")
print("drawn")
"""


# --------------------------------------------------------------------------- the executor


@pytest.mark.anyio
async def test_a_shown_figure_comes_back_as_a_png_even_when_the_program_closes_it(tmp_path):
    result = await run_python(tmp_path, PLOT)
    assert (result["exit_code"], result["stdout"], result["stderr"]) == (0, "drawn\n", "")
    [png] = result["images"]
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    descriptor = json_value(result)["images"][0]
    assert descriptor["mime_type"] == "image/png" and descriptor["sha256"] == hashlib.sha256(png).hexdigest()
    assert (descriptor["width"], descriptor["height"]) == (640, 480)
    assert image_bytes(descriptor) == png  # held for the models that read images
    assert list(tmp_path.iterdir()) == []  # nothing written into the workspace


@pytest.mark.anyio
async def test_figures_left_open_are_kept_also_when_the_program_fails_and_at_most_the_cap(tmp_path):
    failing = ("import matplotlib.pyplot as plt\nplt.figure(); plt.bar([1], [2])\n"
               "raise ValueError('late')\n")
    result = await run_python(tmp_path, failing)
    assert result["exit_code"] == 1 and len(result["images"]) == 1
    # The traceback is the program's own, as `python -` prints it.
    assert result["stderr"].splitlines() == [
        "Traceback (most recent call last):", '  File "<stdin>", line 3, in <module>', "ValueError: late"]
    many = "import matplotlib.pyplot as plt\nfor i in range(12):\n    plt.figure(); plt.plot([i, 0])\n"
    assert len((await run_python(tmp_path, many))["images"]) == FIGURE_CAP


@pytest.mark.anyio
async def test_a_program_without_figures_returns_what_it_did_before(tmp_path):
    result = await run_python(tmp_path, "import sys\nprint(__name__, sys.argv, sys.stdin.read() == '')\n"
                                        "print('_apollia_run' in globals())")
    assert result == {"exit_code": 0, "stdout": "__main__ ['-'] True\nFalse\n", "stderr": ""}
    assert (await run_python(tmp_path, "import sys; sys.exit(3)")) == {"exit_code": 3, "stdout": "", "stderr": ""}


@pytest.mark.anyio
async def test_files_a_program_writes_beside_its_figures_are_taken_only_as_png_images(tmp_path):
    forged = """\
import importlib.util, os
folder = os.path.dirname(importlib.util.find_spec("_apollia_figures").origin)  # the figures' own folder
open(os.path.join(folder, "figure-001.png"), "wb").write(b"not an image at all")
open(os.path.join(folder, "other.png"), "wb").write(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(30))
os.symlink("/etc/passwd", os.path.join(folder, "figure-002.png"))
"""
    result = await run_python(tmp_path, forged)
    assert result["exit_code"] == 0, result["stderr"]
    assert "images" not in result


# --------------------------------------------------------------------------- through a governed task


def _agent(provider_lines: str, images: bool) -> str:
    return ('name = "analyst"\ndescription = "d"\ninstructions = "Plot."\n\n'
            f'[model]\n{provider_lines}max_retries = 0\nimages = {"true" if images else "false"}\n\n'
            '[tools]\nrequired = ["python_executor"]\n')


ARGS = json.dumps({"code": PLOT})


async def _answered(rt: Runtime, handle) -> object:
    """The run asks before the program runs (family execute): answered once, as a person would."""
    await handle.settled()
    assert handle.status == "waiting"
    [card] = handle.pending
    assert card.tool == "python_executor" and card.arguments["code"] == PLOT
    card.answer("once")
    return await handle


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["chat", "anthropic", "responses"])
async def test_a_figure_of_the_agents_program_reaches_the_model_and_the_journal_keeps_its_digest(
        home, monkeypatch, fake_model_server, kind):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    lines, replies = task_replies(kind, fake_model_server, "python_executor", [ARGS[:20], ARGS[20:]], "A zigzag.")
    fake_model_server.reply(*replies)
    async with Runtime(home) as rt:
        await rt.register_agent(_agent(lines, images=True))
        task = await _answered(rt, await rt.submit("analyst", "Plot the sales"))
        assert task.status == "completed", task.error
        entries = rt.journal.entries(run_id=task.run_id)
        result = next(json.loads(e.payload) for e in entries if e.kind == "tool_result")
        assert result["status"] == "ok" and result["output"]["stdout"] == "drawn\n"
        [descriptor] = result["output"]["images"]
        png = image_bytes(descriptor)
        assert png is not None and descriptor["sha256"] == hashlib.sha256(png).hexdigest()
        assert image_sent(kind, fake_model_server.requests[2].json()) == (
            "data:image/png;base64," + base64.b64encode(png).decode("ascii"))
        encoded = base64.b64encode(png).decode("ascii")
        assert not any(encoded[:40].encode() in bytes(e.payload) for e in entries)  # never the bytes
        decision = next(json.loads(e.payload) for e in entries if e.kind == "decision")
        assert (decision["tool"], decision["outcome"]) == ("python_executor", "ask")
        assert rt.replay(task.run_id).verdict == "identical"


@pytest.mark.anyio
async def test_without_images_the_model_reads_the_figure_described_by_its_digest(home, fake_model_server):
    lines, replies = task_replies("chat", fake_model_server, "python_executor", [ARGS[:20], ARGS[20:]], "A zigzag.")
    fake_model_server.reply(*replies)
    async with Runtime(home) as rt:
        await rt.register_agent(_agent(lines, images=False))
        task = await _answered(rt, await rt.submit("analyst", "Plot the sales"))
        assert task.status == "completed", task.error
        sent = fake_model_server.requests[2].json()["messages"]
        assert sent[-1]["role"] == "tool"
        [described] = json.loads(sent[-1]["content"])["images"]
        assert described["type"] == "image" and described["mime_type"] == "image/png"
        assert len(described["sha256"]) == 64
        assert "data:image" not in fake_model_server.requests[2].body.decode()


# --------------------------------------------------------------------------- images and audio from an MCP server

MEDIA_SERVER = '''
import base64, io, wave
import anyio
import mcp_types as t
from mcp.server.mcpserver import MCPServer
from PIL import Image

server = MCPServer("media", log_level="WARNING")

def png(colour):
    out = io.BytesIO()
    Image.new("RGB", (12, 9), colour).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()

def wav():
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1); w.setsampwidth(2); w.setframerate(8000); w.writeframes(bytes(1600))
    return base64.b64encode(out.getvalue()).decode()

@server.tool()
def chart() -> t.CallToolResult:
    """A chart, and its sound."""
    return t.CallToolResult(content=[
        t.TextContent(text="the chart:"),
        t.ImageContent(data=png("orange"), mime_type="image/png"),
        t.AudioContent(data=wav(), mime_type="audio/wav")])

@server.tool()
def odd() -> t.CallToolResult:
    """Media that are not what they say."""
    return t.CallToolResult(content=[
        t.ImageContent(data="not base64 at all!", mime_type="image/png"),
        t.ImageContent(data=base64.b64encode(b"<svg xmlns='http://www.w3.org/2000/svg'/>").decode(),
                       mime_type="image/svg+xml"),
        t.EmbeddedResource(resource=t.BlobResourceContents(uri="file:///c.png", blob=png("teal"),
                                                           mime_type="image/png"))])

anyio.run(server.run_stdio_async)
'''


def _media_server(home, tmp_path) -> None:
    from test_federation_support import write_config

    script = tmp_path / "media_server.py"
    script.write_text(MEDIA_SERVER, encoding="utf-8")
    write_config(home, servers={"media": {"command": sys.executable, "args": [str(script)],
                                          "families": {"chart": "read", "odd": "read"}}})


def _media_agent(url: str, images: bool) -> str:
    return ('name = "viewer"\ndescription = "d"\ninstructions = "Look."\n\n'
            f'[model]\nprovider = "openai"\nmodel = "m"\nbase_url = "{url}/v1"\nmax_retries = 0\n'
            f'images = {"true" if images else "false"}\n\n'
            '[tools]\nrequired = ["mcp:media/chart", "mcp:media/odd"]\n')


def _media_replies(tool: str) -> list:
    return [openai_stream(openai_tool_chunks([("p", "submit_plan", ['{"steps": ["Look at it"]}'])])),
            openai_stream(openai_tool_chunks([("call_m", tool, ["{}"])])),
            openai_stream(openai_text_chunks(["Orange."])),
            openai_stream(openai_tool_chunks([("v", "submit_verdict", ['{"verdict": "pass", "reasons": []}'])]))]


@pytest.mark.anyio
@pytest.mark.parametrize("images", [True, False])
async def test_an_mcp_tools_image_reaches_the_model_by_digest_and_its_audio_stays_described(
        home, tmp_path, fake_model_server, images):
    _media_server(home, tmp_path)
    fake_model_server.reply(*_media_replies("mcp:media/chart"))
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(_media_agent(fake_model_server.url, images))
        task = await (await rt.submit("viewer", "Look at the chart"))
        assert task.status == "completed", task.error
        entries = rt.journal.entries(run_id=task.run_id)
        [result] = [json.loads(e.payload) for e in entries if e.kind == "tool_result"]
        text, image, audio = result["output"]
        assert text == "the chart:"
        assert (image["type"], image["mime_type"], image["width"], image["height"]) == ("image", "image/png", 12, 9)
        png = image_bytes(image)
        assert png is not None and hashlib.sha256(png).hexdigest() == image["sha256"]
        assert audio["type"] == "audio" and audio["mime_type"] == "audio/wav" and len(audio["sha256"]) == 64
        assert image_bytes(audio) is None  # audio is named by digest, never held for a model
        encoded = base64.b64encode(png).decode("ascii")
        assert not any(encoded[:40].encode() in bytes(e.payload) for e in entries)
        request = fake_model_server.requests[2]
        if images:
            sent = request.json()["messages"]
            assert sent[-1]["role"] == "user"
            assert sent[-1]["content"][1] == {"type": "image_url",
                                              "image_url": {"url": "data:image/png;base64," + encoded}}
            assert len(sent[-1]["content"]) == 2  # the image alone: no audio goes to the model
        else:
            assert "data:image" not in request.body.decode()
            assert image["sha256"] in request.json()["messages"][-1]["content"]
        assert rt.replay(task.run_id).verdict == "identical"


@pytest.mark.anyio
async def test_mcp_media_that_are_not_what_they_say_bring_no_image_along(home, tmp_path, fake_model_server):
    _media_server(home, tmp_path)
    fake_model_server.reply(*_media_replies("mcp:media/odd"))
    async with Runtime(home, tool_sources=open_sources) as rt:
        await rt.register_agent(_media_agent(fake_model_server.url, True))
        task = await (await rt.submit("viewer", "Look at the odd things"))
        assert task.status == "completed", task.error
        [result] = [json.loads(e.payload) for e in rt.journal.entries(run_id=task.run_id) if e.kind == "tool_result"]
        broken, svg, embedded = result["output"]
        assert broken == {"type": "image", "mime_type": "image/png", "bytes": None}
        assert svg["mime_type"] == "image/svg+xml" and image_bytes(svg) is None  # not an image a model takes
        image = embedded["image"]
        assert embedded["uri"] == "file:///c.png" and (image["width"], image["height"]) == (12, 9)
        sent = fake_model_server.requests[2].json()["messages"][-1]
        # Only the embedded PNG is given as an image; the others are read described.
        assert [p["type"] for p in sent["content"]] == ["text", "image_url"]
        assert sent["content"][1]["image_url"]["url"].endswith(
            base64.b64encode(image_bytes(image)).decode("ascii"))
