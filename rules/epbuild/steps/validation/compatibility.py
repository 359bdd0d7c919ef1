"""What ONNX Runtime answers about a compiled model's compatibility string for this host's devices of its EP: runs
optimally, runs but prefers a recompile, cannot run, the EP does not judge it, or cannot be judged here (the EP
refuses to judge off its device: QNN judges only on an NPU). Never more than ONNX Runtime answered."""

from __future__ import annotations

from typing import Any

ANSWERS = {"EP_SUPPORTED_OPTIMAL": "runs optimally on this host's devices",
           "EP_SUPPORTED_PREFER_RECOMPILATION": "runs, but the EP prefers a recompile for this host's devices",
           "EP_UNSUPPORTED": "cannot run on this host's devices: recompile for them",
           "EP_NOT_APPLICABLE": "the EP does not judge it (no compatibility check for this artifact)"}
WORST_FIRST = ("EP_UNSUPPORTED", "EP_SUPPORTED_PREFER_RECOMPILATION", "EP_NOT_APPLICABLE", "EP_SUPPORTED_OPTIMAL")
UNJUDGED = "UNJUDGED"  # ONNX Runtime gave no answer here


def answer(ort: Any, ep_name: str, strings: list[str]) -> tuple[str, str]:
    """(ONNX Runtime's answer, or UNJUDGED; the answer in words) for the EP `ep_name`, already registered, and the
    compatibility strings of an artifact (one per EPContext model of a group)."""
    devices = [d for d in ort.get_ep_devices() if d.ep_name == ep_name]
    if not devices:
        return UNJUDGED, f"cannot be judged here: {ep_name} offers no device on this host"
    try:
        from onnxruntime.capi import _pybind_state

        answers = {_pybind_state.get_model_compatibility_for_ep_devices(devices, text).name for text in strings}
    except Exception as exc:  # noqa: BLE001 - the EP's refusal to judge is the answer, never "compatible"
        return UNJUDGED, f"cannot be judged here: {' '.join(str(exc).split())[:200]} (string {strings[0]})"
    worst = next(a for a in WORST_FIRST if a in answers)
    return worst, f"{ANSWERS[worst]} (string {strings[0]})"
