"""``apollia-os serve``: uvicorn around the app, ``server.json``, signals, shutdown.

The server owns the home: it opens the runtime on its own event loop (so
runs are background tasks of the server) before it listens, which is where a
home owned by another process fails with ``HOME_LOCKED`` naming it. Once it
listens it writes ``<home>/server.json`` — ``{"url", "token", "pid"}``, mode
0600, with the real port when started with port 0 — so clients on this
machine find it (``Client.from_home()``). On SIGTERM or SIGINT it stops
accepting, ends every event stream, lets the open requests finish, closes the
runtime (running work is cancelled, suspended runs are kept, the journal
closes with a checkpoint) and removes ``server.json``.

``serve()`` is the coroutine (any asyncio loop); ``run()`` is the blocking
entry point of the CLI; ``ServerThread`` runs a server in a background thread
for scripts, notebooks and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from apollia_nb.errors import ApolliaError, BadInput, Conflict
from apollia_nb.home import Home
from apollia_nb.serverinfo import (
    ServerInfo,
    is_loopback,
    read_server_json,
    write_server_json,
)

__all__ = ["ServerInfo", "serve", "run", "ServerThread", "resolve_token", "is_loopback", "read_server_json"]

TOKEN_ENV = "APOLLIA_TOKEN"


def resolve_token(explicit: str | None = None) -> str:
    """``--token``, else ``$APOLLIA_TOKEN``, else a fresh ``secrets.token_urlsafe(32)``."""
    token = explicit if explicit else os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise BadInput("the token must be printable ASCII without spaces")
    return token


def _url(host: str, port: int) -> str:
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _remove_if_ours(path: Path) -> None:
    info = read_server_json(path)
    if info is not None and info.pid == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _uvicorn_server(app: Any, *, host: str, port: int, log_level: str, on_listening: Callable[[int], None],
                    install_signal_handlers: bool) -> Any:
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn's server, told when it listens, and ending event streams on the way out."""

        def handle_exit(self, sig: int, frame: Any) -> None:  # noqa: D401 - uvicorn's hook
            closing = getattr(app.state, "closing", None)
            if closing is not None:
                closing.set()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn re-raises the signal after shutdown, which would end the process before the
            # runtime closes and server.json is removed; handle the signals on the loop instead.
            if not install_signal_handlers or threading.current_thread() is not threading.main_thread():
                yield
                return
            loop = asyncio.get_running_loop()
            handled = (signal.SIGINT, signal.SIGTERM)
            for sig in handled:
                loop.add_signal_handler(sig, self.handle_exit, sig, None)
            try:
                yield
            finally:
                for sig in handled:
                    loop.remove_signal_handler(sig)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                on_listening(self.servers[0].sockets[0].getsockname()[1])

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=10, access_log=False, server_header=False)
    return _Server(config)


async def serve(
    home: Home | str | Path | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    allow_remote: bool = False,
    allowed_hosts: tuple[str, ...] = (),
    cors_origins: tuple[str, ...] = (),
    max_body_bytes: int = 1_000_000,
    on_listening: Callable[[ServerInfo], None] | None = None,
    install_signal_handlers: bool = True,
    log_level: str = "warning",
    runtime_options: dict[str, Any] | None = None,
    stop: asyncio.Event | None = None,
    hub: str | None = None,
    hub_service: str | None = None,
) -> None:
    """Open the home's runtime, serve the API until a signal (or ``stop``), then close everything.

    Requests are served for the loopback names, the bound address (when it is
    one address, not ``0.0.0.0`` or ``::``) and ``allowed_hosts``; browser
    pages only from the server's own origin and ``cors_origins``. ``hub`` (a JupyterHub's API URL, else
    ``$JUPYTERHUB_API_URL`` when run as a hub service) lets hub users in by their hub tokens, as the
    people of the home of the same names (:mod:`apollia_nb.api.hub`).
    """
    from apollia_nb.api.app import create_app
    from apollia_nb.api.hub import hub_from
    from apollia_nb.federation import open_sources
    from apollia_nb.runtime import Runtime

    if not is_loopback(host) and not allow_remote:
        raise BadInput(f"binding {host} exposes the API beyond this machine: pass --allow-remote to do it")
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise BadInput(f"port must be 0..65535, not {port!r}")
    the_home = home if isinstance(home, Home) else Home.at(home)
    the_token = resolve_token(token)
    the_hub = hub_from(hub, hub_service)
    rt = await Runtime.open(the_home, **{"tool_sources": open_sources, **(runtime_options or {})})
    server_json = the_home.server_json
    try:
        hosts = (*allowed_hosts, *(() if host in ("0.0.0.0", "::", "") else (host,)))
        app = create_app(rt, token=the_token, cors_origins=cors_origins, allowed_hosts=hosts,
                         max_body_bytes=max_body_bytes)
        app.state.hub = the_hub
        _answer_damage(app, the_home)

        def listening(real_port: int) -> None:
            info = ServerInfo(url=_url(host, real_port), token=the_token, pid=os.getpid())
            write_server_json(server_json, info)
            if on_listening is not None:
                on_listening(info)

        server = _uvicorn_server(app, host=host, port=port, log_level=log_level, on_listening=listening,
                                 install_signal_handlers=install_signal_handlers)
        watcher = None
        if stop is not None:
            async def watch() -> None:
                await stop.wait()
                server.handle_exit(signal.SIGTERM, None)

            watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await server.serve()
        except SystemExit:  # uvicorn could not listen (it logged why)
            raise Conflict(f"could not listen on {host}:{port}") from None
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        if not server.started:
            raise Conflict(f"could not listen on {host}:{port}")
    finally:
        try:
            await rt.aclose()
        finally:
            _remove_if_ours(server_json)
            if the_hub is not None:
                await the_hub.aclose()


def _answer_damage(app: Any, home: Home) -> None:
    """A request that finds a block of the home's journal unreadable (a damaged file found after the
    start) is answered 503 ``HOME_FILE_CORRUPT`` naming the file and its repair, not 500. (runtime.db
    and governance.db name themselves where they are read: ``HOME_FILE_CORRUPT``, ``GOVERNANCE_UNREADABLE``.)"""
    import duckdb
    from fastapi.responses import JSONResponse

    from apollia_nb.dbutil import storage_error
    from apollia_nb.home import damage_error

    async def damaged(request: Any, exc: Exception) -> Any:
        error: ApolliaError | None = storage_error(exc, "the request could not be carried out")
        error = error or damage_error(exc, home.journal_db, home=home.path)
        if error is None:
            error = ApolliaError(f"internal error: {type(exc).__name__}")  # as every other unexpected error
        return JSONResponse(error.to_dict(), status_code=error.http_status)

    app.add_exception_handler(duckdb.Error, damaged)


def run(home: Home | str | Path | None = None, **kwargs: Any) -> None:
    """Blocking: ``serve()`` on a fresh event loop (the CLI's entry point)."""
    asyncio.run(serve(home, **kwargs))


class ServerThread:
    """A server in a background thread: ``with ServerThread(home) as srv: Client(srv.url, srv.token)``.

    ``start()`` returns once the server listens (or raises what stopped it);
    ``stop()`` shuts it down as a signal would and waits for the runtime to close.
    """

    def __init__(self, home: Home | str | Path | None = None, **kwargs: Any) -> None:
        self._home = home
        self._kwargs = kwargs
        self._ready = threading.Event()
        self._info: ServerInfo | None = None
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="apollia-api", daemon=True)

    @property
    def info(self) -> ServerInfo:
        if self._info is None:
            raise RuntimeError("the server is not listening")
        return self._info

    @property
    def url(self) -> str:
        return self.info.url

    @property
    def token(self) -> str:
        return self.info.token

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def listening(info: ServerInfo) -> None:
                self._info = info
                self._ready.set()

            await serve(self._home, on_listening=listening, install_signal_handlers=False, stop=self._stop,
                        **self._kwargs)

        try:
            asyncio.run(main())
        except BaseException as exc:  # handed to start()/stop() in the caller's thread
            self._error = exc
        finally:
            self._ready.set()

    def start(self, timeout: float = 60.0) -> "ServerThread":
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the API server did not start listening")
        if self._info is None:
            error = self._error or ApolliaError("the API server stopped before it listened")
            raise error
        return self

    def stop(self, timeout: float = 60.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("the API server did not stop")
        if self._error is not None and self._info is not None:
            raise self._error

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
