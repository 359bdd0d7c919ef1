"""Fresh child processes for compiles and validations.

A fresh process gives byte-identical outputs for identical inputs (a second compile in one process differs),
and a crash inside an EP (SIGSEGV, abort) or a hang ends that one child, not doit. The parent names the signal or
the timeout; the child reports its own errors as JSON.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import BuildError

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def _tail(text: str, lines: int = 12) -> str:
    """The child's last meaningful lines: logged errors and the final exception, not Python traceback frames."""
    all_lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in all_lines if "[E:" in line or "<E>" in line]
    exceptions = [line for line in all_lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Fail)\b", line)]
    kept = errors[-lines:] + exceptions[-1:] if errors or exceptions else [
        line for line in all_lines if not line.startswith(("Traceback", "  "))][-lines:]
    return "\n".join(f"    {line}" for line in kept)


def run_child(module: str, request: dict[str, Any], workdir: Path, timeout: float, what: str,
              log: Path | None = None) -> dict[str, Any]:
    """Run `python -m module request.json result.json`; return its result or raise BuildError naming `what`."""
    workdir.mkdir(parents=True, exist_ok=True)
    request_file, result_file = workdir / "request.json", workdir / "result.json"
    request_file.write_text(json.dumps(request))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run([sys.executable, "-m", module, str(request_file), str(result_file)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        output = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        raise BuildError(f"{what}: timed out after {timeout:g} s; killed\n{_tail(output)}") from None
    finally:
        request_file.unlink(missing_ok=True)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(done.stdout + done.stderr)
    result: dict[str, Any] = {}
    if result_file.exists():
        try:
            result = json.loads(result_file.read_text())
        except ValueError:  # cut short, e.g. by a full disk: judge by the exit status and the child's output
            result = {"error": f"its result file was unreadable\n{_tail(done.stderr)}"} if done.returncode else {}
        result_file.unlink()
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        raise BuildError(f"{what}: the child process was killed by {name}\n{_tail(done.stderr)}")
    if done.returncode != 0 or "error" in result:
        if "error" not in result:
            raise BuildError(f"{what}: exited with status {done.returncode}\n{_tail(done.stderr)}")
        logged = "\n".join(line for line in done.stderr.splitlines() if "[E:" in line or "<E>" in line)
        raise BuildError(f"{what}: {result['error']}" + (f"\n{_tail(logged)}" if logged else ""))
    return result


def serve(function: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The child's main: read the request, call `function`, write its result or its error as JSON."""
    request_file, result_file = Path(sys.argv[1]), Path(sys.argv[2])
    request = json.loads(request_file.read_text())
    try:
        result = function(request)
        status = 0
    except Exception as exc:  # noqa: BLE001 - every failure is reported to the parent as text
        traceback.print_exc()
        result = {"error": str(exc).strip() or type(exc).__name__}
        status = 1
    result_file.write_text(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # skip EP library teardown at exit, which can abort after a good compile
