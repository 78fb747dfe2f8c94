"""What a new user meets in the first hour: registering again, manifest mistakes and the CLI's messages.

Each message is checked for its code and for the words that tell the user what to do next. Real
parts: a Runtime over a fresh home, the CLI in this process and as a subprocess, a server on
127.0.0.1 over real HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from apollia_nb.api.server import ServerThread
from apollia_nb.cli import main
from apollia_nb.errors import Conflict, ConsentsToReview
from apollia_nb.runtime import Runtime
from apollia_nb.sdk import Client
from runtime_helpers import call, manifest

TOKEN = "first-hour-token"
WRITE = [{"tool_calls": [call("write_file", path="out.txt", content="hi")]}, {"text": "Wrote it."}]


def run_cli(*args: str, home, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "APOLLIA_HOME": str(home.path)}
    return subprocess.run([sys.executable, "-m", "apollia_nb", *args], capture_output=True, text=True,
                          input=stdin, env=env, timeout=120)


# --- registering again ------------------------------------------------------------------------------


def test_the_cli_registers_a_fixed_manifest_over_an_idle_agent(home, tmp_path, capsys):
    path = tmp_path / "clerk.toml"
    path.write_text(manifest(max_steps=5))
    assert main(["agents", "register", str(path), "--home", str(home.path)]) == 0
    capsys.readouterr()
    path.write_text(manifest(max_steps=9))  # fixed, registered again in a new process on the same home
    assert main(["agents", "register", str(path), "--home", str(home.path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["state"] == "active" and data["max_steps"] == 9
    assert main(["agents", "list", "--json", "--home", str(home.path)]) == 0
    assert [(a["name"], a["max_steps"]) for a in json.loads(capsys.readouterr().out)] == [("clerk", 9)]


def test_the_cli_refuses_to_replace_an_agent_with_a_task_waiting_and_says_how_to_stop_it(home, tmp_path):
    path = tmp_path / "clerk.toml"
    path.write_text(manifest(actor=WRITE))
    assert run_cli("agents", "register", str(path), home=home).returncode == 0
    task = json.loads(run_cli("run", "clerk", "Write out.txt", "--unattended", "--json", home=home).stdout)
    assert task["status"] == "waiting"
    again = run_cli("agents", "register", str(path), home=home)
    assert again.returncode != 0
    assert "CONFLICT" in again.stderr and "busy" in again.stderr and task["id"] in again.stderr
    assert "apollia-os agents stop clerk" in again.stderr
    stopped = run_cli("agents", "stop", "clerk", home=home)
    assert stopped.returncode == 0, stopped.stderr
    assert run_cli("agents", "register", str(path), home=home).returncode == 0


@pytest.mark.anyio
async def test_the_runtime_replaces_an_idle_agent_and_refuses_a_busy_one(home):
    async with Runtime(home) as rt:
        first = await rt.register_agent(manifest(actor=WRITE, max_steps=5))
        second = await rt.register_agent(manifest(actor=WRITE, max_steps=6))
        assert second is not first and second.state.state == "active" and second.manifest.max_steps == 6
        handle = await rt.submit("clerk", "Write out.txt", watched=False)
        await handle.settled()
        assert handle.status == "waiting"
        with pytest.raises(Conflict) as info:
            await rt.register_agent(manifest(actor=WRITE, max_steps=7))
        message = info.value.message
        assert info.value.code == "CONFLICT" and handle.id in message and "waiting" in message
        assert "apollia-os agents stop clerk" in message and "%apollia stop clerk" in message
        assert rt.agent("clerk") is second and second.state.state == "active"  # left as it was
        [pending] = rt.pending_decisions()
        rt.answer(pending["id"], "once", by="test")
        assert (await handle.wait()).status == "completed"
        third = await rt.register_agent(manifest(actor=WRITE, max_steps=7))
        assert third.manifest.max_steps == 7 and third.state.state == "active"


@pytest.mark.anyio
async def test_a_replacement_the_consents_review_refuses_leaves_the_agent_running(home):
    async with Runtime(home) as rt:
        await rt.register_agent(manifest(required=["read_file"]))
        rt.governance.grant_consent("clerk", "write", by="test")
        wider = manifest(required=["read_file", "write_file"])
        with pytest.raises(ConsentsToReview) as info:
            await rt.register_agent(wider)
        assert info.value.code == "CONSENTS_TO_REVIEW" and "write_file" in info.value.message
        assert "--keep-consents" in info.value.message
        assert rt.agent("clerk").state.state == "active" and rt.agent("clerk").offered == ("read_file",)
        replaced = await rt.register_agent(wider, keep_consents=True)
        assert replaced.state.state == "active" and "write_file" in replaced.offered
        assert [c.family.value for c in rt.governance.consents() if c.agent == "clerk"] == ["write"]


@pytest.mark.anyio
async def test_two_replacements_at_once_do_not_break_the_agent(home):
    import anyio

    async with Runtime(home) as rt:
        await rt.register_agent(manifest(max_steps=5))
        outcomes: list[object] = []

        async def again(steps: int) -> None:
            try:
                outcomes.append(await rt.register_agent(manifest(max_steps=steps)))
            except Conflict as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(again, 6)
            tg.start_soon(again, 7)
        refused = [o for o in outcomes if isinstance(o, Conflict)]
        assert len(refused) == 1 and "being registered" in refused[0].message and refused[0].code == "CONFLICT"
        assert rt.agent("clerk").state.state == "active"


@pytest.fixture
def server(home):
    with ServerThread(home, token=TOKEN) as srv:
        yield srv


def test_rest_and_sdk_replace_an_idle_agent_and_refuse_a_busy_one(server):
    with httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=30) as api:
        assert api.post("/agents", json={"manifest": manifest(actor=WRITE, max_steps=5)}).status_code == 201
        again = api.post("/agents", json={"manifest": manifest(actor=WRITE, max_steps=6)})
        assert again.status_code == 201 and again.json()["max_steps"] == 6
        client = Client(server.url, TOKEN)
        assert client.register_agent(manifest(actor=WRITE, max_steps=8)).max_steps == 8
        task = api.post("/tasks", json={"agent": "clerk", "goal": "Write out.txt"}).json()
        waited = api.get(f"/tasks/{task['id']}/wait", params={"until": "settled", "timeout": 30}).json()
        assert waited["status"] == "waiting"
        busy = api.post("/agents", json={"manifest": manifest(actor=WRITE, max_steps=9)})
        assert busy.status_code == 409 and busy.json()["code"] == "CONFLICT"
        assert task["id"] in busy.json()["message"] and "apollia-os agents stop clerk" in busy.json()["message"]
        assert api.get("/agents/clerk").json()["max_steps"] == 8


# --- manifest mistakes ------------------------------------------------------------------------------


def manifest_error(text: str) -> str:
    from apollia_nb.errors import ManifestInvalid
    from apollia_nb.runtime.manifest import parse_manifest

    with pytest.raises(ManifestInvalid) as info:
        parse_manifest(text, source="clerk.toml")
    assert info.value.code == "MANIFEST_INVALID"
    return info.value.message


@pytest.mark.parametrize(("text", "expected"), [
    ('name = "clerk"\n[model]\nprovder = "scripted"\n', 'clerk.toml:3: unknown key "model.provder" (did you mean provider?)'),
    ('name = "clerk"\n\n[[model.script.acter]]\ntext = "hi"\n', 'clerk.toml:3: unknown key "model.script.acter" (did you mean actor?)'),
    ('name = "clerk"\n[model]\nprovider = "scripted"\n[[model.script.actor]]\ntool_calls = [{ nme = "read_file" }]\n',
     'clerk.toml:5: unknown key "model.script.actor[0].tool_calls[0].nme" (did you mean name?)'),
    ('name = "clerk"\ndescripton = "x"\n', 'clerk.toml:2: unknown key "descripton" (did you mean description?)'),
    ('name = "clerk"\n[workspace]\nrooot = "w"\n', 'clerk.toml:3: unknown key "workspace.rooot" (did you mean root?)'),
    ('name = "clerk"\n[model]\nprovider = "openai"\nmodel = "m"\ntemprature = 0.1\n',
     'clerk.toml:5: unknown key "model.temprature" (did you mean temperature?)'),
    ('name = "clerk"\n[model]\nprovider = "scripted"\n[[model.script.critic]]\nverdict = "maybe"\n',
     'clerk.toml:5: "model.script.critic[0].verdict": must be "pass" or "fail"'),
])
def test_a_misspelt_key_is_named_with_its_line_and_the_close_key(text, expected):
    assert manifest_error(text).startswith(expected)


def test_a_model_table_without_provider_is_scripted_as_documented():
    from apollia_nb.runtime.manifest import parse_manifest

    parsed = parse_manifest('name = "clerk"\n[model]\n[[model.script.actor]]\ntext = "hi"\n')
    assert parsed.model["provider"] == "scripted" and parsed.model["script"] == {"actor": [{"text": "hi"}]}
    message = manifest_error('name = "clerk"\n[model]\nbase_url = "http://127.0.0.1:11434/v1"\n')
    assert message.startswith('clerk.toml:3: unknown key "model.base_url"')
    assert 'provider is not set, so it is "scripted"' in message and 'provider = "openai"' in message


@pytest.mark.parametrize(("name", "url"), [("ollama", "http://localhost:11434/v1"), ("vllm", "http://localhost:8000/v1"),
                                           ("Ollama", "http://localhost:11434/v1"), ("lmstudio", "http://localhost:1234/v1")])
def test_an_openai_compatible_server_named_as_provider_says_what_to_write(name, url):
    message = manifest_error(f'name = "clerk"\n[model]\nprovider = "{name}"\nmodel = "llama3"\n')
    assert message.startswith(f"clerk.toml:3: unknown provider '{name}'")
    assert 'provider = "openai"' in message and f'base_url = "{url}"' in message


def test_a_misspelt_provider_gets_the_close_one():
    assert 'did you mean provider = "openai"?' in manifest_error('name = "clerk"\n[model]\nprovider = "opnai"\n')
    assert 'did you mean provider = "anthropic"?' in manifest_error('name = "clerk"\n[model]\nprovider = "claude"\n')


@pytest.mark.parametrize(("provider", "key", "variable"), [
    ("openai", "api_key", "OPENAI_API_KEY"), ("openai", "token", "OPENAI_API_KEY"),
    ("anthropic", "api_key", "ANTHROPIC_API_KEY"), ("anthropic", "apikey", "ANTHROPIC_API_KEY"),
])
def test_a_key_written_in_the_manifest_points_at_api_key_env_and_is_not_echoed(provider, key, variable):
    message = manifest_error(f'name = "clerk"\n[model]\nprovider = "{provider}"\nmodel = "m"\n{key} = "sk-secret-123"\n')
    assert message.startswith(f'clerk.toml:5: unknown key "model.{key}"')
    assert f'api_key_env = "{variable}"' in message and "environment variable" in message
    assert "sk-secret-123" not in message


def test_a_key_at_the_top_level_points_at_api_key_env_too():
    message = manifest_error('name = "clerk"\napi_key = "sk-secret-123"\n')
    assert message.startswith('clerk.toml:2: unknown key "api_key"') and "api_key_env" in message
    assert "sk-secret-123" not in message


def test_an_approval_key_in_the_model_table_is_reported_once():
    message = manifest_error('name = "clerk"\n[model]\nprovider = "scripted"\nauto_approve = true\n')
    assert message.count("\n") == 0 and "no key for approval" in message and message.startswith("clerk.toml:4:")


SCRIPTED_TYPO = """name = "clerk"
[model]
provider = "scripted"

[[model.script.actor]]
text = "Looking."

[[model.script.actor]]
tool_calls = [{ name = "read_fiel", arguments = { path = "a.txt" } }, { name = "mcp:notes/search", arguments = {} }]

[tools]
required = ["read_file", "write_file"]
"""


@pytest.mark.anyio
async def test_a_scripted_call_to_a_tool_the_agent_lacks_is_refused_at_registration(home):
    from apollia_nb.errors import ManifestInvalid

    async with Runtime(home) as rt:
        with pytest.raises(ManifestInvalid) as info:
            await rt.register_agent(SCRIPTED_TYPO)
        message = info.value.message
        assert info.value.code == "MANIFEST_INVALID"
        assert message.startswith("<manifest>:9: model.script.actor[1] (the actor's turn 2) calls \"read_fiel\"")
        assert "did you mean read_file?" in message and "its tools: read_file, write_file" in message
        assert "mcp:notes/search" not in message  # federated names resolve when the agent starts
        assert rt.agents() == [] and rt.records.agents() == []  # nothing registered
        # a tool the manifest's [tools] does not give it is just as absent
        with pytest.raises(ManifestInvalid) as info:
            await rt.register_agent(SCRIPTED_TYPO.replace("read_fiel", "bash_executor"))
        assert '"bash_executor", which is not a tool of agent' in info.value.message
        fixed = await rt.register_agent(SCRIPTED_TYPO.replace("read_fiel", "read_file"))
        assert fixed.state.state == "active"


def test_the_cli_names_the_scripted_typo(home, tmp_path, capsys):
    path = tmp_path / "clerk.toml"
    path.write_text(SCRIPTED_TYPO)
    assert main(["agents", "register", str(path), "--home", str(home.path)]) != 0
    err = capsys.readouterr().err
    assert "MANIFEST_INVALID" in err and f"{path}:9:" in err and "did you mean read_file?" in err


# --- the CLI's and the API's messages ---------------------------------------------------------------


@pytest.mark.anyio
async def test_unknown_agent_lists_the_registered_ones_or_says_how_to_register(home):
    from apollia_nb.errors import UnknownAgent

    async with Runtime(home) as rt:
        with pytest.raises(UnknownAgent) as info:
            await rt.submit("clerk", "Write")
        assert info.value.code == "UNKNOWN_AGENT" and "no agent is registered" in info.value.message
        assert "apollia-os agents register FILE" in info.value.message and "%%apollia agent" in info.value.message
        await rt.register_agent(manifest("writer"))
        await rt.register_agent(manifest("reader"))
        await rt.stop_agent("reader")
        with pytest.raises(UnknownAgent) as info:
            await rt.submit("writr", "Write")
        message = info.value.message
        assert "did you mean writer?" in message and "reader (stopped)" in message and "writer (active)" in message
        with pytest.raises(UnknownAgent) as info:
            rt.sessions.open("nobody")
        assert "the registered agents are reader (stopped), writer (active)" in info.value.message


def test_unknown_agent_from_the_cli_and_rest(home, server):
    ran = run_cli("run", "clerk", "Write", "--unattended", home=home)
    assert ran.returncode != 0 and "UNKNOWN_AGENT" in ran.stderr and "no agent is registered" in ran.stderr
    with httpx.Client(base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        api.post("/agents", json={"manifest": manifest("writer")})
        missing = api.get("/agents/clerk")
        assert missing.status_code == 404 and missing.json()["code"] == "UNKNOWN_AGENT"
        assert "writer (active)" in missing.json()["message"]


def _two_waiting_tasks(home, tmp_path) -> list[dict]:
    path = tmp_path / "clerk.toml"
    path.write_text(manifest(actor=WRITE))
    assert run_cli("agents", "register", str(path), home=home).returncode == 0
    long_goal = "Write out.txt with the summary of the quarter " + "and more " * 20
    tasks = [json.loads(run_cli("run", "clerk", goal, "--unattended", "--json", home=home).stdout)
             for goal in ("Write out.txt for Alice", long_goal)]
    assert [t["status"] for t in tasks] == ["waiting", "waiting"]
    return tasks


def test_pending_list_tells_the_tasks_apart_by_id_and_goal(home, tmp_path):
    first, second = _two_waiting_tasks(home, tmp_path)
    listed = run_cli("pending", "list", home=home)
    assert listed.returncode == 0, listed.stderr
    heads = [line for line in listed.stdout.splitlines() if line.startswith("pd-")]
    assert len(heads) == 2 and heads[0] != heads[1]
    assert f'task {first["id"]}: "Write out.txt for Alice"' in heads[0]
    assert f'task {second["id"]}: "Write out.txt with the summary of the quarter and' in heads[1]
    assert heads[1].endswith('…"') and len(heads[1].split('"')[1]) <= 60  # the goal, cut
    assert "clerk wants to call write_file (write)" in listed.stdout
    as_json = json.loads(run_cli("pending", "list", "--json", home=home).stdout)
    assert set(as_json[0]) >= {"id", "task_id", "tool", "arguments"} and "goal" not in as_json[0]  # unchanged


def test_pending_list_shows_the_goals_on_a_served_home_too(home, tmp_path):
    first, second = _two_waiting_tasks(home, tmp_path)
    owner = run_cli("pending", "list", home=home).stdout
    with ServerThread(home, token=TOKEN):
        served = run_cli("pending", "list", home=home)
    assert served.returncode == 0, served.stderr
    assert served.stdout == owner and f'task {first["id"]}: "Write out.txt for Alice"' in served.stdout


def test_runs_list_has_a_header_and_json_is_unchanged(home, tmp_path):
    _two_waiting_tasks(home, tmp_path)
    text = run_cli("runs", "list", home=home).stdout.splitlines()
    assert text[0].split() == ["RUN", "AGENT", "KIND", "STATUS", "STARTED", "ENTRIES"] and len(text) == 3
    runs = json.loads(run_cli("runs", "list", "--json", home=home).stdout)
    assert isinstance(runs, list) and len(runs) == 2 and "RUN" not in json.dumps(runs)


def test_a_401_says_where_the_token_is_and_never_shows_it(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.get(server.url + "/api/v1/agents", headers=headers)
        assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"
        message = r.json()["message"]
        assert "server.json" in message and "--token" in message and "apollia-os serve --print-token" in message
        assert TOKEN not in message and str(server.info.pid) not in message


def test_serve_says_what_it_leaves_for_its_next_start_when_stopped(home, tmp_path):
    import signal

    env = {**os.environ, "APOLLIA_HOME": str(home.path)}
    proc = subprocess.Popen([sys.executable, "-m", "apollia_nb", "serve"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout.readline().startswith("apollia-os serve: listening on")
        client = Client.from_home(home.path)
        client.register_agent(manifest(actor=WRITE, workspace=str(tmp_path / "work")))
        submitted = client.submit("clerk", "Write out.txt")
        assert client.wait(submitted.id, until="settled").status == "waiting"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "apollia-os serve: stopped; 1 run suspended, waiting on a person" in err
    assert "resumes when its decision is answered, after `apollia-os serve` starts again" in err

    again = subprocess.Popen([sys.executable, "-m", "apollia_nb", "serve"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert again.stdout.readline().startswith("apollia-os serve: listening on")
    again.send_signal(signal.SIGTERM)
    _, err = again.communicate(timeout=60)
    assert "stopped; 1 run suspended" in err  # still there, still waiting


def test_serve_with_nothing_in_progress_says_so(home, tmp_path):
    import signal

    env = {**os.environ, "APOLLIA_HOME": str(home.path)}
    proc = subprocess.Popen([sys.executable, "-m", "apollia_nb", "serve"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert proc.stdout.readline().startswith("apollia-os serve: listening on")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "apollia-os serve: stopped; no run was in progress" in err
