"""The actions of the compile, stage, validation and operator-check tasks: each calls the step, prints one line and
returns what the build report keeps; a failure is doit's TaskFailed with one readable message."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from doit.exceptions import TaskFailed

from ..contracts.artifact import read_artifact
from ..contracts.statuses import TaskStatus, Verdict
from ..contracts.task_result import PUBLISHED, TaskResult
from ..errors import BuildError, ModelCausedError, ModelError, UserError
from ..execute.executor import run_operator_list, run_validation
from ..files.hashing import snapshot
from ..logs import say
from ..manifest.builds import Build
from ..manifest.stage import Stage
from ..plan.declared_inputs import Blocked
from ..plan.packages import PackagePlan
from ..report.build_report import usage_text
from ..steps.compile import compile_build, file_records
from ..steps.compilers import compiler
from ..steps.fingerprint import validation_fingerprint
from ..steps.packaging.model_package import assemble, check_package, manifest_files, manifest_text, unvalidated
from ..steps.packaging.model_package import fingerprint as package_fingerprint
from ..steps.packaging.package import pipeline_files
from ..steps.reduction.scope import reducible
from ..steps.remote_job import run_job
from ..steps.stage_run import run_stage
from ..steps.toolchain.toolchains import check_operators, find_qaic, supported_operators
from ..steps.toolchain.worker_needs import target_resources
from ..steps.validate import REPORT, cached_validation, summary, validate
from ..steps.validation.fleet import chip, listed_socs
from ..store.cache import Outcome, Workspace, cached_folder
from ..store.task_configs import published

FAILURES = (BuildError, UserError, OSError)


def failure(exc: Exception, prefix: str = "") -> TaskFailed:
    """A task failure with one readable message; an OSError (a full disk, a permission) names the file."""
    if isinstance(exc, OSError) and not isinstance(exc, BuildError):
        return TaskFailed(f"{prefix}{exc.strerror or exc} ({exc.filename or 'artifacts'})")
    return TaskFailed(f"{prefix}{exc}")


def _origin(outcome: Outcome) -> str:
    """' (from the remote cache, 1.2 MB)' for a remote hit, '' otherwise."""
    if outcome.origin != "remote":
        return ""
    return f" (from the remote cache, {outcome.downloaded / 1e6:.1f} MB)"


def run_compile(build: Build, workspace: Workspace) -> TaskFailed | TaskResult:
    """Compile or restore one build; print where its nodes went."""
    try:
        done = compile_build(build, workspace)
    except FAILURES as exc:
        # the EP's failure: a repro is one command away (not where the model's file shows the cause)
        if isinstance(exc, BuildError) and not isinstance(exc, ModelCausedError) and reducible(build) is None:
            return TaskFailed(_suggest_reduce(str(exc), build.task))
        return failure(exc)
    nodes = done.nodes
    if build.shared:
        names = ", ".join(f["name"] for f in done.files)
        detail = f"{len(build.members)} members, {nodes['ep_context']} EPContext node(s) (keep together: {names})"
        sharing = read_artifact(done.out_dir).loading["sharing"]
        if sharing.get("ratio") is not None:
            detail += (f"; shared context {sharing['shared_bytes'] / 1e6:.2f} MB, {sharing['ratio']:.2f} of the "
                       "members compiled alone")
        why_not = None if build.members[0].package else pipeline_files(build.members, build.pipeline_tokens)[1]
        detail += ("; the folder is what onnxruntime-genai loads (genai_config.json: decoder-pipeline)"
                   if build.members[0].package else f"; {why_not}" if why_not else "")
    else:
        detail = compiler(build.target).describe(nodes) + _socs_said(build, done.out_dir)
    say(f"{done.status} {done.build}: {detail}, {done.seconds:.1f} s{usage_text(done.usage)} -> "
          f"{os.path.relpath(done.out_dir)}/{_origin(done.outcome)}")
    return {"status": done.status, **done.outcome.report(), **({"worker": done.worker} if done.worker else {}),
            "fingerprint": done.fingerprint, "files": done.files,
            PUBLISHED: published([done.out_dir / f["name"] for f in done.files], workspace.hashes,
                                    workspace.project_root),
            "seconds": round(done.seconds, 3), **({"child": done.usage} if done.usage else {}),
            **({"nodes": nodes} if "in_ep" in nodes else {})}


def _socs_said(build: Build, folder: Path) -> str:
    """A multi-SoC binary's SoCs, and what `ship_socs` did to it."""
    if not build.target.socs:
        return ""
    record = read_artifact(folder)
    held = ", ".join(chip(soc) for soc in listed_socs(record.compatibility if record.has("compatibility") else None)
                     or build.target.socs)
    pruning = record.soc_pruning if record.has("soc_pruning") else {}
    said = f"; one binary for SoCs {held}"
    if "removed" in pruning:
        said += f" (pruned to ship_socs, {', '.join(pruning['removed']) or 'nothing'} removed)"
    elif "skipped" in pruning:
        said += f"; ship_socs not applied: {pruning['skipped']}"
    return said + "; not opened here (the HTP simulator loads no multi-SoC binary: validation runs each SoC alone)"


def run_stage_task(stage: Stage, workspace: Workspace) -> TaskFailed | TaskResult:
    try:
        outcome, seconds, dynamic, worker, usage = run_stage(stage, workspace)
    except FAILURES as exc:
        return failure(exc)
    if dynamic:
        say(f"warning: {stage.task}: {len(dynamic)} tensor(s) keep dynamic dimensions after shape inference "
              f"(sizes computed from input values): {', '.join(dynamic[:5])}{' ...' if len(dynamic) > 5 else ''}; "
              "an NPU EP compiles what it can and may leave the nodes around them on CPU: the compile line says "
              "where each node ran (placement), and validation fails if that is more than the compile reported")
    if stage.kind == "quantize" and stage.settings["random"]:
        say(f"warning: {stage.task} calibrated on fixed-seed random data: for smoke tests only, the "
              "quantization ranges do not reflect real inputs")
    status = TaskStatus.RESTORED if outcome.restored else TaskStatus.COMPILED  # counted "staged" in the summary
    said = TaskStatus.RESTORED if outcome.restored else TaskStatus.STAGED
    say(f"{said} {stage.task}: {seconds:.1f} s{usage_text(usage)} -> {os.path.relpath(stage.output)}"
          f"{_origin(outcome)}")
    return {"status": status, **outcome.report(), **({"worker": worker} if worker else {}),
            "seconds": round(seconds, 3), **({"child": usage} if usage else {}),
            "files": file_records(stage.output.parent, [p.name for p in stage.outputs], workspace),
            PUBLISHED: published(stage.outputs, workspace.hashes, workspace.project_root)}


def run_validate(build: Build, workspace: Workspace, config: dict[str, Any]) -> TaskFailed | TaskResult:
    """Validate a build's artifact, or restore a passed report for the same bytes from the cache."""
    started = time.monotonic()
    layout = workspace.layout
    folder = build.out_dir(layout)
    artifact = [folder / n for n in build.outputs]
    # the verdict of other settings or bytes goes first: a run stopped before this one's ends leaves none
    (folder / REPORT).unlink(missing_ok=True)
    try:  # a model deleted or made unreadable while the build ran is a line of this task, never a traceback
        inputs = snapshot([*artifact, *build.sources, *build.validation_files])
        fingerprint = validation_fingerprint(artifact, config, [*build.sources, *build.validation_files],
                                             workspace.hashes)

        def produce(workdir: Path) -> dict[str, Any]:
            if workspace.executor:
                return run_validation(build, workspace.job_context(), run_job,
                                      target_resources(build.target, workspace.provenance))
            return validate(build, workspace, workdir)

        report, outcome, written = cached_validation(build.validate_task, fingerprint, workspace, folder, produce,
                                                     config, inputs, build.target.name)
    except (OSError, BuildError) as exc:
        return failure(exc, f"{build.validate_task}: ")
    line = f"{report['status']} validate:{build.name}: {summary(report)}"
    strict = any(member.get("inconclusive") == "fail" for member in config["members"])
    if report["status"] == Verdict.FAILED or (report["status"] == Verdict.INCONCLUSIVE and strict):
        if report["status"] == Verdict.FAILED and report.get("thresholds") and reducible(build) is None and not (
                report.get("task") and (report["task"].get("tensors") == "within the thresholds"
                                        or report["task"].get("lost_by"))) and not any(
                member.get("blame") for member in [report, *report.get("members", {}).values()]
                if isinstance(member, dict)):
            line = _suggest_reduce(line, build.validate_task)
        return TaskFailed(line)
    reference = report.get("cpu_reference")  # from the cache when another validation computed it (a group: each)
    origins = {r["from"] for r in reference["members"].values()} if reference and "members" in reference else {
        reference["from"]} if reference else set()
    say(line + (f" (restored from the {outcome.origin} cache)" if outcome.restored else
                  f" (CPU reference{'s' if reference and 'members' in reference else ''} from the cache)"
                  if origins == {"cache"} else ""))
    status = (TaskStatus.RESTORED if outcome.restored else TaskStatus(report["status"])
              if report["status"] in (Verdict.SKIPPED, Verdict.INCONCLUSIVE, Verdict.STRUCTURAL)
              else TaskStatus.VALIDATED)
    seconds = time.monotonic() - started if outcome.restored else report["seconds"]
    return {"status": status, **outcome.report(), **({"worker": report["worker"]} if "worker" in report else {}),
            "fingerprint": fingerprint, "validation": line, **({"child": report["usage"]} if "usage" in report else {}),
            **({"reason": report["reason"]} if status in (Verdict.INCONCLUSIVE, Verdict.STRUCTURAL)
               and "reason" in report else {}),
            **({"cpu_reference": reference} if reference else {}),
            **({"compatibility": report["compatibility"]} if "compatibility" in report else {}),
            "seconds": round(seconds, 3), PUBLISHED: written}


def run_ops(build: Build, workspace: Workspace, report: Path) -> TaskFailed | None:
    """The operator check of a qaic build, before its compile; the operator list comes from a worker's
    qaic-compile when an executor runs the jobs."""
    try:
        if workspace.executor:
            needs = target_resources(build.target, workspace.provenance)
            supported, version = run_operator_list(build, workspace.job_context(), run_job, needs)
        else:
            found = find_qaic(build.target.sdk_root)
            if isinstance(found, str):
                return TaskFailed(f"{build.ops_task}: {found}")
            supported, version = supported_operators(found, build.log(workspace.layout, "ops")), found.version
        say(f"{build.ops_task}: " + check_operators(supported, version, build.members[0].model.path, report))
    except BuildError as exc:
        return TaskFailed(f"{build.ops_task}: {exc}")
    return None


def refuse_unavailable(task: str, reason: str, named: bool) -> TaskFailed | dict[str, str]:
    """Asked for by name (`named`), a task this host cannot build fails; reached through `doit compile` or
    `doit validate` it is skipped with its reason, like in the default run."""
    if named:
        return TaskFailed(f"{task} cannot be built on this host: {reason}")
    say(f"skipped {task}: {reason}")
    return {"status": Verdict.SKIPPED, "reason": reason}


def run_reduce(build: Build, workspace: Workspace, budget_s: float) -> TaskFailed | TaskResult:
    """Reduce the build's failing compile to a repro folder (`steps.reduction.reduce`, `steps.reduction.repro`); one
    line says how far."""
    task = build.reduce_task
    why_not = reducible(build)
    if why_not:
        return TaskFailed(f"{task}: {why_not}")
    from ..steps.reduction.reduce import reduce_failure  # a reduce task's own: not imported by every build
    from ..steps.reduction.repro import write_repro

    folder = workspace.layout.repro_dir(build.name)
    try:
        reduction = reduce_failure(build, workspace, folder, budget_s)
        sdk = reduction.ep_sdk_version or _earlier_sdk(folder)  # every probe known: as the last reduction found it
        versions = {**workspace.provenance.for_ep(build.target.ep), **({"ep_sdk": sdk} if sdk else {})}
        write_repro(folder, build, reduction, versions)
    except (*FAILURES, ModelError) as exc:
        return failure(exc, f"{task}: ")
    ops = ", ".join(dict.fromkeys(node.op_type for node in reduction.model.graph.node))
    reduced = build.task if reduction.kind == "compile" else build.validate_task
    say(f"reduced {reduced}: {reduction.nodes_before} -> {len(reduction.kept)} nodes ({ops}) in "
          f"{reduction.probes} compiles, {reduction.seconds:.0f} s"
          f"{'' if reduction.complete else ' (its time budget ran out: smaller may exist)'}; repro: "
          f"{os.path.relpath(folder)}/ (python repro.py)")
    return {"status": TaskStatus.REDUCED, "seconds": round(reduction.seconds, 3),
            "reduction": {"task": reduced, "kind": reduction.kind, "nodes_before": reduction.nodes_before,
                          "nodes_after": len(reduction.kept), "probes": reduction.probes,
                          "complete": reduction.complete, "failure": reduction.stem,
                          "folder": os.path.relpath(folder, workspace.project_root)}}


def _suggest_reduce(message: str, task: str) -> str:
    """The failure's first line (the one reports keep) ends with the command that reduces it to a repro."""
    first, newline, rest = message.partition("\n")
    return f"{first}; reduce it to a repro for a bug report: epbuild reduce {task}{newline}{rest}"


def _earlier_sdk(folder: Path) -> str | None:
    try:
        return json.loads((folder / "versions.json").read_text()).get("ep_sdk")
    except (OSError, ValueError, AttributeError):
        return None


def refuse_blocked(task: str, why: Blocked) -> TaskFailed:
    """A task that waits for a fix to the manifest fails with that fix, whichever way it was reached."""
    return TaskFailed(f"{task} waits for a fix: {why}")


def fail_blocked(blocked: dict[str, Blocked]) -> TaskFailed:
    """The default run's last task: the other builds are done; what the manifest must fix, once per line, with
    the tasks that wait for it."""
    waiting: dict[Blocked, list[str]] = {}
    for task, why in blocked.items():
        waiting.setdefault(why, []).append(task)
    return TaskFailed("\n".join(f"error: {why} ({len(tasks)} task(s) wait for it: {', '.join(tasks)}; the rest "
                                 "were built)" for why, tasks in waiting.items()))


def report_unavailable(reasons: dict[str, str]) -> None:
    for task, reason in reasons.items():
        say(f"skipped {task}: {reason}")
    if not reasons:
        say("this host can build every task")




def run_package(plan: PackagePlan, workspace: Workspace) -> TaskFailed | TaskResult:
    """Make a model package from its validated variants and check it through ONNX Runtime
    (`steps.packaging.model_package`), or restore the bytes of the same manifest from the cache."""
    started = time.monotonic()
    layout = workspace.layout
    variants = list(plan.variants)
    try:
        if not variants:
            raise BuildError(f"{plan.task}: no variant to hold: "
                             + "; ".join(f"{name} {why}" for name, why in plan.left_out))
        for build in variants:
            why = unvalidated(build, layout)
            if why:
                raise BuildError(f"{plan.task}: {why}; a package holds validated variants only: validate it where it "
                                 f"runs, or leave {build.target.name} out (`targets` in [packages.{plan.name}])")
        sources = [build.out_dir(layout) / name for build in variants for name in build.outputs]
        inputs = snapshot(sources)  # before they are hashed: the manifest names their bytes
        text = manifest_text(plan.name, variants, dict(plan.left_out), layout, workspace.hashes)
        key = package_fingerprint(text, workspace.provenance.code)
        final = layout.package_dir(plan.name)
        files = manifest_files(text)
        checked: dict[str, Any] = {}

        def produce(scratch: Path) -> None:
            assemble(variants, text, layout, workspace.hashes, scratch)
            checked.update(check_package(plan.name, variants, workspace, scratch))

        outcome = cached_folder(plan.task, key, workspace, final, files, produce, {"kind": "package"}, inputs)
    except FAILURES as exc:
        return failure(exc)
    status = TaskStatus.RESTORED if outcome.restored else TaskStatus.PACKAGED
    seconds = time.monotonic() - started
    how = ("restored (checked when it was made)" if outcome.restored else
           "checked through ModelPackageContext: " + ", ".join(f"{n} {v['status']}" for n, v in checked.items()))
    left = f"; left out: {', '.join(name for name, _ in plan.left_out)}" if plan.left_out else ""
    say(f"{status} {plan.task}: {len(variants)} variant(s), {how}{left}, {seconds:.1f} s -> "
          f"{os.path.relpath(final)}/{_origin(outcome)}")
    return {"status": status, **outcome.report(), "fingerprint": key, "seconds": round(seconds, 3),
            "variants": {b.name: checked.get(b.name, {}) for b in variants},
            "left_out": dict(plan.left_out),
            PUBLISHED: published([final / name for name in files], workspace.hashes, workspace.project_root)}
