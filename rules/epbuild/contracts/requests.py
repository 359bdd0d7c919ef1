"""What the parent sends its validation children, and what they answer (JSON, declared here; the compile job's
records are `contracts.jobs`)."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class MemberValidation(TypedDict):
    """One artifact to validate: the file, what its sidecar recorded, the reference and the settings."""

    artifact: str
    files: list[str]  # every file the sidecar lists, absolute
    ep_sdk_version: str | None
    compatibility: NotRequired[str | None]  # the EP's compatibility string, for ONNX Runtime's answer here
    cpu_nodes: int  # nodes the compile left on CPU: more at run time is a fallback
    source: str  # the model the compile consumed
    weights: dict[str, str]  # models above whose external data resolves in another folder (files.weights)
    reference: str  # the model to compare with
    declared: str  # the model as declared: the reference where a stage's output cannot run on CPU
    reference_is: str  # what the reference is, for messages: "the output of fold:m", "the model as declared (m.onnx)"
    float_reference: str | None  # quantized artifacts: the float model, compared for information
    float_reference_is: str
    ep: str
    device: str
    embed: bool
    mode: str  # run or structural
    options: dict[str, str]  # runtime options, option files inside the artifact folder
    inputs: dict[str, list[int]]
    inputs_file: str | None
    precision: str  # fp32 or fp16 (qdq is recognised from the reference)
    thresholds: dict[str, float]
    frozen: dict[str, list[float]]
    entry: str  # the model's manifest entry, for errors about its keys
    manifest: str
    target: str  # the target's name, for what a failure suggests
    localise: bool  # on failed outputs, find where the EP departs (epbuild.steps.validation.localise)
    compile_options: dict[str, str]  # the EP's options as the compile had them, for localise's sessions
    localise_budget_s: float
    timeout_s: NotRequired[float]  # the validation's time limit: a task's samples must fit in it
    task: NotRequired[dict[str, Any]]  # a task metric on a dataset (`manifest.task_metric.task_settings`)
    repeat_within_s: NotRequired[float]  # a first run at most this long is repeated (`steps.validation.repeatability`)
    package: NotRequired[dict[str, str] | None]  # root, component, variant: the session through a model package
    foldable_on_cpu: NotRequired[dict[str, int]]  # op type -> nodes left on CPU that only compute constants
    share: NotRequired[bool]  # a member of a shared context, loaded as its loading contract says


class ValidationRequest(TypedDict):
    members: dict[str, MemberValidation]
    shared: bool  # a shared-context group: structural checks of all, then each member run
    one_binary: bool  # the EP writes one binary for all members: they must all reference it
    run_blocked: str | None  # why this host cannot load the shared context
    pipeline: dict[str, Any] | None  # `pipeline`: token steps, and the members compiled alone (their requests)
    phase: NotRequired[str]  # a large model: "reference" (the CPU reference alone), then "artifact" (with it)
    reference: NotRequired[str]  # the artifact phase: the folder the reference (restored or computed) is in
    reference_to: NotRequired[str]  # a single model: the folder its child saves the reference it computes in
    references: NotRequired[dict[str, str]]  # a group: member -> the folder its restored reference is in
    references_to: NotRequired[dict[str, str]]  # a group: member -> the folder its computed reference goes to


# A validation child's answer as it travels (JSON): the verdict (`status`, a `statuses.Verdict` word, or "reference"
# from a reference phase) and its figures; what is published is `contracts.validation.ValidationRecord`
ValidationReport = dict[str, Any]
