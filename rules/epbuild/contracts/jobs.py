"""Jobs as records: what the parent sends each kind of child and what the child answers, frozen and versioned
(`JOB_FORMAT`), as `artifact.json` is (`contracts.artifact`): the compile (`CompileJob`, `CompileAnswer`), the
validation (`ValidationJob`, whose answer is the report that becomes `validation.json`: `contracts.validation`), a
stage (`StageJob`, `StageAnswer`), the model reading (`ModelReadJob`, `ModelsRead`), a reduction's probes
(`TensorsProbe`, `DepartureProbe`, `ProbeAnswer`) and, for every kind, a failed job's answer (`JobFailure`). They
travel as JSON (`to_json`: a tuple as a list, a path as its string), and are read back only through `from_json`,
which refuses another format, a key the record does not declare and a missing one, and gives each field its declared
kind again (a tuple, a path): a child of another epbuild (a warm worker left from before an upgrade) answers
"internal error", never a half-understood job. What `execute.child` adds on the way (`ENVELOPE`: the provenance the
job checks, the usage it measured) is not the job's and is ignored here."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any, ClassVar, Self, TypeVar

from ..records import record

# 1: the compile and validation jobs as records (were TypedDicts); 2: every job kind (stages, the model reading and
# the reduction's probes were plain dicts)
JOB_FORMAT = 2
ENVELOPE = frozenset({"format", "provenance", "usage"})
R = TypeVar("R")


class JobFormatError(ValueError):
    """A job or answer this epbuild does not read: another format, unknown or missing keys."""


def _read(cls: type[R], data: Any, nested: Mapping[str, type]) -> R:
    if not isinstance(data, Mapping):
        raise JobFormatError(f"a {cls.__name__} that is not a JSON object")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = {f.name for f in fields}
    required = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    unknown, missing = data.keys() - names - ENVELOPE, required - data.keys()
    if unknown or missing:
        raise JobFormatError(f"a {cls.__name__} with {f'unknown keys {sorted(unknown)}' if unknown else ''}"
                             f"{' and ' if unknown and missing else ''}"
                             f"{f'missing keys {sorted(missing)}' if missing else ''}")
    values = {name: data[name] for name in names & data.keys()}
    for field in fields:  # JSON's list and string made the declared tuple and path again (`from __future__`: text)
        value = values.get(field.name)
        if type(value) is list and str(field.type).startswith("tuple[") and field.name not in nested:
            values[field.name] = tuple(value)
        elif type(value) is str and field.type in ("Path", "Path | None"):
            values[field.name] = Path(value)
    for name, inner in nested.items():
        if not isinstance(values[name], list):
            raise JobFormatError(f"{cls.__name__}.{name} is not a list")
        values[name] = tuple(_read(inner, item, {}) for item in values[name])
    return cls(**values)


def _top(cls: type[R], data: Any, nested: Mapping[str, type]) -> R:
    if not isinstance(data, Mapping) or data.get("format") != JOB_FORMAT:
        found = data.get("format") if isinstance(data, Mapping) else None
        raise JobFormatError(f"a {cls.__name__} of format {found!r}; this epbuild reads format {JOB_FORMAT}")
    return _read(cls, data, nested)


def _plain(value: Any) -> Any:
    """JSON's own types: a record's tuples as lists (what a reader in this process gets is what one across a pipe
    gets)."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, PurePath):
        return str(value)
    return value


def _json(value: Any) -> dict[str, Any]:
    return {"format": JOB_FORMAT, **_plain(dataclasses.asdict(value))}


class _Travelling:
    """What every job record does: written as JSON with its format, read back through `_top` (its `NESTED` fields:
    tuples of another record)."""

    NESTED: ClassVar[dict[str, type]] = {}

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, data: Any) -> Self:
        return _top(cls, data, cls.NESTED)


@record
class CompileMember:
    """One model of a compile job."""

    model: str  # the model file the compile consumes
    output: str  # where the compiled (or optimized) model goes
    external_data: str | None  # CPU targets: the output's own external-data file name
    inputs: dict[str, list[int]]  # static shapes from the manifest
    entry: str  # the model's manifest entry (models.NAME), for errors about its keys
    weights: str | None  # the folder its external data resolves in, from its own, when not that (files.weights)


@record
class CompileJob(_Travelling):
    """What the compile child compiles: each member in order, with the target's settings."""

    members: tuple[CompileMember, ...]
    manifest: str  # the manifest's file name
    share: bool  # compile every member into one shared EP context
    ep: str  # EP alias
    device: str
    compiler: str  # ort or ort_session
    embed: bool
    options: dict[str, str]  # provider options, option files as absolute paths
    optimization_level: str | None  # CPU targets
    prune: dict[str, Any] | None = None  # `ship_socs`: {"python": the tool's interpreter, "keep": [SoCs]}

    NESTED: ClassVar[dict[str, type]] = {"members": CompileMember}


@record
class CompiledMember:
    """What the compile made of one member."""

    nodes: dict[str, Any]  # where the source's nodes ended up (epbuild.steps.graph.placement)
    ep_sdk_version: str | None
    binaries: list[str]  # context binaries the compiled model references
    graphs: list[str] = dataclasses.field(default_factory=list)  # the EPContext nodes' names (Genie looks them up)
    compatibility: str | None = None  # the EP's compatibility string (get_compatibility_info_from_model)
    pruned: list[str] | None = None  # SoCs `ship_socs` removed from a multi-SoC binary (`steps.toolchain.soc_pruning`)


@record
class CompileAnswer(_Travelling):
    """The compile child's answer: each member's result, in the job's order."""

    members: tuple[CompiledMember, ...]

    NESTED: ClassVar[dict[str, type]] = {"members": CompiledMember}


@record
class ValidationMember(_Travelling):
    """One artifact to validate: the file, what its sidecar recorded, the reference and the settings (on its own
    where a validation's samples are spread over processes, `steps.validation.sample_workers`)."""

    artifact: str
    files: list[str]  # every file the sidecar lists, absolute
    ep_sdk_version: str | None
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
    mode: str  # run or structural (`manifest.builds.ValidationMode`)
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
    compatibility: str | None = None  # the EP's compatibility string, for ONNX Runtime's answer here
    timeout_s: float = 600.0  # the validation's time limit: a task's samples must fit in it
    task: dict[str, Any] | None = None  # a task metric on a dataset (`manifest.task_metric.task_settings`)
    repeat_within_s: float = 30.0  # a first run at most this long is repeated (`steps.validation.repeatability`)
    package: dict[str, str] | None = None  # root, component, variant: the session through a model package
    foldable_on_cpu: dict[str, int] | None = None  # op type -> nodes left on CPU that only compute constants
    share: bool = False  # a member of a shared context, loaded as its loading contract says


def _members(data: Any, where: str) -> dict[str, ValidationMember]:
    if not isinstance(data, Mapping):
        raise JobFormatError(f"{where} is not a JSON object")
    return {name: _read(ValidationMember, member, {}) for name, member in data.items()}


@record
class ValidationJob(_Travelling):
    """What the validation child checks: one artifact, or a group's members (then each run where this host loads
    the shared context), and where the CPU reference comes from or goes."""

    members: dict[str, ValidationMember]
    shared: bool  # a shared-context group: structural checks of all, then each member run
    one_binary: bool  # the EP writes one binary for all members: they must all reference it
    run_blocked: str | None  # why this host cannot load the shared context
    # `pipeline`: {"tokens": token steps, "alone": member -> its job compiled alone (or None)}, and the CPU
    # references' folders once computed or restored (`steps.validation.cached_reference`)
    pipeline: dict[str, Any] | None
    phase: str | None = None  # a large model: "reference" (the CPU reference alone), then "artifact" (with it)
    reference: str | None = None  # the artifact phase: the folder the reference (restored or computed) is in
    reference_to: str | None = None  # a single model: the folder its child saves the reference it computes in
    references: dict[str, str] | None = None  # a group: member -> the folder its restored reference is in
    references_to: dict[str, str] | None = None  # a group: member -> the folder its computed reference goes to

    @classmethod
    def from_json(cls, data: Any) -> Self:
        job = _top(cls, data, {})
        members = _members(job.members, "ValidationJob.members")
        pipeline = job.pipeline
        if pipeline is not None:
            if not isinstance(pipeline, Mapping) or not isinstance(pipeline.get("alone"), Mapping):
                raise JobFormatError("ValidationJob.pipeline without its members alone")
            alone = {name: None if member is None else _read(ValidationMember, member, {})
                     for name, member in pipeline["alone"].items()}
            pipeline = {**pipeline, "alone": alone}
        return dataclasses.replace(job, members=members, pipeline=pipeline)


@record
class StageJob(_Travelling):
    """What a stage's child runs (`steps.preprocess`): one stage of one model, by its kind (`steps.stages`)."""

    kind: str
    task: str  # the stage's task name, for messages
    source: Path  # the model the stage reads
    output: Path  # the model it writes
    settings: dict[str, Any]  # the stage's own settings (`manifest.stage.Stage.settings`)
    data_file: str | None  # the output's external-data file beside it, when it has one
    graph_only: bool  # the graph read and written without its weights (they stay where they are)
    weights_folder: Path | None  # where the input's weights are, when not beside it
    flavour: str | None  # quantize: "qnn" or the generic QDQ
    calibration: tuple[str, ...]  # quantize: the calibration files
    manifest: str  # the manifest's file name and the model's entry, for errors about its keys
    entry: str

    @property
    def weights(self) -> bool:
        """Whether the stage reads and writes the model's weights (not a graph-only stage)."""
        return not self.graph_only


@record
class StageAnswer(_Travelling):
    """What a stage's child reports: the tensors `shape` left dynamic, and what the stage says of its work for its
    log (the opsets `upgrade` converted between, what `rewrite` rewrote)."""

    dynamic: tuple[str, ...] = ()
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)


@record
class ModelReadJob(_Travelling):
    """What the model-reading child reads (`plan.external_data`): each model's external-data files, inputs and graph
    facts, without its weights."""

    models: tuple[str, ...]


@record
class ModelsRead(_Travelling):
    """The model reading's answer, per model path: its external-data index entry (`plan.external_data`), or
    {"error": why it cannot be used}."""

    models: dict[str, dict[str, Any]]


@record
class TensorsProbe(_Travelling):
    """A divergence reduction's first job (`steps.reduction.reduce_probe`): the model run on CPU with the
    validation's inputs, every tensor in `names` saved with them to `out` (an .npz)."""

    model: str
    weights: str | None  # the folder the model's external data resolves in, when not its own
    names: tuple[str, ...]
    inputs: dict[str, list[int]]  # the validation's inputs (`steps.validation.validation_inputs.make_inputs`)
    inputs_file: str | None
    frozen: dict[str, list[float]]
    out: str
    kind: str = "tensors"


@record
class DepartureProbe(_Travelling):
    """A divergence reduction's probe: one subgraph compiled for the EP, run there and on CPU with the values
    `tensors` holds, each output held against the failed validation's thresholds."""

    model: str
    tensors: str
    ep: str
    device: str
    options: dict[str, str]
    thresholds: dict[str, float]
    kind: str = "departs"


@record
class ProbeAnswer(_Travelling):
    """A probe's answer: how many arrays `TensorsProbe` saved; whether the subgraph departs, and its worst SNR."""

    saved: int | None = None
    departs: bool | None = None
    snr_db: float | None = None


@record
class JobFailure(_Travelling):
    """What a child of any job kind answers in place of its job's answer when the job failed
    (`execute.child.describe`): the reason as the build says it, and whose it is: the model's (`in_model`: no
    reduction is suggested) or epbuild's own (`internal`: a bug, never the user's mistake)."""

    error: str
    in_model: bool = False
    internal: bool = False

    @staticmethod
    def answered(answer: Mapping[str, Any]) -> bool:
        """Whether a child's answer is a failure (its key, which no job kind's answer has)."""
        return "error" in answer


# A validation child's answer as it travels (JSON): the verdict (`status`, a `statuses.Verdict` word, or "reference"
# from a reference phase) and its figures; what is published is `contracts.validation.ValidationRecord`
ValidationReport = dict[str, Any]
