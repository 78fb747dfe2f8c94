"""Every route of a served home × every role, over real HTTP on 127.0.0.1: allowed, or 403 ``FORBIDDEN``.

The routes are the app's own (its OpenAPI document); what each needs is ``api.roles.ROUTE_ROLES``, the one
table ``docs/people-and-roles.md`` prints (checked for drift here too). A person holding one role sends
each request; one without the route's role gets 403 ``FORBIDDEN`` naming it, one with it never does (the
request then fails or succeeds on its own merits). The owner token is never refused; no token, a wrong
one or a revoked one is 401 everywhere but ``/health``.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apollia_nb.api.deps import API_PREFIX
from apollia_nb.api.roles import ROLE_EXTENSION, ROUTE_ROLES, roles_of
from apollia_nb.governance.people import ROLES

ROOT = Path(__file__).resolve().parents[1]
OWNER = "matrix-owner-" + "k" * 32


def _routes() -> list[tuple[str, str]]:
    from apollia_nb.api.app import create_app

    doc = create_app(None, token="reference").openapi()
    return [(m.upper(), p.removeprefix(API_PREFIX)) for p, item in doc["paths"].items() for m in item]


ROUTES = _routes()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A served home with one person per role (and one revoked); yields the API's URL and each one's token."""
    from apollia_nb.api.server import ServerThread
    from apollia_nb.home import Home

    home = Home.at(tmp_path_factory.mktemp("matrix") / "home")
    with ServerThread(home, token=OWNER) as srv:
        url = srv.url + API_PREFIX
        tokens: dict[str, str] = {}
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {OWNER}"}, timeout=30) as owner:
            for role in (*ROLES, "revoked"):
                made = owner.post("/people", json={"name": f"p-{role}", "roles": [role if role in ROLES else "admin"]})
                assert made.status_code == 201, made.text
                tokens[role] = made.json()["token"]
            assert owner.post("/people/p-revoked/revoke").status_code == 200
        yield url, tokens


def _request(url: str, method: str, path: str, token: str | None) -> httpx.Response:
    concrete = re.sub(r"\{[^}]+\}", "zz-none", path)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    body: Any = {} if method in ("POST", "PUT") else None
    with httpx.Client(base_url=url, timeout=30) as http:
        # event streams are opened and closed at once: the status and first bytes tell
        with http.stream(method, concrete, json=body, headers=headers, params={"timeout": 0}) as response:
            response.read() if response.headers.get("content-type", "").startswith("application/json") else None
            return response


def test_every_route_is_in_the_one_table_and_the_table_names_no_route_that_is_gone():
    assert set(ROUTES) == set(ROUTE_ROLES), (set(ROUTES) ^ set(ROUTE_ROLES))


def test_the_openapi_document_states_each_routes_role():
    from apollia_nb.api.app import create_app

    doc = create_app(None, token="reference").openapi()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            roles = roles_of(method, path.removeprefix(API_PREFIX))
            assert op[ROLE_EXTENSION] == (None if roles is None else roles[0] if len(roles) == 1 else list(roles))
            named = " or ".join(f"`{r}`" for r in roles) if roles else ""
            assert (f"Needs the role {named}" if roles else "No token needed") in op["description"]


def test_the_docs_table_has_not_drifted_from_the_route_table():
    spec = importlib.util.spec_from_file_location("make_roles_table", ROOT / "dev" / "docs" / "make_roles_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "run: python dev/docs/make_roles_table.py"
    text = (ROOT / "docs" / "people-and-roles.md").read_text()
    for method, path in ROUTES:
        roles = roles_of(method, path)
        cell = "none (no token)" if roles is None else " or ".join(f"`{r}`" for r in roles)
        assert f"| `{method} {API_PREFIX}{path}` | {cell} |" in text


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_each_role_is_allowed_or_refused_with_forbidden_naming_the_role(server, method, path):
    url, tokens = server
    needed = roles_of(method, path)
    for role in ROLES:
        response = _request(url, method, path, tokens[role])
        allowed = needed is None or role == "admin" or role in needed
        if allowed:
            assert response.status_code != 403 or response.json().get("code") != "FORBIDDEN", (role, response.text)
            assert response.status_code != 401, (role, response.text)
        else:
            assert response.status_code == 403, (role, response.status_code)
            error = response.json()
            assert needed is not None and error["code"] == "FORBIDDEN", error
            assert f"needs the role {' or '.join(repr(r) for r in needed)};" in error["message"], error
            assert tokens[role] not in response.text
    owner = _request(url, method, path, OWNER)
    assert owner.status_code not in (401, 403), owner.text
    for token in (None, "wrong-" + "w" * 40, tokens["revoked"]):
        refused = _request(url, method, path, token)
        if needed is None:
            assert refused.status_code == 200
        else:
            assert refused.status_code == 401 and refused.json()["code"] == "UNAUTHORIZED", refused.text
