"""`epbuild check`: what ONNX Runtime answers, for every artifact, about this host's devices of its EP: runs
optimally, runs but prefers a recompile, cannot run, or cannot be judged here (and why). The answer comes from the
compatibility string the EP wrote into its compiled model (recorded in artifact.json)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..contracts.artifact import OMIT, ArtifactRecord, read_artifact
from ..errors import printable
from ..manifest.builds import SIDECAR
from ..manifest.eps import lookup
from ..steps.validation.compatibility import answer
from ..steps.validation.fleet import soc_answers, soc_strings


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
    except Exception as exc:  # noqa: BLE001 - a plugin this host cannot load: nothing was judged
        return f"cannot be judged here: {' '.join(str(exc).split())[:200]}"
    said = answer(ort, info.name, strings)[1]
    per_soc = soc_strings(strings[0]) if len(strings) == 1 else {}
    if per_soc:  # a multi-SoC binary: ONNX Runtime asked about each SoC's part too
        return soc_answers(ort, info.name, strings[0])["text"]
    return said


def main(argv: list[str], root: Path) -> int:
    import onnxruntime as ort

    found = sorted((root / "artifacts").glob(f"*/*/{SIDECAR}")) + sorted(
        (root / "artifacts").glob(f"*/groups/*/{SIDECAR}"))
    if not found:
        print(f"error: no artifacts under {root / 'artifacts'}: build first (epbuild)", file=sys.stderr)
        return 2
    unreadable = 0
    for path in found:
        name = path.parent.relative_to(root / "artifacts").as_posix()
        try:
            record = read_artifact(path.parent)
        except (ValueError, OSError) as exc:  # cut short, not JSON, not a record this epbuild reads
            unreadable += 1
            print(printable(f"{name}: unreadable artifact.json ({' '.join(str(exc).split())[:200]}): nothing "
                            "judged; rebuild it (epbuild)", one_line=True))
            continue
        # the compatibility string is the file's text: never a line of its own
        print(printable(f"{name}: {judge(ort, record)}", one_line=True))
    if unreadable:
        print(f"error: {unreadable} artifact(s) could not be read", file=sys.stderr)
        return 1
    return 0
