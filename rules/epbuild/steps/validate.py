"""Validating a compiled artifact: run it on its EP in a fresh child and compare with the source model on CPU.

Never passes on a CPU fallback: Python's retry-on-CPU is disabled, `session.disable_cpu_ep_fallback=1` is set
whenever the compile left no node on CPU, and the recorded EP assignment must put every EPContext node on the
target's EP (an artifact that keeps nodes on CPU by design, such as QNN's graph-I/O quantize/dequantize, may keep
exactly those there). `skipped` means only "this host cannot run this artifact" and is never counted as passed.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..contracts.artifact import OMIT, ArtifactMember, ArtifactRecord, read_artifact
from ..contracts.jobs import ValidationJob, ValidationMember, ValidationReport
from ..contracts.statuses import ValidationMode, Verdict
from ..contracts.validation import ValidationRecord, read_validation
from ..errors import BuildError, located, plain
from ..execute.child import run_child, serve
from ..execute.forked_jobs import Handoff
from ..files.layout import write_json
from ..files.owners import owner_tag
from ..files.publish import discard
from ..files.weights import weights_folder
from ..manifest.builds import REPORT, SIDECAR, Build, Member
from ..manifest.eps import EpInfo, known
from ..manifest.stage import Stage
from ..store.cache import Cached, Outcome, Workspace, through_cache
from ..store.task_configs import Published, published
from ..version import RULES_FORMAT
from .compilers import compiler
from .diagnosis import failure_hints, fp16_hint, openvino_16bit_line, sixteen_bit_qdq
from .expected_peak import build_limits
from .packaging.package import GENAI_CONFIG
from .validation.artifact_session import context_binaries, is_qdq, open_session, placement_failures, structural_problems
from .validation.cached_reference import run_against_reference, run_group_against_references, run_pipeline_against_cache
from .validation.comparison import DEFAULT_THRESHOLDS, compare, compare_outputs
from .validation.compatibility import answer
from .validation.fleet import fleet_verdict
from .validation.fleet import summary as fleet_summary
from .validation.localise import localise
from .validation.localise import summary as localised
from .validation.pipeline import validate_pipeline
from .validation.pipeline_checks import genai_validation
from .validation.reference import (
    ReferenceUnusable,
    load_reference,
    reference_run,
    save_reference,
    session_options,
)
from .validation.repeatability import repeatability
from .validation.selection import selected_outputs
from .validation.validation_inputs import SEED, feeds_for, listed_weights

STRUCTURAL_ONLY = ('validate = "structural": its files and EPContext attributes were checked, nothing was run, so '
                   "nothing it computes was judged")


def member_request(build: Build, member: Member, folder: Path, record: ArtifactRecord,
                   entry: ArtifactRecord | ArtifactMember) -> ValidationMember:
    """One artifact's request; `entry` is the member's part of its artifact record (nodes, SDK version). A quantized
    artifact is compared with its float model too, for information; frozen inputs are fed to the reference with
    the values the artifact was built with."""
    target, settings = build.target, member.validation
    runtime_files = target.runtime_files()
    stages = [stage for stage in build.stages if stage.model == member.name]
    declared = member.declared or member.model.path
    reference = settings.reference or member.model.path
    fields: dict[str, Any] = {
        "float_reference": str(member.float_model) if member.float_model else None,
        "float_reference_is": describe(member.float_model, declared, stages) if member.float_model else "",
        "artifact": str(folder / member.model_file), "files": [str(folder / name) for name in record.files],
        "ep_sdk_version": entry.ep_sdk_version if entry.ep_sdk_version is not OMIT else None,
        "compatibility": entry.compatibility if entry.compatibility is not OMIT else None,
        "cpu_nodes": entry.nodes["cpu"] + entry.nodes.get("cpu_in_subgraphs", 0),  # as a session counts
        "foldable_on_cpu": entry.nodes.get("foldable_on_cpu", {}),
        "source": str(member.model.path), "reference": str(reference), "declared": str(declared),
        "weights": member.weights,
        "reference_is": describe(reference, declared, stages),
        "ep": target.ep.alias, "device": target.device, "embed": target.embed, "mode": settings.mode,
        "options": {key: str(folder / value) if key in runtime_files else value
                    for key, value in record.runtime_options.items()},
        "inputs": {name: list(shape) for name, shape in member.model.inputs.items()},
        "inputs_file": str(settings.inputs) if settings.inputs else None,
        "precision": target.precision(), "thresholds": settings.thresholds,
        "frozen": {name: list(values) for name, values in (member.frozen or {}).items()},
        "entry": f"models.{member.name}", "manifest": build.manifest, "target": target.name,
        "localise": settings.localise, "compile_options": target.session_options(),
        "repeat_within_s": settings.repeat_within_s, "timeout_s": settings.timeout_s,
        "localise_budget_s": settings.timeout_s / 2,
    }
    return ValidationMember(**fields, task=settings.task or None)


def describe(path: Path, declared: Path, stages: list[Stage]) -> str:
    """What a model the validation runs on CPU is, for messages: the user asked which step's file failed."""
    if path == declared:
        return f"the model as declared ({declared.name})"
    made_by = next((stage.task for stage in stages if stage.output == path), None)
    return f"the output of {made_by}" if made_by else f"validation.reference ({path.name})"


def validation_request(build: Build, folder: Path) -> ValidationJob:
    """What the validating child needs: each member's artifact, what the sidecar recorded, reference, settings."""
    record = read_artifact(folder)
    entries = record.member_entries()
    members = {m.name: member_request(build, m, folder, record, entries[m.name]) for m in build.members}
    machine = platform.machine().lower().replace("amd64", "x86_64")
    pipeline = None
    if build.pipeline_tokens:
        alone: dict[str, ValidationMember | None] = {}
        for member in build.members:
            own = dict(build.alone).get(member.name)
            sidecar = own[0].parent / SIDECAR if own else None
            if sidecar is None or not sidecar.is_file():
                alone[member.name] = None
                continue
            single = read_artifact(sidecar.parent)
            alone[member.name] = member_request(build, member, sidecar.parent, single, single)
        pipeline = {"tokens": build.pipeline_tokens, "alone": alone}
    return ValidationJob(members, build.shared, build.target.ep.shares_one_binary,
                         build.target.ep.shared_context_unloadable.get(machine) if build.shared else None, pipeline)


def validate(build: Build, workspace: Workspace, workdir: Path, folder: Path | None = None,
             package: dict[str, Any] | None = None, log: Path | None = None) -> ValidationReport:
    """Validate the published artifact of `build` (or its copy in `folder`), its child working in `workdir`;
    return the report. With `package` (root, component, variant) the artifact's session is the one ONNX Runtime
    creates for the variant it selects from that model package for the target's EP, in a fresh child (a warm
    worker may hold a session of the same context binary, which QNN's simulator does not load twice).

    A crash or timeout of the child becomes a `failed` report naming the signal or timeout."""
    started = time.monotonic()
    layout = workspace.layout
    folder, target = folder or build.out_dir(layout), build.target
    report = compiler(target).validate(build, layout)
    if report is None:
        timeout = sum(m.validation.timeout_s for m in build.members)
        request = validation_request(build, folder)
        members = request.members
        if package:  # a group member's component: GROUP.MODEL
            members = {name: _relocate(dataclasses.replace(member, package={**package, "component": f"{build.name}."
                                                                             f"{name}"} if build.shared else package),
                                       package["assets"]) for name, member in members.items()}
        what = f"validate {'group ' if build.shared else ''}{build.name} ({target.ep.name})"
        what += " through its package" if package else ""
        log = log or build.log(layout, "validate")
        fleet = bool(build.soc_reports)  # a multi-SoC binary: checked structurally, each SoC run alone
        if fleet:
            members = {name: dataclasses.replace(member, mode=ValidationMode.STRUCTURAL)
                       for name, member in members.items()}
        request = dataclasses.replace(request, members=members)
        try:
            if build.shared and request.pipeline:
                report = run_pipeline_against_cache(build, workspace, request, workdir, what, log, timeout)
            elif build.shared and not request.run_blocked:
                report = run_group_against_references(build, workspace, request, workdir, what, log, timeout)
            elif (fleet or build.shared or build.members[0].validation.mode != ValidationMode.RUN
                  or build.members[0].package):
                report = run_child("epbuild.steps.validate", request.to_json(), workdir,
                                   build_limits(build, workspace, "validate", timeout), what, log,
                                   ep=target.fork_server, reuse=target.ep.warm_validations and not package,
                                   expect=workspace.provenance, links=workspace.links)
            else:
                report = run_against_reference(build, workspace, request, workdir, what, log, timeout,
                                               reuse=target.ep.warm_validations and not package)
        except BuildError as exc:
            report = {"status": Verdict.FAILED, "reason": str(exc)}
        if fleet:
            record = read_artifact(folder)
            report = fleet_verdict(build, report, next(iter(request.members.values())).compatibility,
                                   record.soc_pruning if record.has("soc_pruning") else None)
    if "reason" in report:  # an EP's colour codes: reports are read as text
        report["reason"] = plain(report["reason"])
    who = {"group": build.name} if build.shared else {"model": build.members[0].name}
    mode = "group" if build.shared else build.members[0].validation.mode
    return {"format": RULES_FORMAT, **who, "target": target.name, "ep": target.ep.name, "mode": mode,
            "seconds": round(time.monotonic() - started, 3), **report}


def _relocate(member: ValidationMember, assets: dict[str, str]) -> ValidationMember:
    """A package's shared assets (option files) are not in the variant's folder: its files and provider options
    name them where the package holds them."""
    return dataclasses.replace(
        member, files=[assets.get(Path(path).name, path) for path in member.files],
        options={key: assets.get(Path(value).name, value) if Path(value).is_absolute() else value
                 for key, value in member.options.items()})


# outside its fingerprint, never cached: the compatibility answer depends on this host's devices, which the
# fingerprint names only by machine and CPU
NOT_CACHED = ("target", "seconds", "usage", "worker", "cpu_reference", "compatibility")
# in the build report, not beside the artifact: a restored verdict and a fresh one give the same validation.json
NOT_PUBLISHED = ("seconds", "usage", "worker", "cpu_reference", "compatibility")


def cached_validation(label: str, fingerprint: str, workspace: Workspace, folder: Path,
                      produce: Callable[[Path], dict[str, Any]], identity: dict[str, Any],
                      inputs: dict[Path, list[int] | None],
                      target: str) -> tuple[dict[str, Any], Outcome, Published]:
    """A verdict through the cache protocol (`through_cache`): a passed report for this exact artifact, settings and
    host restored, or `produce(workdir)`; either way written into the artifact `folder` as `validation.json`,
    atomically, with the `target` named there: a restored report and a fresh one give the same file. Only passed
    reports are stored (without the target's name, timings or the worker): a failure or a skip is worth re-checking.
    Also the written file's identity for the settings record, read under the fingerprint's lock: a concurrent
    builder of the same task removes the verdict before it waits for the lock, so after the lock the file may be
    gone (or its own)."""
    scratch = workspace.layout.scratch(f"validation.{fingerprint[:16]}.{owner_tag()}")

    def kept(report: dict[str, Any]) -> list[str] | None:
        if report["status"] not in (Verdict.PASSED, Verdict.STRUCTURAL):  # verdicts of these bytes alone
            return None
        cached = ValidationRecord.from_json({k: v for k, v in report.items() if k not in NOT_CACHED})
        write_json(scratch / REPORT, cached.to_json())
        return [REPORT]

    def written(restored: Path, found: list[str] | None,
                report: dict[str, Any] | None) -> tuple[dict[str, Any], Published]:
        if found is not None:
            report = read_validation(restored).replace(target=target).to_json()
            write_json(folder / REPORT, report)
        else:
            assert report is not None
            published = ValidationRecord.from_json({k: v for k, v in report.items() if k not in NOT_PUBLISHED})
            write_json(folder / REPORT, published.to_json())
        return report, _identity(folder, workspace)

    try:
        (report, identity_after), outcome = through_cache(Cached(label, fingerprint, inputs, identity, [REPORT]),
                                                           workspace, scratch, produce, kept, written)
    finally:
        discard(scratch)
    return report, outcome, identity_after


def _identity(folder: Path, workspace: Workspace) -> Published:
    """The verdict's identity for the settings record; none when a concurrent builder of the same task removed it
    (it removes a verdict before taking the lock, and writes its own): the next run checks the file afresh."""
    try:
        return published([folder / REPORT], workspace.hashes, workspace.project_root)
    except FileNotFoundError:
        return {}


def summary(report: dict[str, Any]) -> str:
    """The key metric and which EP ran the EPContext nodes, or the reason it did not pass."""
    if report["status"] not in (Verdict.PASSED, Verdict.STRUCTURAL):
        return report.get("reason", "")
    if "summary" in report:  # a group's pipeline
        return report["summary"]
    if "socs" in report:  # a multi-SoC binary
        return fleet_summary(report)
    if report["status"] == Verdict.STRUCTURAL:
        return ("structural checks only: every referenced file exists, EPContext attributes match the target; "
                "nothing was run")
    if "ran_on" in report and "outputs" not in report and "members" not in report:
        return f"qaic-qpc validate on {', '.join(next(iter(report['ran_on'].values())))}"
    if "members" in report:
        return "; ".join(f"{name}: {summary({'mode': 'run', **member})}" for name, member in report["members"].items())
    if "task" in report:  # the task metric decided; the tensors beside it
        from .validation.task_metrics import summary as task_summary

        tensors = summary({key: value for key, value in report.items() if key != "task"})
        misses = report["task"].get("tensors")
        return f"{task_summary(report['task'])}; tensors: {tensors}" + (
            f" (missed, not deciding: {'; '.join(misses)})" if isinstance(misses, list) else "")
    outputs = [o for o in report["outputs"].values() if not o.get("selection", {}).get("direct")]
    kept = [o["selection_overlap"] for o in report["outputs"].values() if "selection_overlap" in o]
    chose = f", {min(kept):.0%} of the selection kept" if kept else ""
    ran = "; ".join(f"{', '.join(ops)} on {ep}" for ep, ops in report["ran_on"].items())
    if not outputs:
        return f"selection kept {min(kept):.0%} ({report['precision']}; {ran})"
    snr = min(o["snr_db"] for o in outputs)
    max_abs = max(o["max_abs_error"] for o in outputs)
    return f"SNR {snr:.1f} dB, max abs error {max_abs:.2e}{chose} ({report['precision']}; {ran})"


# ---- child process ----


def _validate_group(request: ValidationJob) -> ValidationReport:
    """Structural checks of every member (and, for EPs writing one binary, that all reference the same one),
    then each member run against its source where this host can load the shared context."""
    reports: dict[str, dict[str, Any]] = {}
    for name, member in request.members.items():
        problems = structural_problems(member)
        reports[name] = ({"status": Verdict.FAILED, "reason": "; ".join(problems)} if problems
                         else {"status": Verdict.PASSED})
    failures = [f"{name}: {r['reason']}" for name, r in reports.items() if r["status"] == Verdict.FAILED]
    if not failures and request.one_binary:
        referenced = {name: sorted(context_binaries(m.artifact)) for name, m in request.members.items()}
        if len({tuple(v) for v in referenced.values()}) != 1:
            failures.append(f"members reference different context binaries: {referenced}")
    if failures:
        return {"status": Verdict.FAILED, "reason": "; ".join(failures), "members": reports}
    if request.pipeline:
        return {**validate_pipeline(request), "members": reports}
    if request.run_blocked:
        return {"status": Verdict.SKIPPED, "structural": Verdict.PASSED, "reason": request.run_blocked,
                "members": reports}
    kept, save_to = request.references or {}, request.references_to or {}
    saved: dict[str, Any] = {}
    for name, member in request.members.items():
        if member.mode == ValidationMode.RUN:
            try:
                reference, saved[name] = _reference_for(member, kept.get(name), save_to.get(name))
            except ReferenceUnusable as exc:
                reports[name] = {"status": Verdict.FAILED, "reason": str(exc)}
                continue
            reports[name] = validate_member(member, reference)
            # this host's devices' answer stays out of a group's verdict file: a restored one must equal a fresh one
            reports[name].pop("compatibility", None)
        else:
            reports[name] = {"status": Verdict.STRUCTURAL, "reason": STRUCTURAL_ONLY}
    statuses = {r["status"] for r in reports.values()}
    status = next((s for s in (Verdict.FAILED, Verdict.INCONCLUSIVE, Verdict.SKIPPED, Verdict.STRUCTURAL)
                   if s in statuses), Verdict.PASSED)
    report: dict[str, Any] = {"status": status, "members": reports, **({"references": saved} if saved else {})}
    if status != Verdict.PASSED:
        report["reason"] = "; ".join(f"{name}: {r['reason']}" for name, r in reports.items() if "reason" in r)
    return report


def _reference_for(member: ValidationMember, kept: str | None, save_to: str | None) -> tuple[dict[str, Any],
                                                                                            dict[str, Any]]:
    """A member's CPU reference: from the folder the job restored it into (`kept`), else computed here and saved
    into `save_to` for the cache where the disk lets it; and what to tell the job about that saving. Raises
    ReferenceUnusable."""
    if kept:
        return load_reference(Path(kept)), {}
    import onnxruntime as ort

    with located(member.manifest, member.entry):
        reference = reference_run(ort, member)
    if not save_to:
        return reference, {}
    try:
        save_reference(reference, Path(save_to))
    except OSError as exc:  # a full disk: the validation goes on, its reference is not kept
        return reference, {"reference_unsaved": f"{exc.strerror or exc} ({exc.filename or save_to})"}
    return reference, {"reference_saved": True}



def _localise(ort: Any, info: EpInfo, request: ValidationMember, feeds: dict[str, Any],
              thresholds: dict[str, float]) -> dict[str, Any] | None:
    """Where the EP departs from CPU on the model the artifact was compiled from; None for CPU targets (both
    sides would be ONNX Runtime's CPU EP)."""
    from ..execute.host import select_ep_device

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


def _openvino_16bit(ort: Any, info: EpInfo, request: ValidationMember, reference: dict[str, Any],
                    thresholds: dict[str, float], graph: Any) -> str | None:
    """OpenVINO on a model with 16-bit Q/DQ: its own plain session of the model compiled from, as far from CPU
    too, shows the plugin computes it wrongly (the same model passes on QNN); None where that is not what happened."""
    found = sixteen_bit_qdq(graph) if info.name == "OpenVINOExecutionProvider" else {}
    if not found:
        return None
    from ..execute.host import select_ep_device

    options = session_options(ort)
    options.add_provider_for_devices([select_ep_device(ort, info, request.device)], request.compile_options)
    try:
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
    repeated, varies = repeatability(session, feeds, outputs, seconds, thresholds, kind,
                                     request.repeat_within_s)
    if varies:
        failures.insert(0, varies)
    metrics, missed, undecided = compare_outputs(session, outputs, reference["expected"], thresholds, kind,
                                                 selected_outputs(compared_graph))
    task = None
    if request.task:  # the task metric decides; the tensors' misses are reported beside it
        from .validation.task_metrics import decide

        with located(request.manifest, request.entry):
            task, missed_task = decide(session, request, reference["dataset"], seconds,
                                       request.timeout_s - (time.monotonic() - began), info.name,
                                       [*missed, *undecided])
        failures += [missed_task] if missed_task else []
        missed, undecided = [], []
    failures += missed
    hints, sixteen = _why_missed(ort, info, request, reference, thresholds, compared_graph, metrics, kind) \
        if missed else ([], False)
    failures += hints
    del compared_graph
    localising = missed and request.localise and not sixteen  # it would crash inside OpenVINO's QDQ handling
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
        "inputs": {"from": request.inputs_file or f"generated, seed {SEED}",
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


def _validate_in_child(sent: dict[str, Any]) -> ValidationReport:
    request = ValidationJob.from_json(sent)
    if request.shared:
        return _validate_group(request)
    (member,) = request.members.values()
    phase = request.phase
    if phase == "artifact":  # the reference computed earlier, by another child or another target's validation
        return validate_member(member, load_reference(Path(str(request.reference))))
    if member.mode != ValidationMode.RUN:
        return validate_member(member)
    if (Path(member.artifact).parent / GENAI_CONFIG).is_file():  # a folder packaged for onnxruntime-genai
        return genai_validation(member)
    try:  # the reference first: its session is gone before the artifact's opens
        reference, saved = _reference_for(member, None, request.reference_to)
    except ReferenceUnusable as exc:
        return {"status": Verdict.FAILED, "reason": str(exc)}
    if phase == "reference":  # a large model's first child: the reference alone
        return {"status": "reference", **saved}
    return {**validate_member(member, reference), **saved}


def main(handoff: Handoff | None = None) -> None:
    """`python -m` this module, or a fork server's child or warm worker, runs this."""
    serve(_validate_in_child, handoff)


if __name__ == "__main__":
    main()
