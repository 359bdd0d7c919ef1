"""Compiling one model for one target: EPContext models with ModelCompiler or a context-enabled session, and
offline-optimized models for CPU targets.

The parent side (`compile_build`) runs the compile in a fresh child into a scratch folder, checks what the child
wrote, adds the sidecar and publishes the folder atomically. The child side (`_compile_in_child`) is the only
code that imports onnxruntime.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import RULES_FORMAT
from .child import run_child, serve
from .eps import lookup
from .errors import BuildError
from .host import toolchain_versions
from .publish import discard, publish, scratch_dir
from .targets import SIDECAR, Build

COMPILE_TIMEOUT_S = 3600
CPU_LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


@dataclass(frozen=True)
class Compiled:
    """What one compile produced, for the printed line and the build report."""

    build: str
    out_dir: Path
    files: list[str]
    seconds: float
    nodes: dict[str, int]


def compile_build(build: Build, artifacts: Path) -> Compiled:
    """Compile `build` into `artifacts/<target>/<model>/`, atomically; raise BuildError naming model and target."""
    started = time.monotonic()
    final = build.out_dir(artifacts)
    scratch = scratch_dir(artifacts, f"{build.target.name}.{build.model.name}")
    target = build.target
    request = {
        "model": str(build.model.path), "model_name": build.model.name,
        "output": str(scratch / build.model_file), "ep": target.ep.alias, "device": target.device,
        "compiler": target.compiler, "embed": target.embed, "options": target.session_options(),
        "inputs": {name: list(shape) for name, shape in build.model.inputs.items()},
        "optimization_level": target.optimization_level,
    }
    log = artifacts / ".logs" / target.name / f"{build.model.name}.compile.log"
    try:
        result = run_child("rules.compile", request, scratch / ".child", COMPILE_TIMEOUT_S,
                           f"compile {build.name} ({target.ep.name})", log)
        shutil.rmtree(scratch / ".child")
        for key, name in target.runtime_files().items():
            shutil.copyfile(target.option_files[key], scratch / name)
        (scratch / SIDECAR).write_text(json.dumps(sidecar(build, result), indent=2, sort_keys=True) + "\n")
        produced = sorted(p.name for p in scratch.iterdir())
        expected = build.output_names
        if produced != expected:
            raise BuildError(f"compile {build.name}: {target.ep.name} wrote {produced}, expected {expected}")
        publish(scratch, final)
    except BaseException:
        discard(scratch, final)
        raise
    return Compiled(build.name, final, expected, time.monotonic() - started, result["nodes"])


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
    contexts, cpu_nodes, sdk = 0, 0, None
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
                raise RuntimeError(f"the output references {binary.name}, which was not written")
    if ep_name and contexts == 0:
        raise RuntimeError(f"the output holds no EPContext node from {ep_name}: the EP compiled nothing")
    return {"ep_context_nodes": contexts, "cpu_nodes": cpu_nodes, "ep_sdk_version": sdk}


def _compile_in_child(request: dict[str, Any]) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    from .host import register_plugin, select_ep_device

    info = lookup(request["ep"])
    source_model = onnx.load(request["model"], load_external_data=False)
    source_nodes = len(source_model.graph.node)
    overrides = static_dims(source_model, request["inputs"], needs_static=info.alias != "cpu")
    del source_model
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for name, value in overrides.items():
        options.add_free_dimension_override_by_name(name, value)
    output = Path(request["output"])
    # Compile from bytes, in the model's folder: ONNX Runtime hashes the model path (or the external-data
    # folder) into partition names, so an absolute path would make two checkouts produce different bytes.
    model_bytes = Path(request["model"]).read_bytes()
    os.chdir(Path(request["model"]).parent)
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", ".")
    if info.alias == "cpu":
        level = CPU_LEVELS[request["optimization_level"]]
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.optimized_model_filepath = str(output)
        ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        found = inspect_output(output, None)
    else:
        register_plugin(ort, info)
        options.add_provider_for_devices([select_ep_device(ort, info, request["device"])], request["options"])
        if request["compiler"] == "ort":
            compiler = ort.ModelCompiler(options, model_bytes,
                                         embed_compiled_data_into_model=request["embed"],
                                         flags=int(ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED))
            compiler.compile_to_file(str(output))
        else:
            options.add_session_config_entry("ep.context_enable", "1")
            options.add_session_config_entry("ep.context_file_path", str(output))
            options.add_session_config_entry("ep.context_embed_mode", "1" if request["embed"] else "0")
            options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
            ort.InferenceSession(model_bytes, options)
        if not output.is_file():
            raise RuntimeError(f"{info.name} wrote no compiled model")
        found = inspect_output(output, info.name)
    nodes = {"source": source_nodes, "ep_context": found["ep_context_nodes"], "cpu": found["cpu_nodes"]}
    if info.alias != "cpu":
        nodes["in_ep"] = max(source_nodes - found["cpu_nodes"], 0)
    return {"nodes": nodes, "ep_sdk_version": found["ep_sdk_version"]}


if __name__ == "__main__":
    serve(_compile_in_child)
