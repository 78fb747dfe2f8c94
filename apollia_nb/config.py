"""``apollia.toml`` in the home, parsed into frozen values."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apollia_nb.errors import BadInput

__all__ = ["Config", "load_config"]


@dataclass(frozen=True)
class Config:
    hitl_timeout_hours: float | None = None
    hitl_scan_interval_secs: float = 60.0
    drain_timeout_secs: float = 30.0
    trusted_keys: tuple[str, ...] = ()
    mcp_servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    http_proxy: str | None = None  # [tools.http_request] proxy: the only proxy http_request uses
    subject_arguments: dict[str, tuple[str, ...]] = field(default_factory=dict)  # [subjects.tools]: tool -> arguments
    raw: dict[str, Any] = field(default_factory=dict)


def load_config(path: Path) -> Config:
    """Read ``apollia.toml``; a missing file is the defaults, a broken one is BAD_INPUT."""
    if not path.exists():
        return Config()
    import tomllib  # only with a file to read: its import costs about 2 ms of CPU a kernel's load does not need

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: {exc}") from None
    hitl = data.get("hitl", {})
    runtime = data.get("runtime", {})
    policy = data.get("policy", {})
    keys = policy.get("trusted_keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise BadInput(f"{path}: [policy] trusted_keys must be a list of base64 strings")
    timeout = hitl.get("timeout_hours")
    proxy = (data.get("tools", {}).get("http_request", {}) or {}).get("proxy")
    if proxy is not None and (not isinstance(proxy, str)
                              or not proxy.lower().startswith(("http://", "https://", "socks5://"))):
        raise BadInput(f"{path}: [tools.http_request] proxy must be an http://, https:// or socks5:// URL")
    subjects = _subject_arguments(path, data.get("subjects", {}))
    return Config(
        hitl_timeout_hours=float(timeout) if timeout is not None else None,
        hitl_scan_interval_secs=float(hitl.get("scan_interval_secs", 60)),
        drain_timeout_secs=float(runtime.get("drain_timeout_secs", 30)),
        trusted_keys=tuple(keys),
        mcp_servers=dict(data.get("mcp", {}).get("servers", {})),
        hosts=dict(data.get("hosts", {})),
        http_proxy=proxy,
        subject_arguments=subjects,
        raw=data,
    )


def _subject_arguments(path: Path, table: Any) -> dict[str, tuple[str, ...]]:
    """``[subjects.tools]``: a tool's name to the argument (or list of arguments) whose value is a
    data subject's id. Any other shape is BAD_INPUT: a mapping misread would tag nobody."""
    if not isinstance(table, dict) or set(table) - {"tools"} or not isinstance(table.get("tools", {}), dict):
        raise BadInput(f'{path}: [subjects] has one table, tools: tools."TOOL" = "ARGUMENT" or ["ARGUMENT", ...]')
    out: dict[str, tuple[str, ...]] = {}
    for tool, names in table.get("tools", {}).items():
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise BadInput(f'{path}: [subjects.tools] {tool}: an argument name or a list of argument names')
        out[tool] = tuple(names)
    return out
