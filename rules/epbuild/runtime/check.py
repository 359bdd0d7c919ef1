"""`epbuild check`: what ONNX Runtime answers, for every artifact, about this host's devices of its EP: runs
optimally, runs but prefers a recompile, cannot run, or cannot be judged here (and why). The answer comes from the
compatibility string the EP wrote into its compiled model (recorded in artifact.json)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..contracts.artifact import OMIT, ArtifactRecord, read_artifact
from ..manifest.builds import SIDECAR
from ..manifest.eps import lookup

ANSWERS = {"EP_SUPPORTED_OPTIMAL": "runs optimally on this host's devices",
           "EP_SUPPORTED_PREFER_RECOMPILATION": "runs, but the EP prefers a recompile for this host's devices",
           "EP_UNSUPPORTED": "cannot run on this host's devices: recompile for them",
           "EP_NOT_APPLICABLE": "the EP does not judge it (no compatibility check for this artifact)"}


def judge(ort: Any, record: ArtifactRecord) -> str:
    """One artifact's answer in words."""
    members = record.members.values() if record.has("members") else []
    strings = ([record.compatibility] if record.has("compatibility") else
               [m.compatibility for m in members if m.compatibility is not OMIT])
    if not record.has("ep"):
        return f"a {record.compiler} artifact: ONNX Runtime does not judge it"
    info = lookup(record.ep)
    if info is None or info.is_cpu:
        return "a CPU artifact: runs wherever this onnxruntime runs (no compatibility string)"
    if not strings:
        return f"{record.ep} wrote no compatibility string: cannot be judged"
    from ..execute.host import register_plugin
    from .session import _plugin_ready

    try:
        _plugin_ready(info)
        register_plugin(ort, info)
        devices = [d for d in ort.get_ep_devices() if d.ep_name == info.name]
        if not devices:
            return f"cannot be judged here: {info.name} offers no device on this host"
        from onnxruntime.capi import _pybind_state

        answers = {_pybind_state.get_model_compatibility_for_ep_devices(devices, text).name for text in strings}
    except Exception as exc:  # noqa: BLE001 - the EP's refusal to judge is the answer, never "compatible"
        return f"cannot be judged here: {' '.join(str(exc).split())[:200]} (string {strings[0]})"
    worst = next(a for a in ("EP_UNSUPPORTED", "EP_SUPPORTED_PREFER_RECOMPILATION", "EP_NOT_APPLICABLE",
                             "EP_SUPPORTED_OPTIMAL") if a in answers)
    return f"{ANSWERS[worst]} (string {strings[0]})"


def main(argv: list[str], root: Path) -> int:
    import onnxruntime as ort

    found = sorted((root / "artifacts").glob(f"*/*/{SIDECAR}")) + sorted(
        (root / "artifacts").glob(f"*/groups/*/{SIDECAR}"))
    if not found:
        print(f"error: no artifacts under {root / 'artifacts'}: build first (epbuild)", file=sys.stderr)
        return 2
    for path in found:
        try:
            record = read_artifact(path.parent)
        except ValueError:  # not JSON, or not a record this epbuild reads
            continue
        name = path.parent.relative_to(root / "artifacts").as_posix()
        print(f"{name}: {judge(ort, record)}")
    return 0
