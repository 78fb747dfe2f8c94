"""A batch's items on a ``dask.distributed`` cluster (``Runtime.batch(..., engine="dask")``).

The process that runs the batch (the driver) must be a client of the home's
``apollia-os serve``. It asks the server, with the server's token, for a
worker credential of the batch (:func:`issue_credential`; ``api/worker_tokens.py``
says what it opens: the internal routes one item uses, for the batch's agent and
tasks, nothing else) and revokes it when the batch ends. It sends each item to
the cluster as one Dask task carrying a :class:`WorkerSpec`: the server's URL
and that credential (never the server's token), the home's journal public key,
and the agent (its manifest, its Python tools and model). An item that cannot
be sent (pickled) fails alone, ``BAD_INPUT`` (:func:`send_item`). Each worker
process keeps one client ``Runtime`` of that server per batch (:func:`run_item`):
the item's model calls and tools run on the worker, every decision is the
server's governance and every entry goes into the server's one chain, so
decisions, the inbox and the chain stay one.

The worker's home is a directory of its own under the worker's local
directory holding only ``keys/journal.pub`` (the client checks that the server
signs with it); tools that need a workspace run in ``workspace/`` there, one
per worker process.

A worker that dies mid-item loses nothing acknowledged: every entry its run
appended is in the server's chain. Dask's scheduler runs the item again on
another worker (up to ``distributed.scheduler.allowed-failures`` times); after
that the item fails ``INTERRUPTED``. Any other failure on the worker fails the
item with its code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apollia_nb.errors import ApolliaError, BadInput

__all__ = ["WorkerSpec", "issue_credential", "item_task_id", "item_task_prefix", "make_spec", "open_client",
           "outcome", "revoke_credential", "run_item", "send_item", "worker_identity"]

#: The error code of an item whose workers all died under it.
WORKER_LOST = "INTERRUPTED"


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to run the items of one batch."""

    url: str
    token: str  # the batch's worker credential (never the server's token)
    public_key: bytes  # the contents of the home's keys/journal.pub
    manifest: Any  # a Manifest
    tools: tuple[Any, ...] = ()
    model: Any = None
    max_steps: int | None = None
    batch_id: str = ""
    # How a worker opens its client runtime: the driver's ``Runtime.open``, pickled by reference (so this
    # module never imports the composition root).
    opener: Callable[..., Any] | None = None


def item_task_prefix(batch_id: str) -> str:
    """What the task ids of a Dask batch's items start with: ``task-<the batch's hex>-``."""
    return f"task-{batch_id.removeprefix('batch-')}-"


def item_task_id(batch_id: str, index: int) -> str:
    """The task id of item ``index`` of a Dask batch (its worker credential covers exactly these)."""
    return f"{item_task_prefix(batch_id)}{index}"


def worker_identity(spec: WorkerSpec) -> dict[str, Any]:
    """The identity (tools and model) the batch's agent has on every worker; its workspace is each worker's own.
    The batch's credential lets a worker have the server review exactly this identity, nothing wider."""
    from apollia_nb.runtime.manifest import agent_identity
    from apollia_nb.runtime.tools import ToolDef

    names = [t.name if isinstance(t, ToolDef) else ToolDef.from_function(t).name for t in spec.tools]
    identity = agent_identity(spec.manifest, "", names)
    return {"tools": identity["tools"], "model": identity["model"]}


def issue_credential(address: Any, spec: WorkerSpec, tasks: int) -> str:
    """A worker credential of the batch from the server (``POST /internal/worker-tokens`` with its token)."""
    body = {"agent": spec.manifest.name, "batch_id": spec.batch_id, "tasks": tasks,
            "identity": worker_identity(spec)}
    return str(_server_call(address, "/internal/worker-tokens", body, "issue")["token"])


def revoke_credential(address: Any, credential: str) -> None:
    """End a batch's worker credential (``POST /internal/worker-tokens/revoke``)."""
    _server_call(address, "/internal/worker-tokens/revoke", {"token": credential}, "revoke")


def _server_call(address: Any, path: str, body: dict[str, Any], what: str) -> Any:
    import httpx

    from apollia_nb.runtime.remote import API, _error, _unanswered

    try:
        response = httpx.post(address.url + API + path, json=body, timeout=30.0,
                              headers={"Authorization": f"Bearer {address.token}"})
    except httpx.HTTPError as exc:
        raise ApolliaError(f"the batch's worker credential cannot {what}: {_unanswered(address.url, exc)}") from None
    if response.status_code >= 400:
        raise _error(response)
    return response.json() if response.content else None


def make_spec(rt: Any, agent: str, max_steps: int | None, server_url: str | None, batch_id: str) -> WorkerSpec:
    """The spec of a batch of ``agent``, from the driver's runtime (``BAD_INPUT`` unless it is a served home's client)."""
    from apollia_nb.journal.keys import PUB_FILE
    from apollia_nb.runtime.agents import custom_tools

    server = rt.server
    if server is None:
        raise BadInput("engine='dask' needs the home served by apollia-os serve: start it, then open the home "
                       "again (its workers are clients of that server)")
    the_agent = rt.agent(agent)
    pub = rt.home.keys_dir / PUB_FILE
    if not pub.exists():
        raise BadInput(f"engine='dask' needs the home's journal public key {pub}")
    return WorkerSpec(url=(server_url or server.url).rstrip("/"), token=server.token, public_key=pub.read_bytes(),
                      manifest=the_agent.manifest, tools=tuple(custom_tools(the_agent)),
                      model=the_agent.model if the_agent.custom_model else None, max_steps=max_steps,
                      batch_id=batch_id, opener=type(rt).open)


def open_client(scheduler: Any) -> tuple[Any, bool]:
    """A ``distributed.Client`` for ``scheduler`` (an address or a client) and whether it is ours to close."""
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover - dask is an optional extra
        raise BadInput("engine='dask' needs dask.distributed (pip install 'dask[distributed]')") from None
    if isinstance(scheduler, Client):
        return scheduler, False
    if not isinstance(scheduler, str) or not scheduler.strip():
        raise BadInput("engine='dask' needs scheduler=, the address of the Dask scheduler (tcp://HOST:PORT) "
                       "or a distributed.Client")
    try:
        return Client(scheduler, timeout="10s"), True
    except (OSError, TimeoutError) as exc:
        raise BadInput(f"the Dask scheduler at {scheduler} does not answer: {exc}") from None


def send_item(client: Any, spec: WorkerSpec, task_id: str, goal: str) -> Any:
    """Submit one item to the cluster: its Dask future.

    Dask pickles the task as it is submitted; what cannot be pickled (a tool or a model holding a lock, an
    open file, a connection) is ``BAD_INPUT`` for this item, which never reaches the cluster. Any other
    refusal of the client (closed, its scheduler gone) is raised with its words, as ``ApolliaError``."""
    import pickle

    try:
        return client.submit(run_item, spec, task_id, goal, key=f"apollia-item-{task_id}", pure=False)
    except (TypeError, AttributeError, pickle.PicklingError, RecursionError) as exc:
        cause = exc.__cause__ or exc
        raise BadInput(f"the item cannot be sent to the Dask cluster: {type(cause).__name__}: {cause} (the agent's "
                       "tools and model are pickled with each item: give them no locks, open files or "
                       "connections, or create those inside the tool)") from None
    except Exception as exc:  # noqa: BLE001 - the item fails with the client's words; the driver goes on
        raise ApolliaError(f"the Dask client refused the item: {type(exc).__name__}: {exc}") from None


def outcome(future: Any) -> dict[str, Any]:
    """An item's summary from its finished Dask future: the worker's summary, or a failure with a code."""
    from distributed import KilledWorker

    try:
        return future.result()
    except KilledWorker as exc:
        return _failed(WORKER_LOST, f"every worker that ran the item died ({exc})")
    except ApolliaError as exc:
        return _failed(exc.code, exc.message)
    except BaseException as exc:  # noqa: BLE001 - the item fails; the batch goes on
        if future.status == "cancelled":
            return {"status": "cancelled", "result": None, "error_code": None, "run_id": None, "steps_used": 0}
        return _failed("INTERNAL", f"{type(exc).__name__}: {exc}")


def _failed(code: str, message: str) -> dict[str, Any]:
    return {"status": "failed", "result": None, "error_code": code, "run_id": None, "steps_used": 0,
            "message": message}


# ---------------------------------------------------------------------- on the worker
class _WorkerRuntime:
    """This worker process's client runtime, on an event loop of its own (one thread)."""

    def __init__(self, spec: WorkerSpec, base: Path) -> None:
        from apollia_nb.journal.keys import PUB_FILE
        from apollia_nb.runtime.remote import ServerAddress

        self.base = base
        self.home = base / "home"
        (self.home / "keys").mkdir(parents=True, exist_ok=True)
        (self.home / "keys" / PUB_FILE).write_bytes(spec.public_key)
        self.workspace = base / "workspace"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.address = ServerAddress(url=spec.url, token=spec.token, pid=0)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="apollia-worker", daemon=True).start()
        self.busy = 0  # items running here now (under _WORKERS_LOCK)
        self.rt = self.call(self._open, spec.opener)
        self._agent_lock = asyncio.Lock()
        self._batch_of: dict[str, str] = {}  # agent name -> the batch whose manifest, tools and model it has

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(fn(*args), self.loop).result()

    def close(self) -> None:
        """Close the runtime (its batch is over here: its credential may be revoked) and stop its loop."""
        with contextlib.suppress(Exception):  # a revoked credential may refuse the closing checkpoint
            self.call(self.rt.aclose)
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _open(self, opener: Callable[..., Any] | None) -> Any:
        if opener is None:
            raise BadInput("this worker was given no way to open a runtime (a spec from an older driver)")
        return await opener(self.home, server=self.address)

    async def _agent(self, spec: WorkerSpec) -> str:
        manifest = dataclasses.replace(spec.manifest, workspace_root=str(self.workspace))
        async with self._agent_lock:
            name = manifest.name
            if self._batch_of.get(name) != spec.batch_id:  # another batch's agent of that name: its own version
                if self.rt.find_agent(name) is not None:
                    await self.rt.stop_agent(name)  # drains the other batch's items on this worker first
                await self.rt.register_agent(manifest, tools=list(spec.tools), model=spec.model, cwd=self.workspace,
                                             keep_consents=True)
                self._batch_of[name] = spec.batch_id
        return name

    async def item(self, spec: WorkerSpec, task_id: str, goal: str) -> dict[str, Any]:
        from apollia_nb.runtime.tasks import task_summary

        name = await self._agent(spec)
        handle = await self.rt.submit(name, goal, max_steps=spec.max_steps, watched=False, task_id=task_id)
        await handle.wait()  # an item waiting on a person waits here until it is answered, wherever
        return task_summary(handle.record)


_WORKERS: dict[tuple[str, bytes, str], _WorkerRuntime] = {}
_WORKERS_LOCK = threading.Lock()
_MADE = [0]  # how many worker runtimes this process made (each its own directory)


def _worker_runtime(spec: WorkerSpec) -> _WorkerRuntime:
    """This process's client runtime for the spec's batch (its credential); runtimes of batches whose
    credential is another and that run no item here any more are closed."""
    with _WORKERS_LOCK:
        key = (spec.url, spec.public_key, spec.token)
        found = _WORKERS.get(key)
        if found is None:
            for other, idle in [(k, w) for k, w in _WORKERS.items() if not w.busy]:
                del _WORKERS[other]
                idle.close()
            try:
                from distributed import get_worker

                local = Path(get_worker().local_directory)
            except (ImportError, ValueError):  # not on a worker (called directly)
                import tempfile

                local = Path(tempfile.mkdtemp(prefix="apollia-worker-"))
            found = _WORKERS[key] = _WorkerRuntime(spec, local / "apollia" / f"server-{_MADE[0]}")
            _MADE[0] += 1
        found.busy += 1
        return found


def run_item(spec: WorkerSpec, task_id: str, goal: str) -> dict[str, Any]:
    """The Dask task of one item: run it on this worker's client runtime until it is finished; its summary."""
    worker = _worker_runtime(spec)
    try:
        return worker.call(worker.item, spec, task_id, goal)
    finally:
        with _WORKERS_LOCK:
            worker.busy -= 1
