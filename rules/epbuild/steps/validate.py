"""Validating a compiled artifact: run it on its EP in a fresh child and compare with the source model on CPU.

Never passes on a CPU fallback: Python's retry-on-CPU is disabled, `session.disable_cpu_ep_fallback=1` is set
whenever the compile left no node on CPU, and the recorded EP assignment must put every EPContext node on the
target's EP (an artifact that keeps nodes on CPU by design, such as QNN's graph-I/O quantize/dequantize, may keep
exactly those there). `skipped` means only "this host cannot run this artifact" and is never counted as passed.
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import RULES_FORMAT
from ..errors import BuildError, ModelError, located, plain
from ..execute.child import run_child, serve
from ..execute.requests import MemberValidation, ValidationReport, ValidationRequest
from ..manifest.builds import SIDECAR, Build, Member
from ..manifest.eps import EpInfo, lookup
from ..store.cache import Outcome, Workspace, check_inputs, restore, store
from ..store.layout import Layout, write_json
from ..store.owners import owner_tag
from ..store.publish import discard, scratch_dir
from .compilers import compiler
from .graph import EP_CONTEXT, check_input_names, index_bound, known_shapes, static_dims
from .graph import attributes as node_attributes

REPORT = "validation.json"
GENERATED_LIMIT = 4 * 2**30  # bytes of one generated validation input
SEED = 0
DEFAULT_THRESHOLDS = {
    # fp32 artifacts match the CPU reference to rounding; fp16 keeps ~3 decimal digits; a QDQ artifact is
    # compared with its QDQ source, and the EP's integer kernels differ from CPU's by a few quantization steps.
    "fp32": {"min_snr_db": 60.0, "min_cosine": 0.99999},
    "fp16": {"min_snr_db": 40.0, "min_cosine": 0.9999},
    "qdq": {"min_snr_db": 20.0, "min_cosine": 0.99},
}
SNR_CAP_DB = 200.0  # identical outputs; JSON has no infinity


def member_request(build: Build, member: Member, folder: Path, files: list[str],
                   recorded: dict[str, Any]) -> MemberValidation:
    """One artifact's request; `recorded` is its sidecar entry (runtime options, nodes, SDK version). A quantized
    artifact is compared with its float model too, for information; frozen inputs are fed to the reference with
    the values the artifact was built with."""
    target, settings = build.target, member.validation
    runtime_files = target.runtime_files()
    return {
        "float_reference": str(member.float_model) if member.float_model else None,
        "artifact": str(folder / member.model_file), "files": [str(folder / name) for name in files],
        "ep_sdk_version": recorded.get("ep_sdk_version"),
        "cpu_nodes": recorded["nodes"]["cpu"] + recorded["nodes"].get("cpu_in_subgraphs", 0),  # as a session counts
        "foldable_on_cpu": recorded["nodes"].get("foldable_on_cpu", {}),
        "source": str(member.model.path), "reference": str(settings.reference or member.model.path),
        "ep": target.ep.alias, "device": target.device, "embed": target.embed, "mode": settings.mode,
        "options": {key: str(folder / value) if key in runtime_files else value
                    for key, value in recorded["runtime_options"].items()},
        "inputs": {name: list(shape) for name, shape in member.model.inputs.items()},
        "inputs_file": str(settings.inputs) if settings.inputs else None,
        "precision": target.precision(), "thresholds": settings.thresholds,
        "frozen": {name: list(values) for name, values in (member.frozen or {}).items()},
        "entry": f"models.{member.name}", "manifest": build.manifest,
    }


def validation_request(build: Build, folder: Path) -> ValidationRequest:
    """What the validating child needs: each member's artifact, what the sidecar recorded, reference, settings."""
    recorded = json.loads((folder / SIDECAR).read_text())
    entries = recorded["members"] if build.shared else {build.members[0].name: recorded}
    members = {m.name: member_request(build, m, folder, recorded["files"],
                                      {**entries[m.name], "runtime_options": recorded["runtime_options"]})
               for m in build.members}
    machine = platform.machine().lower().replace("amd64", "x86_64")
    return {"members": members, "shared": build.shared, "one_binary": build.target.ep.shares_one_binary,
            "run_blocked": build.target.ep.shared_context_unloadable.get(machine) if build.shared else None}


def validate(build: Build, layout: Layout, workdir: Path) -> ValidationReport:
    """Validate the published artifact of `build`, its child working in `workdir`; return the report.

    A crash or timeout of the child becomes a `failed` report naming the signal or timeout."""
    started = time.monotonic()
    folder, target = build.out_dir(layout), build.target
    report = compiler(target).validate(build, layout)
    if report is None:
        timeout = sum(m.validation.timeout_s for m in build.members)
        try:
            report = run_child("epbuild.steps.validate", validation_request(build, folder), workdir,
                               target.limits(timeout),
                               f"validate {'group ' if build.shared else ''}{build.name} ({target.ep.name})",
                               build.log(layout, "validate"), target.ep.fork_server, target.ep.warm_validations)
        except BuildError as exc:
            report = {"status": "failed", "reason": str(exc)}
    if "reason" in report:  # an EP's colour codes: reports are read as text
        report["reason"] = plain(report["reason"])
    who = {"group": build.name} if build.shared else {"model": build.members[0].name}
    mode = "group" if build.shared else build.members[0].validation.mode
    return {"format": RULES_FORMAT, **who, "target": target.name, "ep": target.ep.name, "mode": mode,
            "seconds": round(time.monotonic() - started, 3), **report}


NOT_CACHED = ("target", "seconds", "usage", "worker")  # outside the validation's fingerprint: never cached
NOT_PUBLISHED = ("seconds", "usage", "worker")  # timings and where it ran: in the build report, not beside the artifact


def cached_validation(label: str, fingerprint: str, workspace: Workspace, folder: Path,
                      produce: Callable[[Path], dict[str, Any]], identity: dict[str, Any],
                      inputs: dict[Path, list[int] | None], target: str) -> tuple[dict[str, Any], Outcome]:
    """A passed report for this exact artifact, settings and host restored from the caches, or `produce(workdir)`;
    either way written into the artifact `folder` as `validation.json`, atomically, with the `target` named
    there: a restored report and a fresh one give the same file. Only passed reports are stored (without the
    target's name, timings or the worker): a failure or a skip is worth re-checking."""
    with workspace.cache.lock(fingerprint):
        restored = workspace.layout.scratch(f"validation.{fingerprint[:16]}.{owner_tag()}")  # made by a hit
        try:
            found, outcome = restore(label, fingerprint, workspace, restored)
            if found == [REPORT]:
                check_inputs(label, inputs)
                report = {**json.loads((restored / REPORT).read_text()), "target": target}
                write_json(folder / REPORT, report)
                return report, outcome
        finally:
            discard(restored)
        # the child works in the folder that becomes the cache entry (in artifacts/.scratch when the cache is not
        # writable)
        try:
            staging = workspace.cache.staging(fingerprint)
        except OSError as exc:
            workspace.cache.give_up(exc, "staging")
            staging = scratch_dir(workspace.layout.scratch_root, f"validation.{fingerprint[:16]}")
        try:
            report = produce(staging)
            check_inputs(label, inputs)  # the artifact or a reference was replaced while it ran
            write_json(folder / REPORT, {k: v for k, v in report.items() if k not in NOT_PUBLISHED})
            if report["status"] != "passed":
                return report, Outcome(None, outcome.downloaded)
            write_json(staging / REPORT, {k: v for k, v in report.items() if k not in NOT_CACHED})
            uploaded = store(label, fingerprint, workspace, staging, [REPORT], identity, adopt=True)
            return report, Outcome(None, outcome.downloaded, uploaded)
        finally:
            discard(staging)


def summary(report: dict[str, Any]) -> str:
    """The key metric and which EP ran the EPContext nodes, or the reason it did not pass."""
    if report["status"] != "passed":
        return report.get("reason", "")
    if report["mode"] == "structural":
        return "structural: every referenced file exists, EPContext attributes match the target"
    if "ran_on" in report and "outputs" not in report and "members" not in report:
        return f"qaic-qpc validate on {', '.join(next(iter(report['ran_on'].values())))}"
    if "members" in report:
        return "; ".join(f"{name}: {summary({'mode': 'run', **member})}" for name, member in report["members"].items())
    outputs = report["outputs"].values()
    snr = min(o["snr_db"] for o in outputs)
    max_abs = max(o["max_abs_error"] for o in outputs)
    ran = "; ".join(f"{', '.join(ops)} on {ep}" for ep, ops in report["ran_on"].items())
    return f"SNR {snr:.1f} dB, max abs error {max_abs:.2e} ({report['precision']}; {ran})"


# ---- child process ----

def compare(got: Any, want: Any) -> dict[str, Any]:
    """Metrics of one output against the reference (NumPy arrays)."""
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
    y, r = y[finite], r[finite]
    error = np.abs(y - r)
    scale = max(float(np.abs(r).max()) if r.size else 0.0, 1e-12)
    noise, signal = float(np.sum((y - r) ** 2)), float(np.sum(r**2))
    norms = float(np.linalg.norm(y) * np.linalg.norm(r))
    if got.dtype.kind == "f" and r.size and float(np.std(r)) < NEAR_CONSTANT * max(scale, 1.0):
        metrics["near_constant"] = {"reference_std": float(np.std(r)), "reference_max_abs": float(np.abs(r).max())}
    metrics.update({
        "max_abs_error": float(error.max()) if error.size else 0.0,
        "mean_abs_error": float(error.mean()) if error.size else 0.0,
        "max_rel_error": float((error / np.maximum(np.abs(r), 1e-3 * scale)).max()) if error.size else 0.0,
        "cosine": float(np.dot(y, r) / norms) if norms > 0 else float(np.array_equal(y, r)),
        "snr_db": SNR_CAP_DB if noise == 0 else min(SNR_CAP_DB, 10 * float(np.log10(max(signal, 1e-30) / noise))),
    })
    return metrics


NEAR_CONSTANT = 1e-4  # a reference whose spread is below this share of its scale (at least 1): SNR means nothing
THRESHOLD_METRICS = {"max_abs_error": "max_abs_error", "mean_abs_error": "mean_abs_error",
                     "max_rel_error": "max_rel_error", "min_cosine": "cosine", "min_snr_db": "snr_db"}


def check(name: str, metrics: dict[str, Any], reference_nonfinite: int, thresholds: dict[str, float]) -> list[str]:
    """Failure messages naming the output, the metric, its value and the threshold."""
    if not metrics["shape_match"]:
        return [f"output '{name}': shape {metrics['shape']} != reference {metrics['reference_shape']}"]
    failures = []
    if not metrics["dtype_match"]:
        failures.append(f"output '{name}': dtype {metrics['dtype']} != reference {metrics['reference_dtype']}")
    if metrics["nan_count"] + metrics["inf_count"] > reference_nonfinite:
        failures.append(f"output '{name}': {metrics['nan_count']} NaN and {metrics['inf_count']} Inf values, "
                        f"the reference has {reference_nonfinite}")
    near_constant = metrics.get("near_constant")
    for key, limit in sorted(thresholds.items()):
        metric = THRESHOLD_METRICS[key]
        value = metrics[metric]
        if near_constant and key in ("min_snr_db", "min_cosine"):
            if key == "min_snr_db":  # the same margin as an amplitude, at the output's scale (at least 1)
                allowed = max(near_constant["reference_max_abs"], 1.0) * 10 ** (-limit / 20)
                if metrics["max_abs_error"] > allowed:
                    failures.append(f"output '{name}': max_abs_error {metrics['max_abs_error']:.6g} > {allowed:g} "
                                    f"(its reference is nearly constant, so {key} {limit:g} is judged as an "
                                    "error at the output's scale)")
            continue
        if (value < limit) if key.startswith("min_") else (value > limit):
            relation = "<" if key.startswith("min_") else ">"
            failures.append(f"output '{name}': {metric} {value:.6g} {relation} {key} {limit:g}")
    return failures


def _dtype(type_name: str) -> Any:
    import numpy as np

    return np.dtype({"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
                     "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
                     "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
                     "tensor(bool)": np.bool_}.get(type_name, np.float32))


def _mask(shape: list[int], dtype: Any) -> Any:
    """A padding mask: ones, with the last quarter of the last axis masked out (never a whole row)."""
    import numpy as np

    mask = np.ones(shape, dtype=dtype)
    if shape and shape[-1] >= 4:
        mask[..., -(shape[-1] // 4):] = 0
    return mask


def make_inputs(session: Any, source: Any, request: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Inputs for the artifact's true inputs: from the user's .npz, or generated with a fixed seed as the model
    accepts them (floats normal; integer indices inside the dimension they index; masks as padding masks).
    Returns (feeds, how each generated integer input was made)."""
    import numpy as np

    signature = {i.name: i for i in session.get_inputs()}
    shapes = {name: list(shape) for name, shape in request["inputs"].items()}
    if request["inputs_file"]:
        file = Path(request["inputs_file"]).name
        with np.load(request["inputs_file"]) as data:
            given = {k: data[k] for k in data.files if k not in request["frozen"]}
        check_input_names(source.graph, list(given), f"validation.inputs {file}")
        missing = signature.keys() - given.keys()
        if missing:
            raise ModelError(f"validation.inputs {file}: keys {sorted(given)} do not include the model's inputs "
                             f"{sorted(missing)}")
        for name in signature:
            shape = signature[name].shape
            array = given[name]
            if len(shape) != array.ndim or any(
                    isinstance(d, int) and d > 0 and d != s for d, s in zip(shape, array.shape, strict=True)):
                raise ModelError(f"validation.inputs {file}: '{name}' has shape {list(array.shape)}, the model "
                                 f"wants {shape}")
        return {name: given[name] for name in signature}, {}
    rng = np.random.default_rng(SEED)
    feeds, notes = {}, {}
    model_shapes = None
    for name, info in signature.items():
        shape = shapes.get(name) or info.shape
        if any(d == 0 for d in shape):
            raise ModelError(f"input '{name}' has a zero-size dimension ({shape}): nothing to generate; give "
                             "validation.inputs or another shape in inputs")
        if not all(isinstance(d, int) and d > 0 for d in shape):
            raise ModelError(f"input '{name}' has symbolic shape {info.shape}: set inputs.{name} in the model's "
                             f"manifest entry or give validation.inputs")
        dtype = _dtype(info.type)
        size = math.prod(shape) * dtype.itemsize  # before any allocation: a typo in `inputs` can ask for TiBs
        if size > GENERATED_LIMIT:
            raise ModelError(f"input '{name}' of shape {shape} would take {size / 2**30:,.1f} GiB to generate (at "
                             f"most {GENERATED_LIMIT / 2**30:g} GiB); check inputs.{name} or give validation.inputs")
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b" or "mask" in name.lower():
            feeds[name] = _mask(shape, dtype)
            notes[name] = "padding mask"
        else:
            model_shapes = model_shapes or known_shapes(source)
            bound = index_bound(source.graph, name, model_shapes)
            high = bound if bound else 2
            feeds[name] = rng.integers(0, high, shape).astype(dtype)
            notes[name] = (f"indices in [0, {high}) (the dimension it indexes)" if bound else
                           "integers in [0, 2): no Gather shows their range; give validation.inputs for real values")
    return feeds, notes


def feeds_for(session: Any, feeds: dict[str, Any], frozen: dict[str, list[float]], what: str) -> dict[str, Any]:
    """The feeds one session takes: its own true inputs, frozen inputs with their frozen values."""
    import numpy as np

    chosen = {}
    for value in session.get_inputs():
        if value.name in frozen:
            array = np.array(frozen[value.name], dtype=_dtype(value.type))
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in value.shape]
            chosen[value.name] = np.full(shape, array[0], dtype=array.dtype) if array.size == 1 else array.reshape(
                shape)
        elif value.name in feeds:
            chosen[value.name] = feeds[value.name]
        else:
            raise ModelError(f"the {what} has input '{value.name}', which the artifact does not have; compare with "
                             "a reference of the same inputs (validation.reference) or freeze it")
    return chosen


def structural_problems(request: dict[str, Any]) -> list[str]:
    """Without running: referenced files exist; EPContext source, embed mode and SDK version match the target."""
    import onnx

    info = lookup(request["ep"])
    artifact = Path(request["artifact"])
    problems = [f"file {Path(name).name} listed in {SIDECAR} is missing" for name in request["files"]
                if not Path(name).is_file()]
    if problems:
        return problems
    model = onnx.load(str(artifact), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location" and not (artifact.parent / entry.value).is_file():
                problems.append(f"initializer {tensor.name} references missing file {entry.value}")
    if info.is_cpu:
        return problems
    contexts = [n for n in model.graph.node if n.op_type == EP_CONTEXT]
    if not contexts:
        problems.append(f"no EPContext node: the artifact holds nothing compiled for {info.name}")
    for node in contexts:
        attributes = node_attributes(node)
        source = attributes.get("source", b"").decode()
        if source != info.name:
            problems.append(f"EPContext node {node.name} comes from '{source}', the target's EP is {info.name}")
        embed_mode = attributes.get("embed_mode", 1)
        if embed_mode != int(request["embed"]):
            problems.append(f"EPContext node {node.name} has embed_mode {embed_mode}, the target says "
                            f"embed = {str(request['embed']).lower()}")
        if embed_mode == 0 and attributes.get("main_context", 1) != 0:  # main_context 0: refers to the main node
            name = attributes.get("ep_cache_context", b"").decode()
            if not name or not (artifact.parent / name).is_file():
                problems.append(f"EPContext node {node.name} references missing context binary {name or '(none)'}")
        sdk = (attributes.get("ep_sdk_version") or b"").decode()
        if request["ep_sdk_version"] and sdk != request["ep_sdk_version"]:
            problems.append(f"EPContext node {node.name} has ep_sdk_version {sdk}, the build recorded "
                            f"{request['ep_sdk_version']}")
    return problems


def context_binaries(artifact: str) -> set[str]:
    import onnx

    model = onnx.load(artifact, load_external_data=False)
    return {onnx.helper.get_attribute_value(a).decode() for n in model.graph.node if n.op_type == EP_CONTEXT
            for a in n.attribute if a.name == "ep_cache_context"}


def _validate_group(request: ValidationRequest) -> ValidationReport:
    """Structural checks of every member (and, for EPs writing one binary, that all reference the same one),
    then each member run against its source where this host can load the shared context."""
    reports: dict[str, dict[str, Any]] = {}
    for name, member in request["members"].items():
        problems = structural_problems(member)
        reports[name] = {"status": "failed", "reason": "; ".join(problems)} if problems else {"status": "passed"}
    failures = [f"{name}: {r['reason']}" for name, r in reports.items() if r["status"] == "failed"]
    if not failures and request["one_binary"]:
        referenced = {name: sorted(context_binaries(m["artifact"])) for name, m in request["members"].items()}
        if len({tuple(v) for v in referenced.values()}) != 1:
            failures.append(f"members reference different context binaries: {referenced}")
    if failures:
        return {"status": "failed", "reason": "; ".join(failures), "members": reports}
    if request["run_blocked"]:
        return {"status": "skipped", "structural": "passed", "reason": request["run_blocked"], "members": reports}
    for name, member in request["members"].items():
        if member["mode"] == "run":
            reports[name] = validate_member(member)
    statuses = {r["status"] for r in reports.values()}
    status = "failed" if "failed" in statuses else "skipped" if "skipped" in statuses else "passed"
    report: dict[str, Any] = {"status": status, "members": reports}
    if status != "passed":
        report["reason"] = "; ".join(f"{name}: {r['reason']}" for name, r in reports.items() if "reason" in r)
    return report


def session_options(ort: Any) -> Any:
    """Options for a validation session: errors only, and pool threads that block instead of spinning between
    ops. A build runs jobs beside each other (the build process, `-n N`): spinning threads took the cores those
    need, and a tiny model's validation waited a scheduler tick (4 ms) about every other run."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def run_on_cpu(ort: Any, path: str, request: dict[str, Any], feeds: dict[str, Any], what: str) -> dict[str, Any]:
    """Outputs of a reference model on the CPU EP, fed what it takes (frozen inputs with their values)."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    options = session_options(ort)
    inputs = {k: v for k, v in request["inputs"].items() if k in {i.name for i in model.graph.input}}
    for name, value in static_dims(model, inputs, needs_static=False).items():
        options.add_free_dimension_override_by_name(name, value)
    del model
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    chosen = feeds_for(session, feeds, request["frozen"], what)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, chosen), strict=True))


def _open_session(ort: Any, info: EpInfo, request: MemberValidation) -> tuple[Any, ValidationReport | None]:
    """The artifact's session on its EP with CPU fallback disabled where the compile left nothing on CPU; or a
    report: skipped when this host cannot run the EP, failed when the EP cannot load the artifact."""
    from ..execute.host import register_plugin, select_ep_device

    options = session_options(ort)
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if not info.is_cpu:
        try:
            register_plugin(ort, info)
            device = select_ep_device(ort, info, request["device"])
        except (ImportError, OSError, RuntimeError) as exc:
            return None, {"status": "skipped", "reason": f"this host cannot run {info.name}: {exc}"}
        options.add_provider_for_devices([device], request["options"])
        if request["cpu_nodes"] == 0:
            options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        session = ort.InferenceSession(request["artifact"], options,
                                       providers=["CPUExecutionProvider"] if info.is_cpu else None)
        session.disable_fallback()  # no silent retry on CPU after an EP failure
    except Exception as exc:  # noqa: BLE001 - the EP's own error is the report
        foldable = request.get("foldable_on_cpu") or {}
        hint = (f"; {sum(foldable.values())} node(s) left on CPU only compute constants ({', '.join(foldable)}) in "
                "front of the EPContext node, which QNN does not load: fold them (the default for NPU targets, "
                "without optimize = \"none\")") if foldable else ""
        return None, {"status": "failed",
                      "reason": f"{info.name} could not load the artifact: {str(exc).strip()}{hint}"}
    return session, None


def _placement_failures(session: Any, info: EpInfo, cpu_nodes: int) -> tuple[dict[str, list[str]], list[str]]:
    """Which EP ran which op types, and failures when the EPContext nodes or more nodes than the compile left
    there ran on CPU (a fallback)."""
    assignment = session.get_provider_graph_assignment_info() or []
    ran_on: dict[str, list[str]] = {}
    for subgraph in assignment:
        ops = ran_on.setdefault(subgraph.ep_name, [])
        ops.extend(node.op_type for node in subgraph.get_nodes() if node.op_type not in ops)
    if info.is_cpu:
        return ran_on, []
    failures = []
    if "EPContext" in ran_on.get("CPUExecutionProvider", []) or "EPContext" not in ran_on.get(info.name, []):
        failures.append(f"the EPContext nodes did not run on {info.name} (assignment: {ran_on})")
    on_cpu = sum(len(sg.get_nodes()) for sg in assignment if sg.ep_name == "CPUExecutionProvider")
    if on_cpu > cpu_nodes:
        failures.append(f"{on_cpu} nodes fell back to CPU, the compiled model left {cpu_nodes} there")
    return ran_on, failures


def _compare_outputs(session: Any, outputs: list[Any], expected: dict[str, Any],
                     thresholds: dict[str, float]) -> tuple[dict[str, Any], list[str]]:
    """Metrics per output against the reference, and a failure per threshold missed."""
    import numpy as np

    metrics, failures = {}, []
    for output, got in zip(session.get_outputs(), outputs, strict=True):
        name, want = output.name, expected.get(output.name)
        if want is None:
            failures.append(f"output '{name}' does not exist in the reference model")
            continue
        metrics[name] = compare(got, want)
        reference_nonfinite = int((~np.isfinite(want)).sum()) if want.dtype.kind == "f" else 0
        failures.extend(check(name, metrics[name], reference_nonfinite, thresholds))
    return metrics, failures


def _is_qdq(path: str) -> bool:
    import onnx

    model = onnx.load(path, load_external_data=False)
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)


def validate_member(request: MemberValidation) -> ValidationReport:
    """Structural checks; then run the artifact on its EP, check where it ran, and compare every output with the
    reference model on CPU, fed the same inputs."""
    problems = structural_problems(request)
    if problems:
        return {"status": "failed", "reason": "; ".join(problems)}
    if request["mode"] == "structural":
        return {"status": "passed"}

    import onnx
    import onnxruntime as ort

    info = lookup(request["ep"])
    session, refused = _open_session(ort, info, request)
    if refused:
        return refused
    source = onnx.load(request["source"], load_external_data=False)
    with located(request["manifest"], request["entry"]):
        feeds, generated = make_inputs(session, source, request)
    del source
    hint = ("; generated integer inputs " + ", ".join(f"{k}: {v}" for k, v in generated.items())
            if any("give validation.inputs" in v for v in generated.values()) else "")
    try:
        outputs = session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - the EP's own error is the report
        return {"status": "failed", "reason": f"{info.name} could not run the artifact: {str(exc).strip()}{hint}"}
    ran_on, failures = _placement_failures(session, info, request["cpu_nodes"])

    kind = "qdq" if _is_qdq(request["reference"]) else request["precision"]
    thresholds = {**DEFAULT_THRESHOLDS[kind], **request["thresholds"]}
    with located(request["manifest"], request["entry"]):
        expected = run_on_cpu(ort, request["reference"], request, feeds, "reference model")
    metrics, missed = _compare_outputs(session, outputs, expected, thresholds)
    failures += missed
    if failures and hint:
        failures[-1] += hint
    flat = [name for name, m in metrics.items() if m.get("near_constant")]
    notes = [f"the reference output {', '.join(repr(n) for n in flat)} is nearly constant for "
             f"{'these' if request['inputs_file'] else 'generated'} inputs: SNR and cosine say nothing there, so "
             "it is judged by its error at the output's scale; give validation.inputs with realistic data"] if flat \
        else []
    report: ValidationReport = {
        "status": "failed" if failures else "passed", "precision": kind, "thresholds": thresholds,
        "ran_on": ran_on, "outputs": metrics, **({"notes": notes} if notes else {}),
        "inputs": {"from": request["inputs_file"] or f"generated, seed {SEED}",
                   "shapes": {k: list(v.shape) for k, v in feeds.items()},
                   **({"generated": generated} if generated else {}),
                   **({"frozen": request["frozen"]} if request["frozen"] else {})}}
    if request["float_reference"]:  # a quantized artifact: its error against the float model, for information
        float_outputs = run_on_cpu(ort, request["float_reference"], request, feeds, "float model")
        report["against_float_model"] = {output.name: compare(got, float_outputs[output.name])
                                         for output, got in zip(session.get_outputs(), outputs, strict=True)
                                         if output.name in float_outputs}
    if failures:
        report["reason"] = "; ".join(failures)
    return report


def _validate_in_child(request: ValidationRequest) -> ValidationReport:
    if request["shared"]:
        return _validate_group(request)
    (member,) = request["members"].values()
    return validate_member(member)


def main() -> None:
    """`python -m` this module, or a fork server's child or warm worker, runs this."""
    serve(_validate_in_child)


if __name__ == "__main__":
    main()
