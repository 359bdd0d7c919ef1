"""What shapes an output: the settings in each task's `config_changed`, and the portable fingerprints that key
the artifact cache.

For doit, files (model, external data, option files) are tracked through `file_dep` and everything else is in
`config_changed`, with paths relative to the manifest's folder. A fingerprint is a sha256 over the bytes of every
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
from typing import TYPE_CHECKING, Any

from . import RULES_FORMAT
from .hashing import FileHashes
from .host import package_version, toolchain_versions
from .manifest import ModelSpec
from .targets import Build, GroupBuild, ResolvedTarget
from .toolchains import toolchain_identity

if TYPE_CHECKING:  # rules.stages uses these fingerprints
    from .stages import Stage


@functools.cache
def relative(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def compile_config(build: Build, root: Path) -> dict[str, Any]:
    return {
        "rules_format": RULES_FORMAT,
        "model": relative(build.model.path, root),
        "inputs": {name: list(shape) for name, shape in sorted(build.model.inputs.items())},
        **target_config(build.target),
    }


def target_config(target: ResolvedTarget) -> dict[str, Any]:
    """Every target setting that shapes a compiled output, option files by key (their bytes are file_deps)."""
    return {
        "ep": target.ep.name, "ep_source": target.source, "device": target.device,
        "compiler": target.compiler, "embed": target.embed, "options": target.options,
        "option_files": sorted(target.option_files), "optimization_level": target.optimization_level,
        "min_offload": target.min_offload,
        "versions": toolchain_versions(target.ep),
        "qaic": dataclasses.asdict(target.qaic) if target.qaic else None,
        "toolchain": toolchain_identity(target.compiler, target.sdk_root),
    }


def validate_config(build: Build, root: Path) -> dict[str, Any]:
    settings, target = build.validation, build.target
    return {
        "rules_format": RULES_FORMAT, "mode": settings.mode, "thresholds": dict(sorted(settings.thresholds.items())),
        "inputs": relative(settings.inputs, root) if settings.inputs else None,
        "reference": relative(settings.reference, root) if settings.reference else None,
        "timeout_s": settings.timeout_s, "ep": target.ep.name, "device": target.device,
        "versions": toolchain_versions(target.ep),
    }


def group_config(group: GroupBuild, root: Path) -> dict[str, Any]:
    """Members in order (the order shapes the shared binary) with their shapes, plus the target's settings."""
    return {
        "rules_format": RULES_FORMAT,
        "members": [[relative(m.path, root), {k: list(v) for k, v in sorted(m.inputs.items())}]
                    for m in group.members],
        **target_config(group.target),
    }


def group_validate_config(group: GroupBuild, root: Path) -> dict[str, Any]:
    return {"rules_format": RULES_FORMAT, "group": group_config(group, root),
            "members": [{"mode": v.mode, "thresholds": dict(sorted(v.thresholds.items())),
                         "inputs": relative(v.inputs, root) if v.inputs else None,
                         "reference": relative(v.reference, root) if v.reference else None,
                         "timeout_s": v.timeout_s} for v in group.validations]}


@functools.cache
def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(("flags", "Features")):
                    return hashlib.sha256(" ".join(sorted(line.split(":", 1)[1].split())).encode()).hexdigest()
    except OSError:
        pass
    return platform.processor()


def host_properties(target: ResolvedTarget) -> dict[str, str] | None:
    """Only for host-specific artifacts: OpenVINO embeds the CPU ISA in its compatibility string, and CPU
    optimization level "all" adds layout transforms for this host's ISA."""
    if target.ep.alias == "openvino" or target.optimization_level == "all":
        return {"machine": platform.machine(), "cpu_flags": _cpu_flags()}
    return None


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _model_identity(model: ModelSpec, external: tuple[Path, ...], hashes: FileHashes) -> dict[str, Any]:
    """The output stem, the file name (ONNX Runtime hashes it into graph names), and every byte."""
    return {"name": model.name, "file": model.path.name, "sha256": hashes.sha256(model.path),
            "external": {path.relative_to(model.path.parent).as_posix(): hashes.sha256(path) for path in external},
            "inputs": {name: list(shape) for name, shape in sorted(model.inputs.items())}}


def _target_identity(target: ResolvedTarget, hashes: FileHashes) -> dict[str, Any]:
    options = {key: f"file sha256 {hashes.sha256(target.option_files[key])}" if key in target.option_files else value
               for key, value in target.options.items()}
    return {"ep": target.ep.name, "ep_source": target.source, "device": target.device, "compiler": target.compiler,
            "embed": target.embed, "options": options, "optimization_level": target.optimization_level,
            "min_offload": target.min_offload, "versions": toolchain_versions(target.ep),
            "host": host_properties(target),
            "qaic": dataclasses.asdict(target.qaic) if target.qaic else None,
            "toolchain": toolchain_identity(target.compiler, target.sdk_root)}


def compile_fingerprint(build: Build, hashes: FileHashes) -> str:
    return _digest({"kind": "compile", "rules_format": RULES_FORMAT,
                    "model": _model_identity(build.model, build.external, hashes),
                    "target": _target_identity(build.target, hashes)})


def group_fingerprint(group: GroupBuild, hashes: FileHashes) -> str:
    return _digest({"kind": "group", "rules_format": RULES_FORMAT, "group": group.name,
                    "members": [_model_identity(m, group.external[m.name], hashes) for m in group.members],
                    "target": _target_identity(group.target, hashes)})


def validation_fingerprint(artifact_files: list[Path], config: dict[str, Any], extra_files: list[Path],
                           hashes: FileHashes) -> str:
    """The artifact's bytes, the validation settings, the reference and input files, and this host: a result
    says how the artifact ran here."""
    return _digest({"kind": "validate", "rules_format": RULES_FORMAT,
                    "artifact": {path.name: hashes.sha256(path) for path in artifact_files},
                    "settings": {k: v for k, v in config.items() if k not in ("inputs", "reference")},
                    "files": sorted(hashes.sha256(path) for path in extra_files),
                    "host": {"machine": platform.machine(), "cpu_flags": _cpu_flags()}})


def stage_config(stage: Stage) -> dict[str, Any]:
    return {"rules_format": RULES_FORMAT, "stage": stage.kind, "flavour": stage.flavour, "settings": stage.settings,
            "versions": {p: package_version(p) for p in ("onnxruntime", "onnx")}}


def stage_fingerprint(stage: Stage, hashes: FileHashes) -> str:
    """The stage's input bytes (external data too), calibration samples, settings and tool versions."""
    return _digest({"kind": "stage", **stage_config(stage), "model": stage.model, "input": {
        "file": stage.input.name, "sha256": hashes.sha256(stage.input),
        "external": {p.relative_to(stage.input.parent).as_posix(): hashes.sha256(p) for p in stage.input_external}},
        "calibration": [hashes.sha256(p) for p in stage.calibration]})
