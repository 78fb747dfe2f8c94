"""``[mcp.servers.NAME]`` and ``[hosts.NAME]`` of ``apollia.toml``, checked into frozen values.

Pure: no I/O. Each entry is checked on its own, so one broken entry leaves
only its own tools unresolved (its source reports the problem when an agent
asks for them) instead of keeping the whole home from opening. Unknown keys
are errors, as in manifests: a misspelt ``familes`` would otherwise leave
every tool unclassified without a word.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from apollia_nb.errors import BadInput
from apollia_nb.governance.decision import Family

__all__ = [
    "DEFAULT_TIMEOUT_SECS",
    "DEFAULT_START_TIMEOUT_SECS",
    "DEFAULT_INPUT_TIMEOUT_SECS",
    "McpServerConfig",
    "HostConfig",
    "parse_mcp_server",
    "parse_host",
]

#: Seconds one federated call may take.
DEFAULT_TIMEOUT_SECS = 30.0
#: Seconds starting an MCP server (process, handshake, tool list) may take.
DEFAULT_START_TIMEOUT_SECS = 30.0
#: Seconds a server's question (elicitation) or model call (sampling) waits for a person's answer.
DEFAULT_INPUT_TIMEOUT_SECS = 300.0

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_MCP_KEYS = frozenset({
    "command", "args", "env", "cwd", "url", "headers", "token_env", "families", "timeout_secs", "start_timeout_secs",
    "input_timeout_secs", "roots",
})
_HOST_KEYS = frozenset({"base_url", "openapi", "token_env", "families", "timeout_secs"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class McpServerConfig:
    """One MCP server: over stdio (``command``) or streamable HTTP (``url``)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, hash=False)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict, hash=False)
    token_env: str | None = None
    families: dict[str, Family] = field(default_factory=dict, hash=False)
    timeout_secs: float = DEFAULT_TIMEOUT_SECS
    start_timeout_secs: float = DEFAULT_START_TIMEOUT_SECS
    input_timeout_secs: float = DEFAULT_INPUT_TIMEOUT_SECS
    roots: bool = True  # offer the calling agent's workspace as the only root (False: no roots capability)

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


@dataclass(frozen=True)
class HostConfig:
    """One host product's REST API, described by an OpenAPI 3 document."""

    name: str
    openapi: str
    base_url: str | None = None
    token_env: str | None = None
    families: dict[str, Family] = field(default_factory=dict, hash=False)
    timeout_secs: float = DEFAULT_TIMEOUT_SECS


def _where(section: str, name: str, key: str | None = None) -> str:
    return f"[{section}.{name}]" + (f" {key}" if key else "")


def _check_name(section: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadInput(
            f"[{section}.{name}]: the name must be letters, digits, _ . - (at most 64, not starting with . or -)"
        )
    return name


def _table(section: str, name: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadInput(f"{_where(section, name)} must be a table")
    return value


def _unknown(section: str, name: str, table: Mapping[str, Any], allowed: frozenset[str]) -> None:
    extra = sorted(k for k in table if k not in allowed)
    if extra:
        raise BadInput(
            f"{_where(section, name)}: unknown key {extra[0]!r} (keys: {', '.join(sorted(allowed))})"
        )


def _string(section: str, name: str, table: Mapping[str, Any], key: str, *, required: bool = False) -> str | None:
    value = table.get(key)
    if value is None:
        if required:
            raise BadInput(f"{_where(section, name)}: {key} is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"{_where(section, name, key)} must be a non-empty string")
    return value


def _strings(section: str, name: str, table: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadInput(f"{_where(section, name, key)} must be an array of strings")
    return tuple(value)


def _string_table(section: str, name: str, table: Mapping[str, Any], key: str) -> dict[str, str]:
    value = table.get(key, {})
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise BadInput(f"{_where(section, name, key)} must be a table of strings")
    return {str(k): v for k, v in value.items()}


def _families(section: str, name: str, table: Mapping[str, Any]) -> dict[str, Family]:
    value = table.get("families", {})
    if not isinstance(value, Mapping):
        raise BadInput(f"{_where(section, name, 'families')} must be a table: {{ tool = \"family\" }}")
    out: dict[str, Family] = {}
    for tool, family in value.items():
        try:
            out[str(tool)] = Family(family)
        except ValueError:
            known = ", ".join(f.value for f in Family)
            raise BadInput(
                f"{_where(section, name, 'families')}.{tool}: unknown family {family!r} (one of {known}; "
                "leave a tool out to keep it unclassified)"
            ) from None
    return out


def _timeout(section: str, name: str, table: Mapping[str, Any], key: str = "timeout_secs",
             default: float = DEFAULT_TIMEOUT_SECS) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadInput(f"{_where(section, name, key)} must be a positive number, got {value!r}")
    return float(value)


def _flag(section: str, name: str, table: Mapping[str, Any], key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise BadInput(f"{_where(section, name, key)} must be true or false, got {value!r}")
    return value


def _token_env(section: str, name: str, table: Mapping[str, Any]) -> str | None:
    value = _string(section, name, table, "token_env")
    if value is not None and not _ENV_NAME.fullmatch(value):
        raise BadInput(f"{_where(section, name, 'token_env')} must name an environment variable, got {value!r}")
    return value


def _http_url(section: str, name: str, key: str, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"{_where(section, name, key)} must be an http:// or https:// URL, got {value!r}")
    return value


def parse_mcp_server(name: object, value: object) -> McpServerConfig:
    """Check one ``[mcp.servers.NAME]`` table; ``BAD_INPUT`` names the key at fault."""
    section = "mcp.servers"
    name = _check_name(section, name)
    table = _table(section, name, value)
    _unknown(section, name, table, _MCP_KEYS)
    command = _string(section, name, table, "command")
    url = _string(section, name, table, "url")
    if (command is None) == (url is None):
        raise BadInput(f"{_where(section, name)}: give either command (stdio) or url (streamable HTTP)")
    if command is None:
        assert url is not None
        _http_url(section, name, "url", url)
        for key in ("args", "env", "cwd"):
            if key in table:
                raise BadInput(f"{_where(section, name, key)} applies to a stdio server (command), not to a url")
    else:
        for key in ("headers", "token_env"):
            if key in table:
                raise BadInput(
                    f"{_where(section, name, key)} applies to a streamable HTTP server (url), not to a command")
    return McpServerConfig(
        name=name,
        command=command,
        args=_strings(section, name, table, "args"),
        env=_string_table(section, name, table, "env"),
        cwd=_string(section, name, table, "cwd"),
        url=url,
        headers=_string_table(section, name, table, "headers"),
        token_env=_token_env(section, name, table),
        families=_families(section, name, table),
        timeout_secs=_timeout(section, name, table),
        start_timeout_secs=_timeout(section, name, table, "start_timeout_secs", DEFAULT_START_TIMEOUT_SECS),
        input_timeout_secs=_timeout(section, name, table, "input_timeout_secs", DEFAULT_INPUT_TIMEOUT_SECS),
        roots=_flag(section, name, table, "roots", True),
    )


def parse_host(name: object, value: object) -> HostConfig:
    """Check one ``[hosts.NAME]`` table; ``BAD_INPUT`` names the key at fault."""
    section = "hosts"
    name = _check_name(section, name)
    table = _table(section, name, value)
    _unknown(section, name, table, _HOST_KEYS)
    openapi = _string(section, name, table, "openapi", required=True)
    assert openapi is not None
    base_url = _string(section, name, table, "base_url")
    if base_url is not None:
        _http_url(section, name, "base_url", base_url)
    return HostConfig(
        name=name,
        openapi=openapi,
        base_url=base_url,
        token_env=_token_env(section, name, table),
        families=_families(section, name, table),
        timeout_secs=_timeout(section, name, table),
    )
