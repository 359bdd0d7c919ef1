"""Which op types an EP refuses, asked of the EP itself: when a compile takes none of a model's nodes ("Unable to
compile any nodes", with no word of which), each op type's first node is compiled alone, in a model of that one node
(its inputs typed as inference found them, its weights of the same shape and type), by the same EP and options. What
the EP takes alone and not in the model is said too: then the cause is how they are combined (shapes, types)."""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROBE_BUDGET_S = 60.0  # a failure's explanation, not a second build: the op types not reached are said to be unasked
MAX_WEIGHT_BYTES = 64 << 20  # a weight larger than this is not copied into a probe (the op type is left unasked)


def refused_op_types(ort: Any, model_path: Path, options: Callable[[], Any]) -> dict[str, Any]:
    """{"refused": [op types the EP takes no node of alone], "taken": [...], "unasked": [...], "counts": {op: n}}."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - probes then type only what the file declares
        inferred = model
    graph = inferred.graph
    typed = {v.name: v for v in [*graph.input, *graph.value_info, *graph.output]}
    weights = {t.name: t for t in model.graph.initializer}
    counts = Counter(node.op_type for node in model.graph.node)
    first: dict[str, Any] = {}
    for node in model.graph.node:
        first.setdefault(node.op_type, node)
    found: dict[str, list[str]] = {"refused": [], "taken": [], "unasked": []}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="epbuild-probe-") as folder:
        for op, node in first.items():
            probe = _one_node(onnx, model, node, typed, weights)
            if probe is None or time.monotonic() - started > PROBE_BUDGET_S:
                found["unasked"].append(op)
                continue
            path = Path(folder) / f"{op}.onnx"
            onnx.save(probe, str(path))
            try:
                ort.ModelCompiler(options(), str(path), embed_compiled_data_into_model=True,
                                  flags=int(ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)).compile_to_file(
                    str(Path(folder) / f"{op}_ctx.onnx"))
            except Exception:  # noqa: BLE001 - the EP refused the node: that is the answer
                found["refused"].append(op)
            else:
                found["taken"].append(op)
    return {**found, "counts": dict(counts)}


def _one_node(onnx: Any, model: Any, node: Any, typed: dict[str, Any], weights: dict[str, Any]) -> Any | None:
    """A model of `node` alone, or None where it cannot be made (a subgraph, an input of unknown type, a weight
    too large or stored elsewhere)."""
    import numpy as np
    from onnx import helper, numpy_helper

    if any(a.HasField("g") or a.graphs for a in node.attribute):
        return None
    inputs, initializers = [], []
    for name in dict.fromkeys(n for n in node.input if n):
        if name in weights:
            tensor = weights[name]
            dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
            if int(np.prod(tensor.dims)) * dtype.itemsize > MAX_WEIGHT_BYTES:
                return None
            if tensor.data_location == onnx.TensorProto.EXTERNAL:  # the values do not decide what an EP takes
                initializers.append(numpy_helper.from_array(np.zeros(tuple(tensor.dims), dtype), name))
            else:
                initializers.append(tensor)
        elif name in typed and typed[name].type.tensor_type.elem_type:
            inputs.append(typed[name])
        else:
            return None
    outputs = [typed[name] if name in typed else helper.make_empty_tensor_value_info(name)
               for name in node.output if name]
    graph = helper.make_graph([node], f"probe_{node.op_type}", inputs, outputs, initializers)
    probe = helper.make_model(graph, opset_imports=list(model.opset_import))
    probe.ir_version = model.ir_version
    return probe


def refused_line(ep_name: str, found: dict[str, Any]) -> str | None:
    """The probe's answer in words; None where the EP refused no op type alone (ONNX Runtime's own words, and the
    log's, then say more than the probe)."""
    counts = found["counts"]

    def listed(ops: list[str]) -> str:
        return ", ".join(f"{op} ({counts[op]} node{'s' * (counts[op] > 1)})" for op in ops)

    if counts and not found["refused"]:
        return None
    if not counts:
        return (f"{ep_name} took none of the model's nodes: the model has none left to compile (every output is an "
                "input or a constant, computed by the fold stage); build it for a CPU target")
    parts = [f"{ep_name} took none of the model's nodes", f"alone, it takes no node of {listed(found['refused'])}"]
    if found["taken"]:
        parts.append(f"it takes {', '.join(found['taken'])} alone, but not in this model")
    if found["unasked"]:
        parts.append(f"not asked alone: {', '.join(found['unasked'])}")
    return "; ".join(parts) + "; build this model for a target whose EP has these ops, or export it without them"
