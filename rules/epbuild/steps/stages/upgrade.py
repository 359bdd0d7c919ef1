"""The `upgrade` stage: a model below the ai.onnx opset its target's EP takes (QNN: 7, below which ONNX Runtime's
layout transformer refuses the whole model) is written at that opset by ONNX's version converter. The converted model
is validated against the model as declared like every stage's output; a conversion the converter refuses is one line
naming the op, the opsets and what to do, not the converter's C++ assertion."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ...contracts.jobs import StageJob
from ...errors import ModelError
from ...files.weights import load_with_weights
from ..graph import graphs_within
from .output import save

# the converter's assertions carry a source location and a printf format it never filled in
_LOCATION = re.compile(r"^\S+\.(cc|h):\d+: \S+: Assertion `.*?` failed: ")


def upgrade(source: Path, output: Path, opset: int, weights: Path | None, save: Any, data_file: str | None,
            entry: str) -> dict[str, Any]:
    """Convert the model to `opset` and save it with `save(model, output, data_file)`; the opset it had."""
    import onnx
    from onnx import version_converter

    model = load_with_weights(source, weights)
    before = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), None)
    _align_legacy_broadcast(model, entry)
    try:
        converted = version_converter.convert_version(model, opset)
    except Exception as exc:  # noqa: BLE001 - the converter raises RuntimeError (assertions) and ConvertError
        raise ModelError(refusal(model, str(exc), before, opset, entry)) from None
    del model
    for graph in graphs_within(converted.graph):  # its adapters write value_info without an element type (the Unsqueeze
        # that replaces Add's broadcast attribute), which ONNX Runtime refuses to load: a hint, dropped
        kept = [v for v in graph.value_info if not v.type.HasField("tensor_type") or v.type.tensor_type.elem_type]
        if len(kept) < len(graph.value_info):
            del graph.value_info[:]
            graph.value_info.extend(kept)
    # the converter keeps the IR version, which may be older than what the new opset needs
    converted.ir_version = max(converted.ir_version,
                               onnx.helper.find_min_ir_version_for(list(converted.opset_import), True))
    save(converted, output, data_file)
    return {"from_opset": before, "to_opset": opset}


def refusal(model: Any, message: str, before: int | None, opset: int, entry: str) -> str:
    """The converter's refusal in one line: the op it names (the longest op type of the model found in its message),
    why, and what to do."""
    text = _LOCATION.sub("", " ".join(message.split()))
    text = text.replace("Op '%s' has no registered schema; cannot convert it from version %lld to %lld.", "")
    ops = {node.op_type for graph in graphs_within(model.graph) for node in graph.node}
    named = sorted((op for op in ops if re.search(re.escape(op), message, re.I)), key=len, reverse=True)
    op = named[0] if named else None
    if op and "registered schema" in message:
        why = f"ONNX has no schema for {op} (an op only older or other runtimes know)"
    elif op:
        why = f"{op}: {text[:200]}"
    else:
        why = text[:200]
    return (f"upgrade: ONNX's version converter cannot convert the model from opset {before} to {opset} ({why}); "
            f"export the model again at opset {opset} or later, or set upgrade = false in {entry} (the target's EP "
            f"then takes none of its nodes below opset {opset})")


# ops whose opset-1..6 forms broadcast B into A from `axis` (`broadcast = 1`), where opset 7 broadcasts numpy's way
LEGACY_BROADCAST = ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less")


def _align_legacy_broadcast(model: Any, entry: str) -> None:
    """Write each legacy `broadcast = 1, axis = k` as numpy broadcasting before the converter sees it: B gets the
    trailing ones that align it with A from axis k (an Unsqueeze), and loses `axis`. ONNX's own adapter (onnx 1.23)
    appends rank(A) - rank(B) ones whatever the axis, which broadcasts a [C] bias into [C, 1, 1, 1] against
    [N, C, H, W]: a model of another shape and other values."""
    import onnx
    from onnx import helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - ranks then come from what the file declares
        inferred = model
    ranks: dict[str, int] = {}
    for graph in graphs_within(inferred.graph):
        for value in [*graph.input, *graph.value_info, *graph.output]:
            if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
                ranks[value.name] = len(value.type.tensor_type.shape.dim)
        ranks.update({tensor.name: len(tensor.dims) for tensor in graph.initializer})
    for graph in graphs_within(model.graph):
        nodes: list[Any] = []
        for node in graph.node:
            attributes = {a.name: a for a in node.attribute}
            if (node.domain in ("", "ai.onnx") and node.op_type in LEGACY_BROADCAST and "axis" in attributes
                    and "broadcast" in attributes and attributes["broadcast"].i == 1):
                a, b = (ranks.get(name) for name in node.input[:2])
                if a is None or b is None:
                    raise ModelError(f"upgrade: {node.op_type} '{node.name or node.output[0]}' broadcasts from axis "
                                     f"{attributes['axis'].i} (opset 6's form) and the rank of its inputs is not "
                                     f"known, so it cannot be written for opset 7; give the model's inputs static "
                                     f"shapes (inputs = ... in {entry}) or export it again at opset 7 or later")
                axis = attributes["axis"].i % a if a else 0
                trailing = a - axis - b
                if trailing > 0:
                    aligned = f"{node.input[1]}__aligned_{len(nodes)}_{node.output[0]}"
                    nodes.append(helper.make_node("Unsqueeze", [node.input[1]], [aligned],
                                                  axes=list(range(b, b + trailing))))
                    node.input[1] = aligned
                node.attribute.remove(attributes["axis"])
            nodes.append(node)
        if len(nodes) > len(graph.node):
            del graph.node[:]
            graph.node.extend(nodes)


def run(job: StageJob) -> dict[str, Any]:
    return upgrade(job.source, job.output, job.settings["opset"], job.weights_folder, save, job.data_file, job.entry)
