"""Compiling one model for one target: EPContext models with ModelCompiler or a context-enabled session, and
offline-optimized models for CPU targets.

The parent side (`compile_build`) runs the compile in a fresh child into a scratch folder, checks what the child
wrote, adds the sidecar and publishes the folder atomically. The child side (`_compile_in_child`) is the only
code that imports onnxruntime.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import RULES_FORMAT
from .cache import Workspace, cached_folder
from .child import run_child, serve
from .eps import lookup
from .errors import BuildError
from .fingerprint import compile_fingerprint
from .host import toolchain_versions
from .manifest import ModelSpec
from .targets import QPC_PROGRAM, SIDECAR, Build, ResolvedTarget
from .toolchains import Toolchain, ep_context_model, find_qaic, find_qairt, qaic_command, run_tool

COMPILE_TIMEOUT_S = 3600
CPU_LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


@dataclass(frozen=True)
class Compiled:
    """What one compile or restore produced, for the printed line and the build report."""

    build: str
    status: str  # "compiled" or "restored"
    fingerprint: str
    out_dir: Path
    files: list[dict[str, Any]]  # name, size, sha256
    seconds: float
    nodes: dict[str, int]


def cached_compile(label: str, fingerprint: str, workspace: Workspace, final: Path, expected: list[str] | None,
                   produce: Callable[[Path], None]) -> Compiled:
    """`cached_folder`, then what the published sidecar says about nodes, and every file's size and sha256."""
    started = time.monotonic()
    restored = cached_folder(label, fingerprint, workspace, final, expected, produce)
    recorded = json.loads((final / SIDECAR).read_text())
    per_model = [recorded["nodes"]] if "nodes" in recorded else [m["nodes"] for m in recorded["members"].values()]
    nodes = {key: sum(n[key] for n in per_model) for key in per_model[0]}
    return Compiled(label, "restored" if restored else "compiled", fingerprint, final,
                    file_records(final, expected or recorded["files"], workspace), time.monotonic() - started, nodes)


def file_records(folder: Path, names: list[str], workspace: Workspace) -> list[dict[str, Any]]:
    return [{"name": name, "size": (folder / name).stat().st_size, "sha256": workspace.hashes.sha256(folder / name)}
            for name in names]


def compile_build(build: Build, workspace: Workspace, external: list[Path]) -> Compiled:
    """Compile `build` into `artifacts/<target>/<model>/` (or restore it from the cache), atomically; raise
    BuildError naming model and target."""
    target = build.target
    fingerprint = compile_fingerprint(build, external, workspace.hashes)

    def produce(scratch: Path) -> None:
        request = compile_request(target, [(build.model, scratch / build.model_file)], share=False)
        log = workspace.artifacts / ".logs" / target.name / f"{build.model.name}.compile.log"
        (result,) = run_child("rules.compile", request, scratch / ".child", COMPILE_TIMEOUT_S,
                              f"compile {build.name} ({target.ep.name})", log)["members"]
        shutil.rmtree(scratch / ".child")
        for key, name in target.runtime_files().items():
            shutil.copyfile(target.option_files[key], scratch / name)
        (scratch / SIDECAR).write_text(json.dumps(sidecar(build, result), indent=2, sort_keys=True) + "\n")

    if target.compiler in ("qaic", "qairt"):
        produce = functools.partial(produce_qaic if target.compiler == "qaic" else produce_qairt, build,
                                    workspace.artifacts / ".logs" / target.name / f"{build.model.name}.compile.log")
    expected = None if target.compiler == "qaic" else build.output_names  # qaic-compile decides the QPC's files
    return cached_compile(f"compile:{build.name}", fingerprint, workspace, build.out_dir(workspace.artifacts),
                          expected, produce)


def _toolchain(build: Build) -> Toolchain:
    target = build.target
    found = find_qaic(target.sdk_root) if target.compiler == "qaic" else find_qairt(target.sdk_root)
    if isinstance(found, str):
        raise BuildError(f"compile {build.name}: {found}")
    return found


def _external_sidecar(build: Build, toolchain: Toolchain, source_nodes: int, files: list[str]) -> dict[str, Any]:
    return {"format": RULES_FORMAT, "model": build.model.name, "target": build.target.name,
            "compiler": build.target.compiler, "device": build.target.device, "files": files,
            "toolchain": {"name": toolchain.name, "version": toolchain.version}, "nodes": {"source": source_nodes},
            "inputs": {name: list(shape) for name, shape in build.model.inputs.items()}}


def produce_qaic(build: Build, log: Path, scratch: Path) -> None:
    """qaic-compile the single-file model into scratch/qpc; its output is kept in compile.log next to it."""
    import onnx

    toolchain = _toolchain(build)
    source = onnx.load(str(build.model.path), load_external_data=False)
    try:
        symbols = static_dims(source, {k: list(v) for k, v in build.model.inputs.items()}, needs_static=True)
    except ValueError as exc:
        raise BuildError(f"compile {build.name}: {exc}") from None
    command = qaic_command(toolchain.executables["qaic-compile"], build.model.path, scratch / "qpc",
                           build.target.qaic, symbols)
    try:
        run_tool(command, scratch / "compile.log", f"compile {build.name} (qaic-compile)", COMPILE_TIMEOUT_S)
    finally:
        if (scratch / "compile.log").exists():
            log.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(scratch / "compile.log", log)
    if not (scratch / QPC_PROGRAM).is_file():
        raise BuildError(f"compile {build.name}: qaic-compile exited 0 but wrote no {QPC_PROGRAM}")
    files = sorted([SIDECAR, *(p.relative_to(scratch).as_posix() for p in scratch.rglob("*") if p.is_file())])
    (scratch / SIDECAR).write_text(json.dumps(_external_sidecar(build, toolchain, len(source.graph.node), files),
                                              indent=2, sort_keys=True) + "\n")


def produce_qairt(build: Build, log: Path, scratch: Path) -> None:
    """QAIRT: convert to DLC, generate the HTP context binary, and wrap it in an EPContext model for the QNN EP."""
    import onnx

    toolchain = _toolchain(build)
    source = onnx.load(str(build.model.path), load_external_data=False)
    work = scratch / ".qairt"
    work.mkdir()
    what = f"compile {build.name} (QAIRT)"
    shapes = [arg for name, shape in sorted(build.model.inputs.items())
              for arg in ("--source_model_input_shape", name, ",".join(map(str, shape)))]
    run_tool([str(toolchain.executables["converter"]), "--input_network", str(build.model.path),
              "--output_path", str(work / "model.dlc"), *shapes], log, what, COMPILE_TIMEOUT_S)
    binary = build.target.ep.binary_name(build.model.name)
    run_tool([str(toolchain.executables["context"]), "--backend", str(toolchain.executables["backend"]),
              "--model", str(toolchain.root / "lib" / "x86_64-linux-clang" / "libQnnModelDlc.so"),
              "--dlc_path", str(work / "model.dlc"), "--binary_file", Path(binary).stem,
              "--output_dir", str(work)], log, what, COMPILE_TIMEOUT_S)
    if not (work / binary).is_file():
        raise BuildError(f"{what}: qnn-context-binary-generator wrote no {binary}")
    os.replace(work / binary, scratch / binary)
    shutil.rmtree(work)
    ep_context_model(source, binary, build.model.name, scratch / build.model_file)
    sidecar_data = _external_sidecar(build, toolchain, len(source.graph.node), build.output_names)
    sidecar_data.update({"ep": build.target.ep.name, "embed": False, "runtime_options": {
        k: v for k, v in build.target.options.items() if k in build.target.ep.runtime_options}})
    sidecar_data["nodes"] = {"source": len(source.graph.node), "ep_context": 1, "cpu": 0,
                             "in_ep": len(source.graph.node)}
    (scratch / SIDECAR).write_text(json.dumps(sidecar_data, indent=2, sort_keys=True) + "\n")


def compile_request(target: ResolvedTarget, members: list[tuple[ModelSpec, Path]], share: bool) -> dict[str, Any]:
    """The child's request: each (model, output path) in order, and the target's settings."""
    return {
        "members": [{"model": str(model.path), "output": str(output),
                     "inputs": {name: list(shape) for name, shape in model.inputs.items()}}
                    for model, output in members],
        "share": share, "ep": target.ep.alias, "device": target.device, "compiler": target.compiler,
        "embed": target.embed, "options": target.session_options(), "optimization_level": target.optimization_level,
    }


def sidecar(build: Build, result: dict[str, Any]) -> dict[str, Any]:
    """What a runtime needs to load the artifact, and how much of the model the EP took."""
    target = build.target
    runtime_options = {k: v for k, v in target.options.items() if k in target.ep.runtime_options}
    runtime_options.update(target.runtime_files())
    return {
        "format": RULES_FORMAT, "model": build.model.name, "target": target.name,
        "ep": target.ep.name, "ep_source": target.source, "device": target.device, "compiler": target.compiler,
        "embed": target.embed, "model_file": build.model_file,
        "files": build.output_names, "runtime_options": runtime_options,
        "inputs": {name: list(shape) for name, shape in build.model.inputs.items()},
        "versions": toolchain_versions(target.ep), "ep_sdk_version": result.get("ep_sdk_version"),
        "nodes": result["nodes"],
        **({"optimization_level": target.optimization_level} if target.is_cpu else {}),
    }


# ---- child process ----

def static_dims(model: Any, inputs: dict[str, list[int]], needs_static: bool) -> dict[str, int]:
    """Map `inputs` onto the model's symbolic dimension names, for free-dimension overrides.

    Raises ValueError naming the input when a shape does not fit, or when an EP that needs static shapes would
    get a symbolic dimension that `inputs` does not fix.
    """
    graph_inputs = {i.name: i for i in model.graph.input}
    initializers = {t.name for t in model.graph.initializer}
    for name in inputs:
        if name not in graph_inputs:
            raise ValueError(f"inputs.{name}: the model has no input '{name}'; its inputs: "
                             f"{', '.join(n for n in graph_inputs if n not in initializers)}")
    overrides: dict[str, int] = {}
    for name, value_info in graph_inputs.items():
        if name in initializers:
            continue
        dims = value_info.type.tensor_type.shape.dim
        wanted = inputs.get(name)
        if wanted is not None and len(wanted) != len(dims):
            raise ValueError(f"inputs.{name}: the model's input has rank {len(dims)}, "
                             f"the manifest gives {len(wanted)} dimensions {wanted}")
        for index, dim in enumerate(dims):
            if dim.HasField("dim_value"):
                if wanted is not None and wanted[index] != dim.dim_value:
                    raise ValueError(f"inputs.{name}: dimension {index} is fixed to {dim.dim_value} in the model, "
                                     f"the manifest gives {wanted[index]}")
                continue
            if wanted is None:
                if needs_static:
                    label = dim.dim_param or "?"
                    raise ValueError(f"input '{name}' has symbolic dimension {index} ('{label}'); this EP needs "
                                     f"static shapes: set inputs.{name} in the model's manifest entry")
                continue
            if not dim.dim_param:
                raise ValueError(f"inputs.{name}: dimension {index} is unnamed, so it cannot be fixed by name")
            previous = overrides.setdefault(dim.dim_param, wanted[index])
            if previous != wanted[index]:
                raise ValueError(f"inputs.{name}: dimension '{dim.dim_param}' is given both {previous} and "
                                 f"{wanted[index]}")
    return overrides


def inspect_output(path: Path, ep_name: str | None) -> dict[str, Any]:
    """Count EPContext nodes from `ep_name` and CPU nodes; check every referenced context file exists."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    contexts, cpu_nodes, sdk, binaries = 0, 0, None, []
    for node in model.graph.node:
        if node.op_type != "EPContext":
            cpu_nodes += 1
            continue
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        source = attributes.get("source", b"").decode()
        if source != ep_name:
            raise RuntimeError(f"the output holds an EPContext node from '{source}', not {ep_name}")
        contexts += 1
        sdk = (attributes.get("ep_sdk_version") or b"").decode() or sdk
        if attributes.get("embed_mode", 1) == 0:
            binary = path.parent / attributes["ep_cache_context"].decode()
            if not binary.is_file():
                raise RuntimeError(f"{path.name} references {binary.name}, which was not written")
            binaries.append(binary.name)
    if ep_name and contexts == 0:
        raise RuntimeError(f"the output holds no EPContext node from {ep_name}: the EP compiled nothing")
    return {"ep_context_nodes": contexts, "cpu_nodes": cpu_nodes, "ep_sdk_version": sdk, "binaries": binaries}


def _compile_in_child(request: dict[str, Any]) -> dict[str, Any]:
    """Compile each member in order; with `share`, all into one shared EP context (the last stops sharing).

    Every member's static shapes are checked before the first compile, so a group never half-compiles."""
    import onnx
    import onnxruntime as ort

    from .host import register_plugin, select_ep_device

    info = lookup(request["ep"])
    prepared = []
    for member in request["members"]:
        source = onnx.load(member["model"], load_external_data=False)
        overrides = static_dims(source, member["inputs"], needs_static=info.alias != "cpu")
        prepared.append((member, len(source.graph.node), overrides))
        del source
    if info.alias != "cpu":
        register_plugin(ort, info)
        device = select_ep_device(ort, info, request["device"])
    results = []
    for index, (member, _, overrides) in enumerate(prepared):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        for name, value in overrides.items():
            options.add_free_dimension_override_by_name(name, value)
        output = Path(member["output"])
        # Compile by file name from the model's folder: ONNX Runtime hashes the model path into partition (graph)
        # names, so an absolute path would make two checkouts produce different bytes, and bytes without a path
        # give every member of a shared context the same graph names.
        os.chdir(Path(member["model"]).parent)
        model_file = Path(member["model"]).name
        if info.alias == "cpu":
            level = CPU_LEVELS[request["optimization_level"]]
            options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
            options.optimized_model_filepath = str(output)
            ort.InferenceSession(model_file, options, providers=["CPUExecutionProvider"])
            found = inspect_output(output, None)
        else:
            if request["share"]:
                options.add_session_config_entry("ep.share_ep_contexts", "1")
                if index == len(prepared) - 1:
                    options.add_session_config_entry("ep.stop_share_ep_contexts", "1")
            options.add_provider_for_devices([device], request["options"])
            if request["compiler"] == "ort":
                compiler = ort.ModelCompiler(options, model_file,
                                             embed_compiled_data_into_model=request["embed"],
                                             flags=int(ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED))
                compiler.compile_to_file(str(output))
            else:
                options.add_session_config_entry("ep.context_enable", "1")
                options.add_session_config_entry("ep.context_file_path", str(output))
                options.add_session_config_entry("ep.context_embed_mode", "1" if request["embed"] else "0")
                ort.InferenceSession(model_file, options)
            if not output.is_file():
                raise RuntimeError(f"{info.name} wrote no compiled model for {Path(member['model']).name}")
        results.append(output)
    # Check after the last compile: a shared context binary is written only when sharing stops.
    members = []
    for (_, source_nodes, _), output in zip(prepared, results, strict=True):
        found = inspect_output(output, None if info.alias == "cpu" else info.name)
        nodes = {"source": source_nodes, "ep_context": found["ep_context_nodes"], "cpu": found["cpu_nodes"]}
        if info.alias != "cpu":
            nodes["in_ep"] = max(source_nodes - found["cpu_nodes"], 0)
        members.append({"nodes": nodes, "ep_sdk_version": found["ep_sdk_version"],
                        "binaries": found["binaries"]})
    return {"members": members}


if __name__ == "__main__":
    serve(_compile_in_child)
