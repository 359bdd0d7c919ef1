"""Comparing an artifact's outputs with the CPU reference's: the metrics of each output and the thresholds they are
held to. Runs in the validating child (NumPy arrays)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .selection import Selected, compare_indices, match_rows

DEFAULT_THRESHOLDS = {
    # fp32 artifacts match the CPU reference to rounding; fp16 keeps ~3 decimal digits; a QDQ artifact is
    # compared with its QDQ source, and the EP's integer kernels differ from CPU's by a few quantization steps.
    # A selection (TopK, ArgMax, NMS) keeps what scores near a tie decide: exact in fp32, mostly in fp16 and QDQ.
    "fp32": {"min_snr_db": 60.0, "min_cosine": 0.99999, "min_selection_overlap": 0.99},
    "fp16": {"min_snr_db": 40.0, "min_cosine": 0.9999, "min_selection_overlap": 0.9},
    "qdq": {"min_snr_db": 20.0, "min_cosine": 0.99, "min_selection_overlap": 0.8},
}
SNR_CAP_DB = 200.0  # identical outputs; JSON has no infinity


def compare(got: Any, want: Any) -> dict[str, Any]:
    """Metrics of one output against the reference (NumPy arrays). NaN, +Inf and -Inf are compared position by
    position (`nonfinite_mismatch`: where one side has one the other does not, or another one); the numeric
    metrics are over the positions where both are finite, and say how many they left out."""
    import numpy as np

    metrics: dict[str, Any] = {"shape": list(got.shape), "reference_shape": list(want.shape),
                               "dtype": str(got.dtype), "reference_dtype": str(want.dtype),
                               "nan_count": int(np.isnan(got).sum()) if got.dtype.kind == "f" else 0,
                               "inf_count": int(np.isinf(got).sum()) if got.dtype.kind == "f" else 0}
    metrics["shape_match"] = got.shape == want.shape
    metrics["dtype_match"] = got.dtype == want.dtype
    if not metrics["shape_match"]:
        return metrics
    y, r = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    finite = np.isfinite(y) & np.isfinite(r)
    if not finite.all():
        kinds: list[Callable[[Any], Any]] = [np.isnan, np.isposinf, np.isneginf]
        differ = np.zeros(y.shape, bool)
        for kind in kinds:
            differ |= kind(y) != kind(r)
        metrics["nonfinite_left_out"] = int((~finite).sum())  # positions the numeric metrics below leave out
        metrics["nonfinite_mismatch"] = int(differ.sum())
        if differ.any():
            first = int(np.flatnonzero(differ)[0])
            metrics["first_nonfinite_mismatch"] = {"at": [int(i) for i in np.unravel_index(first, got.shape)],
                                                   "value": _shown(y[first]), "reference": _shown(r[first])}
    y, r = y[finite], r[finite]
    error = np.abs(y - r)
    scale = max(float(np.abs(r).max()) if r.size else 0.0, 1e-12)
    noise, signal = float(np.sum((y - r) ** 2)), float(np.sum(r**2))
    norms = float(np.linalg.norm(y) * np.linalg.norm(r))
    # its spread against its own magnitude: an output of small values (a waveform of max 2e-4) is not constant
    if got.dtype.kind == "f" and r.size and float(np.std(r)) <= NEAR_CONSTANT * float(np.abs(r).max()):
        if r.size <= SMALL_OUTPUT:  # a loss, a VAD probability, a pooled score: constant by nature, not for lack
            # of realistic inputs; each value is judged by its own relative error (`check`)
            metrics["small_output"] = {"reference": [float(v) for v in r], "error": [float(e) for e in error]}
        else:
            metrics["near_constant"] = {"reference_std": float(np.std(r)),
                                        "reference_max_abs": float(np.abs(r).max())}
    metrics.update({
        "reference_max_abs": float(np.abs(r).max()) if r.size else 0.0,
        "max_abs_error": float(error.max()) if error.size else 0.0,
        "mean_abs_error": float(error.mean()) if error.size else 0.0,
        "max_rel_error": float((error / np.maximum(np.abs(r), 1e-3 * scale)).max()) if error.size else 0.0,
        "cosine": float(np.dot(y, r) / norms) if norms > 0 else float(np.array_equal(y, r)),
        "snr_db": SNR_CAP_DB if noise == 0 else min(SNR_CAP_DB, 10 * float(np.log10(max(signal, 1e-30) / noise))),
    })
    return metrics


def _shown(value: float) -> str:
    """A value for a message: nan, inf, -inf or the number."""
    value = float(value)
    return repr(value) if not math.isfinite(value) else f"{value:.6g}"


NEAR_CONSTANT = 1e-4  # a reference whose spread is below this share of its own magnitude: SNR and cosine judge
# nothing of what the model computes from its inputs
SMALL_OUTPUT = 16  # values: an output this small whose values do not spread (a scalar has no spread) is judged
# value by value (`check`), never "nearly constant"; with a spread, its SNR judges it as any other
# the smallest error each precision cannot avoid, beside the relative error its SNR threshold allows: what a value
# of 0 in the reference is judged by (fp16's smallest normal; a QDQ step of a unit-scale tensor)
PRECISION_FLOOR = {"fp32": 1e-6, "fp16": 6.1e-5, "qdq": 1e-2}
THRESHOLD_METRICS = {"max_abs_error": "max_abs_error", "mean_abs_error": "mean_abs_error",
                     "max_rel_error": "max_rel_error", "min_cosine": "cosine", "min_snr_db": "snr_db",
                     "min_selection_overlap": "selection_overlap"}
RELATIVE = ("min_snr_db", "min_cosine")


FP16_SMALLEST_NORMAL = 6.1e-5  # below it an fp16 artifact (QNN HTP float) cannot follow a value: flushed, or
# subnormal with a few bits (a detector's sigmoid driven to 1e-6 by noise comes back as 0)


def check(name: str, metrics: dict[str, Any], reference_nonfinite: int, thresholds: dict[str, float],
          precision: str = "fp32") -> tuple[list[str], list[str]]:
    """(failures, what could not be judged), each naming the output, the metric, its value and the threshold.

    A reference nearly constant for these inputs (`near_constant`) leaves SNR and cosine nothing to judge: an
    artifact that departs from it by more than the SNR margin at the output's own scale fails; one within it is
    undecided ("inconclusive": the inputs did not exercise what the output computes), unless identical."""
    chosen = metrics.get("selection", {})
    if not metrics["shape_match"] and not chosen.get("direct"):  # NMS chooses as many boxes as it keeps
        return [f"output '{name}': shape {metrics['shape']} != reference {metrics['reference_shape']}"], []
    failures, undecided = [], []
    if not metrics["dtype_match"]:
        failures.append(f"output '{name}': dtype {metrics['dtype']} != reference {metrics['reference_dtype']}")
    if metrics.get("nonfinite_mismatch"):
        first = metrics["first_nonfinite_mismatch"]
        failures.append(f"output '{name}': {metrics['nonfinite_mismatch']} position(s) differ from the reference in "
                        f"NaN or Inf (first at {first['at']}: the artifact has {first['value']}, the reference "
                        f"{first['reference']})")
    elif "nonfinite_mismatch" not in metrics and metrics["nan_count"] + metrics["inf_count"] > reference_nonfinite:
        failures.append(f"output '{name}': {metrics['nan_count']} NaN and {metrics['inf_count']} Inf values, "
                        f"the reference has {reference_nonfinite}")  # compared as rows (a selection): by count
    near_constant = metrics.get("near_constant")
    small = metrics.get("small_output")
    level = metrics.get("reference_max_abs", 0.0)
    unresolved = precision == "fp16" and 0 < level < FP16_SMALLEST_NORMAL and metrics.get("max_abs_error", 0) > 0
    for key, limit in sorted(thresholds.items()):
        metric = THRESHOLD_METRICS[key]
        if metric not in metrics or (chosen.get("direct") and metric != "selection_overlap"):
            continue  # indices are judged by which were chosen, not by their numeric distance
        value = metrics[metric]
        if (near_constant or unresolved or small) and key in RELATIVE:
            continue
        if (value < limit) if key.startswith("min_") else (value > limit):
            relation = "<" if key.startswith("min_") else ">"
            failures.append(f"output '{name}': {metric} {value:.6g} {relation} {key} {limit:g}")
    if small and set(thresholds) & set(RELATIVE):
        failures.extend(_small_failures(name, metrics, thresholds, precision))
    elif unresolved and set(thresholds) & set(RELATIVE):
        if not failures:
            undecided.append(f"output '{name}': its reference's values (at most {level:.3g}) lie below the smallest "
                             f"normal fp16 value ({FP16_SMALLEST_NORMAL:g}), which an fp16 artifact cannot follow: "
                             "SNR and cosine cannot judge it")
    elif near_constant and metrics["max_abs_error"] > 0 and set(thresholds) & set(RELATIVE):
        level = near_constant["reference_max_abs"]
        allowed = level * 10 ** (-thresholds.get("min_snr_db", DEFAULT_THRESHOLDS["fp32"]["min_snr_db"]) / 20)
        if level > 0 and metrics["max_abs_error"] > allowed:
            failures.append(f"output '{name}': max_abs_error {metrics['max_abs_error']:.6g} > {allowed:.6g}, the SNR "
                            f"margin at its own scale ({level:.6g}; its reference is nearly constant)")
        elif not failures:
            undecided.append(f"output '{name}' is nearly constant for these inputs (spread "
                             f"{near_constant['reference_std']:.3g} around {level:.6g}): SNR and cosine cannot judge "
                             f"the artifact's error {metrics['max_abs_error']:.3g}")
    return failures, undecided


def allowed_relative(thresholds: dict[str, float], precision: str) -> tuple[float, float]:
    """(the relative error one value may have, the absolute error a value of 0 may have) under these thresholds:
    the amplitude ratio `min_snr_db` allows (60 dB: 1e-3), and the precision's floor (`PRECISION_FLOOR`)."""
    snr = thresholds.get("min_snr_db", DEFAULT_THRESHOLDS.get(precision, DEFAULT_THRESHOLDS["fp32"])["min_snr_db"])
    return 10 ** (-snr / 20), PRECISION_FLOOR.get(precision, PRECISION_FLOOR["fp32"])


def _small_failures(name: str, metrics: dict[str, Any], thresholds: dict[str, float], precision: str) -> list[str]:
    """An output of a few values (`SMALL_OUTPUT`), judged value by value: each error against the relative error
    `min_snr_db` allows of that value, plus the precision's floor (what a value of 0 is judged by)."""
    relative, floor = allowed_relative(thresholds, precision)
    values, errors = metrics["small_output"]["reference"], metrics["small_output"]["error"]
    over = [i for i, (value, error) in enumerate(zip(values, errors, strict=True))
            if error > relative * abs(value) + floor]
    if not over:
        return []
    worst = max(over, key=lambda i: errors[i] - relative * abs(values[i]))
    return [f"output '{name}' ({len(values)} value(s), each judged by its relative error): {len(over)} beyond what "
            f"{precision} under min_snr_db {-20 * math.log10(relative):g} allows (relative {relative:.3g}, at least "
            f"{floor:g}); the worst, position {worst}: error {errors[worst]:.3g} on {values[worst]:.6g}"]


def compare_selected(got: Any, want: Any, selected: Selected, given: dict[str, Any],
                     expected: dict[str, Any]) -> dict[str, Any]:
    """An output a selection decides: its chosen indices by overlap; values on the rows both sides chose."""
    if selected.direct:
        metrics = compare(got, want)
        found = compare_indices(selected, got, want)
        metrics.update({k: v for k, v in found.items() if k == "selection_overlap"})
        metrics["selection"] = {"op": selected.op, "direct": True, **{k: v for k, v in found.items()
                                                                       if k != "selection_overlap"}}
        return metrics
    matched = match_rows(got, want, selected, given.get(selected.index_output), expected.get(selected.index_output))
    if matched is None:
        return compare(got, want)
    rows, both = matched
    metrics = {**compare(rows[both], want[both]), "shape": list(got.shape), "reference_shape": list(want.shape)}
    metrics["selection"] = {"op": selected.op, "rows_compared": int(both.sum()), "rows": int(both.size),
                            "paired_by": "indices" if selected.index_output in given else "nearest values"}
    if selected.index_output in given and selected.index_output in expected:
        metrics["selection_overlap"] = float(both.mean())
    return metrics


def compare_outputs(session: Any, outputs: list[Any], expected: dict[str, Any], thresholds: dict[str, float],
                    precision: str = "fp32", selected: dict[str, Selected] | None = None,
                    ) -> tuple[dict[str, Any], list[str], list[str]]:
    """Metrics per output against the reference, a failure per threshold missed, and what could not be judged;
    outputs a selection decides (`selected`) compared as selections."""
    import numpy as np

    metrics, failures, undecided = {}, [], []
    given = {output.name: got for output, got in zip(session.get_outputs(), outputs, strict=True)}
    for name, got in given.items():
        want = expected.get(name)
        if want is None:
            failures.append(f"output '{name}' does not exist in the reference model")
            continue
        choice = (selected or {}).get(name)
        metrics[name] = compare_selected(got, want, choice, given, expected) if choice else compare(got, want)
        reference_nonfinite = int((~np.isfinite(want)).sum()) if want.dtype.kind == "f" else 0
        missed, unjudged = check(name, metrics[name], reference_nonfinite, thresholds, precision)
        failures.extend(missed)
        undecided.extend(unjudged)
    return metrics, failures, undecided

