"""What the tests that start served parts share: ``apollia-os serve`` and JupyterLab from the wheel's
virtual environment, each on a random port of 127.0.0.1, with Jupyter's folders inside the test's own
``tmp_path`` (never the user's ``~/.jupyter``), as the browser tests use them."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import IO, Any

import httpx

#: How long a started server may take to say where it listens (a loaded machine: minutes).
START_SECS = 120.0


def api_client(url: str, token: str | None = None) -> httpx.Client:
    """A client of a served home's REST API at ``url`` (``…/api/v1``), with ``token`` as its bearer when
    given; proxies named in the environment are not used (the server is on 127.0.0.1)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.Client(base_url=url + "/api/v1", headers=headers, timeout=60, trust_env=False)


def lab_env(tmp_path: Path, venv: Path) -> dict[str, str]:
    """The environment of a JupyterLab and a server started from ``venv``: no JUPYTER_/APOLLIA_ setting
    or PYTHONPATH of this run leaks in; Jupyter's runtime, data and config folders and IPython's are
    under ``tmp_path``, and a home named nowhere else is ``tmp_path / "unused-home"``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "APOLLIA")) and k != "PYTHONPATH"}
    env.update({
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_PLATFORM_DIRS": "1",
        "IPYTHONDIR": str(tmp_path / "ipython"), "TMPDIR": str(tmp_path),
        "APOLLIA_HOME": str(tmp_path / "unused-home"),
        "PATH": f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
    })
    return env


def start_serve(venv: Path, home: Path, work: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """``apollia-os serve --home home --port 0`` as a user starts it, once it has printed its first line."""
    served = subprocess.Popen([str(venv / "bin" / "apollia-os"), "serve", "--home", str(home), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work, env=env)
    assert served.stdout is not None
    if not served.stdout.readline():
        served.wait(timeout=30)
        served.stdout.close()
        raise AssertionError("apollia-os serve did not start")
    return served


def start_lab(venv: Path, root: Path, env: dict[str, str], token: str,
              log: IO[str], log_path: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """``jupyter lab`` of ``venv`` on ``root``: no browser, 127.0.0.1, a random port, ``token``, the app
    exposed to the page (``window.jupyterapp``). Returns the process and its server info (``url``, …)
    once the server has written it; a server that ends first fails with its log."""
    process = subprocess.Popen(
        [str(venv / "bin" / "python"), "-m", "jupyterlab", "--no-browser", "--allow-root",
         "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    info_file = Path(env["JUPYTER_RUNTIME_DIR"]) / f"jpserver-{process.pid}.json"
    try:
        # The server writes it once it listens, in place: read until it is whole.
        return process, until(lambda: read_json(info_file), lambda info: "url" in info,
                              lambda: process.poll() is None or log_path.read_text())
    except BaseException:
        stop(process)
        raise


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object a file holds; ``{}`` while the file is missing or still being written."""
    try:
        value = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def until(fetch: Any, ok: Any, alive: Any = lambda: True) -> Any:
    """``fetch()`` again until ``ok`` of its value, while ``alive()`` is true (its value when false is the
    failure's message), for START_SECS at the most."""
    end = time.monotonic() + START_SECS
    while not ok(value := fetch()):
        assert (living := alive()) is True, living
        assert time.monotonic() < end, value
        time.sleep(0.1)
    return value


def stop(*processes: subprocess.Popen[Any] | None) -> None:
    """Terminate each process still running, and wait for it."""
    for process in processes:
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(timeout=30)


async def serve_on_loop(app: Any, task_status: Any, *, path: str = "", carry: tuple[Any, ...] = ()) -> None:
    """``app`` (an ASGI app) served by a real uvicorn on 127.0.0.1, port 0, on this event loop until the
    task group around it is cancelled; started with ``(URL + path, server, *carry)``."""
    import anyio

    from apollia_nb.api.server import _uvicorn_server

    ports: list[int] = []
    listening = anyio.Event()

    def on_listening(port: int) -> None:
        ports.append(port)
        listening.set()

    server = _uvicorn_server(app, host="127.0.0.1", port=0, log_level="warning", on_listening=on_listening,
                             install_signal_handlers=False)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        await listening.wait()
        task_status.started((f"http://127.0.0.1:{ports[0]}{path}", server, *carry))
