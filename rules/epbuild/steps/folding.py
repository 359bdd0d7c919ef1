"""Constant folding for NPU targets (the `fold` stage): every node that only computes constants (Shape of a static
tensor, ConstantOfShape, Range, Identity, the arithmetic of attention masks and recurrent initial states) is
replaced by its value, and nothing else in the model changes.

NPU EPs leave such nodes on CPU in front of their EPContext node, and QNN's artifact then does not load. ONNX
Runtime's own optimizer folds them too, but it also rewrites what it optimizes for the CPU (Cast nodes around fp16
ops, fusions), so this stage evaluates only the constant subgraph, on the CPU EP with every optimization off.
QuantizeLinear and DequantizeLinear are kept: their QDQ structure is what a quantized EP compiles.
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelError
from .graph import EP_CONTEXT, NOT_TENSORS, dims, graphs_within, initializer_names, names_read, subgraphs

FOLD_INPUT_LIMIT = 2**20  # bytes: a node that reads a bigger weight (a Transpose of a Linear's) is left to the EP,
# which takes constant weights' ops itself; folding it would load and rewrite the weights the stage otherwise keeps
KEPT = {EP_CONTEXT, "QuantizeLinear", "DequantizeLinear", "RandomNormal", "RandomUniform", "RandomNormalLike",
        "RandomUniformLike", "Multinomial", "If", "Loop", "Scan", *NOT_TENSORS}


def foldable_nodes(graph: Any) -> list[Any]:
    """The nodes to replace by their values: each computes only from initializers of at most FOLD_INPUT_LIMIT bytes
    and other such nodes (or is the Shape of a static tensor), and at least one node of its chain is not a bare
    Constant (those stay as they are)."""
    big = {t.name for t in graph.initializer if _size(t) > FOLD_INPUT_LIMIT}
    known = initializer_names(graph) | {""}
    shapes = {v.name: v for v in [*graph.value_info, *graph.input, *graph.output]}
    found = []
    for node in graph.node:  # topologically sorted in a valid model
        if node.op_type in KEPT or node.domain not in ("", "ai.onnx"):
            continue
        if any(name in big for name in node.input):
            continue
        static_shape = node.op_type == "Shape" and node.input[0] in shapes and _static(shapes[node.input[0]])
        if static_shape or all(name in known for name in node.input):
            known.update(node.output)
            found.append(node)
    produced = {output: node for node in found for output in node.output}
    computing = set()  # nodes whose value is more than a Constant's own
    for node in found:
        if node.op_type != "Constant":
            computing.add(id(node))
            computing.update(id(produced[name]) for name in node.input if name in produced)
    return [node for node in found if id(node) in computing]


def _fold_failure(text: str, nodes: list[Any]) -> str:
    """What failed computing the foldable nodes' values: the node ONNX Runtime names (with its op type), its first
    line, and the way around the stage."""
    import re

    first = next((line.strip() for line in text.splitlines() if line.strip()), "no message")
    named = re.search(r"[Nn]ode\.? Name:\s*'([^']*)'", text)
    node = next((n for n in nodes if named and n.name == named.group(1)), None)
    where = f" at node '{node.name}' ({node.op_type})" if node is not None else ""
    return (f"folding constant subgraphs failed{where}: {first[:300]}; `optimize = \"basic\"` folds with ONNX "
            "Runtime's own optimizer instead of this stage (`optimize = \"none\"`: no folding)")


def _static(value: Any) -> bool:
    """Whether a value's shape is known and static. A value_info without a shape (an exporter declares the type
    only: silero VAD's) is not: its Shape folded to an empty constant, and a Gather of its second dimension failed
    the fold stage ("idx=1 must be within the inclusive range [0,-1]"). A shape with no dimensions is a scalar's."""
    tensor = value.type.tensor_type if value.type.HasField("tensor_type") else None
    return tensor is not None and tensor.HasField("shape") and all(isinstance(d, int) for d in dims(value))


def _size(tensor: Any) -> int:
    from onnx import helper

    count = 1
    for dim in tensor.dims:
        count *= dim
    try:
        return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError):  # strings and other types without a fixed size
        return count * 8


def _with_values(tensor: Any) -> Any:
    """`tensor` with its bytes: a copy read from its external-data file (in the working folder) when the model was
    read without its weights; the model's own tensor stays a reference."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    if not uses_external_data(tensor) or tensor.HasField("raw_data"):
        return tensor
    loaded = onnx.TensorProto()
    loaded.CopyFrom(tensor)
    load_external_data_for_tensor(loaded, ".")
    loaded.data_location = onnx.TensorProto.DEFAULT
    del loaded.external_data[:]
    return loaded


def read_only_inside(graph: Any) -> list[str]:
    """The graph's initializers that only its nodes' subgraphs read (outer-scope values of a Loop body)."""
    top = {name for node in graph.node for name in node.input} | {v.name for v in graph.output}
    inside = {name for node in graph.node for name in names_read(node)} - top
    return [t.name for t in graph.initializer if t.name in inside]


def carry_into_loops(graph: Any) -> list[str]:
    """Initializers a Loop body reads from the outer scope (a DLRM ranker's EmbeddingBag gathering rows of a table,
    a weight a MatMul outside reads too) become loop-carried values the body passes through unchanged: explicit
    inputs of the Loop, so ONNX Runtime's EPContext writer keeps them. Read from the outer scope, the writer drops
    them (with the nodes it compiled that read them too, or because only a body reads them: "input 'W' ... is not
    output of any previous nodes"); moved into the body, it writes those over 127 bytes as in-memory references it
    then cannot load. The names carried."""
    from onnx import helper

    outer = {t.name: t for t in graph.initializer}
    taken = {name for g in graphs_within(graph) for n in g.node for name in [*n.input, *n.output]} | set(outer)
    carried = []
    for index, node in enumerate(graph.node):
        if node.op_type != "Loop" or node.domain not in ("", "ai.onnx"):
            continue
        body = next(a.g for a in node.attribute if a.name == "body")
        inner = graphs_within(body)
        defined = {name for g in inner for name in [*(v.name for v in g.input), *(t.name for t in g.initializer),
                                                     *(o for n in g.node for o in n.output)]}
        reads = {name for g in inner for n in g.node for name in n.input}
        names = [name for name in outer if name in reads and name not in defined]
        if not names:
            continue
        state = len(node.input) - 2  # loop-carried values: before the scan outputs, in the body and the node
        body_outputs, node_outputs = list(body.output), list(node.output)
        for name in names:
            tensor = outer[name]
            inside, passed, last = (_fresh(f"{name}__carried", taken), _fresh(f"{name}__carried_out", taken),
                                    _fresh(f"{name}__loop{index}_last", taken))
            for g in inner:
                for n in g.node:
                    for position, read in enumerate(n.input):
                        if read == name:
                            n.input[position] = inside
            body.input.append(helper.make_tensor_value_info(inside, tensor.data_type, list(tensor.dims)))
            body_outputs.insert(1 + state, helper.make_tensor_value_info(passed, tensor.data_type, list(tensor.dims)))
            body.node.append(helper.make_node("Identity", [inside], [passed]))
            node.input.append(name)
            node_outputs.insert(state, last)
            state += 1
        del body.output[:]
        body.output.extend(body_outputs)
        del node.output[:]
        node.output.extend(node_outputs)
        carried.extend(names)
    return carried


def _fresh(name: str, taken: set[str]) -> str:
    """`name`, or `name_2`, `name_3`... where the model already has it; the one returned is taken."""
    found, count = name, 1
    while found in taken:
        count += 1
        found = f"{name}_{count}"
    taken.add(found)
    return found


def read_in_bodies(graph: Any) -> list[str]:
    """The graph's initializers that its nodes' subgraphs read, wherever else they are read."""
    inside = {name for node in graph.node for sub in subgraphs(node) for inner in graphs_within(sub)
              for n in inner.node for name in n.input}
    return [t.name for t in graph.initializer if t.name in inside]


def into_bodies(graph: Any) -> list[str]:
    """Initializers read inside a node's subgraphs get to them in a way ONNX Runtime's EPContext writer keeps: a
    Loop's as loop-carried values (`carry_into_loops`); those read only inside an If or Scan move into each subgraph
    that reads them (the writer does not carry outer-scope initializers into the model it writes: an invalid model,
    "input 'offsets_7' ... is not output of any previous nodes"; it keeps only those of at most 127 bytes inside).
    The names carried or moved."""
    carried = carry_into_loops(graph)
    outer = {t.name: t for t in graph.initializer}
    moving = read_only_inside(graph)
    if not moving:
        return carried
    for node in graph.node:
        for sub in subgraphs(node):
            reads = {name for inner in graphs_within(sub) for n in inner.node for name in n.input}
            sub.initializer.extend(outer[name] for name in moving if name in reads)
    kept = [t for t in graph.initializer if t.name not in moving]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    listed = [v for v in graph.input if v.name not in moving]  # old IRs list weights as inputs too
    del graph.input[:]
    graph.input.extend(listed)
    return carried + moving


def fold_constants(model: Any) -> int:
    """Replace the foldable nodes (`foldable_nodes`) by initializers of their values; the number replaced."""
    import numpy as np
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    graph = model.graph
    nodes = foldable_nodes(graph)
    if not nodes:
        return 0
    folded = {id(node) for node in nodes}
    outputs = {name for node in nodes for name in node.output}
    used_after = {name for node in graph.node if id(node) not in folded for name in names_read(node)}
    used_after |= {value.name for value in graph.output}
    wanted = [name for name in dict.fromkeys(n for node in nodes for n in node.output) if name in used_after]
    shapes = {v.name: v for v in [*graph.value_info, *graph.input, *graph.output]}
    evaluated, inputs = [], set()
    for node in nodes:
        if node.op_type == "Shape" and not all(name in outputs or name in initializer_names(graph)
                                               for name in node.input):
            value = np.array(dims(shapes[node.input[0]]), dtype=np.int64)
            start = next((a.i for a in node.attribute if a.name == "start"), 0)
            end = next((a.i for a in node.attribute if a.name == "end"), None)
            evaluated.append(helper.make_node("Constant", [], [node.output[0]],
                                              value=numpy_helper.from_array(value[start:end])))
        else:
            evaluated.append(node)
            inputs.update(node.input)
    weights = [_with_values(t) for t in graph.initializer if t.name in inputs]
    sub = helper.make_graph(evaluated, "constants", [], [helper.make_empty_tensor_value_info(n) for n in wanted],
                            weights)
    sub_model = helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(sub_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        values = dict(zip(wanted, session.run(wanted, {}), strict=True))
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's refusal, said with the node and the way around it
        raise ModelError(_fold_failure(str(exc), nodes)) from None
    kept = [node for node in graph.node if id(node) not in folded]
    del graph.node[:]
    graph.node.extend(kept)
    still_used = {name for node in graph.node for name in names_read(node)} | {v.name for v in graph.output}
    dropped = {t.name for t in graph.initializer if t.name not in still_used}
    remaining = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(remaining)
    graph.initializer.extend(numpy_helper.from_array(np.asarray(value), name) for name, value in values.items())
    listed = [v for v in graph.input if v.name not in dropped]  # old IRs list weights as inputs too
    del graph.input[:]
    graph.input.extend(listed)
    return len(nodes)
