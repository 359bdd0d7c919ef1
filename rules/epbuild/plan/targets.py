"""Target resolution and the build plan: declared targets become concrete EPs, devices and normalised options;
models and groups become `epbuild.manifest.builds.Build`s with their stages and the exact files they produce.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from ..errors import UserError, closest
from ..files.layout import Layout
from ..manifest.builds import REPORT, Build, Member, ResolvedTarget, ValidationSettings
from ..manifest.eps import DEFAULT_EP, QAIC, REGISTRY, SOURCES, EpInfo, known, lookup, valid_ep_names
from ..manifest.names import shown
from ..manifest.parse import GroupSpec, Manifest, ModelSpec, TableReader, TargetSpec, not_a_file
from ..manifest.qaic import check_qaic
from ..manifest.roots import Roots
from ..manifest.schema import THRESHOLDS
from ..manifest.task_metric import task_settings
from ..steps.compilers import COMPILERS, Compiler
from ..steps.packaging.package import genai_files, pipeline_files
from .stages import Chain, stage_chain

CPU_DEFAULT_LEVEL = "extended"  # portable across CPUs; "all" adds layout transforms tied to this host's ISA
COMPILE_TIMEOUT_S = 3600.0
VALIDATION_TIMEOUT_S = 600.0
MEMORY_SHARE = 0.8  # default limit per child: a runaway compile fails before the kernel's OOM killer acts


def default_memory_gb() -> float:
    return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * MEMORY_SHARE / 2**30, 1)


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
        return known(DEFAULT_EP[device or "npu"]), "default"
    alias, at, source = text.partition("@")
    if at and not source:
        raise UserError(file, path, f"'{text}' names no EP source after '@'; valid: {', '.join(SOURCES)} "
                                    f"(e.g. '{alias}@{SOURCES[0]}'), or '{alias}' alone")
    info = lookup(alias)
    if info is None:
        raise UserError(file, path, f"unknown EP '{alias}'{closest(alias, valid_ep_names())}; "
                                    f"valid: {', '.join(valid_ep_names())}")
    if source and source not in SOURCES:
        raise UserError(file, path, f"unknown EP source '{source}'{closest(source, SOURCES)}; "
                                    f"valid: {', '.join(SOURCES)}")
    return info, source or "default"


def resolve_target(spec: TargetSpec, manifest: Manifest) -> ResolvedTarget:
    file, where = manifest.path.name, f"targets.{spec.name}"
    backend = COMPILERS[spec.compiler]
    backend.check(spec, file)
    timeout_s, max_memory_gb = spec.timeout_s or COMPILE_TIMEOUT_S, spec.max_memory_gb or default_memory_gb()
    if spec.compiler == "qaic":
        qaic = check_qaic(TableReader(manifest.path, f"{where}.qaic", spec.qaic or {}))
        return ResolvedTarget(name=spec.name, ep=QAIC, source="sdk", device="npu", compiler="qaic", embed=False,
                              options={}, option_files={}, optimization_level=None, qaic=qaic,
                              sdk_root=manifest.toolchains.get("qaic"), timeout_s=timeout_s,
                              max_memory_gb=max_memory_gb)
    ep, source = parse_ep(file, f"{where}.ep", spec.ep, spec.device)
    source = ep.default_source if source == "default" else source
    device = spec.device or ep.default_device
    if device not in ep.devices:
        raise UserError(file, f"{where}.device", f"{ep.name} does not build for '{device}'; "
                                                 f"valid devices: {', '.join(ep.devices)}")
    if ep.is_cpu:
        for key, value in (("embed", spec.embed), ("compiler", spec.compiler != "ort"), ("options", spec.options),
                           ("min_offload", spec.min_offload is not None)):
            if value:
                raise UserError(file, f"{where}.{key}", "does not apply to ep = \"cpu\" (an optimized ONNX "
                                                        "model, no EP context); use optimization_level")
    elif spec.optimization_level is not None:
        raise UserError(file, f"{where}.optimization_level", "applies only to ep = \"cpu\"")
    options = _options(spec, ep, file, where)
    file_option = ep.precision_option  # an option whose value the plugin reads as a file's JSON text
    if file_option in options and file_option not in spec.option_files and not options[file_option].startswith("{"):
        raise UserError(file, f"{where}.options.{file_option}", f"names a file ({options[file_option]!r}), which "
                        f"{ep.name} would parse as JSON text and reject at run time: add option_files = "
                        f"[\"{file_option}\"] so it is given the file")
    socs = tuple(options[SOC_OPTION].split(",")) if "," in options.get(SOC_OPTION, "") else ()
    ship = _ship_socs(spec, ep, socs, file, where) if spec.ship_socs else ()
    if socs and spec.compiler != "ort":
        raise UserError(file, f"{where}.compiler", "a list of SoCs is compiled with ONNX Runtime's ModelCompiler: "
                        "compiler = \"ort\"")
    return ResolvedTarget(warnings=_unknown_values(options, ep, file, where), socs=socs, ship_socs=ship,
        name=spec.name, ep=ep, source=source, device=device, compiler=spec.compiler, embed=spec.embed,
        options=dict(sorted(options.items())), option_files=_option_files(spec, options, manifest),
        optimization_level=(spec.optimization_level or CPU_DEFAULT_LEVEL) if ep.is_cpu else None,
        quantized=spec.quantized, sdk_root=spec.qnn_sdk_root, min_offload=spec.min_offload, timeout_s=timeout_s,
        max_memory_gb=max_memory_gb,
    )


# an option's value written as the hardware is called, and what it means (difflib would offer 'gpu' for 'npu')
VALUE_MEANS = {("backend_type", word): "the NPU is QNN's HTP: backend_type = \"htp\""
               for word in ("npu", "dsp", "hexagon", "hta")}


def _options(spec: TargetSpec, ep: EpInfo, file: str, where: str) -> dict[str, str]:
    """Provider options checked against the EP's names, as the strings the EP receives."""
    options: dict[str, str] = {}
    for key, value in spec.options.items():
        if isinstance(value, list):
            options[key] = _soc_list(value, key, ep, file, where)
            continue
        if key in ep.ignored_options:
            raise UserError(file, f"{where}.options.{key}", ep.ignored_options[key])
        if ep.known_options is not None and key not in ep.known_options:
            near = closest(key, ep.known_options)  # named alone: the whole list is a line of 1,000 characters
            listed = "" if near else f"; valid: {', '.join(sorted(ep.known_options))}"
            raise UserError(file, f"{where}.options.{key}", f"unknown {ep.name} option{near}{listed}; every "
                            f"option it takes: epbuild's docs, targets/{ep.alias}.md")
        text = _normalise(value)
        if text is None:
            raise UserError(file, f"{where}.options.{key}",
                            f"must be a string, number or boolean, found {type(value).__name__}")
        chips = ep.known_values.get(key, {})
        text = chip_number(text, chips)  # a chip's name (SM8650, any case) for the number the EP takes
        allowed = ep.option_values.get(key)
        if isinstance(allowed, tuple) and text not in allowed:
            meant = VALUE_MEANS.get((key, text.lower()))  # a word for the hardware, not the backend's name
            near = f" ({meant})" if meant else closest(text, allowed)
            raise UserError(file, f"{where}.options.{key}", f"{text!r} is not a value {ep.name} knows{near} (it "
                            f"would be ignored without a word); valid: {', '.join(allowed)}")
        if isinstance(allowed, re.Pattern) and not allowed.fullmatch(text):
            names = sorted(chips.values())
            also = (f" or a chip name epbuild knows{closest(text.upper(), names)}; known: {', '.join(names)}"
                    if names else "")
            raise UserError(file, f"{where}.options.{key}", f"must be a number{also}, found {text!r}")
        options[key] = text
    if not ({"backend_type", "backend_path"} & options.keys()):
        options.update(ep.required_defaults)
    if "," in options.get(SOC_OPTION, "") and (options.get("backend_type") != "htp" or "backend_path" in options):
        key = "backend_path" if "backend_path" in options else "backend_type"
        raise UserError(file, f"{where}.options.{key}", "a list of SoCs (one binary for several SoCs) is built for "
                        "the HTP only: backend_type = \"htp\", no backend_path")
    return options


SOC_OPTION = "soc_model"  # the option a list of SoCs is given for: one QNN binary for several SoCs


def _soc_list(values: list[Any], key: str, ep: EpInfo, file: str, where: str) -> str:
    """`soc_model = ["SM8650", "SC8380XP", 57]`: several SoCs in one multi-SoC QNN binary, as the EP takes them
    (numbers joined by commas, in `soc_order`: the list's order changes nothing). Every entry a chip epbuild knows,
    by name or number; none twice; at least two."""
    at = f"{where}.options.{key}"
    if key != SOC_OPTION or SOC_OPTION not in ep.known_values:
        if key == "htp_arch" and SOC_OPTION in ep.known_values:
            raise UserError(file, at, "a list of HTP architectures, which QNN also takes, is not built by epbuild "
                            "yet: list the SoCs in soc_model (one binary for several SoCs)")
        raise UserError(file, at, "a list is taken only by QNN's soc_model (one binary for several SoCs); give one "
                        "value")
    chips = ep.known_values[SOC_OPTION]
    numbers: dict[str, str] = {}
    for index, value in enumerate(values):
        text = _normalise(value)
        number = chip_number(text, chips) if text is not None and not isinstance(value, bool) else None
        if number not in chips:
            known = ", ".join(f"{name} ({n})" for n, name in chips.items())
            raise UserError(file, f"{at}[{index}]", f"{shown(value)} is not a SoC epbuild knows"
                            f"{closest(str(text).upper(), list(chips.values()))}; known: {known}")
        if number in numbers:
            raise UserError(file, f"{at}[{index}]", f"{shown(value)} is {chips[number]} ({number}), already listed as "
                            f"{shown(numbers[number])}")
        numbers[number] = value
    if not numbers:
        raise UserError(file, at, "an empty list names no SoC: give one (soc_model = \"SM8650\" or 57) or several "
                        "for one binary that runs on each")
    if len(numbers) < 2:
        raise UserError(file, at, f"a list of one SoC is a plain target: write {key} = {shown(values[0])}")
    return ",".join(sorted(numbers, key=lambda number: soc_order(chips[number])))


def soc_order(chip: str) -> list[Any]:
    """Where a SoC goes in a multi-SoC compile: the order of the binary's HTP cache records (`htp.cache.<chip>.0`,
    sorted naturally), which the EP's compatibility string then follows. onnxruntime-qnn's pruning tool drops the
    string's entry at the index of the record it removes: in any other order it drops another SoC's entry (seen:
    57 dropped for 60's record)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", f"htp.cache.{chip.lower()}.0")]


def chip_number(text: str, chips: dict[str, str]) -> str:
    """A chip's name (SM8650, any case) as the number the EP takes; any other text as it is."""
    return next((number for number, name in chips.items() if name.lower() == text.lower()), text)


def _unknown_values(options: dict[str, str], ep: EpInfo, file: str, where: str) -> tuple[tuple[str, str], ...]:
    """Warnings, as (where, what), for values of the right form that no documented device has: the EP takes them
    without a word."""
    found = []
    for key, values in ep.known_values.items():
        if key in options and options[key] not in values and "," not in options[key]:  # a list: each one checked
            listed = ", ".join(f"{value} ({name})" for value, name in values.items())
            found.append((f"{file}: {where}.options.{key}", f"{options[key]} is not a {key} epbuild knows, and "
                          f"{ep.name} compiles without checking it; known: {listed}"))
    return tuple(found)


def _option_files(spec: TargetSpec, options: dict[str, str], manifest: Manifest) -> dict[str, Path]:
    file, where = manifest.path.name, f"targets.{spec.name}"
    option_files: dict[str, Path] = {}
    if not spec.option_files:
        return option_files
    roots = Roots(manifest.path)
    for index, key in enumerate(spec.option_files):
        if key not in options:
            raise UserError(file, f"{where}.option_files[{index}]",
                            f"names option '{key}', but options has no such key")
        path = manifest.root / options[key]
        if not path.is_file():
            raise UserError(file, f"{where}.options.{key}", f"option file {not_a_file(path)}: {path}")
        option_files[key] = roots.check(f"{where}.options.{key}", path).resolve()
    return option_files


def validation_settings(model: ModelSpec, target: TargetSpec, manifest_name: str = "models.toml") -> ValidationSettings:
    """The target's validation settings, the model's over them, and the model's for this target over both."""
    own = {k: v for k, v in model.validation.items() if k != "targets"}
    levels = [model.validation.get("targets", {}).get(target.name, {}), own, target.validation]  # first wins
    merged = {**levels[2], **levels[1], **levels[0]}
    # the gate is one setting: the level that sets either kind decides both (a target's max_drop never outlives
    # a model's min_relative, nor a model's max_drop the model's min_relative for this target)
    gate: dict[str, Any] = next((level for level in levels if "min_relative" in level or "max_drop" in level), {})
    for key in ("min_relative", "max_drop"):
        merged.pop(key, None)
        if key in gate:
            merged[key] = gate[key]
    thresholds = {k: v for k, v in merged.items() if k in THRESHOLDS}
    task = task_settings(merged, manifest_name, model.entry.split(".variants.")[0] or f"models.{model.name}")
    return ValidationSettings(target.validate, merged.get("inputs"), merged.get("reference"), thresholds,
                              merged.get("timeout_s", VALIDATION_TIMEOUT_S), merged.get("localise", False),
                              merged.get("inconclusive", "report"), merged.get("repeat_within_s", 30.0), task)


def _chain(model: ModelSpec, target: ResolvedTarget, manifest: Manifest, external: tuple[Path, ...]) -> Chain:
    backend: Compiler = COMPILERS[target.compiler]
    in_onnxruntime = not target.is_cpu and backend.in_onnxruntime
    return stage_chain(model, Layout(manifest.root / "artifacts"), external, target.quantize_flavour,
                       static_shapes=in_onnxruntime, single_file=backend.single_file, manifest=manifest.path.name,
                       fold=in_onnxruntime and target.device == "npu",
                       min_opset=target.ep.min_opset if in_onnxruntime else None)


def reference_files(model: ModelSpec, chain: Chain, settings: ValidationSettings, external: tuple[Path, ...],
                    reference_external: tuple[Path, ...]) -> tuple[Path, ...]:
    """Every file the CPU reference of a validation may read: the models it may run (the compiled-from model,
    `validation.reference`, the model as declared, the float model) with their external data, and the inputs
    file. Its outputs are cached under their bytes (`fingerprint.reference_fingerprint`)."""
    data = {model.path: external, **{stage.output: stage.output_external for stage in chain.stages}}
    if settings.reference is not None:
        data.setdefault(settings.reference, reference_external)
    models = [chain.model.path, settings.reference, model.path if chain.stages else None, chain.float_model]
    found = [path for path in models if path is not None]
    dataset = [Path(path) for path in settings.task["dataset"]] if settings.task else []  # its outputs are kept too
    return tuple(dict.fromkeys([*(p for path in found for p in (path, *data[path])),
                                *([settings.inputs] if settings.inputs else []), *dataset]))


def _member(model: ModelSpec, target: ResolvedTarget, manifest: Manifest, external: tuple[Path, ...],
            reference_external: tuple[Path, ...]) -> tuple[Member, Chain]:
    """A model as its build consumes it (after its stages), with its validation settings."""
    chain = _chain(model, target, manifest, external)
    settings = validation_settings(model, manifest.targets[target.fleet or target.name], manifest.path.name)
    folded = model.freeze or any(stage.kind in ("rewrite", "fold", "optimize") for stage in chain.stages)
    if folded and chain.float_model is None and settings.reference is None:
        # compare with the model as declared (fed the frozen values): folding errors cannot hide
        settings = dataclasses.replace(settings, reference=model.path)
    return Member(chain.model, settings, chain.external, chain.float_model, model.freeze,
                  model.path if chain.stages else None,
                  reference_files(model, chain, settings, external, reference_external), chain.elsewhere), chain


def _distinct_file_names(group: str, members: tuple[Member, ...], file: str) -> None:
    """ONNX Runtime names compiled graphs after the file it compiles: two members compiled from one file name would
    collide in the shared context. A member that goes through a stage is compiled from a file named after the model
    (variants of one source are told apart); one compiled as it is, from its own file name."""
    seen: dict[str, str] = {}
    for index, member in enumerate(members):
        other = seen.setdefault(member.model.path.name, member.name)
        if other != member.name:
            raise UserError(file, f"groups.{group}.models[{index}]", f"models '{other}' and '{member.name}' are "
                            f"compiled from files both named {member.model.path.name}; ONNX Runtime names compiled "
                            "graphs after it, so their graphs would collide in the shared context: rename one file")


def _build(name: str, target: ResolvedTarget, models: list[ModelSpec], manifest: Manifest,
           external: dict[Path, tuple[Path, ...]], shared: bool, pipeline_tokens: int | None = None) -> Build:
    pairs = [_member(m, target, manifest, external.get(m.path, ()),
                     external.get(m.validation["reference"], ()) if "reference" in m.validation else ())
             for m in models]
    members = tuple(member for member, _ in pairs)
    if shared:
        _distinct_file_names(name, members, manifest.path.name)
        package, _ = pipeline_files(members, pipeline_tokens)
        if package:  # a genai model's prompt and token graphs: the group's folder is what genai loads
            members = (dataclasses.replace(members[0], package=package), *members[1:])
    else:  # genai grows the cache: only a graph that keeps the builder's dynamic shapes runs as genai's model
        (model,) = models
        dynamic = not model.dims and not model.inputs and ".variants." not in model.entry
        package = genai_files(model.path) if dynamic and target.compiler in ("ort", "ort_session") else ()
        if package:
            members = (dataclasses.replace(members[0], package=package),)
    backend = COMPILERS[target.compiler]
    outputs = tuple(sorted({*backend.output_names(target, list(members), shared),
                            *(path.name for m in members for path in m.package)}))
    layout = Layout(manifest.root / "artifacts")
    alone = tuple((m.name, tuple(layout.build_dir(target.name, m.name, False) / file
                                 for file in backend.output_names(target, [m], False)))
                  for m in members if pipeline_tokens and target.name in m.model.targets)
    return Build(name, target, members, outputs, tuple(s for _, chain in pairs for s in chain.stages), shared,
                 manifest.path.name, pipeline_tokens, alone)


def check_group(spec: GroupSpec, manifest: Manifest, target: ResolvedTarget) -> None:
    """Checks that need the resolved EP: it must share contexts, inside ONNX Runtime, and not embedded."""
    file, where = manifest.path.name, f"groups.{spec.name}"
    if not target.ep.can_share_contexts:
        sharing = ", ".join(alias for alias, info in REGISTRY.items() if info.can_share_contexts)
        raise UserError(file, f"{where}.target", f"target '{target.name}' uses {target.ep.name}, which cannot "
                                                 f"share an EP context; EPs that can: {sharing}")
    if not COMPILERS[target.compiler].in_onnxruntime:
        raise UserError(file, f"{where}.target", f"target '{target.name}' uses compiler = \"{target.compiler}\"; "
                                                 "shared contexts are built with ONNX Runtime: compiler = \"ort\" "
                                                 "or \"ort_session\"")
    if target.socs:
        raise UserError(file, f"{where}.target", f"target '{target.name}' lists several SoCs (soc_model = "
                        f"{list(target.socs)}): {target.ep.name} cannot put a multi-SoC binary in a shared context; "
                        "give the group a target with one soc_model")
    if target.embed:
        raise UserError(file, f"{where}.target", f"target '{target.name}' has embed = true; a shared context "
                                                 "must stay in its own file (QNN writes a broken result, OpenVINO "
                                                 "rejects it): use a target with embed = false")


def each_soc(target: ResolvedTarget) -> list[ResolvedTarget]:
    """A multi-SoC target's SoCs (those shipped, with `ship_socs`) as targets of their own (`TARGET~57`, a name no
    manifest can declare): each compiled alone and run on the HTP simulator, which cannot run a multi-SoC binary;
    validated with the target's settings."""
    return [dataclasses.replace(target, name=f"{target.name}~{soc}", options={**target.options, SOC_OPTION: soc},
                                socs=(), ship_socs=(), fleet=target.name, warnings=())
            for soc in target.ship_socs or target.socs]


def _ship_socs(spec: TargetSpec, ep: EpInfo, socs: tuple[str, ...], file: str, where: str) -> tuple[str, ...]:
    """`ship_socs`: some of the target's SoCs, by name or number, none twice."""
    at = f"{where}.ship_socs"
    if not socs:
        raise UserError(file, at, "applies to a QNN target whose soc_model is a list (a multi-SoC binary to prune)")
    if spec.embed:
        raise UserError(file, at, "prunes the binary beside the model: embed = false")
    chips = ep.known_values[SOC_OPTION]
    kept: dict[str, Any] = {}
    for index, value in enumerate(spec.ship_socs):
        text = _normalise(value)
        number = chip_number(text, chips) if text is not None and not isinstance(value, bool) else None
        if number not in socs:
            raise UserError(file, f"{at}[{index}]", f"{shown(value)} is not one of soc_model's SoCs: "
                            f"{', '.join(f'{chips[s]} ({s})' for s in socs)}")
        if number in kept:
            raise UserError(file, f"{at}[{index}]", f"{shown(value)} is listed twice")
        kept[number] = value
    if len(kept) == len(socs):
        raise UserError(file, at, "lists every SoC of soc_model: nothing to prune; remove it")
    return tuple(sorted(kept, key=lambda number: soc_order(chips[number])))


def resolve_targets(manifest: Manifest) -> dict[str, ResolvedTarget]:
    """Every target resolved and every group checked against its target: the manifest's errors that need no
    model file, found before anything is read or written."""
    for model in manifest.models.values():
        for name in model.validation.get("targets", {}):
            if name not in model.targets:
                raise UserError(manifest.path.name, f"models.{model.name}.validation.targets.{name}",
                                f"'{name}' is not a target of this model{closest(name, model.targets)}; its "
                                f"targets: {', '.join(model.targets)}")
    resolved = {name: resolve_target(spec, manifest) for name, spec in manifest.targets.items()}
    for spec in manifest.groups.values():
        check_group(spec, manifest, resolved[spec.target])
    return resolved


def plan(manifest: Manifest, external: dict[Path, tuple[Path, ...]] | None = None,
         resolved: dict[str, ResolvedTarget] | None = None) -> list[Build]:
    """Every build the manifest asks for: each (model, target) compile in manifest order, then each group;
    `external` holds the external-data files of each model and `validation.reference` by path, `resolved` the
    targets (`resolve_targets`)."""
    external = external or {}
    resolved = resolved or resolve_targets(manifest)
    builds = []
    layout = Layout(manifest.root / "artifacts")
    for model in manifest.models.values():
        for name in model.targets:
            build = _build(f"{model.name}@{name}", resolved[name], [model], manifest, external, shared=False)
            runs = build.members[0].validation.mode == "run"  # each SoC alone only to be run
            alone = [_build(f"{model.name}@{soc.name}", soc, [model], manifest, external, shared=False)
                     for soc in each_soc(resolved[name])] if runs else []
            if alone:
                build = dataclasses.replace(build, soc_reports=tuple(
                    (one.target.options[SOC_OPTION], one.out_dir(layout) / REPORT) for one in alone))
            builds += [build, *alone]
    for spec in manifest.groups.values():
        target = resolved[spec.target]
        builds.append(_build(spec.name, target, [manifest.models[m] for m in spec.models], manifest, external,
                             shared=True, pipeline_tokens=spec.pipeline_tokens))
    return builds
