"""Running compiles, stages and validations on a Dask cluster while doit stays the coordinator.

With `EPBUILD_EXECUTOR=tcp://scheduler:8786` (or `[executor] scheduler`), the step that produces an output (a
cache miss) becomes a Dask task (`rules.worker.run_job`) with resources derived from its target, so it runs only
on a worker whose host has the EP or toolchain and the exact package versions of the fingerprint. Inputs travel
by content; outputs come back by content and are verified and published by the coordinator exactly as a local
compile's. Cache lookups, locks and publishing stay here. `distributed` is imported only when an executor is set.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import platform
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .errors import BuildError, UserError
from .layout import write_json

if TYPE_CHECKING:
    from .build import Build, ResolvedTarget
    from .cache import Workspace
    from .stages import Stage

RESULT_CAP = 1 << 30  # bytes of outputs one Dask result may carry
POLL_S = 2.0


@dataclass(frozen=True)
class ExecutorSettings:
    address: str  # tcp://host:port of the Dask scheduler
    wait_s: float  # how long a job may wait for a worker that can run it


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


_CLIENTS: dict[str, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _client(settings: ExecutorSettings) -> Any:
    with _CLIENTS_LOCK:
        if settings.address not in _CLIENTS:
            from distributed import Client

            _CLIENTS[settings.address] = Client(settings.address, timeout="10s", set_as_default=False)
        return _CLIENTS[settings.address]


def target_resources(target: ResolvedTarget) -> dict[str, int]:
    """What a job for `target` needs from a worker: its EP or toolchain, package versions, machine, CPU class
    where the artifact is host-specific."""
    from .compilers import compiler
    from .fingerprint import host_properties
    from .host import toolchain_versions
    from .worker import cpu_class

    needs = {f"host:{platform.machine()}"}
    backend = compiler(target)
    if backend.in_onnxruntime:
        needs.add(f"ep:{target.ep.name}")
        needs |= {f"pkg:{name}:{version}" for name, version in toolchain_versions(target.ep).items() if version}
    else:
        needs.add(f"toolchain:{target.compiler}")
        identity = backend.identity(target)
        if isinstance(identity, dict) and identity.get("version"):
            needs.add(f"pkg:{target.compiler}:{identity['version']}")
    if host_properties(target):
        needs.add(cpu_class())
    return dict.fromkeys(sorted(needs), 1)


def stage_resources() -> dict[str, int]:
    from .host import package_version

    return dict.fromkeys(sorted({f"host:{platform.machine()}", *(
        f"pkg:{p}:{package_version(p)}" for p in ("onnxruntime", "onnx"))}), 1)


class Job:
    """Unpickles (on the worker) into the result of `rules.worker.run_job(job)`."""

    def __init__(self, job: dict[str, Any]):
        self.job = job

    def __reduce__(self) -> tuple[Any, ...]:
        from .worker import run_job

        return run_job, (self.job,)


def _relative(path: Path, root: Path) -> str:
    """Where an input lands on the worker: its place in the project, or a content-named folder outside it."""
    from .worker import OUTSIDE

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


def _run(settings: ExecutorSettings, kind: str, task: str, what: Any, inputs: list[Path], root: Path,
         needs: dict[str, int], through: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one job; `through` (remote URL, fingerprint, identity) sends its outputs through the remote cache."""
    from distributed.scheduler import KilledWorker

    client = _client(settings)
    _wait_for_worker(client, needs, settings, task)
    files = {_relative(path, root): path.read_bytes() for path in dict.fromkeys(inputs)}
    job = {"kind": kind, "task": task, "what": what, "root": str(root), "files": files, "resources": needs,
           "result_cap": RESULT_CAP, **(through or {})}
    # The scheduler unpickles what it is given; as bytes for pickle.loads, the job needs no `rules` there.
    future = client.submit(pickle.loads, pickle.dumps(Job(job)), resources=needs, pure=False,
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
    finally:
        future.release()
    if "error" in result:
        raise BuildError(f"{result['error']} (on Dask worker {result['worker']})")
    for name, data in result["files"].items():
        if hashlib.sha256(data).hexdigest() != result["digests"][name]:
            raise BuildError(f"{task}: {name} from worker {result['worker']} does not match its sha256")
    return result


def _write(result: dict[str, Any], scratch: Path, workspace: Workspace, fingerprint: str, task: str) -> int:
    """The outputs into `scratch`: from the result, or (uploaded by the worker) through the remote and the local
    cache, verified on the way like any remote hit; bytes downloaded from the remote."""
    if result.get("via_remote"):
        remote = workspace.remote
        downloaded = remote.fetch(fingerprint, workspace.cache, task) if remote else None
        if downloaded is None or workspace.cache.restore(fingerprint, scratch) is None:
            raise BuildError(f"{task}: worker {result['worker']} uploaded the outputs, but they could not be "
                             "fetched from the remote cache")
        return downloaded
    for name, data in result["files"].items():
        (scratch / name).parent.mkdir(parents=True, exist_ok=True)
        (scratch / name).write_bytes(data)
    return 0


def _through(workspace: Workspace, fingerprint: str, identity: dict[str, Any]) -> dict[str, Any] | None:
    if workspace.remote_url is None:
        return None
    return {"remote": workspace.remote_url, "fingerprint": fingerprint, "identity": identity}


def run_build(build: Build, workspace: Workspace, scratch: Path, fingerprint: str,
              identity: dict[str, Any]) -> dict[str, Any]:
    """Compile `build` on a worker into `scratch`; the child's `usage`, the `worker`'s name, bytes `downloaded`."""
    assert workspace.executor is not None
    result = _run(workspace.executor, "compile", build.task, build, build.inputs, workspace.project_root,
                  target_resources(build.target), _through(workspace, fingerprint, identity))
    return {**result, "downloaded": _write(result, scratch, workspace, fingerprint, build.task)}


def run_stage(stage: Stage, workspace: Workspace, scratch: Path, fingerprint: str,
              identity: dict[str, Any]) -> dict[str, Any]:
    """Run a stage on a worker into `scratch`; the child's `answer`, the `worker`'s name, bytes `downloaded`."""
    assert workspace.executor is not None
    result = _run(workspace.executor, "stage", stage.task, stage,
                  [stage.input, *stage.input_external, *stage.calibration], workspace.project_root, stage_resources(),
                  _through(workspace, fingerprint, identity))
    return {**result, "downloaded": _write(result, scratch, workspace, fingerprint, stage.task)}


def run_validation(build: Build, workspace: Workspace) -> dict[str, Any]:
    """Validate the published artifact of `build` on a worker; write `validation.json` here."""
    assert workspace.executor is not None
    folder = build.out_dir(workspace.layout)
    artifact = [path for path in sorted(folder.rglob("*")) if path.is_file()]
    external = [p for m in build.members for p in m.external]
    result = _run(workspace.executor, "validate", f"validate:{build.name}", build,
                  [*artifact, *build.sources, *external, *build.validation_files], workspace.project_root,
                  target_resources(build.target))
    report = {**result["report"], "worker": result["worker"]}
    write_json(folder / "validation.json", report)
    return report
