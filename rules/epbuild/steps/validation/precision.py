"""OpenVINO's default precision, judged on evidence: where an fp32 OpenVINO artifact without an f32 hint missed, it
is opened again with `INFERENCE_PRECISION_HINT: f32` and judged the same way. OpenVINO's CPU plugin runs bf16 by
default on a CPU with bf16 in hardware (`avx512_bf16`, AMX: Intel's and AMD's alike), decided when the artifact is
loaded; when the hinted session holds, the line blames the precision default and names the setting, not the EP."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from ...contracts.jobs import ValidationMember
from ...manifest.eps import EpInfo
from ..diagnosis import says_f32
from .artifact_session import open_session
from .comparison import compare_outputs

OPENVINO = "OpenVINOExecutionProvider"
F32 = {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}


def f32_would_hold(ort: Any, info: EpInfo, request: ValidationMember, feeds: dict[str, Any],
                   reference: dict[str, Any], thresholds: dict[str, float], kind: str, selected: Any,
                   task_left_s: float) -> str | None:
    """The line to add where an fp32 OpenVINO artifact without an f32 hint missed and a session of it with the hint
    meets the same thresholds (and task gate); None where that is not what happened (or cannot be tried here)."""
    if info.name != OPENVINO or kind != "fp32" or says_f32(request.options.get("load_config")):
        return None
    with tempfile.TemporaryDirectory(prefix="epbuild-f32-") as folder:
        config = Path(folder) / "f32.json"
        config.write_text(json.dumps(F32))
        hinted = dataclasses.replace(request, options={**request.options, "load_config": str(config)})
        session, refused = open_session(ort, info, hinted)
        if refused or session is None:
            return None
        try:
            outputs = session.run(None, feeds)
        except Exception:  # noqa: BLE001 - no evidence either way: the line stays as it was
            return None
        metrics, missed, _ = compare_outputs(session, outputs, reference["expected"], thresholds, kind, selected)
        scored = ""
        if request.task:  # the task decides, as it did the verdict
            from .task_metrics import evaluate

            task, failure = evaluate(session, hinted, reference["dataset"], 0.0, task_left_s, info.name)
            if failure:
                return None
            scored = f", {task['metric']} {task['artifact']:.4g} against the source's {task['source']:.4g}"
        elif missed:
            return None
    snrs = [m["snr_db"] for m in metrics.values() if "snr_db" in m]
    worst = f"worst SNR {min(snrs):.1f} dB" if snrs else "within the thresholds"
    return (f"opened with OpenVINO's f32 hint the artifact holds ({worst}{scored}): this CPU runs bf16 by default "
            "(bf16 in hardware), not an EP bug; give the target options.load_config = a JSON file "
            "{\"CPU\": {\"INFERENCE_PRECISION_HINT\": \"f32\"}} with option_files = [\"load_config\"]")
