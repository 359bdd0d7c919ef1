"""The build model: a resolved target, and a build that compiles one or more members for it.

A build with one member is a plain compile (`compile:MODEL@TARGET`, `artifacts/<target>/<model>/`); several
members compiled into one shared EP context are a group (`group:NAME`, `artifacts/<target>/groups/<name>/`).
Everything downstream (fingerprint, compile, validation, tasks) takes a `Build`. Plain data: builds travel to
doit's worker processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..contracts.artifact import NAME as SIDECAR  # noqa: F401 - the artifact record's file name
from ..contracts.validation import NAME as VALIDATION_FILE
from ..files.layout import Layout
from ..records import record
from .eps import EpInfo
from .parse import ModelSpec
from .qaic import QaicOptions
from .stage import Stage

REPORT = VALIDATION_FILE  # a validation's report, beside the artifact it judges (`contracts.validation`)
QPC_PROGRAM = "qpc/programqpc.bin"  # qaic targets: the QPC folder that qaic-compile writes, with its program


@record
class Limits:
    """What one child may use: wall time, and resident memory (None: unlimited); and what it is expected to hold at
    its peak (MB, 0: unknown), which memory admission keeps free for it (`execute.memory_ledger`)."""

    timeout_s: float
    max_memory_gb: float | None = None
    expected_mb: float = 0.0
    budget_gb: float | None = None  # `[build] memory_gb` (None: not set; EPBUILD_MEMORY_GB wins)


@record
class ResolvedTarget:
    """Everything that decides how a target compiles. `options` holds strings as the EP receives them, with
    option-file values as written in the manifest (relative), so the config stays free of absolute paths."""

    name: str
    ep: EpInfo
    source: str
    device: str
    compiler: str
    embed: bool
    options: dict[str, str]
    option_files: dict[str, Path]
    optimization_level: str | None
    timeout_s: float
    max_memory_gb: float
    quantized: bool = False
    qaic: QaicOptions | None = None  # compiler = "qaic"
    sdk_root: Path | None = None  # the configured toolchain root (qaic) or QAIRT SDK root (qairt)
    toolchain_version: str | None = None  # qaic/qairt absent here: the version the Dask workers offer
    min_offload: float | None = None
    warnings: tuple[tuple[str, str], ...] = ()  # (where, what): said once per run that reads the manifest
    socs: tuple[str, ...] = ()  # QNN's soc_model as a list: one multi-SoC binary (numbers, ascending)
    fleet: str | None = None  # one SoC of that target's list, compiled alone to be run (`plan.targets.each_soc`)
    ship_socs: tuple[str, ...] = ()  # the SoCs the multi-SoC binary is pruned to (`steps.toolchain.soc_pruning`)

    def limits(self, timeout_s: float | None = None) -> Limits:
        """The limits of this target's children: the compile's timeout unless another is given."""
        return Limits(timeout_s or self.timeout_s, self.max_memory_gb)

    @property
    def quantize_flavour(self) -> str | None:
        """Which quantized variant this target consumes: its EP's QDQ configuration."""
        return self.ep.quantize_flavour if self.quantized else None

    @property
    def is_cpu(self) -> bool:
        return self.ep.is_cpu

    @property
    def fork_server(self) -> str:
        """Which fork server runs this target's jobs (`EpInfo.fork_server_for`)."""
        return self.ep.fork_server_for([*self.options, *self.option_files])

    def session_options(self) -> dict[str, str]:
        """The options passed to the EP: option-file values replaced by absolute paths."""
        return {**self.options, **{key: str(path) for key, path in self.option_files.items()}}

    def runtime_options(self) -> dict[str, str]:
        """What a runtime passes again when loading the artifact: options, and option files by their name inside
        the artifact."""
        return {**{k: v for k, v in self.options.items() if k in self.ep.runtime_options}, **self.runtime_files()}

    def runtime_files(self) -> dict[str, str]:
        """Option files a runtime needs again when loading the artifact: key -> name inside the artifact."""
        return {key: f"{key}{path.suffix}" for key, path in sorted(self.option_files.items())
                if key in self.ep.runtime_options}

    def precision(self) -> str:
        """The float precision the target computes in (QDQ models are recognised in the validating child)."""
        option = self.ep.precision_option
        if option and option in self.option_files:
            return "fp16" if "f16" in self.option_files[option].read_text().lower() else "fp32"
        return self.ep.float_precision


@record
class ValidationSettings:
    """How a member's artifact is validated: the target's `validation` table with the model's keys winning."""

    mode: str  # "run", "structural" or "off"
    inputs: Path | None
    reference: Path | None
    thresholds: dict[str, float]  # only those the manifest sets; the rest default by precision
    timeout_s: float
    localise: bool = False  # a failed validation finds where the EP departs from CPU (steps.validation.localise)
    inconclusive: str = "report"  # "fail": a validation the thresholds could not judge fails its task
    repeat_within_s: float = 30.0  # a first run at most this long is repeated (steps.validation.repeatability)
    task: dict[str, Any] | None = None  # a task metric on a dataset (`manifest.task_metric.task_settings`)

    @property
    def task_files(self) -> tuple[Path, ...]:
        """The dataset's files and a `module:function` metric's files (its own and the project's it imports): the
        validation reads them."""
        if not self.task:
            return ()
        metric = self.task.get("metric_files") or ([self.task["metric_file"]] if self.task["metric_file"] else [])
        return (*(Path(p) for p in self.task["dataset"]), *(Path(p) for p in metric))


@record
class Member:
    """One model of a build. `model` is what the compile consumes: the declared model, or the output of its
    last stage; `float_model` is the float model before quantization, for the validation report's information;
    `frozen` holds the inputs a freeze stage made constant."""

    model: ModelSpec
    validation: ValidationSettings
    external: tuple[Path, ...] = ()  # the external-data files of `model`
    float_model: Path | None = None
    frozen: dict[str, tuple[float, ...]] | None = None
    declared: Path | None = None  # the model as declared, when stages make `model` (the reference's fallback)
    reference_files: tuple[Path, ...] = ()  # every file the CPU reference may read (`targets.reference_files`)
    elsewhere: tuple[tuple[Path, str], ...] = ()  # graphs that read their weights from another folder (`Chain`)
    package: tuple[Path, ...] = ()  # onnxruntime-genai's config and processing files, published beside the artifact

    @property
    def weights(self) -> dict[str, str]:
        """For a child's request: each graph of the member's chain whose external data resolves in another folder
        than its own, and that folder (`files.weights`)."""
        return {str(path): folder for path, folder in self.elsewhere}

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def model_file(self) -> str:
        return f"{self.model.name}.onnx"

    @property
    def data_file(self) -> str:
        """A CPU artifact of a model with external data keeps its weights in this file beside it."""
        return f"{self.model_file}.data"


def package_task(name: str) -> str:
    """The name of a model package's task (`[packages.NAME]`)."""
    return f"package:{name}"


REDUCE_PREFIX = "reduce:"


def reduce_task(name: str) -> str:
    """The name of the task that reduces build `name`'s failing compile (`epbuild reduce`)."""
    return f"{REDUCE_PREFIX}{name}"


def compile_task(model: str, target: str) -> str:
    """The name of one model's compile for one target, as `Build.task` makes it."""
    return f"compile:{model}@{target}"


@record
class Build:
    """Members compiled for one target: one member is a compile, several sharing one EP context a group.

    `outputs` lists the files the compile publishes, known before it runs (the compiler may add more: qaic)."""

    name: str  # MODEL@TARGET, or the group's name
    target: ResolvedTarget
    members: tuple[Member, ...]
    outputs: tuple[str, ...]
    stages: tuple[Stage, ...] = ()
    shared: bool = False
    manifest: str = "models.toml"  # the manifest's file name, for errors about a member's keys
    pipeline_tokens: int | None = None  # a group validated as prompt + token graphs (`pipeline`)
    alone: tuple[tuple[str, tuple[Path, ...]], ...] = ()  # a pipeline's members compiled alone: (name, their files)
    soc_reports: tuple[tuple[str, Path], ...] = ()  # a multi-SoC build: each SoC's validation.json, compiled alone

    @property
    def kind(self) -> str:
        return "group" if self.shared else "compile"

    @property
    def task(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def validate_task(self) -> str:
        return f"validate:{self.name}"

    @property
    def ops_task(self) -> str:
        """qaic targets: the operator check before the compile."""
        return f"ops:{self.name}"

    @property
    def reduce_task(self) -> str:
        """`epbuild reduce compile:MODEL@TARGET`: the failing compile reduced to a repro folder."""
        return reduce_task(self.name)

    @property
    def folder_name(self) -> str:
        return self.name if self.shared else self.members[0].name

    def out_dir(self, layout: Layout) -> Path:
        return layout.build_dir(self.target.name, self.folder_name, self.shared)

    @property
    def log_stem(self) -> str:
        return f"group.{self.name}" if self.shared else self.members[0].name

    def log(self, layout: Layout, step: str) -> Path:
        """`step`: compile, validate, ops."""
        return layout.log(self.target.name, f"{self.log_stem}.{step}")

    @property
    def validates(self) -> bool:
        return self.members[0].validation.mode != "off"

    @property
    def inputs(self) -> list[Path]:
        """Every file the compile reads: models, their external data, option files."""
        return ([p for m in self.members for p in (m.model.path, *m.external, *m.package)]
                + list(self.target.option_files.values()))

    @property
    def validation_files(self) -> list[Path]:
        """Files the validation reads besides the artifact and the compiled-from model: the inputs file, the
        reference, the model as declared and the float model, with their external data; a pipeline's members
        compiled alone; a multi-SoC build's reports of each SoC compiled alone."""
        return [*(p for m in self.members for p in m.reference_files if p not in m.external and p != m.model.path),
                *(path for m in self.members for path in m.validation.task_files if path not in m.reference_files),
                *(path for _, files in self.alone for path in files), *(path for _, path in self.soc_reports)]

    @property
    def origins(self) -> list[Path]:
        """The declared models its stages were made from: a compile that reads a stage's output still fails when
        one of them changes while it runs (its artifact would no longer be of the model the validation reads)."""
        return [m.declared for m in self.members if m.declared is not None]

    @property
    def sources(self) -> list[Path]:
        return [m.model.path for m in self.members]
