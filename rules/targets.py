"""Target resolution: a declared target becomes a concrete EP, source, device and normalised options.

Also defines `Build`, one (model, target) pair, and the exact files it produces, so doit's `targets` can list
every output before anything runs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .child import Limits
from .eps import QAIC, REGISTRY, SOURCES, EpInfo, lookup, valid_ep_names
from .errors import UserError, closest
from .manifest import GroupSpec, Manifest, ModelSpec, TargetSpec
from .stages import Stage, stage_chain
from .toolchains import QaicOptions, check_qaic

SIDECAR = "artifact.json"
QPC_PROGRAM = "qpc/programqpc.bin"  # qaic targets: the QPC folder that qaic-compile writes, with its program
CPU_DEFAULT_LEVEL = "extended"  # portable across CPUs; "all" adds layout transforms tied to this host's ISA
COMPILE_TIMEOUT_S = 3600.0
MEMORY_SHARE = 0.8  # default limit per child: a runaway compile fails before the kernel's OOM killer acts


def default_memory_gb() -> float:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * MEMORY_SHARE / 2**30, 1)


@dataclass(frozen=True)
class ResolvedTarget:
    """Everything that decides how a target compiles. `options` holds strings as the EP receives them, with
    option-file values as written in the manifest (relative), so the config stays free of absolute paths."""

    name: str
    ep: EpInfo
    source: str
    device: str
    compiler: str
    embed: bool
    options: dict[str, str]
    option_files: dict[str, Path]
    optimization_level: str | None
    quantized: bool = False
    qaic: QaicOptions | None = None  # compiler = "qaic"
    sdk_root: Path | None = None  # the configured toolchain root (qaic) or QAIRT SDK root (qairt)
    timeout_s: float = COMPILE_TIMEOUT_S
    max_memory_gb: float | None = None
    min_offload: float | None = None

    def limits(self, timeout_s: float | None = None) -> Limits:
        """The limits of this target's children: the compile's timeout unless another is given."""
        return Limits(timeout_s or self.timeout_s, self.max_memory_gb)

    @property
    def quantize_flavour(self) -> str | None:
        """Which quantized variant this target consumes: QNN's own QDQ configuration or the generic one."""
        if not self.quantized:
            return None
        return "qnn" if self.ep.alias == "qnn" else "generic"

    @property
    def is_cpu(self) -> bool:
        return self.ep.alias == "cpu"

    def session_options(self) -> dict[str, str]:
        """The options passed to the EP: option-file values replaced by absolute paths."""
        return {**self.options, **{key: str(path) for key, path in self.option_files.items()}}

    def runtime_files(self) -> dict[str, str]:
        """Option files a runtime needs again when loading the artifact: key -> name inside the artifact."""
        return {key: f"{key}{path.suffix}" for key, path in sorted(self.option_files.items())
                if key in self.ep.runtime_options}


@dataclass(frozen=True)
class ValidationSettings:
    """How a build's artifact is validated: the target's `validation` table with the model's keys winning."""

    mode: str  # "run", "structural" or "off"
    inputs: Path | None
    reference: Path | None
    thresholds: dict[str, float]  # only those the manifest sets; the rest default by precision
    timeout_s: float


@dataclass(frozen=True)
class Build:
    """One compile: a model for a target, and how its artifact is validated.

    `model` is what the compile consumes: the declared model, or the output of its last stage (`stages`);
    `float_model` is the float model before quantization, for the validation report's information."""

    model: ModelSpec
    target: ResolvedTarget
    validation: ValidationSettings
    external: tuple[Path, ...] = ()  # the external-data files of `model`
    stages: tuple[Stage, ...] = ()
    float_model: Path | None = None
    frozen: dict[str, tuple[float, ...]] | None = None  # inputs a freeze stage made constant

    @property
    def name(self) -> str:
        return f"{self.model.name}@{self.target.name}"

    def out_dir(self, artifacts: Path) -> Path:
        return artifacts / self.target.name / self.model.name

    @property
    def model_file(self) -> str:
        return f"{self.model.name}.onnx"

    @property
    def data_file(self) -> str:
        """A CPU artifact of a model with external data keeps its weights in this file beside it."""
        return f"{self.model_file}.data"

    @functools.cached_property
    def output_names(self) -> list[str]:
        """Every file the compile publishes, known before it runs."""
        if self.target.compiler == "qaic":
            return [SIDECAR, "compile.log", QPC_PROGRAM]
        names = [self.model_file, SIDECAR, *self.target.runtime_files().values()]
        if self.target.is_cpu and self.external:
            names.append(self.data_file)
        binary = self.target.ep.binary_name(self.model.name)
        if binary and not self.target.embed:
            names.append(binary)
        return sorted(names)


def _normalise(value: Any) -> str | None:
    """Provider options are strings to ONNX Runtime; TOML booleans become '1'/'0' as the EPs expect."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float, str)):
        return str(value)
    return None


def parse_ep(file: str, path: str, text: str | None, device: str | None) -> tuple[EpInfo, str]:
    """`qnn`, `QNNExecutionProvider` or `openvino@pypi` -> (EpInfo, source). Without an EP, the device picks it."""
    if text is None:
        return lookup({"npu": "qnn", "gpu": "dml" if sys.platform == "win32" else "openvino",
                       "cpu": "cpu"}[device or "npu"]), "default"
    alias, _, source = text.partition("@")
    info = lookup(alias)
    if info is None:
        raise UserError(file, path, f"unknown EP '{alias}'{closest(alias, valid_ep_names())}; "
                                    f"valid: {', '.join(valid_ep_names())}")
    if source and source not in SOURCES:
        raise UserError(file, path, f"unknown EP source '{source}'{closest(source, SOURCES)}; "
                                    f"valid: {', '.join(SOURCES)}")
    return info, source or "default"


def resolve_qaic(spec: TargetSpec, manifest: Manifest) -> ResolvedTarget:
    """compiler = "qaic": no ONNX Runtime EP, an NPU QPC, the qaic flags checked as the seed documents them."""
    file, where = manifest.path.name, f"targets.{spec.name}"
    for key, value in (("ep", spec.ep), ("options", spec.options), ("embed", spec.embed),
                       ("option_files", spec.option_files), ("quantized", spec.quantized)):
        if value:
            raise UserError(file, f"{where}.{key}", "does not apply to compiler = \"qaic\" (qaic-compile takes "
                                                    "its flags from the `qaic` table)")
    if spec.device not in (None, "npu"):
        raise UserError(file, f"{where}.device", "qaic-compile builds for npu (Cloud AI 100) only")
    options, key, message = check_qaic(spec.qaic or {})
    if options is None:
        raise UserError(file, f"{where}.qaic.{key}", message)
    if spec.min_offload is not None:
        raise UserError(file, f"{where}.min_offload", "applies to ONNX Runtime EP targets (EPContext nodes)")
    return ResolvedTarget(name=spec.name, ep=QAIC, source="sdk", device="npu", compiler="qaic", embed=False,
                          options={}, option_files={}, optimization_level=None, qaic=options,
                          sdk_root=manifest.toolchains.get("qaic"), timeout_s=spec.timeout_s or COMPILE_TIMEOUT_S,
                          max_memory_gb=spec.max_memory_gb or default_memory_gb())


def resolve_target(spec: TargetSpec, manifest: Manifest) -> ResolvedTarget:
    file, where = manifest.path.name, f"targets.{spec.name}"
    if spec.compiler == "qaic":
        return resolve_qaic(spec, manifest)
    if spec.qaic is not None:
        raise UserError(file, f"{where}.qaic", "applies only to compiler = \"qaic\"")
    if spec.compiler == "qairt" and spec.ep not in (None, "qnn", "QNNExecutionProvider"):
        raise UserError(file, f"{where}.ep", "compiler = \"qairt\" builds QNN context binaries: use ep = \"qnn\"")
    if spec.qnn_sdk_root is not None and spec.compiler != "qairt":
        raise UserError(file, f"{where}.qnn_sdk_root", "applies only to compiler = \"qairt\"")
    ep, source = parse_ep(file, f"{where}.ep", spec.ep, spec.device)
    source = ep.default_source if source == "default" else source
    device = spec.device or ep.default_device
    if device not in ep.devices:
        raise UserError(file, f"{where}.device", f"{ep.name} does not build for '{device}'; "
                                                 f"valid devices: {', '.join(ep.devices)}")
    if ep.alias == "cpu":
        for key, value in (("embed", spec.embed), ("compiler", spec.compiler != "ort"), ("options", spec.options),
                           ("min_offload", spec.min_offload is not None)):
            if value:
                raise UserError(file, f"{where}.{key}", "does not apply to ep = \"cpu\" (an optimized ONNX "
                                                        "model, no EP context); use optimization_level")
    elif spec.optimization_level is not None:
        raise UserError(file, f"{where}.optimization_level", "applies only to ep = \"cpu\"")

    options: dict[str, str] = {}
    for key, value in spec.options.items():
        if key in ep.ignored_options:
            raise UserError(file, f"{where}.options.{key}", ep.ignored_options[key])
        if ep.known_options is not None and key not in ep.known_options:
            raise UserError(file, f"{where}.options.{key}",
                            f"unknown {ep.name} option{closest(key, ep.known_options)}; "
                            f"valid: {', '.join(sorted(ep.known_options))}")
        text = _normalise(value)
        if text is None:
            raise UserError(file, f"{where}.options.{key}",
                            f"must be a string, number or boolean, found {type(value).__name__}")
        options[key] = text
    if not ({"backend_type", "backend_path"} & options.keys()):
        options.update(ep.required_defaults)

    option_files: dict[str, Path] = {}
    for index, key in enumerate(spec.option_files):
        if key not in options:
            raise UserError(file, f"{where}.option_files[{index}]",
                            f"names option '{key}', but options has no such key")
        path = manifest.root / options[key]
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "not found"
            raise UserError(file, f"{where}.options.{key}", f"option file {what}: {path}")
        option_files[key] = path.resolve()

    return ResolvedTarget(
        name=spec.name, ep=ep, source=source, device=device, compiler=spec.compiler, embed=spec.embed,
        options=dict(sorted(options.items())), option_files=option_files,
        optimization_level=(spec.optimization_level or CPU_DEFAULT_LEVEL) if ep.alias == "cpu" else None,
        quantized=spec.quantized, sdk_root=spec.qnn_sdk_root, timeout_s=spec.timeout_s or COMPILE_TIMEOUT_S,
        max_memory_gb=spec.max_memory_gb or default_memory_gb(), min_offload=spec.min_offload,
    )


VALIDATION_TIMEOUT_S = 600.0


def validation_settings(model: ModelSpec, target: TargetSpec) -> ValidationSettings:
    merged = {**target.validation, **model.validation}
    thresholds = {k: v for k, v in merged.items() if k not in ("inputs", "reference", "timeout_s")}
    return ValidationSettings(target.validate, merged.get("inputs"), merged.get("reference"), thresholds,
                              merged.get("timeout_s", VALIDATION_TIMEOUT_S))


def artifacts_dir(manifest: Manifest) -> Path:
    return manifest.root / "artifacts"


def chain_for(model: ModelSpec, target: ResolvedTarget, manifest: Manifest, external: tuple[Path, ...]):
    return stage_chain(model, artifacts_dir(manifest), external, target.quantize_flavour,
                       static_shapes=not target.is_cpu and target.compiler in ("ort", "ort_session"),
                       single_file=target.compiler == "qaic")


def plan(manifest: Manifest, external: dict[str, tuple[Path, ...]] | None = None) -> list[Build]:
    """Every (model, target) compile the manifest asks for, in manifest order, with its stages; `external` holds
    each model's external-data files."""
    resolved = {name: resolve_target(spec, manifest) for name, spec in manifest.targets.items()}
    builds = []
    for model in manifest.models.values():
        for name in model.targets:
            target = resolved[name]
            chain = chain_for(model, target, manifest, (external or {}).get(model.name, ()))
            settings = validation_settings(model, manifest.targets[name])
            if model.freeze and chain.float_model is None and settings.reference is None:
                # compare with the model as declared, fed the frozen values: folding errors cannot hide
                settings = dataclasses.replace(settings, reference=model.path)
            builds.append(Build(chain.model, target, settings, chain.external, chain.stages, chain.float_model,
                                model.freeze))
    return builds


@dataclass(frozen=True)
class GroupBuild:
    """Members compiled in order into one shared context under `artifacts/<target>/groups/<group>/`."""

    name: str
    target: ResolvedTarget
    members: tuple[ModelSpec, ...]  # what the compile consumes, after each member's stages
    validations: tuple[ValidationSettings, ...]  # per member, as for its standalone build
    stages: tuple[Stage, ...] = ()
    external: dict[str, tuple[Path, ...]] = dataclasses.field(default_factory=dict)  # per member
    frozen: dict[str, dict[str, tuple[float, ...]] | None] = dataclasses.field(default_factory=dict)  # per member

    def out_dir(self, artifacts: Path) -> Path:
        return artifacts / self.target.name / "groups" / self.name

    @functools.cached_property
    def output_names(self) -> list[str]:
        ep = self.target.ep
        names = [SIDECAR, *self.target.runtime_files().values(), *(f"{m.name}.onnx" for m in self.members)]
        stems = [self.members[0].name] if ep.shares_one_binary else [m.name for m in self.members]
        names += [ep.binary_name(stem) for stem in stems if ep.binary_name(stem)]
        return sorted(names)


def resolve_group(spec: GroupSpec, manifest: Manifest, target: ResolvedTarget,
                  external: dict[str, tuple[Path, ...]]) -> GroupBuild:
    """Checks that need the resolved EP: it must share contexts, and sharing cannot be embedded."""
    file, where = manifest.path.name, f"groups.{spec.name}"
    if not target.ep.can_share_contexts:
        sharing = ", ".join(alias for alias, info in REGISTRY.items() if info.can_share_contexts)
        raise UserError(file, f"{where}.target", f"target '{target.name}' uses {target.ep.name}, which cannot "
                                                 f"share an EP context; EPs that can: {sharing}")
    if target.compiler not in ("ort", "ort_session"):
        raise UserError(file, f"{where}.target", f"target '{target.name}' uses compiler = \"{target.compiler}\"; "
                                                 "shared contexts are built with ONNX Runtime: compiler = \"ort\" "
                                                 "or \"ort_session\"")
    if target.embed:
        raise UserError(file, f"{where}.target", f"target '{target.name}' has embed = true; a shared context "
                                                 "must stay in its own file (QNN writes a broken result, OpenVINO "
                                                 "rejects it): use a target with embed = false")
    declared = [manifest.models[name] for name in spec.models]
    chains = [chain_for(m, target, manifest, external.get(m.name, ())) for m in declared]
    target_spec = manifest.targets[target.name]
    return GroupBuild(spec.name, target, tuple(chain.model for chain in chains),
                      tuple(validation_settings(m, target_spec) for m in declared),
                      tuple(stage for chain in chains for stage in chain.stages),
                      {chain.model.name: chain.external for chain in chains},
                      {m.name: m.freeze for m in declared})


def plan_groups(manifest: Manifest, external: dict[str, tuple[Path, ...]] | None = None) -> list[GroupBuild]:
    return [resolve_group(spec, manifest, resolve_target(manifest.targets[spec.target], manifest), external or {})
            for spec in manifest.groups.values()]
