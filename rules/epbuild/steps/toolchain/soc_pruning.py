"""`ship_socs`: a multi-SoC QNN binary pruned to the SoCs shipped, with onnxruntime-qnn's own tool
(`python -m onnxruntime_qnn.deploy_multi_soc_ep_context`), which drops the HTP cache records of the other SoCs from
the binary and their entries from the model's compatibility string. The tool imports a QAIRT extension built for
Python 3.12 only and ships in the Python 3.12 wheel only: it runs in a Python 3.12 that has onnxruntime-qnn,
`EPBUILD_QNN_DEPLOY_PYTHON` (or this interpreter when it is one). Where there is none, the binary keeps every SoC
and the compile line says why it was not pruned."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...errors import ModelError

TOOL = "onnxruntime_qnn.deploy_multi_soc_ep_context"
VARIABLE = "EPBUILD_QNN_DEPLOY_PYTHON"
PROBE_TIMEOUT_S, PRUNE_TIMEOUT_S = 120.0, 600.0
_PROBE = ("import importlib.metadata as m, importlib.util as u, hashlib, sys\n"
          f"spec = u.find_spec({TOOL!r})\n"
          "print(sys.version.split()[0]); print(m.version('onnxruntime-qnn'))\n"
          "print(hashlib.sha256(open(spec.origin, 'rb').read()).hexdigest() if spec else '')\n")


def deploy_python() -> str:
    """The interpreter that runs the tool: the variable's, else this one."""
    return os.environ.get(VARIABLE) or sys.executable


@functools.cache
def _probe(python: str) -> dict[str, str] | str:
    """The tool's identity in `python` (its Python, onnxruntime-qnn version and the tool's sha256), or why it
    cannot run there."""
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{VARIABLE}={python} cannot be run ({exc})"
    lines = done.stdout.split()
    if done.returncode or len(lines) < 2:
        return f"{python} has no onnxruntime-qnn ({' '.join(done.stderr.split())[-200:] or 'no answer'})"
    version, qnn, tool = lines[0], lines[1], lines[2] if len(lines) > 2 else ""
    if not tool:
        return f"onnxruntime-qnn {qnn} in {python} has no {TOOL}"
    if not version.startswith("3.12."):
        return (f"{TOOL} needs Python 3.12 (its QAIRT extension is built for it alone; {python} is {version}): set "
                f"{VARIABLE} to a Python 3.12 with onnxruntime-qnn installed")
    return {"python": python, "python_version": version, "onnxruntime_qnn": qnn, "tool_sha256": tool}


def deploy_tool() -> dict[str, str] | str:
    """The pruning tool's identity (it shapes the pruned bytes), or why there is none here."""
    found = _probe(deploy_python())
    if isinstance(found, str) and VARIABLE not in os.environ:
        return (f"{TOOL} ships only in the onnxruntime-qnn wheel for Python 3.12 and this is Python "
                f"{sys.version.split()[0]}: set {VARIABLE} to a Python 3.12 with onnxruntime-qnn installed")
    return found


def records(python: str, model: Path, binary: Path) -> list[tuple[str, str]]:
    """The binary's HTP cache records: (record name, SoC model), as the tool lists them."""
    done = _run(python, ["--input_onnx", str(model), "--input_bin", str(binary), "--list"])
    found = []
    for line in done.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].startswith("htp.cache.") and parts[2].isdigit():
            found.append((parts[0], parts[2]))
    if not found:
        raise ModelError(f"{TOOL} listed no HTP cache record in {binary.name}: {' '.join(done.split())[-300:]}")
    return found


def prune(python: str, model: Path, binary: Path, keep: list[str]) -> list[str]:
    """Remove the records of SoCs not in `keep` from `binary` and `model` (in place); the SoCs removed."""
    held = records(python, model, binary)
    drop = [(name, soc) for name, soc in held if soc not in keep]
    missing = sorted(set(keep) - {soc for _, soc in held}, key=int)
    if missing:
        raise ModelError(f"the multi-SoC binary holds no record for SoC {', '.join(missing)} to ship")
    if not drop:
        return []
    # the same names in a folder of their own: the tool writes the binary's file name into the EPContext node
    folder = model.parent / ".pruned"
    folder.mkdir()
    try:
        _run(python, ["--input_onnx", str(model), "--input_bin", str(binary), "--remove_record",
                      ",".join(name for name, _ in drop), "--output_onnx", str(folder / model.name), "--output_bin",
                      str(folder / binary.name)])
        os.replace(folder / binary.name, binary)
        os.replace(folder / model.name, model)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return [soc for _, soc in drop]


def _run(python: str, arguments: list[str]) -> str:
    try:
        done = subprocess.run([python, "-m", TOOL, *arguments], capture_output=True, text=True,
                              timeout=PRUNE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelError(f"{TOOL} could not run: {exc}") from None
    if done.returncode:
        said = " ".join((done.stderr or done.stdout).split())
        raise ModelError(f"{TOOL} failed (exit {done.returncode}): {said[-400:]}")
    return done.stdout


def request_part(ship: tuple[str, ...]) -> dict[str, Any] | None:
    """What the compile child needs to prune: the interpreter and the SoCs kept; None without the tool."""
    found = deploy_tool()
    return {"python": found["python"], "keep": list(ship)} if ship and isinstance(found, dict) else None
