"""The REST API answers only for its own host names, and browser pages only from allowed origins.

Against a real `apollia-os serve` subprocess on 127.0.0.1 and plain HTTP, the way a page that
rebinds its DNS name to 127.0.0.1 (or another local page) would reach it.
"""

from __future__ import annotations

import json

import httpx
import pytest

from apollia_nb.api.app import HostGuard, host_allowed, split_host
from apollia_nb.api.server import ServerThread
from apollia_nb.sdk import Client, errors
from test_api_serve import start, stop

TOKEN = "host-token-abc"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"code", "message"} and body["code"] == code, body
    return body["message"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`apollia-os serve` with one extra host name and one browser origin allowed."""
    home = tmp_path_factory.mktemp("hosts") / "home"
    proc, _ = start(home, "--token", TOKEN, "--allowed-host", "Apollia.Test", "--cors-origin", "http://app.test")
    try:
        info = json.loads((home / "server.json").read_text())
        yield info["url"], home
    finally:
        assert stop(proc) == 0


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "localhost.evil",
                                  "10.0.0.1", "[::2]:8000", "", "::1", "apollia.test.evil"])
@pytest.mark.parametrize("path", ["/api/v1/health", "/api/v1/agents", "/api/v1/internal/journal/head",
                                  "/api/v1/no/such/route"])
def test_a_foreign_host_is_refused_on_every_route_even_with_the_token(served, host, path):
    url, _ = served
    message = error(httpx.get(url + path, headers={**AUTH, "Host": host}), 421, "HOST_NOT_ALLOWED")
    assert "--allowed-host" in message


def test_a_foreign_host_changes_nothing(served):
    url, _ = served
    manifest = {"name": "rebound", "model": "scripted", "tools": ["read_file"]}
    r = httpx.post(url + "/api/v1/agents", json=manifest, headers={**AUTH, "Host": "evil.example"})
    error(r, 421, "HOST_NOT_ALLOWED")
    names = [a["name"] for a in httpx.get(url + "/api/v1/agents", headers=AUTH).json()]
    assert "rebound" not in names


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST:1", "[::1]", "127.0.0.1:{port}",
                                  "localhost:{port}", "[::1]:{port}", "127.9.9.9", "apollia.test", "apollia.test:443",
                                  "localhost."])
def test_loopback_names_and_allowed_hosts_are_served(served, host):
    url, _ = served
    port = url.rsplit(":", 1)[1]
    r = httpx.get(url + "/api/v1/agents", headers={**AUTH, "Host": host.format(port=port)})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:3000", "http://127.0.0.1",
                                    "https://app.test", "http://app.test.evil"])
def test_a_browser_page_of_another_origin_is_refused(served, origin):
    url, _ = served
    for method in ("GET", "POST", "OPTIONS"):
        r = httpx.request(method, url + "/api/v1/tasks", headers={**AUTH, "Origin": origin,
                                                                  "Access-Control-Request-Method": "POST"})
        error(r, 403, "ORIGIN_NOT_ALLOWED")
        assert "access-control-allow-origin" not in r.headers
    error(httpx.get(url + "/api/v1/health", headers={"Origin": origin}), 403, "ORIGIN_NOT_ALLOWED")


def test_the_servers_own_pages_and_allowed_origins_are_served(served):
    url, _ = served
    assert httpx.get(url + "/api/v1/agents", headers={**AUTH, "Origin": url}).status_code == 200
    r = httpx.get(url + "/api/v1/agents", headers={**AUTH, "Origin": "http://app.test"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.test"
    r = httpx.get(url + "/api/v1/agents", headers={**AUTH, "Host": "apollia.test", "Origin": "https://apollia.test"})
    assert r.status_code == 200


def test_the_sdk_still_works_and_raises_the_codes(served):
    url, home = served
    with Client.from_home(home) as api:
        assert api.health().status == "ok"
        assert isinstance(api.agents(), list)
    with httpx.Client(base_url=url, headers={**AUTH, "Host": "evil.example"}) as raw:
        from apollia_nb.sdk.client import raise_for_error

        r = raw.get("/api/v1/agents")
        with pytest.raises(errors.HostNotAllowed):
            raise_for_error(r.status_code, r.content)


def test_with_allow_remote_the_bound_address_is_a_host_and_star_allows_any(tmp_path):
    with ServerThread(tmp_path / "a", token=TOKEN, host="127.0.0.2", allow_remote=True) as srv:
        assert httpx.get(srv.url + "/api/v1/health", headers={"Host": "127.0.0.2"}).status_code == 200
        error(httpx.get(srv.url + "/api/v1/health", headers={"Host": "evil.example"}), 421, "HOST_NOT_ALLOWED")
    with ServerThread(tmp_path / "b", token=TOKEN, allowed_hosts=("*",), cors_origins=("*",)) as srv:
        r = httpx.get(srv.url + "/api/v1/health", headers={"Host": "any.example", "Origin": "http://x.example"})
        assert r.status_code == 200


def test_host_names_are_read_strictly():
    assert split_host("LocalHost:8000") == "localhost"
    assert split_host("[::1]:8000") == "::1" and split_host("[::1]") == "::1"
    assert split_host("example.org.") == "example.org"
    for bad in ("", ":80", "::1", "[::1", "[::1]x", "host:port", "a:1:2"):
        assert split_host(bad) is None, bad
    allowed = frozenset({"apollia.test"})
    assert host_allowed("127.0.0.1", allowed) and host_allowed("::1", allowed) and host_allowed("apollia.test", allowed)
    assert not host_allowed("0.0.0.0", allowed) and not host_allowed("evil.example", allowed)
    guard = HostGuard(None, allowed_hosts=("[::5]",), allowed_origins=("http://App.Test/",))
    assert guard.refusal({b"host": b"[::5]:1"}) is None
    assert guard.refusal({b"host": b"localhost", b"origin": b"http://app.test"}) is None
    assert guard.refusal({}).code == "HOST_NOT_ALLOWED"
