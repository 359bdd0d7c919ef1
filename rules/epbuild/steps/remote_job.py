"""The worker's side of a Dask job (`execute.executor`): the function a job is pickled as, which runs on a worker.

`run_job` writes the job's input files (sent by content, no shared filesystem) under the worker's working folder
with the project's relative layout, refuses a job whose fingerprint names other versions or epbuild code than this
worker has, runs the same produce step as a local build (a fresh child per job), and returns the output files by
content: uploaded to the remote cache when the coordinator has one, else in the Dask result (up to a size cap).
The coordinator's steps hand it to the executor (`run_build(..., entry=run_job)`): the executor, below the steps,
pickles it by its name and never imports it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BuildError, UserError
from ..files.layout import Layout

if TYPE_CHECKING:
    from ..execute.links import Links
    from ..store.cache import Workspace

LOG_CAP = 1 << 20  # bytes of each log a job sends back: its end, where the errors are


def relocate(value: Any, old: Path, new: Path) -> Any:
    """`value` with every path under `old` (Path or string) moved under `new`; dataclasses are rebuilt."""
    if isinstance(value, Path):
        return new / value.relative_to(old) if value.is_relative_to(old) else value
    if isinstance(value, str):
        return str(new / Path(value).relative_to(old)) if value.startswith(f"{old}{os.sep}") else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: relocate(getattr(value, f.name), old, new) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    if isinstance(value, tuple):
        return tuple(relocate(v, old, new) for v in value)
    if isinstance(value, list):
        return [relocate(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: relocate(v, old, new) for k, v in value.items()}
    return value


def _check_versions(job: dict[str, Any]) -> None:
    """Defence in depth behind routing: a package version that differs from the fingerprint's refuses the job."""
    from ..execute.host import package_version
    from ..execute.provenance import code_digest
    from .job_modules import CODE_ROOTS
    from .toolchain.toolchains import Toolchain, find_qaic, find_qairt

    if job.get("code") != code_digest(CODE_ROOTS):
        raise BuildError(f"{job['task']}: worker refused the job: it runs other epbuild code than the coordinator "
                         "(install the same epbuild version on every worker)")
    for name in job["resources"]:
        if name.startswith("pkg:") and name.count(":") == 2:
            _, package, wanted = name.split(":")
            if package in ("qaic", "qairt"):
                tool = find_qaic(None) if package == "qaic" else find_qairt(None)
                found = tool.version if isinstance(tool, Toolchain) else None
            else:
                found = package_version(package)
            if found != wanted:
                raise BuildError(f"{job['task']}: worker refused the job: its fingerprint needs {package} {wanted}, "
                                 f"this worker has {found or 'none'}")


def _outputs(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _through_remote(job: dict[str, Any], scratch: Path, links: Links) -> bool:
    """Upload the outputs as the entry of the job's fingerprint (this worker's AWS settings and signing key);
    False when the remote is read-only here, and the outputs travel in the result instead. A remote this worker
    cannot use fails the job, so the coordinator shows why (a worker without the bucket's credentials)."""
    from ..files.hashing import sha256_file
    from ..store.remote_cache import connect

    remote = connect(links, job["remote"])
    names = sorted(p.relative_to(scratch).as_posix() for p in scratch.rglob("*") if p.is_file())
    digests = {name: sha256_file(scratch / name) for name in names}
    remote.upload(job["fingerprint"], scratch, digests, job["identity"], job["task"])
    if remote.down:
        raise BuildError(f"{job['task']}: this worker cannot use the remote cache {remote.url}: {remote.down}; "
                         "give it the coordinator's remote-cache settings")
    return not remote.readonly


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One compile, stage or validation, in a folder of its own under the worker's working folder; a failure
    comes back as {"error": message}."""
    from distributed import get_worker

    worker = get_worker()
    name = worker.name or worker.address
    base = Path(os.environ.get("EPBUILD_WORKER_DIR") or Path(tempfile.gettempdir()) / "epbuild-worker")
    root = base / "jobs" / uuid.uuid4().hex
    try:
        result = {**relocate(_run_job(job, base, root), root, Path(job["root"])), "worker": name}
    except (BuildError, UserError, OSError) as exc:  # a message for the coordinator, not a pickled exception
        result = {"error": str(exc).replace(str(root), job["root"]), "worker": name}
    try:
        return {**result, "logs": _logs(root / "artifacts")}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _logs(artifacts: Path) -> dict[str, bytes]:
    """The job's logs (child and tool output) by their place under `.logs`, the last LOG_CAP bytes of each."""
    folder = Layout(artifacts).logs
    return {p.relative_to(folder).as_posix(): p.read_bytes()[-LOG_CAP:] for p in sorted(folder.rglob("*.log"))}


def _run_job(job: dict[str, Any], base: Path, root: Path) -> dict[str, Any]:
    from ..execute.links import Links
    from ..execute.provenance import Provenance
    from ..store.cache import Workspace
    from .job_modules import CODE_ROOTS, JOB_MODULES

    _check_versions(job)
    for relative, data in job["files"].items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    what = relocate(job["what"], Path(job["root"]), root)
    if job["kind"] != "stage" and what.target.compiler in ("qaic", "qairt"):  # this host's SDK, as advertised
        what = dataclasses.replace(what, target=dataclasses.replace(what.target, sdk_root=None))
    workspace = Workspace(root / "artifacts", base / "cache", None, provenance=Provenance.read(CODE_ROOTS),
                          links=Links(JOB_MODULES))
    try:  # the job's leases and remote connection are its own, let go when it ends
        return _produce(job, what, workspace, root / ".job-output")
    finally:
        workspace.links.close()


def _produce(job: dict[str, Any], what: Any, workspace: Workspace, scratch: Path) -> dict[str, Any]:
    from .compilers import compiler
    from .compilers.external import ExternalToolCompiler
    from .preprocess import produce_stage
    from .toolchain.toolchains import supported_operators
    from .validate import validate

    scratch.mkdir(parents=True)
    result: dict[str, Any] = {}
    if job["kind"] == "compile":
        result["usage"] = compiler(what.target).produce(what, workspace, scratch) or {}
    elif job["kind"] == "stage":
        result["answer"] = produce_stage(what, workspace, scratch)
    elif job["kind"] == "ops":
        backend = compiler(what.target)
        assert isinstance(backend, ExternalToolCompiler), "ops tasks are made for external toolchains only"
        toolchain = backend.found(what)
        operators = supported_operators(toolchain, what.log(workspace.layout, "ops"))
        return {"answer": sorted(operators), "version": toolchain.version, "files": {}, "digests": {}}
    else:
        result["report"] = validate(what, workspace, scratch)
    if job.get("remote") and _through_remote(job, scratch, workspace.links):
        return {**result, "files": {}, "digests": {}, "via_remote": True}
    files = _outputs(scratch)
    size = sum(len(data) for data in files.values())
    if size > job["result_cap"]:
        raise BuildError(f"{job['task']}: its outputs ({size / 1e6:.0f} MB) exceed the "
                         f"{job['result_cap'] / 1e6:.0f} MB a Dask result may carry; configure a remote cache "
                         "(`[cache] remote`) so outputs travel through it")
    return {**result, "files": files, "digests": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}
