"""Identity from JupyterHub: a served home lets hub users in by their hub tokens, as its people of the same names.

A real JupyterHub (installed by dev/install-test-jupyterhub.sh: jupyterhub from PyPI in its own venv and
configurable-http-proxy from npm) runs on loopback once for this file, with the DummyAuthenticator, the
simple spawner, an admin service that makes users and their tokens, a role granting
``access:services!service=apollia`` to ann, bob and carol, and a hub-managed service that is itself
``apollia-os serve``. The served homes are real ``apollia-os serve`` processes on 127.0.0.1 (port 0).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from served_helpers import api_client

from apollia_nb.api.hub import CACHE_SECS, HubCheck, HubUser, hub_from, read_hub_answer
from apollia_nb.errors import BadInput, Forbidden, HubUnreachable

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / ".test-peers"
HUB = PEERS / "venv-jupyterhub" / "bin" / "jupyterhub"
PROXY = PEERS / "npm-jupyterhub" / "node_modules" / ".bin" / "configurable-http-proxy"
APOLLIA = [sys.executable, "-m", "apollia_nb"]
OWNER = "owner-token-" + "o" * 32
SERVICE = "apollia"


def _require_hub() -> None:
    missing = [str(p.relative_to(REPO)) for p in (HUB, PROXY) if not p.exists()]
    if not missing:
        return
    message = f"{', '.join(missing)} missing: run `bash dev/install-test-jupyterhub.sh`"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    drop = ("APOLLIA_TOKEN", "APOLLIA_HOME", "JUPYTERHUB_USER", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL",
            "JUPYTERHUB_SERVICE_NAME")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


#: What the hub's spawner starts as a user's server (in place of jupyterhub-singleuser): with the environment
#: the hub gives a user's server and its kernels, it does what a notebook does (``Client(url)`` with no
#: token, the cards' ``by``), writes what it got, and answers HTTP so the hub sees the server up.
USER_SERVER = """
import http.server, json, os, pathlib, sys, urllib.parse
where = pathlib.Path(os.environ["APOLLIA_TEST_DIR"])
user = os.environ["JUPYTERHUB_USER"]
result = {}
try:
    from apollia_nb.sdk import Client
    from apollia_nb.notebook.bridge import login_name
    with Client((where / "target").read_text()) as api:
        result["changed_by"] = api.set_developer_mode(True, by="mallory").changed_by
    result["login_name"] = login_name()
except Exception as exc:
    result["error"] = f"{type(exc).__name__}: {exc}"
(where / f"{user}.part").write_text(json.dumps(result))
(where / f"{user}.part").replace(where / f"{user}.json")

class Up(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass

port = urllib.parse.urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"]).port
http.server.ThreadingHTTPServer(("127.0.0.1", port), Up).serve_forever()
"""


@dataclass
class Hub:
    api: str
    admin: str
    managed_home: Path

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = httpx.request(method, f"{self.api}{path}", headers={"Authorization": f"token {self.admin}"},
                          timeout=30, trust_env=False, **kw)
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r

    def wait_for(self, path: Path, what: str) -> str:
        deadline = time.monotonic() + 120
        while not path.exists():
            assert time.monotonic() < deadline, f"{what} did not happen"
            time.sleep(0.2)
        return path.read_text()

    def token(self, user: str, scopes: list[str] | None = None) -> tuple[str, str]:
        """A new token of ``user`` made through the hub's API: ``(token, token id)``."""
        body: dict[str, Any] = {"note": "apollia test"}
        if scopes is not None:
            body["scopes"] = scopes
        made = self.call("POST", f"/users/{user}/tokens", json=body).json()
        return made["token"], made["id"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    _require_hub()
    where = tmp_path_factory.mktemp("jupyterhub")
    public, hub_port, proxy_api = _free_port(), _free_port(), _free_port()
    admin = secrets.token_hex(32)
    managed_home = where / "managed-home"
    config = f"""
c = get_config()  # noqa
c.JupyterHub.ip = '127.0.0.1'
c.JupyterHub.port = {public}
c.JupyterHub.hub_ip = '127.0.0.1'
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{proxy_api}'
c.ConfigurableHTTPProxy.command = [{str(PROXY)!r}]
c.JupyterHub.authenticator_class = 'dummy'
c.Authenticator.allow_all = True
c.JupyterHub.spawner_class = 'simple'
c.JupyterHub.db_url = 'sqlite:///{where}/jupyterhub.sqlite'
c.JupyterHub.cookie_secret_file = {str(where / 'cookie_secret')!r}
c.JupyterHub.pid_file = {str(where / 'jupyterhub.pid')!r}
c.JupyterHub.services = [
    {{'name': 'tester', 'api_token': {admin!r}}},
    {{'name': {SERVICE!r}, 'command': {[*APOLLIA, 'serve', '--home', str(managed_home), '--port', '0',
                                        '--token', OWNER]!r}}},
]
c.SimpleLocalProcessSpawner.home_dir_template = {str(where / 'homes' / '{username}')!r}
c.Spawner.cmd = [{sys.executable!r}, {str(where / 'server.py')!r}]
c.Spawner.environment = {{'APOLLIA_TEST_DIR': {str(where)!r}}}
c.Spawner.server_token_scopes = ['users:activity!user', 'access:servers!server', 'access:services!service={SERVICE}']
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 90
c.JupyterHub.load_roles = [
    {{'name': 'tester', 'scopes': ['admin:users', 'tokens', 'servers'], 'services': ['tester']}},
    {{'name': 'apollia-users', 'scopes': ['access:services!service={SERVICE}'], 'users': ['ann', 'bob', 'carol']}},
]
"""
    (where / "jupyterhub_config.py").write_text(config)
    (where / "server.py").write_text(USER_SERVER)
    log = (where / "hub.log").open("w")
    proc = subprocess.Popen([str(HUB), "-f", str(where / "jupyterhub_config.py")], cwd=where, stdout=log,
                            stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    api = f"http://127.0.0.1:{hub_port}/hub/api"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (where / "hub.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{api}/", timeout=2, trust_env=False).status_code == 200:
                    break
            assert time.monotonic() < deadline, (where / "hub.log").read_text()
            time.sleep(0.2)
        the_hub = Hub(api, admin, managed_home)
        the_hub.call("POST", "/users/dave")  # ann, bob and carol exist: the hub made them for their role
        yield the_hub
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def cli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APOLLIA, *args, "--home", str(home)], capture_output=True, text=True,
                          env=_env(**env), cwd=home.parent, timeout=180)


@contextlib.contextmanager
def serving(home: Path, *extra: str) -> Iterator[tuple[str, list[str]]]:
    """``apollia-os serve`` on ``home``; yields its /api/v1 URL and, once it stopped, its stderr lines."""
    work = home.parent / "work"
    work.mkdir(exist_ok=True)
    proc = subprocess.Popen([*APOLLIA, "serve", "--home", str(home), "--port", "0", "--token", OWNER, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=work)
    err: list[str] = []
    try:
        assert proc.stdout is not None and proc.stdout.readline(), proc.stderr.read() if proc.stderr else ""
        yield json.loads((home / "server.json").read_text())["url"] + "/api/v1", err
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        err.extend(stderr.splitlines())


def add_person(home: Path, name: str, *roles: str) -> None:
    out = cli(home, "people", "add", name, *[a for r in roles for a in ("--role", r)])
    assert out.returncode == 0, out.stderr


def send(url: str, token: str, method: str = "PUT", path: str = "/governance/developer-mode",
         body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.request(method, f"{url}{path}", json=body if body is not None else {"enabled": True, "by": "mallory"},
                         headers={"Authorization": f"Bearer {token}"}, timeout=60, trust_env=False)


def journal_of(home: Path) -> list[Any]:
    from apollia_nb.home import Home
    from apollia_nb.journal import Journal

    with Journal.open(Home.at(home)) as journal:
        return journal.entries()


def who_changed_devmode(home: Path) -> list[tuple[Any, ...]]:
    return [tuple(json.loads(e.payload).get(k) for k in ("by", "by_role", "auth", "enabled"))
            for e in journal_of(home) if e.kind == "devmode_changed"]


def _files_holding(root: Path, secret: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


# --- a served home with a real hub ----------------------------------------------------------------


def test_two_hub_users_on_one_served_home_are_journaled_by_their_hub_names(hub, tmp_path):
    home = tmp_path / "home"
    ann, _ = hub.token("ann")
    bob, _ = hub.token("bob")
    with serving(home, "--hub", hub.api, "--hub-service", SERVICE) as (url, err):
        add_person(home, "ann", "rules")
        add_person(home, "bob", "rules", "auditor")
        on = send(url, ann, body={"enabled": True, "by": "mallory"})
        assert on.status_code == 200, on.text
        assert on.json()["changed_by"] == "ann"  # a hub user is themselves, whatever the body says
        off = send(url, bob, body={"enabled": False, "by": "mallory"})
        assert off.status_code == 200 and off.json()["changed_by"] == "bob", off.text
        again = send(url, ann, body={"enabled": True})  # a second request: the hub's answer is kept, same person
        assert again.status_code == 200 and again.json()["changed_by"] == "ann"
        # the roles are the home's: bob may read the journal, ann may not
        assert send(url, bob, "GET", "/audit/verify").status_code == 200
        refused = send(url, ann, "GET", "/audit/verify")
        assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN"
        assert "'auditor'" in refused.json()["message"] and "ann has rules" in refused.json()["message"]
    assert who_changed_devmode(home) == [("ann", "rules", "hub", True), ("bob", "rules+auditor", "hub", False),
                                         ("ann", "rules", "hub", True)]
    assert _files_holding(home, ann) == [] and _files_holding(home, bob) == []
    assert not any(ann in line or bob in line for line in err)
    with serving(home) as (url, _):  # served again without a hub: no hub is asked, a hub token is no token
        r = send(url, ann)
        assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED"


def test_a_hub_user_who_is_no_person_of_the_home_or_is_revoked_holds_no_role(hub, tmp_path):
    home = tmp_path / "home"
    carol, _ = hub.token("carol")
    bob, _ = hub.token("bob")
    with serving(home, "--hub", hub.api) as (url, _):
        add_person(home, "bob", "rules")
        for path, method, role in (("/governance/developer-mode", "PUT", "rules"), ("/agents", "GET", "runner"),
                                   ("/people", "GET", "admin")):
            refused = send(url, carol, method, path)
            assert refused.status_code == 403, refused.text
            assert refused.json()["code"] == "FORBIDDEN"
            assert f"needs the role {role!r}" in refused.json()["message"]
            assert "carol has no role on this home" in refused.json()["message"]
        # a retry key from someone without a role is no key: nothing is replayed, it is refused as it is
        keyed = httpx.put(f"{url}/governance/developer-mode", json={"enabled": True},
                          headers={"Authorization": f"Bearer {carol}", "Idempotency-Key": "k-1"}, timeout=60)
        assert keyed.status_code == 403
        assert send(url, bob).status_code == 200
        assert cli(home, "people", "revoke", "bob").returncode == 0
        revoked = send(url, bob)  # the hub still vouches for bob; the home no longer gives him a role
        assert revoked.status_code == 403 and "bob has no role" in revoked.json()["message"]
    assert who_changed_devmode(home) == [("bob", "rules", "hub", True)]


def test_a_token_the_hub_does_not_know_is_401_and_one_not_meant_for_this_home_is_403(hub, tmp_path):
    home = tmp_path / "home"
    dave, _ = hub.token("dave")  # a hub user without access:services!service=apollia
    narrow, _ = hub.token("ann", scopes=["read:users:name!user=ann"])  # ann's, but only to read her name
    revoked, revoked_id = hub.token("ann")
    hub.call("DELETE", f"/users/ann/tokens/{revoked_id}")
    with serving(home, "--hub", hub.api) as (url, _):
        add_person(home, "ann", "admin")
        add_person(home, "dave", "admin")
        for token in ("not-a-token", revoked, secrets.token_hex(16), "x" * 5000):
            r = send(url, token)
            assert r.status_code == 401, r.text
            assert r.json()["code"] == "UNAUTHORIZED" and r.headers["www-authenticate"] == "Bearer"
        for raw in (b"Bearer t\xf6ken", b"Bearer a b"):  # never passed on, never a 500
            r = httpx.put(f"{url}/governance/developer-mode", json={"enabled": True}, timeout=60,
                          headers={"Authorization": raw})
            assert r.status_code == 401 and r.json()["code"] == "UNAUTHORIZED", (raw, r.text)
        # A control byte is no field value (RFC 9110 5.5): the HTTP parser refuses the request (400)
        # before any route sees it.
        r = httpx.put(f"{url}/governance/developer-mode", json={"enabled": True}, timeout=60,
                      headers={"Authorization": b"Bearer \x7f"})
        assert r.status_code in (400, 401), r.text
        for token, who in ((dave, "'dave'"), (narrow, "'ann'")):
            r = send(url, token)
            assert r.status_code == 403, r.text
            assert r.json()["code"] == "FORBIDDEN" and who in r.json()["message"]
            assert "access:services!service=apollia" in r.json()["message"]
        keyed = httpx.post(f"{url}/governance/rules", json={"tool": "bash_executor", "effect": "allow"}, timeout=60,
                           headers={"Authorization": f"Bearer {dave}", "Idempotency-Key": "k-1"})
        assert keyed.status_code == 403 and keyed.json()["code"] == "FORBIDDEN"
        service = send(url, hub.admin)  # a hub service's own token is no person
        assert service.status_code == 403 and "not a person's" in service.json()["message"]
        assert send(url, OWNER, body={"enabled": True}).status_code == 200  # the owner's token is the server's own, as ever
    assert who_changed_devmode(home) == [("api", "admin", "owner", True)]


def test_a_hub_that_does_not_answer_refuses_every_hub_token_and_no_other(hub, tmp_path):
    home = tmp_path / "home"
    ann, _ = hub.token("ann")
    dead = f"http://127.0.0.1:{_free_port()}/hub/api"
    with serving(home, "--hub", dead) as (url, _):
        add_person(home, "ann", "rules")
        add_person(home, "rita", "rules")
        personal = cli(home, "people", "rotate", "rita").stdout.strip()
        for token in (ann, "not-a-token"):
            r = send(url, token)
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "HUB_UNREACHABLE" and token not in r.text
            assert dead.split("/hub")[0] not in r.text  # the hub's address is the server's to know
        stream = httpx.get(f"{url}/tasks/t-1/events", headers={"Authorization": f"Bearer {ann}"}, timeout=60)
        assert stream.status_code == 503 and stream.json()["code"] == "HUB_UNREACHABLE"
        keyed = httpx.post(f"{url}/governance/rules", json={"tool": "bash_executor", "effect": "allow"}, timeout=60,
                           headers={"Authorization": f"Bearer {ann}", "Idempotency-Key": "k-1"})
        assert keyed.status_code == 503 and keyed.json()["code"] == "HUB_UNREACHABLE"
        assert send(url, personal).status_code == 200  # a personal token and the owner's never ask the hub
        assert send(url, OWNER, body={"enabled": False}).status_code == 200
    assert [b for b, *_ in who_changed_devmode(home)] == ["rita", "api"]


def test_the_home_jupyterhub_starts_as_its_service_checks_tokens_at_that_hub(hub):
    info_file = hub.managed_home / "server.json"
    deadline = time.monotonic() + 60
    while not info_file.exists():
        assert time.monotonic() < deadline, "the hub's managed service did not start serving"
        time.sleep(0.2)
    url = json.loads(info_file.read_text())["url"] + "/api/v1"
    ann, _ = hub.token("ann")
    with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
        added = http.post("/people", json={"name": "ann", "roles": ["rules"]},
                          headers={"Authorization": f"Bearer {OWNER}"})
        assert added.status_code in (201, 409), added.text  # 409: made by an earlier run of this test
        r = http.get("/governance/developer-mode", headers={"Authorization": f"Bearer {ann}"})
        assert r.status_code == 200, r.text
        dave, _ = hub.token("dave")
        refused = http.get("/governance/developer-mode", headers={"Authorization": f"Bearer {dave}"})
        assert refused.status_code == 403 and "access:services!service=apollia" in refused.json()["message"]


def test_a_hub_user_runs_and_another_answers_its_card_each_journaled_by_their_hub_name(hub, home):
    from runtime_helpers import call, manifest

    from apollia_nb.api.server import ServerThread

    writer = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="b")]}, {"text": "Done."}])
    ann, _ = hub.token("ann")
    bob, _ = hub.token("bob")

    with ServerThread(home, token=OWNER, hub=hub.api) as srv, api_client(srv.url, OWNER) as owner, \
            api_client(srv.url, ann) as as_ann, api_client(srv.url, bob) as as_bob:
        for name, role in (("ann", "runner"), ("bob", "approver")):
            assert owner.post("/people", json={"name": name, "roles": [role]}).status_code == 201
        assert as_ann.post("/agents", json={"manifest": writer}).status_code == 201
        task = as_ann.post("/tasks", json={"agent": "clerk", "goal": "Write a"}).json()
        deadline = time.monotonic() + 60
        while not (pending := as_bob.get("/pending-decisions").json()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        [card] = pending
        assert card["task_id"] == task["id"]
        refused = as_ann.post("/pending-decisions/decide", json={"id": card["id"], "answer": "once"})
        assert refused.status_code == 403 and "'approver'" in refused.json()["message"]
        answered = as_bob.post("/pending-decisions/decide", json={"id": card["id"], "answer": "once", "by": "x"})
        assert answered.status_code == 200, answered.text
        entries = owner.get("/audit/entries", params={"limit": 1000}).json()["entries"]
    [answer] = [e["payload"] for e in entries if e["kind"] == "answer"]
    assert {k: answer[k] for k in ("answered_by", "by_role", "auth")} == {
        "answered_by": "bob", "by_role": "approver", "auth": "hub"}
    assert ann not in json.dumps(entries) and bob not in json.dumps(entries)


# --- the kernel side ------------------------------------------------------------------------------


def test_a_users_server_the_hub_spawns_sends_its_hub_token_and_names_its_hub_user(hub, tmp_path):
    home = tmp_path / "home"
    where = hub.managed_home.parent
    with serving(home, "--hub", hub.api) as (url, _):
        add_person(home, "ann", "rules")
        (where / "target").write_text(url.removesuffix("/api/v1"))
        hub.call("POST", "/users/ann/server")  # the hub spawns ann's server with its own token for her
        try:
            got = json.loads(hub.wait_for(where / "ann.json", "ann's server"))
        finally:
            with contextlib.suppress(AssertionError):
                hub.call("DELETE", "/users/ann/server")
    assert got == {"changed_by": "ann", "login_name": "ann"}
    assert who_changed_devmode(home) == [("ann", "rules", "hub", True)]


def test_the_cli_in_a_hubs_terminal_names_its_hub_user_on_a_home_nobody_serves(tmp_path):
    owned = tmp_path / "owned"
    done = cli(owned, "devmode", "on", JUPYTERHUB_USER="ann")
    assert done.returncode == 0, done.stderr
    assert [b for b, *_ in who_changed_devmode(owned)] == ["ann"]


def test_a_client_with_no_token_anywhere_says_so():
    from apollia_nb.sdk import Client

    saved = {k: os.environ.pop(k) for k in ("APOLLIA_TOKEN", "JUPYTERHUB_API_TOKEN") if k in os.environ}
    try:
        with pytest.raises(BadInput, match="no token to send"):
            Client("http://127.0.0.1:9")
    finally:
        os.environ.update(saved)


# --- the hub check itself: the real hub, a hub that misbehaves, the answer's reading ---------------


def test_a_token_revoked_at_the_hub_stops_working_when_the_cache_window_ends(hub):
    now = [1000.0]
    check = HubCheck(hub.api, service=SERVICE, clock=lambda: now[0])
    token, token_id = hub.token("ann")

    async def main() -> list[HubUser | None]:
        seen = [await check.identify(token)]
        hub.call("DELETE", f"/users/ann/tokens/{token_id}")
        seen.append(await check.identify(token))  # kept: the hub is not asked again within the window
        now[0] += CACHE_SECS - 0.001
        seen.append(await check.identify(token))
        now[0] += 0.002
        seen.append(await check.identify(token))  # the window ended: asked, and the hub no longer knows it
        await check.aclose()
        return seen

    seen = anyio.run(main)
    assert [u.name if u else None for u in seen] == ["ann", "ann", "ann", None]
    assert CACHE_SECS == 30.0


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, bytes]] = {}
    seen: list[str] = []

    def do_GET(self) -> None:  # http.server's name
        self.seen.append(self.headers.get("Authorization", ""))
        status, body = self.answers.get(self.path.split("/")[1], (404, b""))
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "http://127.0.0.1:9/hub/api/user")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def misbehaving() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Misbehaving)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


USER = {"kind": "user", "name": "ann", "scopes": ["access:services!service=apollia"]}


@pytest.mark.parametrize(("answer", "outcome"), [
    ((500, b'{"status": 500}'), HubUnreachable),
    ((502, b""), HubUnreachable),
    ((404, b""), HubUnreachable),  # not a hub API at that URL
    ((302, b""), HubUnreachable),  # a redirect is not followed with a token
    ((200, b"<html>not json</html>"), HubUnreachable),
    ((200, b"[]"), HubUnreachable),
    ((200, json.dumps({"kind": "user", "name": "ann"}).encode()), HubUnreachable),  # no scopes
    ((200, json.dumps({**USER, "name": ""}).encode()), HubUnreachable),
    ((200, json.dumps({**USER, "scopes": "access:services"}).encode()), HubUnreachable),
    ((200, json.dumps({**USER, "kind": "service"}).encode()), Forbidden),
    ((200, json.dumps({**USER, "kind": None}).encode()), Forbidden),
    ((200, json.dumps({**USER, "scopes": ["access:services!service=other"]}).encode()), Forbidden),
    ((200, json.dumps({**USER, "scopes": ["access:servers!server=ann/"]}).encode()), Forbidden),
    ((200, json.dumps({**USER, "scopes": ["access:services!service=apollia-x"]}).encode()), Forbidden),
    ((401, b""), None),
    ((403, b'{"status": 403, "message": null}'), None),
    ((200, json.dumps(USER).encode()), "ann"),
    ((200, json.dumps({**USER, "scopes": ["access:services"]}).encode()), "ann"),
])
def test_what_the_hub_answers_decides_and_anything_unexpected_refuses(misbehaving, answer, outcome):
    _Misbehaving.answers = {"hub": answer}
    _Misbehaving.seen = []
    check = HubCheck(f"{misbehaving}/hub/api", service=SERVICE)

    async def ask() -> HubUser | None:
        try:
            return await check.identify("the-token")
        finally:
            await check.aclose()

    if isinstance(outcome, type):
        with pytest.raises(outcome) as raised:
            anyio.run(ask)
        assert "the-token" not in raised.value.message
    else:
        user = anyio.run(ask)
        assert (user.name if user else None) == outcome
        assert read_hub_answer(answer[0], answer[1], SERVICE) == user  # the pure reading says the same
    assert _Misbehaving.seen == ["token the-token"]  # asked once, the JupyterHub way


def test_the_homes_own_tokens_revoked_or_rotated_away_are_never_sent_to_the_hub(misbehaving, home):
    from apollia_nb.api.server import ServerThread

    _Misbehaving.answers = {"hub": (403, b"")}
    _Misbehaving.seen = []
    with ServerThread(home, token=OWNER, hub=f"{misbehaving}/hub/api") as srv:
        with api_client(srv.url) as http:
            def as_(token: str) -> httpx.Response:
                return http.get("/governance/developer-mode", headers={"Authorization": f"Bearer {token}"})

            made = http.post("/people", json={"name": "rita", "roles": ["rules"]},
                             headers={"Authorization": f"Bearer {OWNER}"}).json()
            first = made["token"]
            second = http.post("/people/rita/rotate", headers={"Authorization": f"Bearer {OWNER}"}).json()["token"]
            assert as_(second).status_code == 200
            http.post("/people/rita/revoke", headers={"Authorization": f"Bearer {OWNER}"})
            other_home = secrets.token_urlsafe(32)  # another home's owner token, sent here by mistake
            for token in (first, second, other_home):
                refused = as_(token)
                assert refused.status_code == 401 and refused.json()["code"] == "UNAUTHORIZED"
            assert _Misbehaving.seen == []  # none of them left the server
            assert as_(secrets.token_hex(16)).status_code == 401  # a token of the hub's shape is asked about
    assert _Misbehaving.seen and all(s.startswith("token ") and len(s) == 38 for s in _Misbehaving.seen)


def test_refusals_and_failures_are_asked_again_only_a_users_answer_is_kept(misbehaving):
    _Misbehaving.seen = []
    check = HubCheck(f"{misbehaving}/hub/api", service=SERVICE)

    async def main() -> None:
        _Misbehaving.answers = {"hub": (403, b"")}
        assert await check.identify("t") is None
        _Misbehaving.answers = {"hub": (500, b"")}
        with pytest.raises(HubUnreachable):
            await check.identify("t")
        _Misbehaving.answers = {"hub": (200, json.dumps(USER).encode())}
        assert (await check.identify("t")).name == "ann"
        _Misbehaving.answers = {"hub": (500, b"")}
        assert (await check.identify("t")).name == "ann"  # kept
        with pytest.raises(HubUnreachable):
            await check.identify("another")
        await check.aclose()

    anyio.run(main)
    assert len(_Misbehaving.seen) == 4


def test_which_hub_a_served_home_asks():
    assert hub_from(None, None, {}) is None
    # a single-user server and its terminals have the hub's API URL, and are no service: nothing turns on
    assert hub_from(None, None, {"JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api"}) is None
    as_service = hub_from(None, None, {"JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api/",
                                       "JUPYTERHUB_SERVICE_NAME": "governed"})
    assert as_service is not None
    assert (as_service.api_url, as_service.service) == ("http://127.0.0.1:8081/hub/api", "governed")
    flagged = hub_from("http://hub.internal:8081/hub/api", None, {"JUPYTERHUB_SERVICE_NAME": "governed",
                                                                 "JUPYTERHUB_API_URL": "http://x/hub/api"})
    assert flagged is not None and (flagged.api_url, flagged.service) == ("http://hub.internal:8081/hub/api",
                                                                           "governed")
    plain = hub_from("http://127.0.0.1:8081/hub/api", "mine", {})
    assert plain is not None and plain.service == "mine"
    assert hub_from("http://127.0.0.1:8081/hub/api", None, {}).service == "apollia"  # type: ignore[union-attr]
    for bad in ("127.0.0.1:8081", "file:///etc/passwd", "ftp://hub/api", "http:///hub/api",
                "http://admin:secret@127.0.0.1:8081/hub/api", "http://127.0.0.1:8081/hub/api?x=1",
                "http://127.0.0.1:8081/hub/api#x"):
        with pytest.raises(BadInput):
            hub_from(bad, None, {})
    with pytest.raises(BadInput):
        HubCheck("http://127.0.0.1:8081/hub/api", service="")


def test_a_kernel_a_hub_started_journals_its_hub_user_on_the_home_it_owns(home, monkeypatch):
    from IPython.testing import globalipapp

    from apollia_nb.notebook.extension import unload_ipython_extension

    monkeypatch.setenv("JUPYTERHUB_USER", "ann")  # what the hub's spawner sets for ann's server and kernels
    monkeypatch.setenv("USER", "root")
    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    try:
        shell.run_line_magic("load_ext", "apollia_nb")
        shell.run_line_magic("apollia", "devmode on")
    finally:
        unload_ipython_extension(shell)
        shell.extension_manager.loaded.discard("apollia_nb")
    assert [b for b, *_ in who_changed_devmode(home.path)] == ["ann"]
