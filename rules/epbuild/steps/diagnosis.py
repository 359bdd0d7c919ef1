"""What would fix a failure, where the model shows a known cause: graph patterns an NPU compiler is known to
reject, `If` nodes that branch on a graph input, fp16 accuracy just below a threshold. Read from the model's graph
without its weights, only after something failed, and said in the failure's one line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..contracts.jobs import ValidationMember
from .folding import read_in_bodies, read_only_inside
from .graph import consumers, true_inputs
from .validation.comparison import DEFAULT_THRESHOLDS

QNN = "QNNExecutionProvider"
FP16_MARGIN_DB = 12.0  # an fp16 SNR this close below the threshold reads as the HTP's fp16, not a broken graph


def _producers(graph: Any) -> dict[str, Any]:
    return {name: node for node in graph.node for name in node.output}


def _constant_value(graph: Any, name: str) -> float | None:
    """The single value of a small constant (an initializer stored in the model or a Constant node), else None."""
    from onnx import numpy_helper

    tensors = [t for t in graph.initializer if t.name == name and not t.external_data]
    tensors += [a.t for n in graph.node if n.op_type == "Constant" and name in n.output for a in n.attribute
                if a.name == "value"]
    if not tensors:
        return None
    value = numpy_helper.to_array(tensors[0])
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def rsqrt_rmsnorms(graph: Any) -> list[tuple[Any, Any, Any]]:
    """RMSNorm written as `x * rsqrt(mean(x^2) + eps)`: (Sqrt, its inverse (Reciprocal or Div(1, .)), the Mul
    by it) for each place. QNN HTP fails to finalize such graphs (QNN_COMMON_ERROR_MEM_ALLOC) where
    `x / sqrt(mean(x^2) + eps)` compiles."""
    producers, readers = _producers(graph), consumers(graph)
    found = []
    for sqrt in (n for n in graph.node if n.op_type == "Sqrt"):
        add = producers.get(sqrt.input[0])
        if add is None or add.op_type != "Add" or not any(
                producers.get(name) is not None and producers[name].op_type == "ReduceMean" for name in add.input):
            continue
        for inverse in readers.get(sqrt.output[0], []):
            reciprocal = inverse.op_type == "Reciprocal" or (
                inverse.op_type == "Div" and list(inverse.input)[1:] == [sqrt.output[0]]
                and _constant_value(graph, inverse.input[0]) == 1.0)
            if reciprocal:
                found += [(sqrt, inverse, mul) for mul in readers.get(inverse.output[0], []) if mul.op_type == "Mul"]
    return found


def rewrite_rmsnorm(graph: Any) -> int:
    """Each `x * rsqrt(v)` of an RMSNorm becomes `x / sqrt(v)` (the same value; the form QNN HTP compiles); an
    inverse no other node reads is removed. The number of places rewritten."""
    from onnx import helper

    places = rsqrt_rmsnorms(graph)
    replaced = {}
    for sqrt, inverse, mul in places:
        other = next(name for name in mul.input if name != inverse.output[0]) if len(set(mul.input)) == 2 else None
        if other is not None:
            replaced[id(mul)] = helper.make_node("Div", [other, sqrt.output[0]], list(mul.output), name=mul.name)
    nodes = [replaced.get(id(node), node) for node in graph.node]
    read = {name for node in nodes for name in node.input} | {value.name for value in graph.output}
    unused = {id(inverse) for _, inverse, _ in places if inverse.output[0] not in read}
    kept = [node for node in nodes if id(node) not in unused]
    del graph.node[:]
    graph.node.extend(kept)
    return len(replaced)


REWRITES = {"rmsnorm": rewrite_rmsnorm}  # the model key `rewrite`'s values (epbuild.manifest.schema.REWRITES)
PATTERNS = {"rmsnorm": "x * rsqrt(mean(x^2) + eps), the rsqrt as Reciprocal(Sqrt) or Div(1, Sqrt)"}


def strided_gathers(graph: Any) -> list[Any]:
    """The torch dynamo exporter's `as_strided`: a Conv's output reshaped flat, gathered by index and transposed;
    QNN HTP's compile aborts on it (an assertion in its op builder). The Gather nodes."""
    producers, readers = _producers(graph), consumers(graph)
    found = []
    for gather in (n for n in graph.node if n.op_type == "Gather"):
        reshape = producers.get(gather.input[0])
        if reshape is None or reshape.op_type != "Reshape":
            continue
        source = producers.get(reshape.input[0])
        if source is not None and source.op_type == "Conv" and any(
                c.op_type == "Transpose" for c in readers.get(gather.output[0], [])):
            found.append(gather)
    return found


def input_branches(graph: Any) -> dict[str, list[str]]:
    """If nodes whose condition is computed from graph inputs: node name -> those inputs. A configuration input
    (a sample rate, a mode flag) frozen at build time selects the branch, and the If disappears."""
    producers = _producers(graph)
    inputs = {value.name for value in true_inputs(graph)}

    def reaches(name: str) -> list[str]:
        fed_by, seen, pending = set(), set(), [name]
        while pending:
            tensor = pending.pop()
            if tensor in inputs:
                fed_by.add(tensor)
            elif tensor not in seen and tensor in producers:
                seen.add(tensor)
                pending.extend(i for i in producers[tensor].input if i)
        return sorted(fed_by)

    found = {}
    for node in graph.node:
        if node.op_type == "If":
            fed_by = reaches(node.input[0])
            if fed_by:
                found[node.name or node.output[0]] = fed_by
    return found


def _places(nodes: list[Any]) -> str:
    names = [node.name or node.output[0] for node in nodes]
    return f"{len(names)} place(s), e.g. '{names[0]}'"


def compile_hints(model_path: Path, ep_name: str, entry: str, frozen: bool, message: str) -> list[str]:
    """What would fix a failed compile of `model_path` for `ep_name`, from the causes its graph shows and the
    failure's `message`."""
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # noqa: BLE001 - a model that cannot be read has its own failure; no hint
        return []
    old = _old_opset(model, ep_name, entry)
    if ep_name != QNN:
        return [old] if old else []
    graph = model.graph
    hints = [old] if old else []
    rmsnorms = rsqrt_rmsnorms(graph)
    if rmsnorms:
        hints.append(f"the model writes RMSNorm as x * rsqrt(mean(x^2) + eps) ({_places([m for _, _, m in rmsnorms])}"
                     f"), which QNN HTP is known to fail to finalize: add rewrite = [\"rmsnorm\"] to {entry} (the "
                     "same value as x / sqrt(...), which compiles)")
    strided = strided_gathers(graph)
    if strided:
        hints.append(f"the model has the torch dynamo exporter's as_strided pattern (Conv -> Reshape -> Gather -> "
                     f"Transpose, {_places(strided)}), on which QNN HTP's compile aborts: export with "
                     "torch.onnx.export(..., dynamo=False) or write the as_strided as view/unfold in the model")
    writer_fault = "This is an invalid model" in message or "in-memory address marker" in message
    top = {name for node in graph.node for name in node.input}
    shared = [name for name in read_in_bodies(graph) if name in top] if writer_fault else []
    if shared and _checks(model):
        hints.append(f"{WRITER_FAULT} (onnx.checker accepts the model it "
                     f"compiled from): a Loop/If/Scan body reads the outer-scope initializer(s) "
                     f"{', '.join(repr(n) for n in shared[:4])}, which nodes outside it that {ep_name} compiled read "
                     f"too, and the writer drops them with those nodes; the default fold stage passes a Loop's "
                     f"outer-scope weights in as loop-carried values, which the writer keeps (remove optimize from "
                     f"{entry}); an If's: build this model for a CPU or OpenVINO target")
    outer = read_only_inside(graph) if "This is an invalid model" in message else []
    if outer and _checks(model):
        hints.append(f"ONNX Runtime's EPContext writer wrote an invalid model (onnx.checker accepts the model it "
                     f"compiled from): a Loop/If/Scan body reads outer-scope initializers "
                     f"({', '.join(repr(n) for n in outer[:4])}), which the writer does not carry into the EPContext "
                     f"model; the default fold stage passes them to a Loop as loop-carried values, and moves them into "
                     f"the If or Scan bodies that read them (remove optimize from {entry})")
    loops = sorted({node.op_type for node in graph.node if node.op_type in ("Loop", "Scan")})
    took_none = "took none of the model's nodes" in message or "Unable to compile any nodes" in message
    if "nodes that cannot be fused together" in message:
        hints.append(f"QNN put nodes from both sides of a node it does not take ({', '.join(loops) or 'one on CPU'}) "
                     "into one partition, which ONNX Runtime refuses (a fault of the QNN EP, not of the model): "
                     "split the model at that node, or build it for a CPU or OpenVINO target")
    elif took_none and loops and not old:
        hints.append(f"QNN HTP does not compile {' or '.join(loops)}: export the loop unrolled (a fixed trip count) "
                     "or build this model for a CPU or OpenVINO target")
    branches = input_branches(graph)
    if branches and not frozen:
        node, fed_by = next(iter(branches.items()))
        values = ", ".join(f"{name} = ..." for name in fed_by)
        hints.append(f"If node '{node}' branches on graph input {', '.join(repr(n) for n in fed_by)}: where QNN HTP "
                     f"refuses the If and that is a configuration input, freeze it (freeze = {{ {values} }} in "
                     f"{entry}) so the build picks the branch")
    return hints


OLD_OPSET = "the model is at ai.onnx opset "  # how `_old_opset`'s hint begins
WRITER_FAULT = "ONNX Runtime's EPContext writer produced an invalid graph"  # the hint that replaces ORT's words


def _old_opset(model: Any, ep_name: str, entry: str) -> str | None:
    """The model's ai.onnx opset, when it is below what the EP takes (`EpInfo.min_opset`) or below ONNX Runtime's
    own kernels (7), as a hint; else None."""
    from ..manifest.eps import BY_NAME
    from .validation.reference import ORT_MIN_OPSET

    opset = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), None)
    info = BY_NAME.get(ep_name)
    lowest = info.min_opset if info and info.min_opset else None
    if opset is not None and lowest and opset < lowest:
        return (f"{OLD_OPSET}{opset}, below {lowest}, the lowest {ep_name} takes (ONNX Runtime's "
                f"layout transformer refuses older models, so every node stays on CPU): let the upgrade stage "
                f"convert it (remove upgrade = false from {entry})")
    if opset is not None and opset < ORT_MIN_OPSET:
        return (f"{OLD_OPSET}{opset}, below {ORT_MIN_OPSET}, the oldest ONNX Runtime guarantees: "
                f"export it again at opset {ORT_MIN_OPSET} or later")
    return None


def fp16_hint(metrics: dict[str, dict[str, Any]], thresholds: dict[str, float], target: str, entry: str) -> str | None:
    """An fp16 artifact whose worst SNR is just below `min_snr_db`: say it is the HTP's fp16 and what the options
    are, with the number that would pass."""
    limit = thresholds.get("min_snr_db")
    snrs = [m["snr_db"] for m in metrics.values() if "snr_db" in m and not m.get("near_constant")]
    if limit is None or not snrs or not limit - FP16_MARGIN_DB <= min(snrs) < limit:
        return None
    suggested = int(min(snrs)) - 1
    return (f"this fp32 model runs in fp16 on the HTP (about 3 decimal digits), which accounts for an SNR of "
            f"{min(snrs):.1f} dB: if that is accurate enough, relax this target only (validation.targets = "
            f"{{ {target} = {{ min_snr_db = {suggested} }} }} in {entry}), or build a quantized target")


LOCALISE_BELOW_DB = 20.0  # this far below what the precision explains, a failure is a broken op: say how to find it
BF16_BAND_DB = (30.0, 55.0)  # the SNR bf16 arithmetic gives against an fp32 reference


def failure_hints(metrics: dict[str, dict[str, Any]], thresholds: dict[str, float], request: ValidationMember,
                  kind: str) -> list[str]:
    """Where a missed threshold points: an OpenVINO fp32 artifact missing by what bf16 explains (the CPU plugin
    runs bf16 where the CPU has it, unless load_config says f32); a result far below what its precision explains
    with localise off (the setting that finds the first node departing)."""
    limit = thresholds.get("min_snr_db")
    snrs = [m["snr_db"] for m in metrics.values() if "snr_db" in m and not m.get("near_constant")]
    if limit is None or not snrs or min(snrs) >= limit:
        return []
    worst, hints = min(snrs), []
    if request.ep == "openvino" and kind == "fp32" and not says_f32(request.options.get("load_config")) \
            and BF16_BAND_DB[0] <= worst < BF16_BAND_DB[1]:
        hints.append(f"an SNR of {worst:.1f} dB is what bf16 gives: OpenVINO's CPU plugin runs bf16 where the CPU "
                     "has it; give options.load_config a JSON file {\"CPU\": {\"INFERENCE_PRECISION_HINT\": "
                     "\"f32\"}} with option_files = [\"load_config\"]")
    elif not request.localise and worst < DEFAULT_THRESHOLDS.get(kind, {}).get("min_snr_db", 0) - LOCALISE_BELOW_DB:
        hints.append(f"{worst:.1f} dB is far below what {kind} explains: set validation.localise = true (in "
                     f"{request.entry}) to find the first node where {request.ep} departs from CPU")
    return hints


SIXTEEN_BIT = {4: "uint16", 5: "int16"}  # TensorProto data types


def sixteen_bit_qdq(model: Any) -> dict[str, int]:
    """QuantizeLinear/DequantizeLinear nodes with a 16-bit zero point, counted by 'domain type'."""
    types = {t.name: t.data_type for t in model.graph.initializer}
    found: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2:
            kind = SIXTEEN_BIT.get(types.get(node.input[2], 0))
            if kind:
                key = f"{node.domain or 'ai.onnx'} {kind}"
                found[key] = found.get(key, 0) + 1
    return found


def openvino_16bit_line(found: dict[str, int], plain_snr: float | None, plain_error: str | None) -> str:
    """One line for OpenVINO on 16-bit Q/DQ, the evidence being OpenVINO's own plain session of the same model."""
    nodes = ", ".join(f"{count} {key}" for key, count in found.items())
    seen = (f"a plain OpenVINO session of the quantized model is as far from CPU (SNR {plain_snr:.1f} dB)"
            if plain_error is None else f"a plain OpenVINO session of the quantized model fails too ({plain_error})")
    return (f"OpenVINO computes 16-bit Q/DQ wrongly ({nodes} QuantizeLinear/DequantizeLinear): {seen}, so neither "
            "the compile nor the model is at fault, and localise cannot look inside it; quantize OpenVINO targets "
            "with activation_type = \"uint8\" (or build the float model for them)")


OPENVINO_UNCONVERTED = re.compile(r"Failed operations detailed log:(?P<log>.*?)(Summary:|$)", re.S)


def plain_ep_error(message: str) -> str:
    """An EP's failure in one line a user can act on: OpenVINO's unconverted-ops report (hundreds of characters of
    frontend checks) becomes the ops it could not convert, each with its reason."""
    found = OPENVINO_UNCONVERTED.search(message)
    if not found:
        return message
    head = message[:message.find("[ONNXRuntimeError]")] if "[ONNXRuntimeError]" in message else ""
    ops = []
    for entry in found.group("log").split(" -- "):
        op, _, detail = entry.strip(" -").partition(" with a message: ")
        if op:
            reason = detail.rsplit("': ", 1)[-1].strip() if detail else ""
            ops.append(f"{op} ({reason})" if reason else op)
    if not ops:
        return message
    return (f"{head}OpenVINO cannot convert {len(ops)} op type(s): {'; '.join(ops)}; build this model for a target "
            "whose EP has these ops, or export it without them")


def _checks(model: Any) -> bool:
    """Whether onnx.checker accepts the model (its graph; weights stay where they are)."""
    import onnx

    try:
        onnx.checker.check_model(model)
    except Exception:  # noqa: BLE001 - any refusal means: no claim that the model is valid
        return False
    return True


def says_f32(config: str | None) -> bool:
    """Whether an OpenVINO `load_config` (a file, or JSON inline) asks for f32."""
    return config is not None and "f32" in _text(config)


def _text(value: str) -> str:
    """An option's value, or the text of the file it names."""
    try:
        return Path(value).read_text(errors="replace") if not value.lstrip().startswith("{") else value
    except OSError:
        return value
