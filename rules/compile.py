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
from .errors import BuildError, ModelError
from .fingerprint import compile_fingerprint
from .graph import check_ep_contexts, missing_files, placement, static_dims
from .host import toolchain_versions
from .manifest import ModelSpec
from .preprocess import always_written, external_output
from .targets import QPC_PROGRAM, SIDECAR, Build, ResolvedTarget
from .toolchains import Toolchain, ep_context_model, find_qaic, find_qairt, qaic_command, run_tool

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
    nodes: dict[str, Any]  # a single model's placement; for groups the counts summed over members
    usage: dict[str, float] | None  # the child's wall time and peak memory; None when restored


def cached_compile(label: str, fingerprint: str, workspace: Workspace, final: Path, expected: list[str] | None,
                   produce: Callable[[Path], dict[str, float] | None]) -> Compiled:
    """`cached_folder`, then what the published sidecar says about nodes, and every file's size and sha256;
    `produce` returns the child's usage."""
    started = time.monotonic()
    usage: dict[str, float] = {}

    def run(scratch: Path) -> None:
        usage.update(produce(scratch) or {})

    restored = cached_folder(label, fingerprint, workspace, final, expected, run)
    recorded = json.loads((final / SIDECAR).read_text())
    if "nodes" in recorded:
        nodes = recorded["nodes"]
    else:
        per_model = [m["nodes"] for m in recorded["members"].values()]
        nodes = {key: sum(n[key] for n in per_model) for key in ("source", "ep_context", "cpu", "in_ep")
                 if key in per_model[0]}
    return Compiled(label, "restored" if restored else "compiled", fingerprint, final,
                    file_records(final, expected or recorded["files"], workspace), time.monotonic() - started, nodes,
                    usage or None)


def file_records(folder: Path, names: list[str], workspace: Workspace) -> list[dict[str, Any]]:
    return [{"name": name, "size": (folder / name).stat().st_size, "sha256": workspace.hashes.sha256(folder / name)}
            for name in names]


def compile_build(build: Build, workspace: Workspace) -> Compiled:
    """Compile `build` into `artifacts/<target>/<model>/` (or restore it from the cache), atomically; raise
    BuildError naming model and target."""
    target = build.target
    fingerprint = compile_fingerprint(build, workspace.hashes)

    def produce(scratch: Path) -> dict[str, float]:
        data_file = build.data_file if target.is_cpu and build.external else None
        request = compile_request(target, [(build.model, scratch / build.model_file, data_file)], share=False)
        log = workspace.artifacts / ".logs" / target.name / f"{build.model.name}.compile.log"
        answer = run_child("rules.compile", request, scratch / ".child", target.limits(),
                           f"compile {build.name} ({target.ep.name})", log)
        (result,) = answer["members"]
        shutil.rmtree(scratch / ".child")
        for key, name in target.runtime_files().items():
            shutil.copyfile(target.option_files[key], scratch / name)
        (scratch / SIDECAR).write_text(json.dumps(sidecar(build, result), indent=2, sort_keys=True) + "\n")
        return answer["usage"]

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
    except ModelError as exc:
        raise BuildError(f"compile {build.name}: {exc}") from None
    command = qaic_command(toolchain.executables["qaic-compile"], build.model.path, scratch / "qpc",
                           build.target.qaic, symbols)
    try:
        run_tool(command, scratch / "compile.log", f"compile {build.name} (qaic-compile)", build.target.timeout_s)
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
              "--output_path", str(work / "model.dlc"), *shapes], log, what, build.target.timeout_s)
    binary = build.target.ep.binary_name(build.model.name)
    run_tool([str(toolchain.executables["context"]), "--backend", str(toolchain.executables["backend"]),
              "--model", str(toolchain.root / "lib" / "x86_64-linux-clang" / "libQnnModelDlc.so"),
              "--dlc_path", str(work / "model.dlc"), "--binary_file", Path(binary).stem,
              "--output_dir", str(work)], log, what, build.target.timeout_s)
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


def compile_request(target: ResolvedTarget, members: list[tuple[ModelSpec, Path, str | None]],
                    share: bool) -> dict[str, Any]:
    """The child's request: each (model, output path, external-data file name of a CPU output) in order, and
    the target's settings."""
    return {
        "members": [{"model": str(model.path), "output": str(output), "external_data": data_file,
                     "inputs": {name: list(shape) for name, shape in model.inputs.items()}}
                    for model, output, data_file in members],
        "share": share, "ep": target.ep.alias, "device": target.device, "compiler": target.compiler,
        "embed": target.embed, "options": target.session_options(), "optimization_level": target.optimization_level,
        "min_offload": target.min_offload,
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
        "nodes": result["nodes"], **({"frozen": {k: list(v) for k, v in build.frozen.items()}} if build.frozen else {}),
        **({"optimization_level": target.optimization_level} if target.is_cpu else {}),
    }


# ---- child process ----

def inspect_output(path: Path, source_nodes: int, ep_name: str | None) -> dict[str, Any]:
    """Check a compiled model before it is published (every file it references is beside it; EPContext nodes
    come from `ep_name` and name binaries that exist) and say where the source's nodes ended up."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    problems = missing_files(path, model)
    if problems:
        raise ModelError("; ".join(problems))
    sdk, binaries = check_ep_contexts(model, ep_name, path.parent) if ep_name else (None, [])
    return {"nodes": placement(source_nodes, model, ep_name), "ep_sdk_version": sdk, "binaries": binaries}


def check_offload(name: str, nodes: dict[str, Any], min_offload: float | None) -> None:
    """`min_offload`: the share of source nodes that must end inside EPContext nodes."""
    if min_offload is None or nodes["offload"] >= min_offload:
        return
    left = ", ".join(f"{op} x{count}" for op, count in nodes["cpu_op_types"].items())
    raise ModelError(f"{name}: only {nodes['offload']:.1%} of {nodes['source']} source nodes are in EPContext "
                     f"nodes, below min_offload = {min_offload:g}; left on CPU: {left}")


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
            external_output(options, member["external_data"])  # its own weights, not the source's data file
            ort.InferenceSession(model_file, options, providers=["CPUExecutionProvider"])
            if member["external_data"]:
                always_written(output.with_name(member["external_data"]))
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
            raise ModelError(f"{info.name} wrote no compiled model for {model_file}")
        results.append(output)
    # Check after the last compile: a shared context binary is written only when sharing stops.
    members = []
    for (member, source_nodes, _), output in zip(prepared, results, strict=True):
        found = inspect_output(output, source_nodes, None if info.alias == "cpu" else info.name)
        if info.alias != "cpu":
            check_offload(Path(member["model"]).name, found["nodes"], request["min_offload"])
        members.append(found)
    return {"members": members}


if __name__ == "__main__":
    serve(_compile_in_child)
