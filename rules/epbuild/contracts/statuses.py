"""The words epbuild writes for what happened: a validation's verdict, a task's status in the build report, and a
validation's mode. String enums: they compare equal to, and are written in JSON as, the words themselves, so every
file that carries them reads as before."""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    """What a validation concluded (`validation.json` and a member's report: "status")."""

    PASSED = "passed"  # the thresholds judged every output and they were met
    FAILED = "failed"
    SKIPPED = "skipped"  # nothing was judged here (this host cannot run the EP, no device): never passed
    INCONCLUSIVE = "inconclusive"  # run, but the thresholds could not judge an output (a nearly constant one)
    STRUCTURAL = "structural"  # `validate = "structural"`: files and EPContext attributes checked, nothing run


class TaskStatus(StrEnum):
    """A task's entry in `build-report.json` and the reports made from it."""

    COMPILED = "compiled"
    RESTORED = "restored"  # the output (or verdict) of these very inputs and settings, from the cache
    VALIDATED = "validated"
    PACKAGED = "packaged"  # a model package made and checked through ONNX Runtime
    REDUCED = "reduced"  # a failing compile reduced to a repro folder (`epbuild reduce`)
    STAGED = "staged"  # counted so in the summary: a stage that ran
    SKIPPED = "skipped"
    INCONCLUSIVE = "inconclusive"
    STRUCTURAL = "structural"  # a validation that only checked the artifact's structure: never counted as passed
    FAILED = "failed"
    NOT_BUILT = "not built"  # a task it needs failed
    INTERRUPTED = "interrupted"  # the run stopped while it ran
    UP_TO_DATE = "up-to-date"
    PENDING = "pending"  # no run has reached it yet


class ValidationMode(StrEnum):
    """`validate = ...` of a target or model."""

    RUN = "run"  # run the artifact and compare its outputs with the CPU reference
    STRUCTURAL = "structural"  # load-time checks only
    OFF = "off"
