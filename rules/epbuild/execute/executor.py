"""Running compiles, stages and validations on a Dask cluster while doit stays the coordinator.

With `EPBUILD_EXECUTOR=tcp://scheduler:8786` (or `[executor] scheduler`), the step that produces an output (a
cache miss) becomes a Dask task with resources derived from its target, so it runs only on a worker whose host has
the EP or toolchain and the exact package versions of the fingerprint. Inputs travel by content; outputs come back
by content and are verified and published by the coordinator exactly as a local compile's. Cache lookups, locks
and publishing stay with the caller. `distributed` is imported only when an executor is set.

What a job needs of its build is narrow and declared here: a `JobContext` (settings, project layout, links, code
digest, remote URL), an `OutputCache` for a worker's upload (the build's caches provide it), and the `entry` the
job runs on the worker (`steps.remote_job.run_job`, handed down by the steps that call this: pickled by its name,
never imported here).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import platform
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import CancelledError
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from ..errors import BuildError, UserError
from ..files.layout import Layout
from ..records import record
from .links import Links

if TYPE_CHECKING:
    from ..manifest.builds import Build
    from ..manifest.stage import Stage

RESULT_CAP = 1 << 30  # bytes of outputs one Dask result may carry
OUTSIDE = "_outside"  # where files from outside the coordinator's project land on a worker
POLL_S = 2.0


@record
class ExecutorSettings:
    """Where jobs run instead of this host: a Dask scheduler."""

    address: str  # tcp://host:port of the Dask scheduler
    wait_s: float  # how long a job may wait for a worker that can run it


@record
class JobContext:
    """What running one job on the cluster needs of its build, and nothing more."""

    settings: ExecutorSettings
    layout: Layout  # the project's artifacts: its root is where inputs are relative to, its logs where logs land
    links: Links  # the build's Dask client (`execute.links`)
    code: str  # the build's code digest: a worker running other epbuild code refuses the job
    remote_url: str | None  # outputs travel through this remote cache, when there is one


class OutputCache(Protocol):
    """What a job needs of the build's caches (`store.cache.Workspace` provides it): the outputs a worker uploaded
    under `fingerprint`, brought through the remote and the local cache into `scratch`, verified on the way;
    the bytes downloaded, or None when they could not be."""

    def fetch_into(self, fingerprint: str, scratch: Path, task: str) -> int | None: ...


Entry = Callable[[dict[str, Any]], dict[str, Any]]  # what a job runs on the worker (`steps.remote_job.run_job`)


def executor_settings(scheduler: str | None, wait_s: float) -> ExecutorSettings | None:
    """EPBUILD_EXECUTOR when set (empty: run locally), else `[executor] scheduler`."""
    address = os.environ.get("EPBUILD_EXECUTOR", scheduler)
    if not address:
        return None
    parts = urlsplit(address)
    if parts.scheme not in ("tcp", "tls") or not parts.hostname or not parts.port:
        source = "EPBUILD_EXECUTOR" if "EPBUILD_EXECUTOR" in os.environ else "models.toml: executor.scheduler"
        raise UserError(source, None, f"must be a Dask scheduler address such as tcp://scheduler:8786, found "
                                      f"{address!r}")
    return ExecutorSettings(address, wait_s)


def unreachable(settings: ExecutorSettings) -> str | None:
    """Why the scheduler's port does not answer (checked once before a build), or None."""
    parts = urlsplit(settings.address)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=5).close()
    except OSError as exc:
        return f"the Dask scheduler {settings.address} is unreachable: {exc.strerror or exc}"
    return None


def _client(links: Links, settings: ExecutorSettings) -> Any:
    """The build's client of the scheduler, made on its first job (never before doit forks its workers)."""
    with links.lock:
        if settings.address not in links.dask:
            from distributed import Client

            links.dask[settings.address] = Client(settings.address, timeout="10s", set_as_default=False)
        return links.dask[settings.address]


async def _identity(address: str) -> dict[str, Any]:
    from distributed.core import rpc

    async with rpc(address, timeout=10) as scheduler:
        return await scheduler.identity()


def worker_resources(settings: ExecutorSettings) -> dict[str, set[str]]:
    """Each connected worker's resource names. One request on a private event loop: a Dask client would leave
    threads behind in the process that doit then forks for `-n N`."""
    import asyncio

    try:
        identity = asyncio.run(asyncio.wait_for(_identity(settings.address), 15))
    except (OSError, TimeoutError) as exc:
        raise BuildError(f"the Dask scheduler {settings.address} did not answer: {exc}") from None
    return {info.get("name") or address: set(info.get("resources", {}))
            for address, info in identity["workers"].items()}


def cpu_class() -> str:
    """A worker resource naming this host's CPU features: host-specific artifacts build only where they match."""
    from .host import cpu_flags

    return "cpu:" + hashlib.sha256((cpu_flags() or "").encode()).hexdigest()[:12]


def stage_resources() -> dict[str, int]:
    from .host import package_version

    return dict.fromkeys(sorted({f"host:{platform.machine()}", *(
        f"pkg:{p}:{package_version(p)}" for p in ("onnxruntime", "onnx"))}), 1)


class Job:
    """Unpickles (on the worker) into the result of `entry(job)`: pickle names the entry by its module and name,
    which the worker imports."""

    def __init__(self, job: dict[str, Any], entry: Entry):
        self.job, self.entry = job, entry

    def __reduce__(self) -> tuple[Any, ...]:
        return self.entry, (self.job,)


def _relative(path: Path, root: Path) -> str:
    """Where an input lands on the worker: its place in the project, or a content-named folder outside it."""
    if path.is_relative_to(root):
        return path.relative_to(root).as_posix()
    return f"{OUTSIDE}/{hashlib.sha256(str(path).encode()).hexdigest()[:16]}/{path.name}"


def _wait_for_worker(client: Any, needs: dict[str, int], settings: ExecutorSettings, task: str) -> None:
    """Dask waits forever for a worker with the resources; this waits `wait_s` and then names what is missing."""
    deadline = time.monotonic() + settings.wait_s
    while True:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        lacking = {info.get("name") or address: sorted(set(needs) - set(info.get("resources", {})))
                   for address, info in workers.items()}
        if any(not missing for missing in lacking.values()):
            return
        if time.monotonic() >= deadline:
            offered = "; ".join(f"{name} lacks {', '.join(missing)}" for name, missing in lacking.items())
            raise BuildError(f"{task}: no Dask worker can run it after {settings.wait_s:.0f} s: it needs "
                             f"{', '.join(needs)}" + (f"; {offered}" if offered else "; no worker is connected"))
        time.sleep(POLL_S)


def _keep_logs(logs: dict[str, bytes], folder: Path) -> None:
    """A job's logs from the worker, in this project's log folder where a local run would have left them."""
    for name, data in logs.items():
        path = folder / name
        if path.resolve().is_relative_to(folder.resolve()):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def _run(context: JobContext, entry: Entry, kind: str, task: str, what: Any, inputs: list[Path],
         needs: dict[str, int], through: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one job; `through` (remote URL, fingerprint, identity) sends its outputs through the remote cache."""
    from distributed.scheduler import KilledWorker

    settings, root = context.settings, context.layout.root.parent
    client = _client(context.links, settings)
    _wait_for_worker(client, needs, settings, task)
    files = {_relative(path, root): path.read_bytes() for path in dict.fromkeys(inputs)}
    job = {"kind": kind, "task": task, "what": what, "root": str(root), "files": files, "resources": needs,
           "result_cap": RESULT_CAP, "code": context.code, **(through or {})}
    # The scheduler unpickles what it is given; as bytes for pickle.loads, the job needs no `rules` there.
    future = client.submit(pickle.loads, pickle.dumps(Job(job, entry)), resources=needs, pure=False,
                           key=f"{task}-{uuid.uuid4().hex[:8]}")
    try:
        while True:
            try:
                result = future.result(timeout=POLL_S)
                break
            except TimeoutError:
                _wait_for_worker(client, needs, settings, task)  # the workers that could run it may have left
    except KilledWorker as exc:
        raise BuildError(f"{task}: the Dask workers running it died ({exc})") from None
    except OSError as exc:  # the connection to the scheduler was lost
        raise BuildError(f"{task}: lost the Dask scheduler {settings.address}: {exc}") from None
    except CancelledError as exc:  # the client cancels what it waits for when the scheduler goes away
        raise BuildError(f"{task}: lost the Dask scheduler {settings.address} while the job ran "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); rerun once it is back, or "
                         "without [executor] to build here") from None
    finally:
        with contextlib.suppress(Exception):  # nothing to release with a scheduler gone
            future.release()
    _keep_logs(result.get("logs", {}), context.layout.logs)
    if "error" in result:
        raise BuildError(f"{result['error']} (on Dask worker {result['worker']})")
    for name, data in result["files"].items():
        if hashlib.sha256(data).hexdigest() != result["digests"][name]:
            raise BuildError(f"{task}: {name} from worker {result['worker']} does not match its sha256")
    return result


def _write(result: dict[str, Any], scratch: Path, cache: OutputCache, fingerprint: str, task: str) -> int:
    """The outputs into `scratch`: from the result, or (uploaded by the worker) through the remote and the local
    cache, verified on the way like any remote hit; bytes downloaded from the remote."""
    if result.get("via_remote"):
        downloaded = cache.fetch_into(fingerprint, scratch, task)
        if downloaded is None:
            raise BuildError(f"{task}: worker {result['worker']} uploaded the outputs, but they could not be "
                             "fetched from the remote cache")
        return downloaded
    for name, data in result["files"].items():
        (scratch / name).parent.mkdir(parents=True, exist_ok=True)
        (scratch / name).write_bytes(data)
    return 0


def _through(context: JobContext, fingerprint: str, identity: dict[str, Any]) -> dict[str, Any] | None:
    if context.remote_url is None:
        return None
    return {"remote": context.remote_url, "fingerprint": fingerprint, "identity": identity}


def run_build(build: Build, context: JobContext, cache: OutputCache, entry: Entry, scratch: Path, fingerprint: str,
              identity: dict[str, Any], needs: dict[str, int]) -> dict[str, Any]:
    """Compile `build` on a worker that has `needs` into `scratch`; the child's `usage`, the `worker`'s name, bytes
    `downloaded`."""
    result = _run(context, entry, "compile", build.task, build, build.inputs, needs,
                  _through(context, fingerprint, identity))
    return {**result, "downloaded": _write(result, scratch, cache, fingerprint, build.task)}


def run_stage(stage: Stage, context: JobContext, cache: OutputCache, entry: Entry, scratch: Path, fingerprint: str,
              identity: dict[str, Any]) -> dict[str, Any]:
    """Run a stage on a worker into `scratch`; the child's `answer`, the `worker`'s name, bytes `downloaded`."""
    result = _run(context, entry, "stage", stage.task, stage,
                  [stage.input, *stage.input_external, *stage.calibration], stage_resources(),
                  _through(context, fingerprint, identity))
    return {**result, "downloaded": _write(result, scratch, cache, fingerprint, stage.task)}


def run_validation(build: Build, context: JobContext, entry: Entry, needs: dict[str, int]) -> dict[str, Any]:
    """Validate the published artifact of `build` on a worker that has `needs`; its report."""
    folder = build.out_dir(context.layout)
    artifact = [path for path in sorted(folder.rglob("*")) if path.is_file()]
    external = [p for m in build.members for p in m.external]
    result = _run(context, entry, "validate", build.validate_task, build,
                  [*artifact, *build.sources, *external, *build.validation_files, *build.target.option_files.values()],
                  needs)
    return {**result["report"], "worker": result["worker"]}


def run_operator_list(build: Build, context: JobContext, entry: Entry,
                      needs: dict[str, int]) -> tuple[set[str], str]:
    """The ONNX operators a worker's qaic-compile (one that has `needs`) supports, and its version, for `ops:`."""
    result = _run(context, entry, "ops", build.ops_task, build, [], needs)
    return set(result["answer"]), result["version"]
