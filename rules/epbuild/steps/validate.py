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
from ..manifest.builds import REPORT, SIDECAR, Build, Member
from ..manifest.stage import Stage
from ..store.cache import Cached, Outcome, Workspace, through_cache
from ..store.task_configs import Published, published
from ..version import RULES_FORMAT
from .compilers import compiler
from .expected_peak import build_limits
from .packaging.package import GENAI_CONFIG
from .validation.artifact_session import context_binaries, structural_problems
from .validation.cached_reference import run_against_reference, run_group_against_references, run_pipeline_against_cache
from .validation.fleet import fleet_verdict
from .validation.fleet import summary as fleet_summary
from .validation.member import STRUCTURAL_ONLY, validate_member
from .validation.pipeline import validate_pipeline
from .validation.pipeline_checks import genai_validation
from .validation.reference import (
    ReferenceUnusable,
    load_reference,
    reference_run,
    save_reference,
)


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
    ran = placed(report["ran_on"])
    if not outputs:
        return f"selection kept {min(kept):.0%} ({report['precision']}; {ran})"
    snr = min(o["snr_db"] for o in outputs)
    max_abs = max(o["max_abs_error"] for o in outputs)
    return f"SNR {snr:.1f} dB, max abs error {max_abs:.2e}{chose} ({report['precision']}; {ran})"


SHOWN_OP_TYPES = 4  # a line names this many op types per EP; a CPU-only artifact's are counted, not listed


def placed(ran_on: dict[str, list[str]]) -> str:
    """Where the artifact's nodes ran, for the console line: a CPU target's op types counted (its line listed 25),
    an EP's and those left beside it on CPU named, the first few."""
    if list(ran_on) == ["CPUExecutionProvider"]:
        return f"{len(ran_on['CPUExecutionProvider'])} op type(s), all on CPUExecutionProvider"
    return "; ".join(f"{', '.join(ops[:SHOWN_OP_TYPES])}"
                     f"{f' and {len(ops) - SHOWN_OP_TYPES} more' if len(ops) > SHOWN_OP_TYPES else ''} on {ep}"
                     for ep, ops in ran_on.items())


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
