"""Who a token is: ``GET /api/v1/people/me`` answers any caller its name, roles and how it authenticated, and
the side panel of a kernel that joined a served home says who that kernel really is.

The server is a real ``apollia-os serve`` process on 127.0.0.1 (port 0); the kernels are a real IPython in
this process that joined it with a person's token (``$APOLLIA_TOKEN``), each panel's snapshot asked over its
comm as JupyterLab asks it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from runtime_helpers import call, manifest
from test_four_eyes import FOUR_EYES, _deposit
from test_jupyterhub_identity import hub  # noqa: F401 - the fixture: a real JupyterHub, once for this file
from test_notebook_panel import ask, open_panel
from test_served_identity import OWNER, _client, _people, clean_env, serving  # noqa: F401 - the fixture

from apollia_nb.notebook import panel


def test_me_names_the_owner_a_person_and_never_a_token(tmp_path, clean_env):
    with serving(tmp_path / "home") as url:
        tokens = _people(url, ann=["runner", "approver"], audra=["auditor"], rita=["rules"], bob=["approver"])
        with _client(url, OWNER) as owner:
            got = owner.get("/people/me")
            assert got.status_code == 200, got.text
            assert got.json() == {"name": "owner", "roles": ["admin"], "auth": "owner"}
        expected = {"ann": ["runner", "approver"], "audra": ["auditor"], "rita": ["rules"], "bob": ["approver"]}
        for name, held in expected.items():  # every role may ask
            with _client(url, tokens[name]) as person:
                got = person.get("/people/me")
            assert got.status_code == 200, got.text
            assert got.json() == {"name": name, "roles": held, "auth": "token"}
            assert tokens[name] not in got.text
        with _client(url, OWNER) as owner:
            assert owner.post("/people/bob/revoke").status_code == 200
            rotated = owner.post("/people/rita/rotate")
            assert rotated.status_code == 200
        for token in (tokens["bob"], tokens["rita"], "not-a-token", OWNER + "x"):  # revoked, rotated, unknown
            with _client(url, token) as stranger:
                got = stranger.get("/people/me")
            assert got.status_code == 401 and got.json()["code"] == "UNAUTHORIZED", got.text
            assert token not in got.text
        with _client(url, rotated.json()["token"]) as rita:
            assert rita.get("/people/me").json() == {"name": "rita", "roles": ["rules"], "auth": "token"}
        assert httpx.get(url + "/api/v1/people/me", timeout=60).status_code == 401  # no token at all


def test_a_person_named_me_is_still_managed_by_name(tmp_path, clean_env):
    with serving(tmp_path / "home") as url:
        tokens = _people(url, me=["auditor"])
        with _client(url, tokens["me"]) as me:
            assert me.get("/people/me").json() == {"name": "me", "roles": ["auditor"], "auth": "token"}
            assert me.post("/people/me/revoke").status_code == 403  # an auditor manages nobody
        with _client(url, OWNER) as owner:
            assert owner.post("/people/me/revoke").json()["name"] == "me"
        with _client(url, tokens["me"]) as me:
            assert me.get("/people/me").status_code == 401


def test_the_route_is_every_roles_in_the_table_and_the_openapi_document(tmp_path, clean_env):
    from apollia_nb.api.roles import ROUTE_ROLES

    assert ROUTE_ROLES[("GET", "/people/me")] == ("auditor", "runner", "approver", "rules")
    with serving(tmp_path / "home") as url, _client(url, OWNER) as owner:
        op = owner.get("/openapi.json").json()["paths"]["/api/v1/people/me"]["get"]
    assert op["x-apollia-role"] == ["auditor", "runner", "approver", "rules"]
    schema = json.dumps(op["responses"]["200"])
    assert "token" not in schema.replace("how the token", "")


def test_the_cli_says_who_you_are_on_a_served_home_and_on_an_owned_one(tmp_path, clean_env):
    from apollia_nb.governance.approvals import local_person

    home = tmp_path / "home"
    cli = [sys.executable, "-m", "apollia_nb", "people", "me", "--home", str(home)]
    owned = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=120)
    assert owned.returncode == 0, owned.stderr
    assert json.loads(owned.stdout) == {"name": local_person(), "roles": ["admin"], "auth": "local"}
    with serving(home) as url:
        tokens = _people(url, ann=["runner", "approver"])
        env = clean_env_vars()
        as_ann = subprocess.run(cli, capture_output=True, text=True, timeout=120,
                                env={**env, "APOLLIA_TOKEN": tokens["ann"]})
        assert as_ann.returncode == 0, as_ann.stderr
        assert as_ann.stdout.strip() == "ann (runner, approver; by token)"
        assert tokens["ann"] not in as_ann.stdout + as_ann.stderr
        as_owner = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=120, env=env)
        assert json.loads(as_owner.stdout) == {"name": "owner", "roles": ["admin"], "auth": "owner"}
        with _client(url, OWNER) as owner:
            assert owner.post("/people/ann/revoke").status_code == 200
        revoked = subprocess.run(cli, capture_output=True, text=True, timeout=120,
                                 env={**env, "APOLLIA_TOKEN": tokens["ann"]})
        assert revoked.returncode != 0 and "UNAUTHORIZED" in revoked.stderr, (revoked.stdout, revoked.stderr)


def clean_env_vars() -> dict[str, str]:
    import os

    from test_served_identity import _IDENTITY_ENV

    return {k: v for k, v in os.environ.items() if k not in _IDENTITY_ENV}


# --- the panel of a kernel that joined the home -------------------------------------------------------


@pytest.fixture
def shell(capsys: pytest.CaptureFixture[str]) -> Any:
    """The real IPython of this process, apollia not loaded (each test loads it as one person)."""
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    return globalipapp.get_ipython()


@contextmanager
def joined_as(ip: Any, monkeypatch: pytest.MonkeyPatch, home: Path, token: str) -> Iterator[None]:
    """``ip`` with apollia loaded, its kernel joined to the server of ``home`` with ``token``."""
    from apollia_nb.notebook.extension import unload_ipython_extension

    monkeypatch.setenv("APOLLIA_HOME", str(home))
    monkeypatch.setenv("APOLLIA_TOKEN", token)
    ip.run_line_magic("load_ext", "apollia_nb")
    try:
        yield
    finally:
        unload_ipython_extension(ip)
        ip.extension_manager.loaded.discard("apollia_nb")
        ip.config.pop("ApolliaMagics", None)


def _snapshot(ip: Any, waiting: str) -> dict[str, Any]:
    """The panel's snapshot once the card of task ``waiting`` is in its inbox."""
    p, comm = open_panel(ip)
    deadline = time.monotonic() + 60
    n = 0
    while True:
        n += 1
        data = ask(p, comm, f"s{n}", op="snapshot")["data"]
        if any(i.get("task_id") == waiting and i.get("kind") == "card" for i in data["inbox"]):
            return data
        assert time.monotonic() < deadline, (data["problems"], data["inbox"], data["me"])
        time.sleep(0.1)


def test_a_joined_panel_says_who_its_token_is_and_offers_four_eyes_answers_for_that_person(
        tmp_path, clean_env, monkeypatch, shell):
    ip = shell
    root = tmp_path / "home"
    _deposit(SimpleNamespace(path=root), FOUR_EYES)  # type: ignore[arg-type]  # only its path is read
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    writer = manifest(actor=[{"tool_calls": [call("write_file", path="a.txt", content="one")]}, {"text": "Done."}],
                      workspace=str(work))
    with serving(root) as url:
        tokens = _people(url, ann=["runner", "approver"], bob=["approver"])
        with _client(url, OWNER) as owner:
            assert owner.post("/agents", json={"manifest": writer}).status_code == 201
        with _client(url, tokens["ann"]) as ann:
            task = ann.post("/tasks", json={"agent": "clerk", "goal": "Write for ann", "watched": False}).json()
        with joined_as(ip, monkeypatch, root, tokens["ann"]):
            data = _snapshot(ip, task["id"])
            assert data["mode"] == "served"
            assert data["me"] == {"name": "ann", "role": "runner, approver", "auth": "token",
                                  "roles": ["runner", "approver"]}
            [item] = [i for i in data["inbox"] if i.get("task_id") == task["id"]]
            assert item["may_answer"]["started_by"] == "ann"
            assert item["you"]["answers"] == ["refuse"]
            assert item["you"]["why"].startswith("Four eyes: you (ann) started this run")
        with joined_as(ip, monkeypatch, root, tokens["bob"]):
            data = _snapshot(ip, task["id"])
            assert data["me"] == {"name": "bob", "role": "approver", "auth": "token", "roles": ["approver"]}
            assert [x for x in data["problems"] if x["part"] == "inbox"] == []  # an approver's inbox: the cards
            [item] = [i for i in data["inbox"] if i.get("task_id") == task["id"]]
            assert item["you"] == {"answers": ["once", "always", "refuse"], "why": None}
        with joined_as(ip, monkeypatch, root, OWNER):  # the owner's token: the owner, and admin
            data = _snapshot(ip, task["id"])
            assert data["me"] == {"name": "owner", "role": "admin", "auth": "owner", "roles": ["admin"]}


def test_a_joined_panel_whose_token_the_server_refuses_names_nobody_and_claims_no_role(
        tmp_path, clean_env, monkeypatch, shell):
    root = tmp_path / "home"
    with serving(root) as url:
        tokens = _people(url, ann=["runner", "approver"])
        with joined_as(shell, monkeypatch, root, tokens["ann"]):
            with _client(url, OWNER) as owner:  # ann's token stops working before her panel first asks
                assert owner.post("/people/ann/revoke").status_code == 200
            p, comm = open_panel(shell)
            data = ask(p, comm, "s1", op="snapshot")["data"]
            assert data["mode"] == "served"
            assert data["me"]["name"] == "unknown" and data["me"]["auth"] == "unknown"
            assert "admin" not in data["me"]["role"] and "owner" not in data["me"]["role"]
            [problem] = [x for x in data["problems"] if x["part"] == "you"]
            assert problem["code"] == "UNAUTHORIZED" and tokens["ann"] not in problem["message"]
            again = ask(p, comm, "s2", op="snapshot")["data"]  # an error is not kept: asked again
            assert [x["code"] for x in again["problems"] if x["part"] == "you"] == ["UNAUTHORIZED"]


def test_yours_with_nobody_known_offers_every_answer_for_the_server_to_decide():
    item = {"answers": ["once", "always", "refuse"], "answered": None,
            "may_answer": {"four_eyes": True, "started_by": "ann", "excluded": ["ann"]}}
    assert panel.yours(item, None) == {"answers": ["once", "always", "refuse"], "why": None}
    assert panel.yours(item, "ann")["answers"] == ["refuse"]
    assert panel.me_of("served", None)["auth"] == "unknown"
    for told in ({}, {"name": ""}, {"name": 3}, "ann", {"roles": ["admin"]}):
        me = panel.me_of("served", told)  # type: ignore[arg-type]
        assert (me["name"], me["auth"]) == ("unknown", "unknown") and "admin" not in me["role"]
    assert panel.me_of("served", {"name": "bob", "roles": ["approver"], "auth": "hub"})["role"] == \
        "hub user: approver"
    assert panel.me_of("served", {"name": "zed", "roles": [], "auth": "hub"})["role"] == \
        "hub user: no role on this home"



# --- a JupyterHub user ------------------------------------------------------------------------------


def test_me_names_a_hub_user_by_their_hub_name_with_the_homes_roles(hub, tmp_path):  # noqa: F811
    """A real JupyterHub on loopback (started as tests/test_jupyterhub_identity.py starts it)."""
    import test_jupyterhub_identity as jh

    home = tmp_path / "home"
    bob, _ = hub.token("bob")
    carol, _ = hub.token("carol")
    with jh.serving(home, "--hub", hub.api, "--hub-service", jh.SERVICE) as (url, err):
        jh.add_person(home, "bob", "approver")
        got = jh.send(url, bob, "GET", "/people/me")
        assert got.status_code == 200, got.text
        assert got.json() == {"name": "bob", "roles": ["approver"], "auth": "hub"}
        assert bob not in got.text
        nobody = jh.send(url, carol, "GET", "/people/me")  # the hub vouches for carol; the home gives her no role
        assert nobody.status_code == 403 and "carol has no role on this home" in nobody.json()["message"]
    assert not any(bob in line for line in err)
