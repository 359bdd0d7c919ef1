"""What a Dask worker must have to run a target's jobs (`execute.executor` routes by these resource names), and the
external toolchain versions the workers offer to a build whose host lacks the toolchain."""

from __future__ import annotations

import dataclasses
import platform
from typing import Any

from ...execute.executor import ExecutorSettings, cpu_class, worker_resources
from ...execute.provenance import Provenance
from ...manifest.builds import Build, ResolvedTarget
from ..compilers import compiler
from ..compilers.external import ExternalToolCompiler
from ..fingerprint import host_properties


def target_resources(target: ResolvedTarget, provenance: Provenance) -> dict[str, int]:
    """What a job for `target` needs from a worker: its EP or toolchain, package versions, machine, CPU class
    where the artifact is host-specific."""
    needs = {f"host:{platform.machine()}"}
    backend = compiler(target)
    if backend.in_onnxruntime:
        needs.add(f"ep:{target.ep.name}:{target.device}")
        needs |= {f"pkg:{name}:{version}" for name, version in provenance.for_ep(target.ep).items() if version}
    else:
        needs.add(f"toolchain:{target.compiler}")
        identity = backend.identity(target)
        if isinstance(identity, dict) and identity.get("version"):
            needs.add(f"pkg:{target.compiler}:{identity['version']}")
    if host_properties(target):
        needs.add(cpu_class())
    return dict.fromkeys(sorted(needs), 1)


def _version_key(version: str) -> tuple[Any, ...]:
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in version.replace("-", ".").split("."))


def with_worker_toolchains(builds: list[Build], settings: ExecutorSettings) -> list[Build]:
    """Builds whose external toolchain (qaic, qairt) this host lacks take the version the workers offer, the newest
    when they differ, so the fingerprint names the toolchain that will compile; unchanged when no worker has it."""
    lacking = {b.target.name for b in builds if isinstance(backend := compiler(b.target), ExternalToolCompiler)
               and isinstance(backend.toolchain(b.target), str)}
    if not lacking:
        return builds
    offered = set().union(*worker_resources(settings).values())
    targets: dict[str, ResolvedTarget] = {}
    for build in builds:
        tool = build.target.compiler
        versions = [name.split(":", 2)[2] for name in offered if name.startswith(f"pkg:{tool}:")]
        if build.target.name in lacking and versions:
            newest = max(versions, key=_version_key)
            targets[build.target.name] = dataclasses.replace(build.target, toolchain_version=newest)
    return [dataclasses.replace(b, target=targets.get(b.target.name, b.target)) for b in builds]
