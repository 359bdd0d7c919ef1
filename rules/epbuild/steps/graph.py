"""What a model's graph says, as real exporters write it: its true inputs, its dimensions, the files it
references, where its nodes were placed, and what its integer inputs index. Read in child processes only.

Real exports differ from the tidy models tests start with: IR < 4 exporters list every weight in `graph.input`
(optional overrides, not runtime inputs), Paddle2ONNX stores dynamic dimensions as `dim_value: -1`, partial
offload leaves several EPContext nodes of which only the main one names the context binary, and weights can be
computed at run time by constant subgraphs.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import ModelError

EP_CONTEXT = "EPContext"
# Nodes an index travels through unchanged on its way to a Gather (token ids, positions).
INDEX_PASSTHROUGH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand"}
INDEX_CONSUMERS = {"Gather": 1, "GatherElements": 1}  # op type -> input position of the indices
# sequences and optionals are no tensors: an initializer cannot hold them (SequenceEmpty folded became float64)
NOT_TENSORS = ("SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SequenceAt",
               "SequenceLength", "SequenceMap", "SplitToSequence", "ConcatFromSequence", "Optional",
               "OptionalGetElement", "OptionalHasElement")


def attributes(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def initializer_names(graph: Any) -> set[str]:
    return {t.name for t in graph.initializer}


def true_inputs(graph: Any) -> list[Any]:
    """`graph.input` without the initializers that IR < 4 exporters also list there."""
    weights = initializer_names(graph)
    return [value for value in graph.input if value.name not in weights]


# dim_param values exporters write for "unknown", each one its own dimension: Paddle's "?" (several in one input),
# -1 or None as text, onnx shape inference's unk__N; never a name that ties dimensions together
PLACEHOLDER = re.compile(r"^(|\?|-1|none|null|unk__\d+)$", re.IGNORECASE)


def dim_name(dim: Any) -> str | None:
    """A symbolic dimension's name, None when it has none (unnamed, -1 or a placeholder)."""
    return None if PLACEHOLDER.match(dim.dim_param) else dim.dim_param


def dims(value: Any) -> list[int | str | None]:
    """A value's dimensions: an int when static, the dim_param name when named, None when unnamed, -1 or a
    placeholder."""
    found: list[int | str | None] = []
    for dim in value.type.tensor_type.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            found.append(dim.dim_value)
        else:
            found.append(dim_name(dim))
    return found


def refuse_zero_size(value: Any) -> None:
    """A true input the model declares with a zero-size dimension holds no values: no EP compiles it, and calling
    the 0 a symbolic dimension (as `dims` reads it) would send the user to the manifest."""
    shape = [d.dim_value if d.HasField("dim_value") else "?" for d in value.type.tensor_type.shape.dim]
    if any(d.HasField("dim_value") and d.dim_value == 0 for d in value.type.tensor_type.shape.dim):
        raise ModelError(f"input '{value.name}' is declared {shape} in the model: a zero-size dimension, an empty "
                         "tensor, which an EP cannot compile; export the model with the size it runs at",
                         in_model=True)


def clear_placeholder_dims(graph: Any) -> None:
    """Placeholder dim_params (`dim_name`) become unknown dimensions, in the graph and its subgraphs: fixing one
    by name would fix every other dimension that shares the placeholder."""
    for each in graphs_within(graph):
        for value in [*each.input, *each.output, *each.value_info]:
            for dim in value.type.tensor_type.shape.dim:
                if dim.HasField("dim_param") and dim_name(dim) is None:
                    dim.Clear()


def check_input_names(graph: Any, names: list[str], key: str) -> None:
    """Every name is a true input; an initializer listed as an input gets its own explanation. `key` is the
    manifest table the names come from (`inputs`, `freeze`: the error names `inputs.<name>`) or a file."""
    weights = initializer_names(graph)
    valid = [v.name for v in true_inputs(graph)]
    for name in names:
        table = key in ("inputs", "freeze")
        where = {"key": f"{key}.{name}"} if table else {"key": None}
        prefix = "" if table else f"{key}: "
        if name in weights:
            raise ModelError(f"{prefix}'{name}' is a weight (an initializer that an old exporter also lists in "
                             f"graph.input), not a runtime input; the model's inputs: {', '.join(valid)}", **where)
        if name not in valid:
            raise ModelError(f"{prefix}the model has no input '{name}'; its inputs: {', '.join(valid)}", **where)


def static_dims(model: Any, inputs: dict[str, list[int]], needs_static: bool) -> dict[str, int]:
    """Map `inputs` onto the model's named symbolic dimensions, for free-dimension overrides.

    Dimensions stored as -1 or unnamed cannot be overridden by name: targets that need static shapes get them
    fixed in the file by the `shape` stage before the compile, so here they only fail when still present and the
    EP needs static shapes. Raises ModelError about the key `inputs.<name>`.
    """
    check_input_names(model.graph, list(inputs), "inputs")
    overrides: dict[str, int] = {}
    for value in true_inputs(model.graph):
        name, found = value.name, dims(value)
        wanted = inputs.get(name)
        if wanted is not None and len(wanted) != len(found):
            raise ModelError(f"the model's input has rank {len(found)}, the manifest gives {len(wanted)} "
                             f"dimensions {wanted}", f"inputs.{name}")
        for index, dim in enumerate(found):
            if isinstance(dim, int):
                if wanted is not None and wanted[index] != dim:
                    raise ModelError(f"dimension {index} is fixed to {dim} in the model, the manifest gives "
                                     f"{wanted[index]}", f"inputs.{name}")
                continue
            if wanted is None:
                if needs_static:
                    refuse_zero_size(value)
                    raise ModelError(f"input '{name}' has symbolic dimension {index} ('{dim or '-1'}'); this EP "
                                     f"needs static shapes: set inputs.{name} in the model's manifest entry",
                                     f"inputs.{name}")
                continue
            if dim is None:
                if needs_static:
                    raise ModelError(f"dimension {index} is stored as -1 or unnamed and was not fixed in the file",
                                     f"inputs.{name}")
                continue
            previous = overrides.setdefault(dim, wanted[index])
            if previous != wanted[index]:
                raise ModelError(f"dimension '{dim}' is given both {previous} and {wanted[index]}", f"inputs.{name}")
    return overrides


def subgraphs(node: Any) -> list[Any]:
    """A node's own subgraphs (If branches, Loop and Scan bodies)."""
    return [graph for attribute in node.attribute
            for graph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)]


def graphs_within(graph: Any) -> list[Any]:
    """The graph and every subgraph (If, Loop, Scan bodies), at any depth."""
    return [graph, *(found for node in graph.node for sub in subgraphs(node) for found in graphs_within(sub))]


def names_read(node: Any) -> set[str]:
    """What a node reads: its inputs and every name read inside its subgraphs at any depth (an If branch or a Loop
    body reads outer-scope values, initializers included, without listing them as the node's inputs)."""
    return {*node.input, *(name for sub in subgraphs(node) for graph in graphs_within(sub)
                           for inner in graph.node for name in inner.input)}


def referenced_files(model: Any) -> dict[str, str]:
    """Every file the model needs beside it: external-data locations and context binaries -> who needs it."""
    import onnx

    needed: dict[str, str] = {}
    for graph in graphs_within(model.graph):
        tensors = [*graph.initializer, *(a.t for n in graph.node for a in n.attribute if a.HasField("t"))]
        for tensor in tensors:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                for entry in tensor.external_data:
                    if entry.key == "location":
                        needed.setdefault(entry.value, f"initializer {tensor.name}")
        for node in graph.node:
            if node.op_type == EP_CONTEXT:
                found = attributes(node)
                if found.get("embed_mode", 1) == 0 and found.get("ep_cache_context"):
                    needed.setdefault(found["ep_cache_context"].decode(), f"EPContext node {node.name}")
    return needed


def missing_files(path: Path, model: Any, folder: Path | None = None) -> list[str]:
    """The closed-file-set check: every referenced file lies inside the model's folder (or the `folder` its
    external data resolves in) and exists."""
    folder = (folder or path.parent).resolve()
    problems = []
    for name, user in sorted(referenced_files(model).items()):
        file = (folder / name).resolve()
        if folder != file.parent and folder not in file.parents:
            problems.append(f"{path.name}: {user} references {name}, outside the artifact folder")
        elif not file.is_file():
            problems.append(f"{path.name}: {user} references {name}, which is not in the artifact folder")
    return problems


def constant_tensors(graph: Any) -> set[str]:
    """Tensors computable without any input: initializers, Constant outputs, and outputs of nodes whose inputs
    are all constant (Shape of a static tensor included)."""
    known = initializer_names(graph) | {""}
    shapes = {v.name: v for v in [*graph.value_info, *graph.input]}
    for node in graph.node:  # nodes are topologically sorted in a valid model
        if node.op_type in (EP_CONTEXT, "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                            "Multinomial", "If", "Loop", "Scan"):
            continue
        if node.op_type == "Shape" and node.input[0] in shapes:
            if all(isinstance(d, int) for d in dims(shapes[node.input[0]])):
                known.update(node.output)
            continue
        if all(name in known for name in node.input) and node.domain in ("", "ai.onnx"):
            known.update(node.output)
    return known - {""}


def placement(source_nodes: int, model: Any, ep_name: str | None) -> dict[str, Any]:
    """Where the source model's nodes ended: in EPContext nodes of `ep_name`, or on CPU (with op types), and the
    constant subgraphs left on CPU that folding (optimize = "basic") would remove."""
    graph = model.graph
    contexts = [n for n in graph.node if n.op_type == EP_CONTEXT]
    cpu = [n for n in graph.node if n.op_type != EP_CONTEXT]
    nodes: dict[str, Any] = {"source": source_nodes, "ep_context": len(contexts), "cpu": len(cpu),
                             "cpu_op_types": dict(sorted(Counter(n.op_type for n in cpu).items()))}
    nested = sum(len(sub.node) for n in cpu for each in subgraphs(n) for sub in graphs_within(each))
    if nested:  # the branches of a CPU `If` (a Loop's body) run on CPU too: a session counts them, so does this
        nodes["cpu_in_subgraphs"] = nested
    if ep_name:
        in_ep = max(source_nodes - len(cpu), 0)
        nodes.update({"in_ep": in_ep, "offload": round(in_ep / source_nodes, 4) if source_nodes else 1.0,
                      "by_ep": {ep_name: in_ep, "CPUExecutionProvider": len(cpu)}})
        constant = constant_tensors(graph)
        foldable = [n for n in cpu if n.output and all(o in constant for o in n.output)
                    and n.op_type not in NOT_TENSORS]
        if foldable:
            nodes["foldable_on_cpu"] = dict(sorted(Counter(n.op_type for n in foldable).items()))
    return nodes


def check_ep_contexts(model: Any, ep_name: str, folder: Path) -> tuple[str | None, list[str]]:
    """Every EPContext node comes from `ep_name`; main nodes (main_context = 1, or no such attribute) that keep
    their context outside the model name a binary that exists. Nodes with main_context = 0 (partial offload)
    refer to the main node's binary by partition name and carry no file name. Returns (SDK version, binaries)."""
    contexts = [n for n in model.graph.node if n.op_type == EP_CONTEXT]
    if not contexts:
        raise ModelError(f"the output holds no EPContext node from {ep_name}: the EP compiled nothing")
    sdk, binaries = None, []
    for node in contexts:
        found = attributes(node)
        source = found.get("source", b"").decode()
        if source != ep_name:
            raise ModelError(f"the output holds an EPContext node from '{source}', not {ep_name}")
        sdk = (found.get("ep_sdk_version") or b"").decode() or sdk
        if found.get("main_context", 1) == 0 or found.get("embed_mode", 1) == 1:
            continue
        name = (found.get("ep_cache_context") or b"").decode()
        if not name:
            raise ModelError(f"EPContext node {node.name} keeps its context outside the model but names no file")
        if not (folder / name).is_file():
            raise ModelError(f"EPContext node {node.name} references {name}, which was not written")
        if name not in binaries:
            binaries.append(name)
    return sdk, binaries


def consumers(graph: Any) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def index_bound(graph: Any, input_name: str, shapes: dict[str, list[int | str | None]]) -> int | None:
    """For an integer input used as an index (token ids, positions, type ids): the size of the dimension it
    indexes, so generated values stay inside it; None when no Gather consumes it."""
    readers = consumers(graph)
    bounds = []
    frontier, seen = [input_name], set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in readers.get(name, []):
            if node.op_type in INDEX_PASSTHROUGH and node.input[0] == name:
                frontier.extend(node.output)
            elif INDEX_CONSUMERS.get(node.op_type) == list(node.input).index(name):
                axis = attributes(node).get("axis", 0)
                data = shapes.get(node.input[0])
                if data and -len(data) <= axis < len(data) and isinstance(data[axis], int):
                    bounds.append(data[axis])
    return min(bounds) if bounds else None


def known_shapes(model: Any) -> dict[str, list[int | str | None]]:
    """Shapes of initializers and of every tensor ONNX shape inference can reach (no external data loaded)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - inference is a best effort here: without it, bounds stay unknown
        inferred = model
    shapes: dict[str, list[int | str | None]] = {t.name: list(t.dims) for t in model.graph.initializer}
    for value in [*inferred.graph.value_info, *inferred.graph.input]:
        shapes.setdefault(value.name, dims(value))
    return shapes
