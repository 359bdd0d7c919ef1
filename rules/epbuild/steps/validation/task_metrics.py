"""Whether the compiled model still does its job: a task metric on the user's samples (`validation.dataset`), the
source model's score against the artifact's on the same samples, and the gate between them (`min_relative`, MLPerf's
99% by default, or `max_drop`). Tensor closeness on one batch is not what users ask: an fp16 detector at 36 dB keeps
its detections, a QDQ model at 20 dB can lose a class. Runs in the validating child; the source's outputs on the
samples are computed with the CPU reference and kept with it (`reference.reference_run`). The source is the model as
declared: a quantized artifact is judged against the float model it was quantized from (its tensors against the QDQ
model, which a poor calibration can make as wrong as it).

A dataset is an `.npz` (or a folder of them, concatenated in name order) whose arrays are named after the model's
inputs, each with a leading sample axis, and optionally `labels`. Samples are fed in the batches the model takes (a
batch-1 artifact gets one sample at a time; a last partial batch is filled with its last sample, whose extra outputs
are dropped)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...contracts.jobs import ValidationMember
from ...errors import ModelError
from ...execute.forked_jobs import resident_bytes
from .metric_code import custom_metric
from .sample_workers import START_S, DatasetRun, estimate_s, prepare_runs, processes_for
from .validation_inputs import dtype_of, read_npz

LABELS = "labels"
DYNAMIC_BATCH = 32  # samples per run where the model's batch axis is symbolic


class Dataset:
    """The chosen samples of a dataset, checked against a model's inputs."""

    def __init__(self, arrays: dict[str, Any], labels: Any | None, total: int):
        self.arrays, self.labels, self.total = arrays, labels, total

    @property
    def count(self) -> int:
        return len(next(iter(self.arrays.values())))

    def batches(self, size: int) -> Iterator[tuple[dict[str, Any], int]]:
        """(feeds, how many of them are samples) for each run: `size` samples, the last run's filled with its last."""
        import numpy as np

        for start in range(0, self.count, size):
            real = min(size, self.count - start)
            feeds = {}
            for name, array in self.arrays.items():
                chunk = array[start:start + real]
                if real < size:
                    chunk = np.concatenate([chunk, np.repeat(chunk[-1:], size - real, axis=0)])
                feeds[name] = chunk
            yield feeds, real


def _where(key: str) -> str:
    return f"validation.{key}"


def read_dataset(task: dict[str, Any], inputs: list[tuple[str, str, list[Any]]], frozen: dict[str, Any]) -> Dataset:
    """The dataset's chosen samples for a model whose true inputs are `inputs` (name, ONNX type, shape); every
    mismatch one line naming `validation.dataset` and what the model takes (ModelError)."""
    import numpy as np

    found: dict[str, list[Any]] = {}
    for path in task["dataset"]:
        try:
            arrays = read_npz(path, "validation.dataset")
        except ModelError as exc:
            raise ModelError(exc.message, _where("dataset")) from None
        for name, array in arrays.items():
            found.setdefault(name, []).append(array)
    wanted = [(name, kind, shape) for name, kind, shape in inputs if name not in frozen]
    names = {name for name, _, _ in wanted}
    unknown = sorted(set(found) - names - {LABELS})
    missing = sorted(names - set(found))
    if unknown or missing:
        raise ModelError(f"its arrays {sorted(found)} are not the model's inputs {sorted(names)} (and optionally "
                         f"'{LABELS}'): {'missing ' + ', '.join(missing) if missing else ''}"
                         f"{'; ' if missing and unknown else ''}{'unknown ' + ', '.join(unknown) if unknown else ''}",
                         _where("dataset"))
    joined = {}
    for name, parts in found.items():
        if any(part.ndim == 0 for part in parts):
            raise ModelError(f"array '{name}' is a scalar: every array has a leading sample axis", _where("dataset"))
        try:
            joined[name] = np.concatenate(parts) if len(parts) > 1 else parts[0]
        except ValueError as exc:
            raise ModelError(f"array '{name}' differs in shape between the dataset's files ({exc})",
                             _where("dataset")) from None
    counts = {name: len(array) for name, array in joined.items()}
    if len(set(counts.values())) != 1:
        raise ModelError(f"its arrays hold different numbers of samples ({counts}): every array's first axis is the "
                         "sample axis, the same for all", _where("dataset"))
    total = next(iter(counts.values()))
    if total == 0:
        raise ModelError("holds no samples", _where("dataset"))
    for name, kind, shape in wanted:
        array = joined[name]
        expected = dtype_of(kind)
        if array.dtype != expected:
            raise ModelError(f"array '{name}' is {array.dtype}; the model's input '{name}' takes {expected}",
                             _where("dataset"))
        sample = list(shape[1:]) if shape else []
        if _fits(array.shape[1:], [1, *sample]) and shape and shape[0] == 1:  # each sample as the model takes it
            array = joined[name] = array.reshape((len(array), *array.shape[2:]))
        if not _fits(array.shape[1:], sample):
            raise ModelError(f"array '{name}' holds samples of shape {list(array.shape[1:])}; the model's input "
                             f"'{name}' takes {list(shape)}, so each sample is {sample}: give an array of shape "
                             f"[N, {', '.join(map(str, sample))}] (N samples; [N, {', '.join(map(str, shape))}] "
                             "also does for a batch of 1)".replace(", ]", "]"), _where("dataset"))
    chosen = _chosen(total, task.get("samples"))
    labels = joined.pop(LABELS, None)
    if labels is not None:
        if labels.dtype.kind not in "iu":
            raise ModelError(f"'{LABELS}' is {labels.dtype}: class indices are integers", _where("dataset"))
        labels = labels[chosen]
    return Dataset({name: joined[name][chosen] for name, _, _ in wanted}, labels, total)


def _fits(given: tuple[int, ...], wanted: list[Any]) -> bool:
    """Whether a sample of shape `given` is one of `wanted` (a named or unknown dimension takes any size)."""
    return len(given) == len(wanted) and all(not isinstance(w, int) or w in (g, -1) for g, w in
                                             zip(given, wanted, strict=True))


def _chosen(total: int, samples: int | None) -> Any:
    """A deterministic subset: `samples` evenly spaced over the dataset (a dataset sorted by class keeps every class),
    or all."""
    import numpy as np

    if not samples or samples >= total:
        return np.arange(total)
    return np.unique(np.linspace(0, total - 1, samples).round().astype(np.int64))


def batch_size(shape: list[Any]) -> int:
    """How many samples one run takes: the model's static batch axis, else `DYNAMIC_BATCH`."""
    first = shape[0] if shape else 1
    return first if isinstance(first, int) and first > 0 else DYNAMIC_BATCH


def dataset_feeds(task: dict[str, Any], inputs: list[tuple[str, str, list[Any]]], frozen: dict[str, Any],
                  declared: dict[str, list[int]]) -> dict[str, Any] | None:
    """The tensors' comparison inputs taken from the dataset (its first samples, one run's worth: the model's static
    batch, else the batch `inputs` declares, else 1) instead of generated ones; None where a run's worth does not
    have the shapes the model takes (the generated inputs then serve, as before)."""
    dataset = read_dataset(task, inputs, frozen)
    if not inputs:
        return None
    name, _, shape = inputs[0]
    first = shape[0] if shape else 1
    size = first if isinstance(first, int) and first > 0 else (declared.get(name) or [1])[0]
    if size > dataset.count:
        return None
    feeds, _ = next(dataset.batches(size))
    for name, _, shape in inputs:
        want = declared.get(name) or shape
        if name in feeds and not _fits(feeds[name].shape, list(want)):
            return None
    return feeds


def output_name(task: dict[str, Any], outputs: list[str]) -> str:
    """The output the metric reads: `validation.output`, else the model's first."""
    name = task.get("output") or outputs[0]
    if name not in outputs:
        raise ModelError(f"the model has no output '{name}'; its outputs: {', '.join(outputs)}", _where("output"))
    return name


# ---- metrics: each over (the scored model's output, labels or the source's output) ----

def _top(values: Any, k: int) -> Any:
    import numpy as np

    flat = values.reshape(len(values), -1)
    return np.argsort(-flat, axis=1, kind="stable")[:, :k]


def _check_labels(labels: Any, values: Any, metric: str, output: str) -> None:
    classes = values.shape[1] if metric == "miou" else values.reshape(len(values), -1).shape[1]
    if metric == "miou" and labels.shape != values.shape[:1] + values.shape[2:]:
        wanted = [values.shape[0], *values.shape[2:]]
        raise ModelError(f"'{LABELS}' has shape {list(labels.shape)}; miou compares it position by position with "
                         f"output '{output}' {list(values.shape)}: labels of shape {wanted}", _where("dataset"))
    if metric != "miou" and labels.shape != (len(values),):
        raise ModelError(f"'{LABELS}' has shape {list(labels.shape)}; {metric} takes one class per sample: "
                         f"[{len(values)}]", _where("dataset"))
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ModelError(f"'{LABELS}' holds classes from {int(labels.min())} to {int(labels.max())}, outside output "
                         f"'{output}''s {classes} classes (0 to {classes - 1})", _where("dataset"))


def _miou(predicted: Any, truth: Any, classes: int) -> float:
    import numpy as np

    scores = []
    for cls in range(classes):
        union = np.logical_or(predicted == cls, truth == cls).sum()
        if union:
            scores.append(np.logical_and(predicted == cls, truth == cls).sum() / union)
    return float(np.mean(scores)) if scores else 1.0


def builtin_score(metric: str, values: Any, against: Any, labelled: bool) -> float:
    """`values`: the scored model's output, samples first; `against`: the labels, or the source model's output
    (agreement with it). top1/top5/agreement read classes on the output's other axes flattened; miou on axis 1."""

    if metric == "miou":
        predicted = values.argmax(axis=1)
        truth = against if labelled else against.argmax(axis=1)
        return _miou(predicted, truth, values.shape[1])
    truth = against if labelled else against.reshape(len(against), -1).argmax(axis=1)
    if metric == "top5":
        return float((_top(values, 5) == truth[:, None]).any(axis=1).mean())
    return float((values.reshape(len(values), -1).argmax(axis=1) == truth).mean())  # top1, agreement


def score(task: dict[str, Any], outputs: dict[str, Any], source: dict[str, Any], labels: Any | None,
          output: str) -> float:
    """The metric of `outputs` (the scored model's, stacked), against the labels or the source model's outputs."""
    metric = task["metric"]
    if ":" in metric:
        function = custom_metric(task)
        try:
            value = float(function(outputs=outputs, labels=labels, reference=source))
        except Exception as exc:  # noqa: BLE001 - the user's function: its error, in one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ModelError(f"'{metric}' raised {type(exc).__name__}: {first}", _where("metric")) from None
        if not math.isfinite(value):
            raise ModelError(f"'{metric}' returned {value}: a metric is a finite number", _where("metric"))
        return value
    values = outputs[output]
    classes = values.reshape(len(values), -1).shape[1] if values.ndim > 1 else 1
    if metric == "top5" and classes <= 5:  # every class is among the top 5: it would pass anything
        raise ModelError(f"top5 on output '{output}' of {classes} classes counts every sample right, whatever the "
                         "model computes: use top1 (or agreement) for an output of 5 classes or fewer",
                         _where("metric"))
    if labels is not None and metric != "agreement":
        _check_labels(labels, values, metric, output)
        return builtin_score(metric, values, labels, True)
    return builtin_score(metric, values, source[output], False)


def gate(task: dict[str, Any], source: float, artifact: float) -> tuple[float, str]:
    """(the score the artifact needs, the gate in words)."""
    if "max_drop" in task["gate"]:
        drop = task["gate"]["max_drop"]
        return source - drop, f"the source's {source:.4g} minus max_drop {drop:g}"
    share = task["gate"]["min_relative"]
    return share * source, f"{share:.0%} of the source's {source:.4g}, min_relative {share:g}"


def judge(task: dict[str, Any], output: str, dataset: Dataset, source_outputs: dict[str, Any],
          artifact_outputs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(validation.json's `task`, the failure when the gate is missed)."""
    labels = dataset.labels
    against = "labels" if labels is not None and task["metric"] != "agreement" else "the source model's outputs"
    source = score(task, source_outputs, source_outputs, labels, output)
    artifact = score(task, artifact_outputs, source_outputs, labels, output)
    needed, rule = gate(task, source, artifact)
    passed = artifact >= needed - 1e-12
    report = {"metric": task["metric"], "output": output, "samples": dataset.count, "of": dataset.total,
              "against": against, "source": source, "artifact": artifact, "gate": task["gate"], "needed": needed,
              "passed": passed}
    if passed:
        return report, None
    return report, (f"task metric {task['metric']} on {dataset.count} samples (against {against}): the artifact "
                    f"scores {artifact:.4g}; it needs {needed:.4g} ({rule})")


def summary(task: dict[str, Any]) -> str:
    """The task's verdict in a line: what decided it."""
    return (f"{task['metric']} {task['artifact']:.4g} against the source's {task['source']:.4g} (needs "
            f"{task['needed']:.4g}; {task['samples']} samples, against {task['against']})")


@dataclasses.dataclass
class TaskRuns:
    """A task metric's samples made ready to run on the artifact (`start`): its dataset, the output it scores, and
    the runs, whose workers may already be starting."""

    dataset: Dataset
    output: str
    runs: DatasetRun
    processes: int


def start(session: Any, request: ValidationMember, seconds: float, left_s: float, ep: str,
          ran: tuple[dict[str, Any], list[Any]] | None = None) -> TaskRuns:
    """The task's samples read and checked, and the processes that share them started: as soon as one run's time
    (`seconds`) is known, so that their start overlaps the validation's other work. Samples that would not fit in
    `left_s` (what the validation's time limit leaves) are said, with how many would, before any runs."""
    task = request.task
    assert task is not None, "a job with a task metric"
    inputs = [(i.name, i.type, i.shape) for i in session.get_inputs()]
    dataset = read_dataset(task, inputs, request.frozen)
    size = batch_size(inputs[0][2] if inputs else [])
    runs = math.ceil(dataset.count / size)
    processes = processes_for(runs, seconds, resident_bytes(os.getpid()))
    if estimate_s(runs, seconds, processes) > left_s:
        fit = max(1, int(max(0.0, left_s - (START_S if processes > 1 else 0.0)) / max(seconds, 1e-9)) * processes
                  * size)
        spread = f" in {processes} processes" if processes > 1 else ""
        raise ModelError(f"{dataset.count} samples take {runs} runs of about {seconds:.3g} s on {ep} (its simulator "
                         f"where the device is absent){spread}: about {estimate_s(runs, seconds, processes):.0f} s, "
                         f"beyond the {left_s:.0f} s validation.timeout_s leaves; about {fit} fit "
                         f"(validation.samples = {fit}), or raise validation.timeout_s", _where("samples"))
    output = output_name(task, [o.name for o in session.get_outputs()])
    keep = None if ":" in task["metric"] else [output]
    prepared = prepare_runs(session, dataset, size, keep, {}, "artifact", processes, request, seconds, ran)
    return TaskRuns(dataset, output, prepared, processes)


def evaluate(session: Any, request: ValidationMember, source_outputs: dict[str, Any], seconds: float, left_s: float,
             ep: str, ran: tuple[dict[str, Any], list[Any]] | None = None,
             started: TaskRuns | None = None) -> tuple[dict[str, Any], str | None]:
    """The artifact's session run on the task's samples (`started`: made ready earlier, else now) and judged
    against the source's outputs on them (kept with the CPU reference): (validation.json's `task`, the failure).
    `seconds`: one run of it; `left_s`: what the validation's time limit leaves."""
    task = request.task
    assert task is not None, "a job with a task metric"
    prepared = started or start(session, request, seconds, left_s, ep, ran)
    try:
        outputs = prepared.runs.outputs(session)
    finally:
        prepared.runs.stop()
    report, failure = judge(task, prepared.output, prepared.dataset, source_outputs, outputs)
    return {**report, "processes": prepared.processes}, failure


def decide(session: Any, request: ValidationMember, source_outputs: dict[str, Any], seconds: float, left_s: float,
           ep: str, tensor_misses: list[str], stage_session: Callable[[], Any] | None = None,
           ran: tuple[dict[str, Any], list[Any]] | None = None,
           started: TaskRuns | None = None) -> tuple[dict[str, Any], str | None]:
    """`evaluate`, with what the tensors missed (reported beside the task, not deciding) and, when the task is lost,
    where to look: the model the artifact was compiled from lost it already (its tensors match it; or, scored on a
    CPU session of it, `stage_session()`, it misses the gate too)."""
    task, failure = evaluate(session, request, source_outputs, seconds, left_s, ep, ran, started)
    task["tensors"] = tensor_misses or "within the thresholds"
    declared = f"the model as declared ({Path(request.declared).name})"
    if failure and not tensor_misses and request.reference_is != declared:
        failure += (f"; the artifact matches {request.reference_is} (tensors within the thresholds): that model "
                    "loses it already (a quantization's calibration data?)")
        task["lost_by"] = request.reference_is
    elif failure and request.reference_is != declared and stage_session is not None:  # the stage's model's score
        staged = _stage_score(stage_session, request, source_outputs, left_s)
        if staged is not None and not staged["passed"]:
            failure += (f"; {request.reference_is}, the model it was compiled from, already scores "
                        f"{staged['artifact']:.4g} on CPU on the same samples: that stage lost the task, not "
                        f"{ep} (a quantization's calibration data, its types?)")
            task["lost_by"] = request.reference_is
    return task, failure


def _stage_score(stage_session: Callable[[], Any], request: ValidationMember, source_outputs: dict[str, Any],
                 left_s: float) -> dict[str, Any] | None:
    """The task judged on a CPU session of the model the artifact was compiled from (a stage's output); None where
    it cannot be run on CPU here."""
    try:
        staged, _ = evaluate(stage_session(), request, source_outputs, 0.0, left_s, "CPUExecutionProvider")
    except Exception:  # noqa: BLE001 - no evidence: the line stays as it was
        return None
    return staged
