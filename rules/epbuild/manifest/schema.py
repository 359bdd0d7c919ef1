"""The manifest's keys, declared once: where each is allowed, its type, default, check and a one-line doc.

The parser (`epbuild.manifest.parse`), the qaic flag checks and the docs' key table all read this table, so a new key
is one entry here plus the code that uses it. `python -m epbuild.manifest.schema` prints that table (docs/manifest.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..records import record
from .eps import DEVICES

COMPILERS = ("ort", "ort_session", "qaic", "qairt")
QUANT_TYPES = ("uint8", "int8", "uint16", "int16")
THRESHOLDS = ("max_abs_error", "mean_abs_error", "max_rel_error", "min_cosine", "min_snr_db", "min_selection_overlap")
GATES = ("min_relative", "max_drop")  # a task metric's gate: also per target (`validation.targets.T`)
METRICS = ("top1", "top5", "miou", "agreement")  # built in; else "module:function" from the user's repository
PMU_RECIPES = ("AxiRd", "AxiWr", "AxiRdWr", "KernelUtil", "HmxMacs")
NUMBER = (int, float)

# Where a key is allowed; the docs' key table names them in this order.
SCOPES = {
    "top": "top level", "model": "`[models.NAME]`", "variant": "`[models.NAME] variants.V`",
    "quantize": "`[models.NAME] quantize`",
    "target": "`[targets.NAME]`", "validation": "`validation` (model or target)", "qaic": "`[targets.NAME] qaic`",
    "group": "`[groups.NAME]`", "pipeline": "`[groups.NAME] pipeline`", "package": "`[packages.NAME]`",
    "build": "`[build]`",
    "cache": "`[cache]`",
    "executor": "`[executor]`",
    "toolchain": "`[toolchains.NAME]`",
}


LARGEST = 1e12  # no limit, size or threshold of a build comes near: a bigger number is a typo (or inf)


def positive(value: Any) -> str | None:
    return None if 0 < value <= LARGEST else f"must be a positive number up to {LARGEST:g}, found {value!r}"


def non_negative(value: Any) -> str | None:
    return None if 0 <= value <= LARGEST else f"must be a number from 0 to {LARGEST:g}, found {value!r}"


def npz_file(value: Any) -> str | None:
    return None if value.endswith(".npz") else f"must name an .npz file (numpy.savez), found {value!r}"


def fraction(value: Any) -> str | None:
    return None if 0 <= value <= 1 else f"must be a fraction between 0 and 1 (e.g. 0.95), found {value!r}"


def cosine(value: Any) -> str | None:
    return None if 0 <= value <= 1 else f"must be a non-negative number <= 1, found {value!r}"


def positive_integer(value: Any) -> str | None:
    return None if value > 0 else f"must be a positive integer, found {value}"


def strings(value: Any) -> str | None:
    return None if all(isinstance(v, str) for v in value) else "must be a list of strings"


REWRITES = ("rmsnorm",)  # epbuild.steps.diagnosis: graph rewrites a model can ask for


def rewrites(value: Any) -> str | None:
    unknown = [v for v in value if v not in REWRITES]
    if unknown or len(set(value)) != len(value):
        return (f"must list rewrites from {', '.join(REWRITES)}, each once (\"rmsnorm\": x * rsqrt(mean(x^2) + eps) "
                f"written as x / sqrt(...)), found {value!r}")
    return None


def s3_url(value: Any) -> str | None:
    if re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?", value):
        return None
    return f"must be an S3 URL such as \"s3://models-cache/epbuild\" (s3://BUCKET/PREFIX), found {value!r}"


def hex_events(value: Any) -> str | None:
    if len(value) > 8:
        return f"at most 8 events, found {len(value)}"
    for event in value:
        if not isinstance(event, str) or not re.fullmatch(r"(0x)?[0-9A-Fa-f]+", event):
            return f"must be hex event ids such as \"3F\", found {event!r}"
    return None


@record
class Key:
    """One manifest key. `kind` is the TOML type(s); `choices` the valid strings; `check` returns a message for a
    value of the right type that is still invalid."""

    name: str
    scopes: tuple[str, ...]
    kind: type | tuple[type, ...]
    doc: str
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], str | None] | None = None


KEYS: tuple[Key, ...] = (
    Key("models", ("top",), dict, "the models, one `[models.NAME]` table each", required=True),
    Key("targets", ("top",), dict, "the targets, one `[targets.NAME]` table each"),
    Key("groups", ("top",), dict, "shared-context groups, one `[groups.NAME]` table each"),
    Key("packages", ("top",), dict, "ONNX Runtime model packages (`artifacts/packages/NAME/`), one `[packages.NAME]` "
        "table each"),
    Key("build", ("top",), dict, "how builds run on a host: jobs at once, the memory they share, the time a "
        "reduction may take"),
    Key("cache", ("top",), dict, "the artifact cache"),
    Key("toolchains", ("top",), dict, "external toolchains: `[toolchains.qaic] root`"),
    # models
    Key("path", ("model",), str, "the source ONNX file, relative to models.toml; external-data files next to it "
        "are found and tracked", required=True),
    Key("inputs", ("model", "variant"), dict, "`{input = [dims]}`: static shapes. CPU targets fix named symbolic "
        "dimensions with free-dimension overrides; ONNX Runtime EP targets get a `shape` stage that fixes the inputs "
        "in the file (`-1` and unnamed dimensions too) and runs shape inference. Only true inputs can be named: a "
        "weight that an old exporter also lists in `graph.input` is refused with that explanation", {}),
    Key("dims", ("model", "variant"), dict, "`{ dim_param = size }`: named dimensions fixed once for every input "
        "that has them (`{ batch_size = 1, sequence_length = 128, past_sequence_length = 3968 }` instead of dozens "
        "of KV-cache shapes in `inputs`); an input given in `inputs` wins; a name no input has is refused, listing "
        "the model's names"),
    Key("variants", ("model",), dict, "`{ V = { dims = {...}, inputs = {...} } }`: build the model as several "
        "models `NAME.V` (a prompt and a token graph of one decoder), each with these keys over the model's; the "
        "model itself is then only their template"),
    Key("targets", ("model",), list, "target names to build this model for (default: every target)"),
    Key("optimize", ("model",), str, "an ORT graph-optimization stage before quantization, in place of the `fold` "
        "stage NPU targets get by default (nodes that only compute constants replaced by their values, nothing "
        "else rewritten: left on CPU in front of the EPContext node, they make QNN artifacts unloadable); `none`: "
        "neither", choices=("basic", "extended", "none")),
    Key("quantize", ("model",), dict, "a QDQ quantization stage (keys below)"),
    Key("rewrite", ("model",), list, "graph rewrites in a `rewrite` stage before the others, each validated like "
        "every stage (against the model as declared): `\"rmsnorm\"` writes RMSNorm's x * rsqrt(mean(x^2) + eps) "
        "as x / sqrt(...), the same value, which QNN HTP compiles where the first form fails to finalize; a model "
        "without the pattern is refused", [], check=rewrites),
    Key("squash", ("model",), bool, "a stage that writes a single-file ONNX with external data inlined (refused "
        "beyond the 2 GiB protobuf limit, naming the size)", False),
    Key("upgrade", ("model",), bool, "an `upgrade` stage for targets whose EP takes no model below some ai.onnx "
        "opset (QNN: 7, below which ONNX Runtime's layout transformer refuses the whole model): ONNX's version "
        "converter writes the model at that opset, validated against the model as declared; `false`: compile the "
        "model as it is", True),
    Key("freeze", ("model",), dict, "`{ input = value or [values] }`: a stage that turns configuration inputs (a "
        "sample rate, a mode flag) into constants and folds what they select with ORT's basic optimization; "
        "validation feeds the same values to the model as declared"),
    Key("validation", ("model",), dict, "validation inputs, reference and thresholds (keys below); they win over "
        "the target's"),
    # quantize
    Key("calibration", ("quantize",), str, "a folder of `.npz` files, one sample each, keys = input names; "
        "`\"random\"`: a fixed-seed set for smoke tests (a warning says so)", required=True),
    Key("activation_type", ("quantize",), str, "activation type", "uint8", choices=QUANT_TYPES),
    Key("weight_type", ("quantize",), str, "weight type", "uint8", choices=QUANT_TYPES),
    Key("per_channel", ("quantize",), bool, "per-channel weight scales", False),
    # targets
    Key("ep", ("target",), str, "alias (qnn, openvino, cpu, dml, vitisai, migraphx, nvtensorrtrtx) or full EP name, "
        "optionally with a source: `openvino@pypi`; as `winml compile --ep`"),
    Key("device", ("target",), str, "default: the EP's device (qnn: npu, openvino: cpu); without an EP the device "
        "picks one (npu: qnn, cpu: cpu)", choices=DEVICES),
    Key("compiler", ("target",), str, "`ort`: ModelCompiler; `ort_session`: a session with ep.context_enable; "
        "`qaic`: qaic-compile to a QPC; `qairt`: the QAIRT SDK", "ort", choices=COMPILERS),
    Key("embed", ("target",), bool, "the context binary inside the .onnx (`winml compile --embed`)", False),
    Key("options", ("target",), dict, "provider options; booleans become \"1\"/\"0\". For QNN and OpenVINO unknown "
        "names are errors with the closest valid name; options the OpenVINO plugin ignores point to `load_config`",
        {}),
    Key("option_files", ("target",), list, "option keys whose values are files, relative to models.toml, passed "
        "as absolute paths and tracked by content (winml's `provider_option_file_keys`)", [], check=strings),
    Key("extends", ("target",), str, "inherit another target; this target's keys win, `options` and `validation` "
        "merge per key"),
    Key("optimization_level", ("target",), str, "cpu targets: level of the offline-optimized model (default "
        "extended, portable across CPUs; all is tied to this host's ISA)", choices=("basic", "extended", "all")),
    Key("validate", ("target",), (bool, str), "`true` (run and compare), `\"structural\"` (check without running) "
        "or `false`", True),
    Key("validation", ("target",), dict, "validation inputs and thresholds for every model of the target"),
    Key("quantized", ("target",), bool, "compile the quantized variant of models that declare `quantize` (QNN "
        "targets get QNN's QDQ configuration, others the generic one)", False),
    Key("config", ("target",), str, "a WinMLBuildConfig JSON: `compile.provider_options` become options (the "
        "manifest's win) and `compile.provider_option_file_keys` become option_files"),
    Key("qaic", ("target",), dict, "with `compiler = \"qaic\"`: the qaic-compile flags (keys below)"),
    Key("qnn_sdk_root", ("target",), str, "with `compiler = \"qairt\"`: the QAIRT SDK (else `QNN_SDK_ROOT`)"),
    Key("timeout_s", ("target",), NUMBER, "wall-time limit of the compile child (default 3600)", check=positive),
    Key("max_memory_gb", ("target",), NUMBER, "resident-memory limit of the compile and validation children "
        "(default 80% of this host's memory)", check=positive),
    Key("ship_socs", ("target",), list, "QNN targets whose soc_model is a list: the SoCs shipped; the multi-SoC "
        "binary is pruned to them with onnxruntime-qnn's deploy_multi_soc_ep_context (in a Python 3.12 with "
        "onnxruntime-qnn: EPBUILD_QNN_DEPLOY_PYTHON) and they alone are validated; where the tool is missing the "
        "compile line says so and the binary keeps every SoC"),
    Key("min_offload", ("target",), NUMBER, "EP targets: the share of source nodes that must end inside EPContext "
        "nodes, e.g. 0.95; below it the compile fails listing the op types left on CPU", check=fraction),
    # validation
    Key("inputs", ("validation",), str, "an `.npz` of inputs, keys = input names (default: generated, fixed seed)",
        check=npz_file),
    Key("reference", ("validation",), str, "models only: another model to compare with (default: the source)"),
    Key("targets", ("validation",), dict, "models only: thresholds for one target, winning over the model's: "
        "`targets = { qnn-htp = { min_snr_db = 30 } }` relaxes fp16 QNN without relaxing CPU or OpenVINO"),
    Key("timeout_s", ("validation",), NUMBER, "wall-time limit of the validation child (default 600)",
        check=positive),
    Key("dataset", ("validation",), str, "samples the model's task is judged on: an `.npz` whose arrays are named "
        "after the model's inputs with a leading sample axis (and optionally `labels`), or a folder of such files, "
        "inside the project; with `metric`, the compiled model must keep its source's score on them (see "
        "`min_relative`)"),
    Key("samples", ("validation",), int, "how many of the dataset's samples to judge on: a deterministic subset "
        "(evenly spaced; default all)", check=positive_integer),
    Key("metric", ("validation",), str, "the task metric that decides the verdict when a `dataset` is given: "
        "`top1`, `top5` (an output's argmax / top 5 against `labels`), `miou` (per-position argmax, segmentation), "
        "`agreement` (share of samples whose chosen class equals the source model's), or `\"module:function\"` from "
        "the project, called as `function(outputs=..., labels=..., reference=...)`; without labels a built-in metric "
        "is agreement with the source model", check=lambda v: None if v in METRICS or re.fullmatch(
            r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", v) else f"must be one of {', '.join(METRICS)} or "
        f"\"module:function\" (a module of the project), found {v!r}"),
    Key("output", ("validation",), str, "the output the task metric reads (default: the model's first output)"),
    Key("min_relative", ("validation",), NUMBER, "the task metric's gate: the compiled model's score at least this "
        "share of the source model's on the same samples (default 0.99, MLPerf's standard); also per target",
        check=fraction),
    Key("max_drop", ("validation",), NUMBER, "the gate as an absolute drop instead: the compiled model's score at "
        "least the source's minus this; also per target", check=non_negative),
    Key("repeat_within_s", ("validation",), NUMBER, "the artifact is run twice on the same inputs, and outputs "
        "that differ between the runs beyond what its precision explains fail it (a simulator or EP whose result is "
        "luck); a first run longer than this many seconds is not repeated, and validation.json says so (default 30; "
        "0: never); changes no passed result", check=non_negative),
    Key("localise", ("validation",), bool, "when outputs miss a threshold, find the first intermediate tensor where "
        "the EP departs from CPU (its node, op type and SNR, in the failure line and `validation.json`'s "
        "`divergence`); a few extra EP compiles of the model with chosen tensors as outputs, within the "
        "validation's time limit; changes no passed result, so no task reruns for it"),
    Key("inconclusive", ("validation",), str, "what a validation the thresholds could not judge (an output nearly "
        "constant for its inputs, within the SNR margin) does: `report` it as its own verdict, never counted as "
        "passed (the default), or `fail` the task", choices=("report", "fail")),
    Key("max_abs_error", ("validation",), NUMBER, "threshold per output", check=non_negative),
    Key("mean_abs_error", ("validation",), NUMBER, "threshold per output", check=non_negative),
    Key("max_rel_error", ("validation",), NUMBER, "threshold per output", check=non_negative),
    Key("min_cosine", ("validation",), NUMBER, "threshold per output (default by precision)", check=cosine),
    Key("min_snr_db", ("validation",), NUMBER, "threshold per output (default by precision: fp32 60, fp16 40, QDQ "
        "20)", check=non_negative),
    Key("min_selection_overlap", ("validation",), NUMBER, "outputs a TopK, ArgMax/ArgMin or NonMaxSuppression "
        "decides are compared as selections: the share of the reference's chosen indices the artifact chose too "
        "(order aside), then values on the rows both chose (default by precision: fp32 0.99, fp16 0.9, QDQ 0.8)",
        check=cosine),
    # qaic
    Key("num_cores", ("qaic",), int, "`-aic-num-cores`", check=positive_integer),
    Key("convert_to_fp16", ("qaic",), bool, "`-convert-to-fp16`", False),
    Key("stats_level", ("qaic",), int, "`-stats-level` (50: I/O waits, 70: per-operator cycles, 100: extended "
        "PMU)", check=positive_integer),
    Key("stats_batchsize", ("qaic",), int, "`-stats-batchsize`", check=positive_integer),
    Key("ddr_stats", ("qaic",), bool, "`-ddr-stats`, needs stats_level >= 40", False),
    Key("pmu_recipe", ("qaic",), str, "`-aic-pmu-recipe`; exclusive with pmu_events", choices=PMU_RECIPES),
    Key("pmu_events", ("qaic",), list, "`-aic-pmu-events`: up to 8 hex event ids", [], check=hex_events),
    Key("perf_warnings", ("qaic",), bool, "`-aic-perf-warnings`", False),
    Key("perf_metrics", ("qaic",), bool, "`-aic-perf-metrics`", False),
    Key("aic_hw", ("qaic",), bool, "`-aic-hw`", True),
    Key("extra_args", ("qaic",), list, "more qaic-compile flags, verbatim", [], check=strings),
    # groups, cache, toolchains
    Key("target", ("group",), str, "the target whose EP shares one context (it must not embed)", required=True),
    Key("models", ("group",), list, "two or more models, compiled in this order", required=True),
    Key("pipeline", ("group",), dict, "validate the group as an LLM runs it: the first model the prompt graph, the "
        "second the token graph; `present.*` outputs feed the next step's `past_key_values.*` inputs (from position "
        "0 for GroupQueryAttention models, else the newest positions where the token graph's cache is shorter), "
        "`input_ids` gets the prompt then each greedy token, `attention_mask` marks the filled positions, "
        "`position_ids` counts them; per-step logits and the greedy tokens are compared with the source models on "
        "CPU, whose run is checked against a growing-cache run of the model as declared and onnxruntime-genai"),
    Key("models", ("package",), list, "the models it holds, one component each; every target of theirs whose "
        "validation passed is a variant that ONNX Runtime selects by EP", [], check=strings),
    Key("groups", ("package",), list, "shared-context groups it holds: one component per member (`GROUP.MODEL`), "
        "the members sharing one variant folder and loading together (`ep.share_ep_contexts`)", [], check=strings),
    Key("targets", ("package",), list, "only these targets' variants (default: every target of its models)",
        check=strings),
    Key("tokens", ("pipeline",), int, "greedy token steps after the prompt", 4, check=lambda n: None if 1 <= n <= 64
        else f"must be from 1 to 64, found {n}"),
    Key("jobs", ("build",), (int, str), "jobs at once without `-n`: a number, or `\"cores\"` (one per core; "
        "EPBUILD_JOBS wins; default: one per core)", check=lambda v: None if v == "cores" or (
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024)
        else f"must be a number of jobs from 1 to 1024 or \"cores\", found {v!r}"),
    Key("memory_gb", ("build",), NUMBER, "the memory budget the jobs of this host's builds share: a job starts when "
        "its expected peak fits (EPBUILD_MEMORY_GB wins; 0: no admission; default 80% of this host's memory)",
        check=lambda v: None if 0 <= v <= LARGEST else f"must be 0 or a positive number of GB, found {v!r}"),
    Key("reduce_budget_s", ("build",), NUMBER, "seconds `epbuild reduce TASK` may spend reducing one failure to a "
        "repro (it then stops with the smallest failing subgraph found)", 300, check=positive),
    Key("dir", ("cache",), str, "the cache folder (EPBUILD_CACHE_DIR wins; default ~/.cache/epbuild)"),
    Key("max_size_mb", ("cache",), NUMBER, "size cap; least-recently-used entries are evicted", check=positive),
    Key("hard_links", ("cache",), bool, "publish artifacts as hard links to the cache's files instead of copies: "
        "saves the disk and the time of a copy for large models, but onnx refuses to load external data that has "
        "several links, and an in-place edit of an artifact then changes the cache entry too (it is evicted on its "
        "next restore)", False),
    Key("remote", ("cache",), str, "a shared S3-API cache, `s3://BUCKET/PREFIX` (EPBUILD_CACHE_REMOTE wins; "
        "endpoint and credentials from the standard AWS settings)", check=s3_url),
    Key("remote_budget_s", ("cache",), NUMBER, "seconds a build (all its processes together) may spend waiting on "
        "the remote (each request's time beyond its transfer at 20 MB/s) before it skips the remote with one warning "
        "and builds locally", 60, check=positive),
    Key("remote_timeout_s", ("cache",), NUMBER, "seconds one remote request may go without an answer (tried "
        "twice) before the remote is skipped for the build", 10, check=positive),
    Key("executor", ("top",), dict, "run builds on a Dask cluster"),
    Key("scheduler", ("executor",), str, "the Dask scheduler, `tcp://HOST:PORT` (EPBUILD_EXECUTOR wins; empty: run "
        "locally)"),
    Key("wait_s", ("executor",), NUMBER, "how long a job waits for a worker that can run it before failing with "
        "what is missing", 60, check=positive),
    Key("root", ("toolchain",), str, "the toolchain's root (qaic: the Cloud AI Apps SDK, else `QAIC_ROOT`, else "
        "`/opt/qti-aic`)", required=True),
)


def keys(scope: str) -> dict[str, Key]:
    """The keys allowed in one scope, in declaration order."""
    return {key.name: key for key in KEYS if scope in key.scopes}


def _kind_text(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({str: "string", bool: "boolean", int: "integer", float: "number", list: "array",
                        dict: "table"}[k] for k in kinds if not (k is int and float in kinds))


def key_table() -> str:
    """The key table of docs/manifest.md, generated from `KEYS`."""
    rows = ["| key | where | type | default | meaning |", "|---|---|---|---|---|"]
    for scope, title in SCOPES.items():
        for key in keys(scope).values():
            default = "required" if key.required else "" if key.default in (None, {}, []) else f"`{key.default!r}`"
            default = default.replace("True", "true").replace("False", "false").replace("'", '"')
            choices = " \\| ".join(key.choices or ())
            kind = _kind_text(key.kind) + (f": {choices}" if choices else "")
            rows.append(f"| `{key.name}` | {title} | {kind} | {default} | {key.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(key_table())
