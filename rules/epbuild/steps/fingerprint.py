"""What shapes an output: each task's settings (compared with those it last succeeded with, `store.task_configs`),
and the portable fingerprints that key the artifact cache.

For doit, files (model, external data, option files) are tracked through `file_dep` and everything else is in the
task's settings, with paths relative to the manifest's folder. Both carry the digest of the epbuild code that runs
in the jobs and the toolchain's versions, as this run's `execute.provenance.Provenance` names them: upgrading
epbuild rebuilds, and no cache serves an older rule's bytes. A fingerprint is a sha256 over the bytes of every
input file and every setting that can change the output, with no absolute path, mtime or user name in it, so
clones on other machines compute the same one; host properties enter only where the artifact is host-specific.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from ..contracts.jobs import ValidationJob, ValidationMember
from ..execute.host import cpu_flags
from ..execute.provenance import Provenance
from ..files.weights import resolved
from ..manifest.builds import Build, Member, ResolvedTarget
from ..manifest.stage import Stage
from ..state.hash_memory import FileHashes
from ..version import RULES_FORMAT
from . import vendor_shim
from .compilers import compiler
from .packaging.package import GENAI_DISTRIBUTION as GENAI
from .packaging.package import genai_files


@functools.cache
def relative(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def host_properties(target: ResolvedTarget) -> dict[str, str] | None:
    """Only for host-specific artifacts: the EP embeds the CPU ISA (OpenVINO's compatibility string), or CPU
    optimization level "all" adds layout transforms for this host's ISA."""
    if target.ep.host_specific or target.optimization_level == "all":
        return {"machine": platform.machine(), "cpu_flags": cpu_flags()}
    return None


def target_identity(target: ResolvedTarget, provenance: Provenance, hashes: FileHashes | None = None) -> dict[str, Any]:
    """Every target setting that shapes a compiled output. Option files enter by key for doit's config (their
    bytes are file_deps) and, with `hashes`, by content for the cache fingerprint."""
    options = dict(target.options)
    if hashes is not None:
        options.update({key: f"file sha256 {hashes.sha256(path)}" for key, path in target.option_files.items()})
    return {"ep": target.ep.name, "ep_source": target.source, "device": target.device, "compiler": target.compiler,
            "embed": target.embed, "options": options, "option_files": sorted(target.option_files),
            "optimization_level": target.optimization_level,
            "versions": provenance.for_ep(target.ep), "host": host_properties(target),
            "qaic": dataclasses.asdict(target.qaic) if target.qaic else None,
            "toolchain": compiler(target).identity(target),
            **({"vendor_shim": vendor_shim.identity()} if target.ep.vendor_shim and vendor_shim.active() else {})}


def _shapes(member: Member) -> dict[str, list[int]]:
    return {name: list(shape) for name, shape in sorted(member.model.inputs.items())}


def compile_config(build: Build, root: Path, provenance: Provenance) -> dict[str, Any]:
    """A compile's settings for doit: members in order (the order shapes a shared binary) with their shapes, and
    `min_offload`, a check of the recorded placement that re-runs the task (a restore) but shapes no byte."""
    return {"rules_format": RULES_FORMAT, "code": provenance.code, "kind": build.kind,
            "members": [[relative(m.model.path, root), _shapes(m)] for m in build.members],
            **target_identity(build.target, provenance), "min_offload": build.target.min_offload}


def validate_config(build: Build, root: Path, provenance: Provenance) -> dict[str, Any]:
    """A validation's settings: not its time limit, which cannot change a passed result (a validation that timed
    out failed, and a failed task runs again anyway)."""
    target = build.target
    return {"rules_format": RULES_FORMAT, "code": provenance.code, "ep": target.ep.name, "device": target.device,
            "versions": provenance.for_ep(target.ep),
            "members": [{"mode": v.mode, "thresholds": dict(sorted(v.thresholds.items())),
                         "inputs": relative(v.inputs, root) if v.inputs else None,
                         "reference": relative(v.reference, root) if v.reference else None,
                         **({"inconclusive": v.inconclusive} if v.inconclusive != "report" else {}),
                         **({"task": _task_config(v.task, root)} if v.task else {})}
                        for v in (m.validation for m in build.members)],
            **({"pipeline": {"tokens": build.pipeline_tokens}} if build.pipeline_tokens else {}),
            # a genai folder's verdict is onnxruntime-genai's generator run on it
            **({"genai": provenance.version(GENAI)} if build.members[0].package else {})}


def _task_reference(task: dict[str, Any]) -> dict[str, Any]:
    """What the reference's outputs on a task's samples depend on besides the dataset's bytes (in its files): which
    samples, and which outputs are kept (a `module:function` metric reads them all)."""
    return {"samples": task["samples"], "output": task["output"], "all_outputs": ":" in task["metric"],
            "dataset": [Path(path).name for path in task["dataset"]]}


def _task_config(task: dict[str, Any], root: Path) -> dict[str, Any]:
    """A task metric's settings, its files by their place in the project (their bytes are the task's inputs)."""
    return {**task, "dataset": [relative(Path(p), root) for p in task["dataset"]],
            "metric_file": relative(Path(task["metric_file"]), root) if task["metric_file"] else None,
            "metric_files": [relative(Path(p), root) for p in task.get("metric_files") or ()]}


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _member_identity(member: Member, hashes: FileHashes) -> dict[str, Any]:
    """The output stem, the file name or the weights' folder string (ONNX Runtime hashes it into graph names), and
    every byte."""
    model = member.model
    folder = member.weights.get(str(model.path))
    base = resolved(model.path, folder) if folder else model.path.parent
    return {"name": model.name, "file": model.path.name, "sha256": hashes.sha256(model.path),
            "external": {path.relative_to(base).as_posix(): hashes.sha256(path) for path in member.external},
            **({"weights": folder} if folder else {}), "inputs": _shapes(member),
            **({"package": {path.name: hashes.sha256(path) for path in member.package}} if member.package else {})}


def compile_fingerprint(build: Build, hashes: FileHashes, provenance: Provenance) -> str:
    return _digest({"kind": build.kind, "rules_format": RULES_FORMAT, "code": provenance.code,
                    "name": build.name if build.shared else None,
                    "members": [_member_identity(m, hashes) for m in build.members],
                    "target": target_identity(build.target, provenance, hashes)})


def validation_fingerprint(artifact_files: list[Path], config: dict[str, Any], extra_files: list[Path],
                           hashes: FileHashes) -> str:
    """The artifact's bytes, the validation settings, the reference and input files, and this host: a result
    says how the artifact ran here. `config` is the validation's settings (`validate_config`), code digest
    included."""
    settings = {**config, "members": [{k: v for k, v in m.items() if k not in ("inputs", "reference")}
                                                        for m in config["members"]]}
    return _digest({"kind": "validate", "rules_format": RULES_FORMAT, "code": config["code"],
                    "artifact": {path.name: hashes.sha256(path) for path in artifact_files},
                    "settings": settings, "files": sorted(hashes.sha256(path) for path in extra_files),
                    "host": {"machine": platform.machine(), "cpu_flags": cpu_flags()}})


def reference_fingerprint(member: Member, request: ValidationMember, hashes: FileHashes,
                          provenance: Provenance) -> str:
    """What the CPU reference's outputs depend on, so that targets validating the same model on the same inputs
    share them: the bytes of each model it may run, in its role, and of their external data and the inputs file
    (`Member.reference_files`); the inputs' shapes and frozen values; what the notes call those models; the CPU
    libraries and this host's CPU. Not the target: a CPU reference is the same for every EP."""
    paths = {"source": request.source, "reference": request.reference, "declared": request.declared,
             "float_reference": request.float_reference, "inputs_file": request.inputs_file}
    roles = {role: [Path(path).name, hashes.sha256(Path(path))] if path else None
             for role, path in paths.items()}  # names: in notes
    return _digest({"kind": "reference", "rules_format": RULES_FORMAT, "code": provenance.code, "roles": roles,
                    "files": sorted([path.name, hashes.sha256(path)] for path in member.reference_files),
                    "inputs": request.inputs, "frozen": request.frozen,
                    "described": [request.reference_is, request.float_reference_is],
                    **({"task": _task_reference(request.task)} if request.task else {}),
                    "versions": provenance.of("onnxruntime", "onnx", "numpy"),
                    "host": {"machine": platform.machine(), "cpu_flags": cpu_flags()}})


def pipeline_fingerprint(build: Build, request: ValidationJob, hashes: FileHashes,
                         provenance: Provenance) -> str:
    """What a pipeline's CPU run depends on: each member's CPU reference key (its source's bytes, the CPU
    libraries, this host's CPU), in the group's order, and the number of token steps. Not the target."""
    members = [reference_fingerprint(member, request.members[member.name], hashes, provenance)
               for member in build.members]
    first = build.members[0]
    checked = genai_files(first.declared or first.model.path)  # the CPU run is checked against genai's generator
    assert request.pipeline is not None, "a pipeline's job"
    return _digest({"kind": "pipeline", "members": members, "tokens": request.pipeline["tokens"],
                    **({"genai": provenance.version(GENAI)} if checked else {})})


def stage_config(stage: Stage, provenance: Provenance) -> dict[str, Any]:
    return {"rules_format": RULES_FORMAT, "code": provenance.code, "stage": str(stage.kind), "flavour": stage.flavour,
            "settings": stage.settings,
            "versions": provenance.of("onnxruntime", "onnx")}


def stage_fingerprint(stage: Stage, hashes: FileHashes, provenance: Provenance) -> str:
    """The stage's input bytes (external data too), calibration samples, settings and tool versions."""
    return _digest({"kind": "stage", **stage_config(stage, provenance), "model": stage.model, "input": {
        "file": stage.input.name, "sha256": hashes.sha256(stage.input),
        "external": {p.relative_to(stage.input_folder).as_posix(): hashes.sha256(p) for p in stage.input_external}},
        "calibration": [hashes.sha256(p) for p in stage.calibration]})
