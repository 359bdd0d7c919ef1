"""Where an artifact's result departs from the CPU reference (`validation.localise = true`, on a failed
validation): the model the artifact was compiled from is run on the target's EP and on CPU with chosen intermediate
tensors as extra graph outputs, fed the validation's inputs, and compared tensor by tensor in topological order.
The first tensor below the validation's thresholds narrows the search: the next round checks every tensor between
the last one that held and it, so a few compiles find the node. Runs in the validating child, within a time budget.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ...files.weights import load_with_weights
from ..graph import constant_tensors
from .comparison import compare

CHECKPOINTS = 48  # tensors made graph outputs per round: one EP compile each round
ROUNDS = 3
NUMERIC = (1, 10, 11)  # float, float16, double: the tensors whose error is measured


def _candidates(model: Any) -> list[tuple[str, Any]]:
    """(tensor, node that computes it) for every float tensor a node computes from the inputs, in topological
    order; the graph's own outputs excluded (the validation compared those), and constants too: an EP folds them
    away, and made a graph output one becomes a tensor of another rank it cannot compile (a Resize's scales)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.input]}
    outputs = {v.name for v in model.graph.output} | constant_tensors(model.graph)
    return [(name, node) for node in model.graph.node for name in node.output
            if name and name not in outputs and types.get(name) in NUMERIC]


def _run_with_outputs(ort: Any, model: Any, names: list[str], make_options: Any, providers: Any,
                      feeds: dict[str, Any]) -> dict[str, Any]:
    """The values of `names` from one session of `model` with them added as graph outputs."""
    import onnx
    from onnx import helper

    extended = onnx.ModelProto()
    extended.CopyFrom(model)
    extended.graph.output.extend(helper.make_empty_tensor_value_info(name) for name in names)
    session = ort.InferenceSession(extended.SerializeToString(), make_options(), providers=providers)
    wanted = [o.name for o in session.get_outputs() if o.name in set(names)]
    chosen = {i.name: feeds[i.name] for i in session.get_inputs() if i.name in feeds}
    return dict(zip(wanted, session.run(wanted, chosen), strict=True))


def _spread(items: list[Any], count: int) -> list[Any]:
    if len(items) <= count:
        return items
    step = len(items) / count
    return [items[int(i * step)] for i in range(count - 1)] + [items[-1]]


def _held(metrics: dict[str, Any], thresholds: dict[str, float]) -> bool:
    if metrics.get("near_constant") or not metrics["shape_match"]:
        return True  # a constant-like tensor says nothing; a shape the EP changed is not a numeric divergence
    return (metrics["snr_db"] >= thresholds.get("min_snr_db", 0.0)
            and metrics["cosine"] >= thresholds.get("min_cosine", 0.0))


def localise(ort: Any, model_path: str, feeds: dict[str, Any], thresholds: dict[str, float], ep_options: Any,
             cpu_options: Any, budget_s: float, weights: Path | None = None) -> dict[str, Any]:
    """The first tensor whose EP value misses `thresholds` against CPU, with its node, op type and metrics, and
    the inputs' metrics; or that every tensor checked held. `ep_options()`/`cpu_options()` make session options;
    `weights`: the folder the model's external data resolves in, when not its own."""
    started = time.monotonic()
    model = load_with_weights(model_path, weights)
    candidates = _candidates(model)
    window, last_good, first_bad, checked, rounds = candidates, None, None, 0, 0
    measured: dict[str, dict[str, Any]] = {}
    while window and rounds < ROUNDS and time.monotonic() - started < budget_s:
        rounds += 1
        chosen = _spread(window, CHECKPOINTS)
        names = [name for name, _ in chosen]
        on_ep = _run_with_outputs(ort, model, names, ep_options, None, feeds)
        on_cpu = _run_with_outputs(ort, model, names, cpu_options, ["CPUExecutionProvider"], feeds)
        checked += len(names)
        bad = None
        for name, node in chosen:
            if name not in on_ep or name not in on_cpu:
                continue
            measured[name] = compare(on_ep[name], on_cpu[name])
            if _held(measured[name], thresholds):
                last_good = (name, node)
            else:
                bad = (name, node)
                break
        if bad is None:
            break
        first_bad = bad
        start = candidates.index(last_good) + 1 if last_good else 0
        end = candidates.index(bad)
        window = candidates[start:end] if len(chosen) < len(window) else []
        if not window:
            break
    seconds = round(time.monotonic() - started, 3)
    if first_bad is None:
        return {"found": False, "checked": checked, "rounds": rounds, "seconds": seconds}
    name, node = first_bad
    metrics = measured[name]
    inputs = {i: round(measured[i]["snr_db"], 1) for i in node.input if i in measured}
    return {"found": True, "tensor": name, "node": node.name or name, "op_type": node.op_type,
            "snr_db": round(metrics["snr_db"], 1), "cosine": metrics["cosine"],
            "max_abs_error": metrics["max_abs_error"], "inputs_snr_db": inputs,
            "last_good": last_good[0] if last_good else None, "checked": checked, "rounds": rounds,
            "seconds": seconds}


def summary(found: dict[str, Any]) -> str:
    """One clause for the failure line."""
    if not found["found"]:
        return (f"localise: the {found['checked']} intermediate tensors checked all hold; the outputs' own nodes "
                "depart")
    before = (f" (its inputs: {', '.join(f'{k} {v} dB' for k, v in found['inputs_snr_db'].items())})"
              if found["inputs_snr_db"] else f" (last tensor that held: {found['last_good']})"
              if found["last_good"] else " (the first tensor checked)")
    return (f"localise: first departs at node '{found['node']}' ({found['op_type']}), tensor '{found['tensor']}' "
            f"at SNR {found['snr_db']} dB{before}")
