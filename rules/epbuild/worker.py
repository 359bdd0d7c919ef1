"""A build host in a Dask cluster:
`python -m epbuild.worker tcp://scheduler:8786 [--workdir DIR] [dask worker args]`.

The worker advertises, as Dask resources, exactly what `doit backends` finds here: each EP ONNX Runtime registers
(`ep:QNNExecutionProvider`), each external toolchain (`toolchain:qaic`), the machine (`host:x86_64`), the CPU's
ISA class (`cpu:<digest of its flags>`, for host-specific artifacts) and the versions of the packages that shape
an artifact (`pkg:onnxruntime-qnn:2.7.0`). A job asks for the versions in its fingerprint, so it only ever runs
where the artifact will be what the fingerprint says.

The Dask task a job runs is `epbuild.steps.remote_job.run_job`, which the coordinator's steps hand the executor.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .execute.executor import cpu_class
from .execute.python_path import child_import_path

if TYPE_CHECKING:
    pass

RESOURCE_AMOUNT = 1000  # resources route jobs; the worker's thread count limits concurrency


def host_resources(state_dir: Path, shim: dict[str, str]) -> dict[str, int]:
    """What this host can build, as Dask resources (the same probe as `doit backends`): `ep:<EP>:<device>` for
    each device the EP offers here; `shim` is what `epbuild.steps.vendor_shim.prepare` answered on this host."""
    from .execute.host import capabilities, package_version, unavailable_reason
    from .manifest.eps import REGISTRY
    from .steps.toolchain.toolchains import Toolchain, find_qaic, find_qairt

    caps = {**capabilities(state_dir), "vendor_shim": shim}
    names = {f"host:{platform.machine()}", cpu_class(), "ep:CPUExecutionProvider:cpu"}
    names |= {f"ep:{info.name}:{device}" for info in REGISTRY.values() if not info.is_cpu
              for device in info.devices if unavailable_reason(info, info.default_source, device, caps) is None}
    for tool, found in (("qaic", find_qaic(None)), ("qairt", find_qairt(None))):
        if isinstance(found, Toolchain):
            names |= {f"toolchain:{tool}", f"pkg:{tool}:{found.version}"}
    packages = {"onnxruntime", "onnx", *(info.package for info in REGISTRY.values() if info.package)}
    names |= {f"pkg:{name}:{version}" for name in packages if (version := package_version(name))}
    return dict.fromkeys(sorted(names), RESOURCE_AMOUNT)


def main(argv: list[str]) -> None:
    """Probe this host, then become `dask worker SCHEDULER --resources ...` with the remaining arguments."""
    from .steps import vendor_shim

    if not argv or argv[0].startswith("-"):
        raise SystemExit("usage: python -m epbuild.worker tcp://SCHEDULER:8786 [--workdir DIR] "
                         "[dask worker args]")
    scheduler, rest = argv[0], argv[1:]
    workdir = Path(tempfile.gettempdir()) / "epbuild-worker"
    if "--workdir" in rest:
        at = rest.index("--workdir")
        workdir = Path(rest[at + 1]).absolute()
        rest = rest[:at] + rest[at + 2:]
    workdir.mkdir(parents=True, exist_ok=True)
    shim = vendor_shim.prepare(workdir / "cache")  # its path reaches the job children through the environment
    resources = host_resources(workdir / "state", shim)
    print(f"epbuild worker: {workdir}; resources: {', '.join(resources)}", flush=True)
    os.environ["EPBUILD_WORKER_DIR"] = str(workdir)
    os.environ["PYTHONPATH"] = child_import_path()
    arguments = ",".join(f"{name}={amount}" for name, amount in resources.items())
    os.execv(sys.executable, [sys.executable, "-m", "distributed.cli.dask_worker", scheduler,
                              "--resources", arguments, "--local-directory", str(workdir / "dask"), *rest])


if __name__ == "__main__":
    main(sys.argv[1:])
