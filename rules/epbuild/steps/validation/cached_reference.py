"""The job's side of a validation's CPU reference: computed once per (model, inputs) and kept in the caches like
other outputs, so that every target validating the same model, and a validation after a recompile, runs only
its artifact. The outputs are the reference child's (`epbuild.steps.validation.reference`), saved where the cache
adopts them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...contracts.jobs import ValidationJob, ValidationReport
from ...contracts.statuses import ValidationMode, Verdict
from ...execute.child import run_child
from ...files.hashing import snapshot
from ...files.publish import discard, scratch_dir
from ...logs import warn
from ...manifest.builds import Build
from ...store.cache import Cached, Outcome, Workspace, check_inputs, restore, store, through_cache
from ..expected_peak import build_limits
from ..fingerprint import pipeline_fingerprint, reference_fingerprint
from .pipeline import PIPELINE_FILES
from .reference import REFERENCE_FILES

SEPARATE_REFERENCE_BYTES = 2**30  # a model this big (with its weights) gets its CPU reference in a child of its own


def _large(build: Build) -> bool:
    member = build.members[0]
    return sum(p.stat().st_size for p in (member.model.path, *member.external)) >= SEPARATE_REFERENCE_BYTES


def run_against_reference(build: Build, workspace: Workspace, request: ValidationJob, workdir: Path,
                          what: str, log: Path, timeout: float, reuse: bool) -> ValidationReport:
    """One artifact run against its CPU reference, which is computed once per (model, inputs) and kept in the
    caches (`reference_fingerprint`) through the one cache protocol (`through_cache`): a target validating the
    same model restores it and runs the artifact alone. A reference not cached is computed in the artifact's child
    and stored from there, without the lock (two targets may compute a small one at once: cheaper than waiting); a
    large model's in a child of its own under the lock, which ends before the artifact's starts (never both in
    memory)."""
    (member,) = request.members.values()
    step = Cached(f"the CPU reference of validate:{build.name}",
                  reference_fingerprint(build.members[0], member, workspace.hashes, workspace.provenance),
                  snapshot(list(build.members[0].reference_files)),  # before they are hashed: the child reads those
                  {"kind": "reference"}, REFERENCE_FILES)
    folder = _staging(workspace, step.fingerprint)  # among the artifacts, like every restore
    target = build.target
    limits = build_limits(build, workspace, "validate", timeout)

    def artifact_child(extra: dict[str, Any]) -> ValidationReport:
        return run_child("epbuild.steps.validate", dataclasses.replace(request, **extra).to_json(), workdir, limits,
                         what, log,
                         ep=target.fork_server, reuse=reuse, expect=workspace.provenance, links=workspace.links)

    def kept(answer: dict[str, Any]) -> list[str] | None:
        if _saved(answer, step.label):
            return REFERENCE_FILES
        discard(folder)  # not written (a full disk): the artifact's child computes it again
        return None

    def origin(outcome: Outcome) -> dict[str, Any]:  # for the build report: outside the validation's fingerprint
        return {"cpu_reference": {"from": "cache" if outcome.restored else "computed", "fingerprint": step.fingerprint}}

    try:
        if not _large(build):
            report, outcome = through_cache(
                step, workspace, folder, lambda into: artifact_child({"reference_to": str(into)}), kept,
                lambda kept_in, _, ran: ran if ran is not None else artifact_child(
                    {"phase": "artifact", "reference": str(kept_in)}), locked=False)
            return {**report, **origin(outcome)}
        computed, outcome = through_cache(
            step, workspace, folder, lambda into: run_child(
                "epbuild.steps.validate",
                dataclasses.replace(request, phase="reference", reference_to=str(into)).to_json(), into, limits,
                f"{what}: the CPU reference", log.with_suffix(".ref.log"), expect=workspace.provenance,
                links=workspace.links),
            lambda answer: kept(answer) if answer["status"] != Verdict.FAILED else None, lambda _, __, ran: ran)
        if computed is not None and computed["status"] == Verdict.FAILED:
            return computed
        report = artifact_child({"phase": "artifact", "reference": str(folder)} if folder.is_dir() else {})
        if computed is None:
            return {**report, **origin(outcome)}
        first, second = computed["usage"], report["usage"]  # both children: their time, the larger peak
        return {**report, **origin(outcome),
                "usage": {"seconds": round(first["seconds"] + second["seconds"], 3),
                          "peak_mb": max(first["peak_mb"], second["peak_mb"])}}
    finally:
        discard(folder)


def run_group_against_references(build: Build, workspace: Workspace, request: ValidationJob, workdir: Path,
                                 what: str, log: Path, timeout: float) -> ValidationReport:
    """A group whose members run here: each member's reference restored from the caches where one is kept
    (the same key as a standalone validation of that model: those of a full build are there), the others computed
    in the group's child and stored from there."""
    label = f"the CPU references of validate:{build.name}"
    runs = {m.name: m for m in build.members if request.members[m.name].mode == ValidationMode.RUN}
    inputs = snapshot([path for member in runs.values() for path in member.reference_files])
    keys = {name: reference_fingerprint(m, request.members[name], workspace.hashes,
                                        workspace.provenance) for name, m in runs.items()}
    folders = {name: _staging(workspace, key) for name, key in keys.items()}
    try:
        restored = {name for name, key in keys.items()
                    if restore(label, key, workspace, folders[name])[0] == REFERENCE_FILES}
        report = run_child("epbuild.steps.validate", dataclasses.replace(
            request, references={name: str(folders[name]) for name in restored},
            references_to={name: str(folders[name]) for name in keys if name not in restored}).to_json(),
            workdir, build_limits(build, workspace, "validate", timeout), what, log, ep=build.target.fork_server,
            reuse=build.target.ep.warm_validations, expect=workspace.provenance, links=workspace.links)
        answers = report.pop("references", {})
        for name, answer in answers.items():
            _keep(answer, folders[name], keys[name], label, inputs, workspace)
        origins = {name: {"from": "cache" if name in restored else "computed", "fingerprint": key}
                   for name, key in keys.items() if name in answers}
        return {**report, **({"cpu_reference": {"members": origins}} if origins else {})}
    finally:
        for folder in folders.values():
            discard(folder)


def run_pipeline_against_cache(build: Build, workspace: Workspace, request: ValidationJob, workdir: Path,
                               what: str, log: Path, timeout: float) -> ValidationReport:
    """A pipeline group: its CPU run (prompt, then the token steps, on the source models) restored from the caches
    where one is kept (`pipeline_fingerprint`), else computed in the group's child and stored from there (without
    the lock, as a small reference); the EP's run is compared with it step by step."""
    step = Cached(f"the CPU run of validate:{build.name}",
                  pipeline_fingerprint(build, request, workspace.hashes, workspace.provenance),
                  snapshot([path for member in build.members for path in member.reference_files]),
                  {"kind": "pipeline"}, PIPELINE_FILES)
    folder = _staging(workspace, step.fingerprint)

    def group_child(cpu: dict[str, str]) -> ValidationReport:
        return run_child("epbuild.steps.validate",
                         dataclasses.replace(request, pipeline={**(request.pipeline or {}), **cpu}).to_json(),
                         workdir,
                         build_limits(build, workspace, "validate", timeout), what, log, ep=build.target.fork_server,
                         reuse=build.target.ep.warm_validations, expect=workspace.provenance, links=workspace.links)

    try:
        report, outcome = through_cache(
            step, workspace, folder, lambda into: group_child({"cpu_to": str(into)}),
            lambda answer: PIPELINE_FILES if _saved(answer, step.label) else None,
            lambda kept_in, _, ran: ran if ran is not None else group_child({"cpu": str(kept_in)}), locked=False)
        if "pipeline" not in report:  # it failed or was skipped before running the pipeline
            return report
        return {**report, "cpu_reference": {"from": "cache" if outcome.restored else "computed",
                                            "fingerprint": step.fingerprint}}
    finally:
        discard(folder)


def _saved(answer: dict[str, Any], label: str) -> bool:
    """Whether the child saved what it computed where the cache adopts it (one line when the disk refused it)."""
    if "reference_unsaved" in answer:
        warn(f"{label} could not be kept ({answer.pop('reference_unsaved')}); it is computed where it "
             "is needed")
    return bool(answer.pop("reference_saved", False))


def _keep(answer: dict[str, Any], folder: Path, key: str, label: str, inputs: dict[Path, list[int] | None],
          workspace: Workspace) -> None:
    """Store the reference a group's child saved in `folder` under `key`, its inputs checked unchanged first (a
    group's members' references: one child computes several, so each is stored here rather than through
    `through_cache`, which takes one output per job)."""
    if _saved(answer, label):
        check_inputs(label, inputs)
        store(label, key, workspace, folder, REFERENCE_FILES, {"kind": "reference"})


def _staging(workspace: Workspace, key: str) -> Path:
    """A scratch folder among the artifacts for the child to save the reference in; the cache copies it from
    there (a full or read-only cache costs one warning, never the validation)."""
    return scratch_dir(workspace.layout.scratch_root, f"reference.{key[:16]}")
