"""One member's validation, in the validation child: its artifact run on its EP (never a silent CPU fallback: the
session and its placement are checked), every output compared position by position with the reference's on CPU,
fed the same inputs, the run repeated, a task metric deciding where one is configured, and what the report says of
outputs that missed (an fp16 or OpenVINO 16-bit explanation, hints, the first departing node). `steps.validate` is
the task's side and the child's entry."""

from __future__ import annotations

import time
from typing import Any

from ...contracts.jobs import ValidationMember, ValidationReport
from ...contracts.statuses import ValidationMode, Verdict
from ...errors import located
from ...files.weights import weights_folder
from ...manifest.eps import EpInfo, known
from ..diagnosis import failure_hints, fp16_hint, openvino_16bit_line, sixteen_bit_qdq
from .artifact_session import is_qdq, open_session, placement_failures, structural_problems
from .comparison import DEFAULT_THRESHOLDS, compare, compare_outputs
from .compatibility import answer
from .history import dirty
from .localise import localise
from .localise import summary as localised
from .precision import f32_would_hold
from .reference import (
    DATASET_NOTE,
    ReferenceUnusable,
    cpu_session,
    reference_run,
    seeded,
    session_options,
)
from .repeatability import repeatability
from .selection import selected_outputs
from .validation_inputs import SEED, feeds_for, listed_weights

STRUCTURAL_ONLY = ('validate = "structural": its files and EPContext attributes were checked, nothing was run, so '
                   "nothing it computes was judged")


def _localise(ort: Any, info: EpInfo, request: ValidationMember, feeds: dict[str, Any],
              thresholds: dict[str, float]) -> dict[str, Any] | None:
    """Where the EP departs from CPU on the model the artifact was compiled from; None for CPU targets (both
    sides would be ONNX Runtime's CPU EP)."""
    from ...execute.host import select_ep_device

    if info.is_cpu:
        return None

    def on_ep() -> Any:
        options = session_options(ort)
        options.add_provider_for_devices([select_ep_device(ort, info, request.device)],
                                         request.compile_options)
        return options

    try:
        return localise(ort, request.source, feeds, thresholds, on_ep, lambda: session_options(ort),
                        request.localise_budget_s, weights_folder(request.source, request.weights))
    except Exception as exc:  # noqa: BLE001 - the validation's own result stands; say why there is no more
        return {"found": False, "error": " ".join(str(exc).split())[:300]}


def _after_other_graph(ort: Any, info: EpInfo, request: ValidationMember) -> tuple[Any, str | None]:
    """The artifact's new session, opened after another graph ran on its EP with the target's options; or why
    there is none (the repeat is then the same session's, and validation.json says so)."""
    from ...execute.host import select_ep_device

    options = session_options(ort)
    options.add_provider_for_devices([select_ep_device(ort, info, request.device)], request.compile_options)
    why = dirty(ort, options)
    if why:
        return None, f"another graph could not run on {info.name} before it: {why}"
    fresh, refused = open_session(ort, info, request)
    return (fresh, None) if fresh is not None else (None, str((refused or {}).get("reason", "")))


def _openvino_16bit(ort: Any, info: EpInfo, request: ValidationMember, reference: dict[str, Any],
                    thresholds: dict[str, float], graph: Any) -> str | None:
    """OpenVINO on a model with 16-bit Q/DQ: its own plain session of the model compiled from, as far from CPU
    too, shows the plugin computes it wrongly (the same model passes on QNN); None where that is not what happened."""
    found = sixteen_bit_qdq(graph) if info.name == "OpenVINOExecutionProvider" else {}
    if not found:
        return None
    from ...execute.host import select_ep_device

    options = session_options(ort)
    options.add_provider_for_devices([select_ep_device(ort, info, request.device)], request.compile_options)
    try:
        seeded(ort)
        plain = ort.InferenceSession(request.source, options)
        got = plain.run(None, feeds_for(plain, reference["feeds"], request.frozen, "quantized model"))
    except Exception as exc:  # noqa: BLE001 - the plugin's own failure is the evidence
        return openvino_16bit_line(found, None, " ".join(str(exc).split())[:160])
    snrs = [compare(value, reference["expected"][output.name])["snr_db"]
            for output, value in zip(plain.get_outputs(), got, strict=True) if output.name in reference["expected"]]
    worst = min(snrs, default=None)
    if worst is None or worst >= thresholds.get("min_snr_db", 0.0):
        return None  # OpenVINO computes the model itself right: the compile's result is the one to question
    return openvino_16bit_line(found, worst, None)


def validate_member(request: ValidationMember, reference: dict[str, Any] | None = None) -> ValidationReport:
    """Structural checks; then run the artifact on its EP, check where it ran, and compare every output with the
    reference's on CPU, fed the same inputs (`reference_run`: computed here before the artifact's session opens,
    or earlier by another child or another target's validation, `cached_reference`)."""
    problems = structural_problems(request)
    if problems:
        return {"status": Verdict.FAILED, "reason": "; ".join(problems)}
    if request.mode == ValidationMode.STRUCTURAL:
        return {"status": Verdict.STRUCTURAL, "reason": STRUCTURAL_ONLY}

    import onnx
    import onnxruntime as ort

    began = time.monotonic()
    info = known(request.ep)
    opened = _opened(ort, info, request, reference)
    if isinstance(opened, dict):
        return opened
    session, feeds, reference = opened
    generated = reference["generated"]
    hint = ("; generated integer inputs " + ", ".join(f"{k}: {v}" for k, v in generated.items())
            if any("give validation.inputs" in v for v in generated.values()) else "")
    try:
        started = time.perf_counter()
        outputs = session.run(None, feeds)
        seconds = time.perf_counter() - started
    except Exception as exc:  # noqa: BLE001 - the EP's own error is the report
        return {"status": Verdict.FAILED, "reason": f"{info.name} could not run the artifact: {str(exc).strip()}{hint}"}
    ran_on, failures = placement_failures(session, info, request.cpu_nodes, recorded=not request.package)
    compatibility = request.compatibility
    judged = answer(ort, info.name, [compatibility]) if compatibility else None

    compared_graph = onnx.load(request.reference, load_external_data=False)  # read once: kind and selections
    kind = "qdq" if is_qdq(compared_graph) else request.precision
    thresholds = {**DEFAULT_THRESHOLDS[kind], **request.thresholds}
    samples = None
    if request.task:  # its samples' other processes start now, while the repeat and the comparison run here
        from .task_metrics import decide, start

        with located(request.manifest, request.entry):
            samples = start(session, request, seconds, request.timeout_s - (time.monotonic() - began), info.name,
                            (feeds, outputs))
    try:
        repeated, varies = repeatability(session, feeds, outputs, seconds, thresholds, kind, request.repeat_within_s,
                                         info.name, (lambda: _after_other_graph(ort, info, request))
                                         if info.history_check else None)
        metrics, missed, undecided = compare_outputs(session, outputs, reference["expected"], thresholds, kind,
                                                     selected_outputs(compared_graph))
    except BaseException:
        if samples is not None:
            samples.runs.stop()
        raise
    if varies:
        failures.insert(0, varies)
    task, task_lost = None, False
    if request.task:  # the task metric decides; the tensors' misses are reported beside it
        with located(request.manifest, request.entry):
            task, missed_task = decide(session, request, reference["dataset"], seconds,
                                       request.timeout_s - (time.monotonic() - began), info.name,
                                       [*missed, *undecided], lambda: cpu_session(ort, request.reference, request),
                                       (feeds, outputs), samples)
        failures += [missed_task] if missed_task else []
        task_lost = missed_task is not None  # localise looks for where it departs as for a tensor miss
        missed, undecided = [], []
    failures += missed
    leftovers = bool(repeated.get("leftovers"))  # the misses may be what ran before: no hint, localise or reduce
    missed = [] if leftovers else missed
    held = f32_would_hold(ort, info, request, feeds, reference, thresholds, kind, selected_outputs(compared_graph),
                          request.timeout_s - (time.monotonic() - began)) if failures and not varies else None
    hints, sixteen = _why_missed(ort, info, request, reference, thresholds, compared_graph, metrics, kind) \
        if missed and not held else ([], False)
    failures += [held] if held else hints
    del compared_graph
    # (not where OpenVINO's 16-bit QDQ is the cause: it would crash inside its handling)
    localising = (missed or task_lost) and request.localise and not sixteen and not held
    divergence = _localise(ort, info, request, feeds, thresholds) if localising else None
    if divergence:
        failures.append(localised(divergence) if "error" not in divergence else
                        f"localise could not run: {divergence['error']}")
    if failures and hint:
        failures[-1] += hint
    notes = list(reference["notes"])
    status = Verdict.FAILED if failures else Verdict.INCONCLUSIVE if undecided else Verdict.PASSED
    report: ValidationReport = {
        "status": status, "precision": kind, "thresholds": thresholds,
        "ran_on": ran_on, "outputs": metrics, "repeatability": repeated, **({"notes": notes} if notes else {}),
        **({"task": task} if task else {}),
        **({"compatibility": {"answer": judged[0], "text": judged[1]}} if judged else {}),
        **({"divergence": divergence} if divergence else {}),
        **({"blame": "precision default"} if held else {}),  # not the EP's: no repro to reduce
        # the EP's, but a reduced graph run alone would not show it: docs/targets/qnn.md's repro is the report's
        **({"blame": "outputs left unwritten by the EP"} if leftovers else {}),
        "inputs": {"from": request.inputs_file or ("validation.dataset (its first samples)" if any(
                       note.startswith(DATASET_NOTE) for note in notes) else f"generated, seed {SEED}"),
                   "shapes": {k: list(v.shape) for k, v in feeds.items()},
                   **({"generated": generated} if generated else {}),
                   **({"frozen": request.frozen} if request.frozen else {})}}
    if request.float_reference:  # a quantized artifact: its error against the float model, for information
        floats = reference["floats"]
        report["against_float_model"] = {output.name: compare(got, floats[output.name])
                                         for output, got in zip(session.get_outputs(), outputs, strict=True)
                                         if output.name in floats}
    if failures or undecided:
        report["reason"] = "; ".join(failures) if failures else _undecided_reason(request, undecided)
    return report


def _opened(ort: Any, info: EpInfo, request: ValidationMember,
            reference: dict[str, Any] | None) -> tuple[Any, dict[str, Any], dict[str, Any]] | ValidationReport:
    """The reference run (first: its session is gone when the artifact's opens), the artifact's session and its
    feeds (the reference's, the frozen inputs, listed weights it asks for); or the failed report saying why not."""
    try:
        with located(request.manifest, request.entry):
            reference = reference or reference_run(ort, request)
    except ReferenceUnusable as exc:
        return {"status": Verdict.FAILED, "reason": str(exc)}
    session, refused = open_session(ort, info, request)
    if refused:
        return refused
    with located(request.manifest, request.entry):
        asked = {i.name for i in session.get_inputs()} - reference["feeds"].keys() - request.frozen.keys()
        weights = listed_weights(request.reference, asked) if asked else {}
        feeds = feeds_for(session, reference["feeds"], request.frozen, "artifact", weights)
    return session, feeds, reference


def _why_missed(ort: Any, info: EpInfo, request: ValidationMember, reference: dict[str, Any],
                thresholds: dict[str, float], compared_graph: Any, metrics: dict[str, Any],
                kind: str) -> tuple[list[str], bool]:
    """What the report says of outputs that missed their thresholds: an fp16 or OpenVINO 16-bit explanation where
    one holds (True with the latter: localising would crash inside OpenVINO's QDQ handling), else each miss's
    hints."""
    fp16 = fp16_hint(metrics, thresholds, request.target, request.entry) if kind == "fp16" else None
    sixteen = _openvino_16bit(ort, info, request, reference, thresholds, compared_graph)
    if fp16 or sixteen:
        return [fp16 or sixteen or ""], bool(sixteen)
    return failure_hints(metrics, thresholds, request, kind), False


def _undecided_reason(request: ValidationMember, undecided: list[str]) -> str:
    given = "these validation.inputs" if request.inputs_file else "generated inputs"
    return (f"{'; '.join(undecided)} ({given}); give validation.inputs with realistic data, or set "
            "validation.inconclusive = \"fail\" to fail such builds")
