"""`ort` (ONNX Runtime's ModelCompiler) and `ort_session` (a session with ep.context_enable): the EP compiles in a
fresh ONNX Runtime child (`steps.compile`); `artifact.json` says what a runtime needs to load the result."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ...contracts.artifact import OMIT, ArtifactMember, ArtifactRecord
from ...contracts.jobs import CompileAnswer, CompiledMember, CompileJob, CompileMember
from ...errors import BuildError
from ...execute.child import run_child
from ...execute.host import package_reason, unavailable_reason
from ...execute.provenance import Provenance
from ...files.layout import write_json
from ...files.publish import copy_file
from ...manifest.builds import SIDECAR, Build, ResolvedTarget
from ...manifest.eps import QNN_KNOWN_VALUES
from ...store.cache import Workspace
from ...version import RULES_FORMAT
from .. import vendor_shim
from ..expected_peak import build_limits
from ..toolchain.soc_pruning import deploy_tool, request_part
from ..validation.fleet import listed_socs
from .base import Compiler


class OrtCompiler(Compiler):
    """ONNX Runtime's ModelCompiler with the target's EP."""

    name = "ort"

    def identity(self, target: ResolvedTarget) -> dict[str, Any] | None:
        """`ship_socs`: the pruning tool (or why there is none), which shapes the binary."""
        return {"qnn_deploy": deploy_tool()} if target.ship_socs else None

    def unavailable(self, target: ResolvedTarget, caps: dict[str, Any] | None) -> str | None:
        """Why this host cannot build the target, or None. With `caps` None (a Dask executor runs the jobs), only
        what the coordinator itself needs: the package whose version enters the fingerprint."""
        if target.is_cpu:
            return None
        if caps is None:
            return package_reason(target.ep, target.source)
        return unavailable_reason(target.ep, target.source, target.device, caps)

    def produce(self, build: Build, workspace: Workspace, scratch: Path) -> dict[str, float] | None:
        """Write the build's files into `scratch`; return the child's usage (seconds, peak memory)."""
        layout, target = workspace.layout, build.target
        what = f"{build.kind} {build.name} ({target.ep.name})"
        answer = run_child("epbuild.steps.compile", compile_request(build, scratch).to_json(), scratch,
                           build_limits(build, workspace, "compile"), what,
                           build.log(layout, "compile"), ep=target.fork_server, reuse=target.ep.warm_compiles,
                           expect=workspace.provenance, links=workspace.links)
        for key, name in target.runtime_files().items():
            shutil.copyfile(target.option_files[key], scratch / name)
        if build.shared and target.ep.shared_weights_outside:
            copy_shared_weights(build, workspace, scratch)
        compiled = CompileAnswer.from_json(answer).members
        write_json(scratch / SIDECAR, sidecar(build, list(compiled), workspace.provenance).to_json())
        return answer["usage"]


class OrtSessionCompiler(OrtCompiler):
    """A session with ep.context_enable, for EPs whose ModelCompiler path differs."""

    name = "ort_session"


def copy_shared_weights(build: Build, workspace: Workspace, scratch: Path) -> None:
    """The weights a weight-sharing group's binaries refer to by file name, beside them: members may share a name
    only with the same bytes (variants of one model, models exported with one weights file)."""
    by_name: dict[str, Path] = {}
    for member in build.members:
        for path in member.external:
            other = by_name.setdefault(path.name, path)
            if workspace.hashes.sha256(other) != workspace.hashes.sha256(path):
                raise BuildError(f"{build.task}: members' external-data files are both named {path.name} with "
                                 "different bytes; the shared context refers to its weights by file name: export "
                                 "the members with one weights file, or with differently named ones")
    for name, path in by_name.items():
        copy_file(path, scratch / name)


def compile_request(build: Build, scratch: Path) -> CompileJob:
    """The ONNX Runtime child's job: each member in order, where its output goes, and the target's settings."""
    target = build.target
    members = tuple(CompileMember(str(m.model.path), str(scratch / m.model_file),
                                  m.data_file if target.is_cpu and m.external else None,
                                  {name: list(shape) for name, shape in m.model.inputs.items()}, f"models.{m.name}",
                                  m.weights.get(str(m.model.path)))
                    for m in build.members)
    return CompileJob(members, build.manifest, build.shared, target.ep.alias, target.device, target.compiler,
                      target.embed, target.session_options(), target.optimization_level,
                      request_part(target.ship_socs) if target.ship_socs else None)


def pruning(target: ResolvedTarget, result: CompiledMember) -> dict[str, Any]:
    """What `ship_socs` did: the SoCs kept and removed, or why the binary was not pruned."""
    if result.pruned is not None:
        return {"kept": list(target.ship_socs), "removed": result.pruned}
    found = deploy_tool()
    return {"skipped": found if isinstance(found, str) else "the tool was not run"}


def sidecar(build: Build, results: list[CompiledMember], provenance: Provenance) -> ArtifactRecord:
    """`artifact.json`: what a runtime needs to load the artifact (per member for a group), and how much of each
    model the EP took. The target's name is not in the fingerprint, so it is added when the folder is published
    (`compile.publishing`), never cached."""
    target = build.target
    common = ArtifactRecord(
        format=RULES_FORMAT, ep=target.ep.name, ep_source=target.source, device=target.device,
        compiler=target.compiler, files=list(build.outputs), runtime_options=target.runtime_options(),
        versions=provenance.for_ep(target.ep),
        vendor_shim=vendor_shim.identity() if target.ep.vendor_shim and vendor_shim.active() else OMIT)
    if build.shared:
        return common.replace(group=build.name, embed=False, order=[m.name for m in build.members], members={
            m.name: ArtifactMember(model_file=m.model_file, binaries=r.binaries, nodes=r.nodes,
                                   ep_sdk_version=r.ep_sdk_version, graphs=r.graphs,
                                   compatibility=r.compatibility or OMIT,
                                   inputs={k: list(v) for k, v in m.model.inputs.items()})
            for m, r in zip(build.members, results, strict=True)})
    (member,), (result,) = build.members, results
    return common.replace(
        model=member.name, embed=target.embed, model_file=member.model_file,
        inputs={name: list(shape) for name, shape in member.model.inputs.items()},
        ep_sdk_version=result.ep_sdk_version, nodes=result.nodes, graphs=result.graphs or OMIT,
        compatibility=result.compatibility or OMIT,
        socs={soc: QNN_KNOWN_VALUES["soc_model"].get(soc, "") for soc in listed_socs(result.compatibility)
              or target.socs} if target.socs else OMIT,
        soc_pruning=pruning(target, result) if target.ship_socs else OMIT,
        frozen={k: list(v) for k, v in member.frozen.items()} if member.frozen else OMIT,
        optimization_level=target.optimization_level if target.is_cpu else OMIT)
