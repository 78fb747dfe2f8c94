"""Identity from JupyterHub: a served home asks the hub who holds a token it does not know itself.

A home served with ``apollia-os serve --hub URL`` (or started by JupyterHub as a service, which sets
``JUPYTERHUB_API_URL`` and ``JUPYTERHUB_SERVICE_NAME``) answers a request whose bearer token is neither
the owner's nor a person's by asking the hub: ``GET <hub api>/user`` with ``Authorization: token <T>``,
as JupyterHub's REST API documents it (JupyterHub 6.x; the route and its answer, the user model with
``kind`` and the token's expanded ``scopes``, are unchanged since 2.0). The hub user's name is a person
of the home by the same name, and their roles come from the home's people table, never from the hub.

Why it is shaped this way:

* **Fail closed.** A token the hub does not know (401/403) is 401 ``UNAUTHORIZED``. A hub that cannot be
  reached, times out, answers 5xx or answers something that is not a user model is 503
  ``HUB_UNREACHABLE``: never an allow, and never the owner. A hub user who is no person of the home (or is
  revoked) holds no role: every route answers 403 ``FORBIDDEN`` naming the role it needs. A token of a hub
  *service* is no person: 403.
* **The token must be meant for this home.** JupyterHub lets a person reach a service only with the
  scope ``access:services!service=<name>`` (or ``access:services``); the hub lists a token's scopes
  in its answer. A token without it (say the token a single-user server got for itself, or one issued
  to another service) is 403 ``FORBIDDEN`` naming the scope, so no other service a person logged in to
  can replay their token here.
* **The home's own tokens stay home.** The owner's token and a person's current token are recognised
  before the hub is asked; a token of the shape this project makes (43 characters of URL-safe base64: a
  rotated-away or revoked personal token, another home's owner token) is never sent to the hub either.
* **A short cache.** A verified token's identity is kept :data:`CACHE_SECS` (30 s) by the SHA-256 of
  the token, never the token: a token revoked at the hub stops working here within that window. Only
  answers that identify a user are kept; refusals and failures are asked again on the next request. The
  person's roles are read from ``governance.db`` on every request, so a change in the home is immediate.
* :func:`read_hub_answer` is pure (status and body in, a user or an error out); :class:`HubCheck` does the
  HTTP and the clock.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from apollia_nb.errors import BadInput, Forbidden, HubUnreachable

__all__ = ["CACHE_SECS", "DEFAULT_SERVICE", "TIMEOUT_SECS", "HubCheck", "HubUser", "hub_from",
           "read_hub_answer"]

#: How long a verified token's identity is kept before the hub is asked again.
CACHE_SECS = 30.0
#: How long one question to the hub may take before the request is refused ``HUB_UNREACHABLE``.
TIMEOUT_SECS = 5.0
#: The service name whose access scope a token needs when neither ``--hub-service`` nor
#: ``$JUPYTERHUB_SERVICE_NAME`` names one.
DEFAULT_SERVICE = "apollia"
#: A longer token is no hub token (JupyterHub's are 32 hex digits) and is not sent to the hub.
_TOKEN_LIMIT = 1024
#: The shape of the tokens this project makes (``secrets.token_urlsafe(32)``: an owner token, a person's token,
#: current, rotated away or revoked): JupyterHub makes none of this shape, so such a token is never sent to it.
_OURS = re.compile(r"[A-Za-z0-9_-]{43}")
#: At most this many verified tokens are kept at once (the oldest go first).
_CACHE_LIMIT = 4096


@dataclass(frozen=True)
class HubUser:
    """A hub user the hub vouched for: their name and the scopes of the token they sent."""

    name: str
    scopes: frozenset[str]


def access_scopes(service: str) -> frozenset[str]:
    """The scopes any one of which lets a token reach the service ``service``."""
    return frozenset({"access:services", f"access:services!service={service}"})


def read_hub_answer(status: int, body: bytes, service: str) -> HubUser | None:
    """What the hub's answer to ``GET /user`` says of a token (pure).

    ``None``: the hub does not know the token (401, 403). A :class:`HubUser`: a user whose token may reach
    ``service``. Raises ``FORBIDDEN`` for a service's token or a token without the access scope, and
    ``HUB_UNREACHABLE`` for any other answer."""
    if status in (401, 403):
        return None
    if status != 200:
        raise HubUnreachable(f"the JupyterHub API answered {status} when asked who holds a token; "
                             "nobody is let in until it answers")
    try:
        model = json.loads(body)
    except ValueError:
        model = None
    scopes = model.get("scopes") if isinstance(model, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    if (not isinstance(name, str) or not name or not isinstance(scopes, list)
            or not all(isinstance(s, str) for s in scopes)):
        raise HubUnreachable("the JupyterHub API's answer is not a user model (no name or no scopes); "
                             "nobody is let in until it answers one")
    kind = model.get("kind")
    if kind != "user":
        raise Forbidden(f"the token is a JupyterHub {kind if isinstance(kind, str) else 'unknown'}'s "
                        f"({name!r}), not a person's: only hub users can be people of this home")
    if not access_scopes(service) & set(scopes):
        raise Forbidden(f"the JupyterHub token of {name!r} does not hold the scope "
                        f"'access:services!service={service}': the hub admin grants it to the users of this home "
                        "(a role in c.JupyterHub.load_roles), and a single-user server's token gets it from "
                        "c.Spawner.server_token_scopes")
    return HubUser(name, frozenset(scopes))


class HubCheck:
    """Asks the hub at ``api_url`` (``…/hub/api``) who holds a token, keeping verified answers briefly."""

    def __init__(self, api_url: str, *, service: str = DEFAULT_SERVICE, cache_secs: float = CACHE_SECS,
                 timeout: float = TIMEOUT_SECS, clock: Callable[[], float] = time.monotonic) -> None:
        parts = urlsplit(api_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadInput(f"the JupyterHub API URL must be http(s)://host[:port]/hub/api, not {api_url!r}")
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
            raise BadInput("the JupyterHub API URL must be http(s)://host[:port]/hub/api, without credentials, "
                           "a query or a fragment")
        if not service or not isinstance(service, str):
            raise BadInput("the JupyterHub service name must not be empty")
        self.api_url = api_url.rstrip("/")
        self.service = service
        self.cache_secs = cache_secs
        self.timeout = timeout
        self._clock = clock
        self._cache: dict[str, tuple[float, HubUser]] = {}
        self._http: Any = None

    def _client(self) -> Any:
        if self._http is None:
            import httpx

            # trust_env=False: a token goes to the hub itself, never through a proxy named by the environment
            self._http = httpx.AsyncClient(timeout=self.timeout, trust_env=False, follow_redirects=False)
        return self._http

    async def identify(self, token: str) -> HubUser | None:
        """The hub user holding ``token`` (``None``: not a hub token); raises as :func:`read_hub_answer`."""
        import httpx

        if not token.isascii() or not token.isprintable() or len(token) > _TOKEN_LIMIT or _OURS.fullmatch(token):
            return None  # no hub token looks like this: not sent anywhere
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
        now = self._clock()
        kept = self._cache.get(key)
        if kept is not None:
            if kept[0] > now:
                return kept[1]
            del self._cache[key]
        try:
            response = await self._client().get(f"{self.api_url}/user", headers={"Authorization": f"token {token}"})
            body = response.content
        except (httpx.HTTPError, OSError) as exc:
            raise HubUnreachable(f"the JupyterHub API did not answer ({type(exc).__name__}); "
                                 "nobody is let in by a hub token until it does") from None
        user = read_hub_answer(response.status_code, body, self.service)
        if user is not None and self.cache_secs > 0:
            if len(self._cache) >= _CACHE_LIMIT:
                for old in [k for k, (until, _) in self._cache.items() if until <= now] or list(self._cache)[:1]:
                    del self._cache[old]
            self._cache[key] = (now + self.cache_secs, user)
        return user

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()


def hub_from(url: str | None, service: str | None, env: Mapping[str, str] | None = None) -> HubCheck | None:
    """The hub a served home asks, or None: ``url`` (``--hub``), else ``$JUPYTERHUB_API_URL`` when the
    server runs as a JupyterHub service (``$JUPYTERHUB_SERVICE_NAME`` is set too); the service's name is
    ``service`` (``--hub-service``), else ``$JUPYTERHUB_SERVICE_NAME``, else :data:`DEFAULT_SERVICE`.

    ``$JUPYTERHUB_API_URL`` alone (as in every single-user server and its terminals) turns nothing on."""
    env = os.environ if env is None else env
    name = env.get("JUPYTERHUB_SERVICE_NAME") or ""
    if not url and name:
        url = env.get("JUPYTERHUB_API_URL") or None
    if not url:
        return None
    return HubCheck(url, service=service or name or DEFAULT_SERVICE)
