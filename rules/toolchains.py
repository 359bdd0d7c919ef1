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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BuildError, closest
from .hashing import sha256_file

QAIC_DEFAULT_ROOT = Path("/opt/qti-aic")
PMU_RECIPES = ("AxiRd", "AxiWr", "AxiRdWr", "KernelUtil", "HmxMacs")
QAIC_KEYS = ("num_cores", "convert_to_fp16", "stats_level", "stats_batchsize", "ddr_stats", "pmu_recipe",
             "pmu_events", "perf_warnings", "perf_metrics", "aic_hw", "extra_args")
STATS_LEVEL_DEFAULT = 40  # 50: I/O doorbell waits, 70: per-operator cycles (needed by qaic-opstats), 100: extended PMU
LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class QaicOptions:
    """The `qaic = {...}` table of a target, checked against the seed's rules."""

    num_cores: int | None = None
    convert_to_fp16: bool = False
    stats_level: int | None = None
    stats_batchsize: int | None = None
    ddr_stats: bool = False
    pmu_recipe: str | None = None
    pmu_events: tuple[str, ...] = ()
    perf_warnings: bool = False
    perf_metrics: bool = False
    aic_hw: bool = True
    extra_args: tuple[str, ...] = ()


def check_qaic(options: dict[str, Any]) -> tuple[QaicOptions | None, str | None, str | None]:
    """(options, None, None), or (None, key, message) for the first rule broken."""
    kinds = {"num_cores": int, "stats_level": int, "stats_batchsize": int, "convert_to_fp16": bool,
             "ddr_stats": bool, "perf_warnings": bool, "perf_metrics": bool, "aic_hw": bool, "pmu_recipe": str,
             "pmu_events": list, "extra_args": list}
    for key, value in options.items():
        if key not in kinds:
            return None, key, f"unknown key{closest(key, QAIC_KEYS)}; valid keys: {', '.join(QAIC_KEYS)}"
        kind = kinds[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return None, key, f"must be {kind.__name__}, found {value!r}"
    for key in ("num_cores", "stats_level", "stats_batchsize"):
        if key in options and options[key] <= 0:
            return None, key, f"must be a positive integer, found {options[key]}"
    level = options.get("stats_level", STATS_LEVEL_DEFAULT)
    if options.get("ddr_stats") and level < 40:
        return None, "ddr_stats", f"needs stats_level >= 40, found {level}"
    recipe, events = options.get("pmu_recipe"), options.get("pmu_events", [])
    if recipe is not None and recipe not in PMU_RECIPES:
        return None, "pmu_recipe", f"'{recipe}' is not a recipe; valid: {', '.join(PMU_RECIPES)}"
    if recipe is not None and events:
        return None, "pmu_events", "pmu_recipe and pmu_events are mutually exclusive: give one"
    if len(events) > 8:
        return None, "pmu_events", f"at most 8 events, found {len(events)}"
    for index, event in enumerate(events):
        if not isinstance(event, str) or not re.fullmatch(r"(0x)?[0-9A-Fa-f]+", event):
            return None, f"pmu_events[{index}]", f"must be a hex event id such as \"3F\", found {event!r}"
    if not all(isinstance(arg, str) for arg in options.get("extra_args", [])):
        return None, "extra_args", "must be a list of strings"
    fields = {**options, "pmu_events": tuple(e.removeprefix("0x") for e in events),
              "extra_args": tuple(options.get("extra_args", []))}
    return QaicOptions(**fields), None, None


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


@dataclass(frozen=True)
class Toolchain:
    """A found external toolchain: its root, executables, and a version (or the compiler binary's sha256 when
    the SDK states none), so an upgrade changes every fingerprint."""

    name: str
    root: Path
    executables: dict[str, Path]
    version: str


def find_qaic(configured: Path | None) -> Toolchain | str:
    """The Cloud AI Apps SDK: `[toolchains.qaic] root`, else $QAIC_ROOT, else /opt/qti-aic; or why not."""
    root = configured or (Path(os.environ["QAIC_ROOT"]) if os.environ.get("QAIC_ROOT") else QAIC_DEFAULT_ROOT)
    executables = {"qaic-compile": root / "exec" / "qaic-compile", "qaic-qpc": root / "exec" / "qaic-qpc"}
    missing = [str(path) for path in executables.values() if not os.access(path, os.X_OK)]
    if missing:
        return (f"qaic-compile not found ({', '.join(missing)} missing): install the Qualcomm Cloud AI Apps SDK, "
                f"or set [toolchains.qaic] root in models.toml or QAIC_ROOT")
    return Toolchain("qaic", root, executables, _sdk_version(root, executables["qaic-compile"]))


def find_qairt(configured: Path | None) -> Toolchain | str:
    """The QAIRT SDK: the target's `qnn_sdk_root`, else $QNN_SDK_ROOT; or why not."""
    root = configured or (Path(os.environ["QNN_SDK_ROOT"]) if os.environ.get("QNN_SDK_ROOT") else None)
    if root is None:
        return "the QAIRT SDK is not configured: set qnn_sdk_root on the target or QNN_SDK_ROOT"
    tools = root / "bin" / "x86_64-linux-clang"
    executables = {"converter": tools / "qairt-converter", "context": tools / "qnn-context-binary-generator",
                   "backend": root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"}
    missing = [str(path) for name, path in executables.items() if not (path.is_file() if name == "backend"
                                                                         else os.access(path, os.X_OK))]
    if missing:
        return f"the QAIRT SDK at {root} lacks {', '.join(missing)}"
    return Toolchain("qairt", root, executables, _sdk_version(root, executables["converter"]))


def _sdk_version(root: Path, binary: Path) -> str:
    """The SDK's version file if it has one (Apps SDK versions/apps.xml, QAIRT sdk.yaml), else the binary's hash."""
    for candidate in ("versions/apps.xml", "sdk.yaml", "VERSION"):
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


def toolchain_identity(compiler: str, sdk_root: Path | None) -> dict[str, str] | None:
    """For config and fingerprints: which external toolchain (and version) builds a target, None for ORT."""
    if compiler not in ("qaic", "qairt"):
        return None
    found = find_qaic(sdk_root) if compiler == "qaic" else find_qairt(sdk_root)
    return {"name": compiler, "version": found.version if isinstance(found, Toolchain) else "absent"}


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
