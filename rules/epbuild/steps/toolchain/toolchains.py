"""Compilers outside ONNX Runtime: Qualcomm Cloud AI `qaic-compile` (ONNX -> QPC) and the QAIRT SDK (ONNX ->
QNN context binary -> EPContext model for the QNN EP).

Each adapter has discovery (manifest key, then environment variable, then the SDK's default place), a version that
enters the task's config and fingerprint, the exact command line, and a clear reason when the tool is absent, which
makes the target unavailable on this host exactly like an absent EP. Nothing here imports onnxruntime.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from ...errors import BuildError
from ...files.hashing import sha256_file
from ...files.layout import write_json
from ...manifest.qaic import QaicOptions
from ...records import record

QAIC_DEFAULT_ROOT = Path("/opt/qti-aic")
LOG_TAIL_LINES = 20


def qaic_command(executable: Path, model: Path, binary_dir: Path, options: QaicOptions,
                 symbols: dict[str, int]) -> list[str]:
    """The qaic-compile command line, flag by flag as the seed documents them."""
    command = [str(executable), f"-model={model}", f"-aic-binary-dir={binary_dir}"]
    if options.aic_hw:
        command.append("-aic-hw")
    if options.num_cores is not None:
        command.append(f"-aic-num-cores={options.num_cores}")
    if options.convert_to_fp16:
        command.append("-convert-to-fp16")
    command += [f"-onnx-define-symbol={name},{value}" for name, value in sorted(symbols.items())]
    if options.stats_level is not None:
        command.append(f"-stats-level={options.stats_level}")
    if options.stats_batchsize is not None:
        command.append(f"-stats-batchsize={options.stats_batchsize}")
    if options.ddr_stats:
        command.append("-ddr-stats")
    if options.pmu_recipe:
        command.append(f"-aic-pmu-recipe={options.pmu_recipe}")
    if options.pmu_events:
        command.append(f"-aic-pmu-events={','.join(options.pmu_events)}")
    if options.perf_warnings:
        command.append("-aic-perf-warnings")
    if options.perf_metrics:
        command.append("-aic-perf-metrics")
    return command + list(options.extra_args)


@record
class Toolchain:
    """A found external toolchain: its root, executables, and a version (or the compiler binary's sha256 when
    the SDK states none), so an upgrade changes every fingerprint."""

    name: str
    root: Path
    executables: dict[str, Path]
    version: str


VERSION_FILES = ("versions/apps.xml", "sdk.yaml", "VERSION")


def _qaic_paths(configured: Path | None) -> tuple[Path, dict[str, Path]]:
    root = configured or (Path(os.environ["QAIC_ROOT"]) if os.environ.get("QAIC_ROOT") else QAIC_DEFAULT_ROOT)
    return root, {"qaic-compile": root / "exec" / "qaic-compile", "qaic-qpc": root / "exec" / "qaic-qpc"}


def _qairt_paths(configured: Path | None) -> tuple[Path | None, dict[str, Path]]:
    root = configured or (Path(os.environ["QNN_SDK_ROOT"]) if os.environ.get("QNN_SDK_ROOT") else None)
    if root is None:
        return None, {}
    tools = root / "bin" / "x86_64-linux-clang"
    return root, {"converter": tools / "qairt-converter", "context": tools / "qnn-context-binary-generator",
                  "backend": root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"}


def probed_files(name: str, configured: Path | None) -> list[Path]:
    """The files whose presence and bytes decide what find_qaic / find_qairt answer (a no-op stamp watches them)."""
    root, executables = (_qaic_paths if name == "qaic" else _qairt_paths)(configured)
    return [] if root is None else [*executables.values(), *(root / name for name in VERSION_FILES)]


def find_qaic(configured: Path | None) -> Toolchain | str:
    """The Cloud AI Apps SDK: `[toolchains.qaic] root`, else $QAIC_ROOT, else /opt/qti-aic; or why not."""
    root, executables = _qaic_paths(configured)
    missing = [str(path) for path in executables.values() if not os.access(path, os.X_OK)]
    if missing:
        return (f"qaic-compile not found ({', '.join(missing)} missing): install the Qualcomm Cloud AI Apps SDK, "
                f"or set [toolchains.qaic] root in models.toml or QAIC_ROOT")
    return Toolchain("qaic", root, executables, _sdk_version(root, executables["qaic-compile"]))


def find_qairt(configured: Path | None) -> Toolchain | str:
    """The QAIRT SDK: the target's `qnn_sdk_root`, else $QNN_SDK_ROOT; or why not."""
    root, executables = _qairt_paths(configured)
    if root is None:
        return "the QAIRT SDK is not configured: set qnn_sdk_root on the target or QNN_SDK_ROOT"
    missing = [str(path) for name, path in executables.items() if not (path.is_file() if name == "backend"
                                                                         else os.access(path, os.X_OK))]
    if missing:
        return f"the QAIRT SDK at {root} lacks {', '.join(missing)}"
    return Toolchain("qairt", root, executables, _sdk_version(root, executables["converter"]))


def _sdk_version(root: Path, binary: Path) -> str:
    """The SDK's version file if it has one (Apps SDK versions/apps.xml, QAIRT sdk.yaml), else the binary's hash."""
    for candidate in VERSION_FILES:
        path = root / candidate
        if path.is_file():
            match = re.search(r"\d+\.\d+(?:\.\d+)+", path.read_text(errors="replace"))
            if match:
                return match.group(0)
    return f"sha256:{sha256_file(binary)[:16]}"


def run_tool(command: list[str], log: Path, what: str, timeout: float) -> str:
    """Run one tool, keep its whole output in `log`, and on failure show its last lines."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{what}: timed out after {timeout:g} s") from None
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}\n")
    if done.returncode != 0:
        tail = "\n".join(f"    {line}" for line in (done.stdout + done.stderr).strip().splitlines()[-LOG_TAIL_LINES:])
        raise BuildError(f"{what}: {Path(command[0]).name} exited with status {done.returncode}\n{tail}")
    return done.stdout


def cloud_ai_devices() -> list[str]:
    """Cloud AI 100 cards this host exposes (the qaic kernel driver's accel nodes)."""
    return sorted(glob.glob("/dev/accel/accel*") + glob.glob("/dev/qaic_*"))


def supported_operators(toolchain: Toolchain, log: Path) -> set[str]:
    """`qaic-compile -operators-supported=onnx`: the ONNX operator names this compiler supports."""
    output = run_tool([str(toolchain.executables["qaic-compile"]), "-operators-supported=onnx"], log,
                      "qaic-compile -operators-supported=onnx", 300)
    return set(re.findall(r"[A-Za-z][A-Za-z0-9_]*", output))


def ep_context_model(source: Any, binary: str, graph_name: str, output: Path) -> None:
    """An ONNX model with one EPContext node that hands the QNN EP a context binary, with the source's
    (static) inputs and outputs: what ONNX Runtime's own compile writes, for a binary made by the QAIRT SDK."""
    import onnx
    from onnx import helper

    initializers = {t.name for t in source.graph.initializer}
    inputs = [v for v in source.graph.input if v.name not in initializers]
    node = helper.make_node(
        "EPContext", [v.name for v in inputs], [v.name for v in source.graph.output], name=graph_name,
        domain="com.microsoft", main_context=1, ep_cache_context=binary, embed_mode=0,
        source="QNNExecutionProvider", partition_name=graph_name)
    graph = helper.make_graph([node], graph_name, inputs, list(source.graph.output))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="epbuild-qairt")
    model.ir_version = source.ir_version
    onnx.save(model, str(output))


def check_operators(supported: set[str], version: str, model_path: Path, report: Path) -> str:
    """Compare the model's operators with what qaic-compile `version` supports, before a long compile fails on
    them; write the operator report, or raise BuildError naming the unsupported ones."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    used = sorted({n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")})
    unsupported = [op for op in used if op not in supported]
    if unsupported:
        report.unlink(missing_ok=True)
        raise BuildError(f"qaic-compile does not support {', '.join(unsupported)} (used by {model_path.name})")
    report.parent.mkdir(parents=True, exist_ok=True)
    write_json(report, {"operators": used, "unsupported": unsupported}, indent=1)
    return f"all {len(used)} operators are supported by qaic-compile {version}"
