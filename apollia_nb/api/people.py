"""The REST API's people: ``GET /people/me``, ``GET/POST /people``, ``POST /people/{name}/revoke``,
``POST /people/{name}/rotate``.

``/people/me`` answers any caller who they are to the server (every role, and the owner's token): the name,
the roles and how the token authenticated them, never a token. The others need ``admin``
(:mod:`apollia_nb.api.roles`). A new or rotated token is in the answer once and
nowhere else: these routes take no ``Idempotency-Key``, so no answer holding a token is ever stored for
a replay. Its ``router`` is included by ``api/app.py``'s ``create_app``.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi import Path as FastPath
from pydantic import BaseModel, ConfigDict, Field

from apollia_nb.api.deps import authorize, error_responses, json_route, runtime_of
from apollia_nb.governance.people import ROLES, People

__all__ = ["Me", "PersonIn", "me_of", "router"]

router = APIRouter(dependencies=[Depends(authorize)], responses=error_responses(401, 422))


class PersonIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="lowercase letters, digits, `_`, `.`, `-`; not `owner`")
    roles: list[str] = Field(min_length=1, description=f"one or more of {', '.join(ROLES)}")


class Me(BaseModel):
    name: str = Field(description="who the token is: a person's name, a hub user's name, or `owner`")
    roles: list[str] = Field(description="the roles held on this home (`admin` holds every role)")
    auth: Literal["owner", "token", "hub"] = Field(
        description="how the token authenticated: the owner's token, a person's own, or a JupyterHub user's")


def me_of(identity: Any) -> dict[str, Any]:
    """What ``/people/me`` answers for an identity (:class:`apollia_nb.governance.people.Identity`)."""
    return {"name": identity.name, "roles": [r for r in ROLES if r in identity.roles], "auth": identity.via}


def _people(rt: Any) -> People:
    return People(rt.governance)


NAME = FastPath(description="the person's name")


# before the /people/{name}/... routes: `me` is no person's name
@json_route(router, "GET", "/people/me", response_model=Me,
            summary="Who the token sent is: name, roles and how it authenticated (never a token)")
async def who_am_i(request: Request) -> dict[str, Any]:
    return me_of(request.state.identity)


@json_route(router, "GET", "/people", summary="The people of this home (never a token or its hash)",
            responses=error_responses(503))
async def list_people(rt: Any = Depends(runtime_of)) -> list[dict[str, Any]]:
    return [p.to_dict() for p in await anyio.to_thread.run_sync(_people(rt).list)]


@json_route(router, "POST", "/people", 201, idempotent=False, summary="Add a person; their token is in this answer only",
            responses=error_responses(409, 503))
async def add_person(body: PersonIn, request: Request, rt: Any = Depends(runtime_of)) -> dict[str, Any]:
    person, token = await anyio.to_thread.run_sync(
        lambda: _people(rt).add(body.name, body.roles, by=request.state.identity))
    return {**person.to_dict(), "token": token}


@json_route(router, "POST", "/people/{name}/revoke", idempotent=False,
            summary="Revoke a person: their token stops working on the next request",
            responses=error_responses(404, 409, 503))
async def revoke_person(request: Request, name: str = NAME, rt: Any = Depends(runtime_of)) -> dict[str, Any]:
    person = await anyio.to_thread.run_sync(lambda: _people(rt).revoke(name, by=request.state.identity))
    return person.to_dict()


@json_route(router, "POST", "/people/{name}/rotate", idempotent=False,
            summary="A new token for a person, in this answer only; the old one stops working",
            responses=error_responses(404, 409, 503))
async def rotate_person(request: Request, name: str = NAME, rt: Any = Depends(runtime_of)) -> dict[str, Any]:
    person, token = await anyio.to_thread.run_sync(lambda: _people(rt).rotate(name, by=request.state.identity))
    return {**person.to_dict(), "token": token}
