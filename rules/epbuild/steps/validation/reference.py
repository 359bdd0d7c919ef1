"""The CPU reference a validation compares with, run in the validating child: the model as declared, a stage's
output or the user's `validation.reference`. A reference that ONNX Runtime cannot load is named as what it is (a
stage's output, not the target's EP), and a stage's output that cannot be loaded gives way to the model as declared,
said in the report's notes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...contracts.jobs import ValidationMember
from ...errors import ModelError
from ...files.weights import read_weights_from, weights_folder
from ..graph import static_dims
from .validation_inputs import feeds_for, make_inputs, signature_of


class ReferenceUnusable(Exception):
    """The reference could not run on CPU; the message names which model it was."""


def session_options(ort: Any) -> Any:
    """Options for a validation session: errors only, and pool threads that block instead of spinning between
    ops. A build runs jobs beside each other (the build process, `-n N`): spinning threads took the cores those
    need, and a tiny model's validation waited a scheduler tick about every other run."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


RANDOM_SEED = 0  # ONNX Runtime's seed for random ops that name none, set before each session a validation makes


def seeded(ort: Any) -> None:
    """A random op's draws (RandomNormal, Dropout in training mode, ... without a `seed` of their own) made a
    function of the model and its inputs, not of the process: ONNX Runtime seeds them from the clock at its first
    use in a process, and every session made after draws the same, so a reference computed in another process than
    the artifact's session (a cached reference, another worker) drew other values than one computed beside it. Two
    runs of one session still draw differently (the run-to-run check sees it)."""
    ort.set_seed(RANDOM_SEED)


def cpu_session(ort: Any, path: str, request: ValidationMember, fix_dims: bool = True) -> Any:
    """A session of a reference model on the CPU EP (`fix_dims`: its named dimensions fixed as the manifest's
    inputs fix them)."""
    import onnx

    options = session_options(ort)
    if fix_dims:
        model = onnx.load(path, load_external_data=False)
        inputs = {k: v for k, v in request.inputs.items() if k in {i.name for i in model.graph.input}}
        for name, value in static_dims(model, inputs, needs_static=False).items():
            options.add_free_dimension_override_by_name(name, value)
        del model
    read_weights_from(options, weights_folder(path, request.weights))
    seeded(ort)
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def run_on_cpu(ort: Any, path: str, request: ValidationMember, feeds: dict[str, Any],
               what: str) -> dict[str, Any]:
    """Outputs of a reference model on the CPU EP, fed what it takes (frozen inputs with their values)."""
    session = cpu_session(ort, path, request)
    chosen = feeds_for(session, feeds, request.frozen, what)
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, chosen), strict=True))


def dataset_outputs(ort: Any, request: ValidationMember, signature: list[Any], model: str) -> dict[str, Any]:
    """The reference model's outputs on the task metric's samples (`steps.validation.task_metrics`), in the batches the
    compiled-from model takes: the output the metric reads, or every output for a `module:function` metric."""
    from .sample_workers import run_dataset
    from .task_metrics import batch_size, output_name, read_dataset

    task = request.task
    assert task is not None, "a job with a task metric"
    dataset = read_dataset(task, [(s.name, s.type, s.shape) for s in signature], request.frozen)
    session = cpu_session(ort, model, request, fix_dims=False)  # batches of the compiled-from model's size
    names = [o.name for o in session.get_outputs()]
    keep = None if ":" in task["metric"] else [output_name(task, names)]
    size = batch_size(signature[0].shape if signature else [])
    return run_dataset(session, dataset, size, keep, request.frozen, "reference model")


def _cause(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


ORT_MIN_OPSET = 7  # ONNX Runtime "only guarantees support for models stamped with opset version 7 or above"


def below_floor(path: str, cause: str) -> str:
    """Why a model without kernels in ONNX Runtime cannot be a reference, when its opset is the reason; else ""."""
    import onnx

    if "Could not find an implementation" not in cause:
        return ""
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - the cause as ONNX Runtime gave it stands alone
        return ""
    opset = next((e.version for e in model.opset_import if e.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= ORT_MIN_OPSET:
        return ""
    return (f"; the model is at ai.onnx opset {opset}, below {ORT_MIN_OPSET}, the oldest ONNX Runtime guarantees, and "
            f"nothing here can run it: give validation.reference a model you trust at opset {ORT_MIN_OPSET} or later "
            "(an export of the same network), or validate = \"structural\" on the target")


DATASET_NOTE = "the tensors are compared on the dataset's first samples"
EVALUATED_NODES = 500  # onnx.reference runs op by op in Python: a bound on what it is asked to evaluate
EVALUATED_VALUES = 50_000_000  # and on the values of the model's inputs and weights


def evaluated_by_onnx(path: str, feeds: dict[str, Any], frozen: dict[str, Any]) -> dict[str, Any] | None:
    """The outputs of a model ONNX Runtime cannot run (an opset below its floor: a legacy broadcast, opset-6 Gemm),
    computed by ONNX's reference implementation, for a model small enough to evaluate in Python; None where it
    cannot serve (too large, an op it lacks, its own error)."""
    import numpy as np
    import onnx
    from onnx.reference import ReferenceEvaluator

    try:
        model = onnx.load(path)
        values = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
        if len(model.graph.node) > EVALUATED_NODES or values > EVALUATED_VALUES:
            return None
        evaluator = ReferenceEvaluator(model)
        given = {**{k: np.asarray(v) for k, v in frozen.items()}, **feeds}
        names = list(evaluator.input_names)
        outputs = evaluator.run(None, {name: given[name] for name in names if name in given})
        return dict(zip(evaluator.output_names, (np.asarray(o) for o in outputs), strict=True))
    except Exception:  # noqa: BLE001 - no reference from it: the caller says why ONNX Runtime could not
        return None


def reference_outputs(ort: Any, request: ValidationMember, feeds: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The reference's outputs, and a note when they come from the model as declared because the reference, a
    stage's output, could not be loaded or run on CPU. Raises ReferenceUnusable when no model can serve."""
    reference, declared, described = request.reference, request.declared, request.reference_is
    try:
        return run_on_cpu(ort, reference, request, feeds, "reference model"), None
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's or onnx's error, said with the model's name
        cause = _cause(exc)
        evaluated = evaluated_by_onnx(reference, feeds, request.frozen)
        if evaluated is not None:
            return evaluated, (f"ONNX Runtime could not run {described} on CPU ({cause}): the reference outputs were "
                               "computed by ONNX's reference implementation (onnx.reference.ReferenceEvaluator)")
        if reference == declared or not described.startswith("the output of "):
            raise ReferenceUnusable(f"the CPU reference, {described}, could not run on CPU: {cause}"
                                    + below_floor(reference, cause)) from None
    try:
        outputs = run_on_cpu(ort, declared, request, feeds, "model as declared")
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ReferenceUnusable(f"the CPU reference, {described}, could not run on CPU ({cause}), nor could the "
                                f"model as declared: {_cause(exc)}") from None
    return outputs, (f"the CPU reference, {described}, could not run on CPU ({cause}): the artifact was compared "
                     "with the model as declared instead")


def float_outputs(ort: Any, request: ValidationMember, feeds: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A quantized artifact's float model's outputs, for information: a model that cannot run is a note."""
    try:
        return run_on_cpu(ort, str(request.float_reference), request, feeds, "float model"), None
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001
        return {}, (f"the float model, {request.float_reference_is}, could not run on CPU ({_cause(exc)}): no "
                    "comparison with it")


REFERENCE_FILE = "reference.npz"  # the arrays: feeds, expected and float outputs, the outputs on a task's samples
NOTES_FILE = "reference.json"  # the rest: generated inputs' descriptions, notes
REFERENCE_FILES = [NOTES_FILE, REFERENCE_FILE]  # a cache entry of the reference (sorted, as the cache lists them)
NO_TIME = (1980, 1, 1, 0, 0, 0)  # the zip members' date: the file's bytes depend on the arrays alone


def reference_run(ort: Any, request: ValidationMember) -> dict[str, Any]:
    """What the validation compares with, computed before (and, for large models, in another process than) the
    artifact's session: the inputs, made from the compiled-from model's inputs; the reference's outputs; the float
    model's; and the notes about them. Raises ReferenceUnusable or ModelError."""
    import onnx

    source = onnx.load(request.source, load_external_data=False)
    signature = signature_of(source)
    taken = None
    if request.task and not request.inputs_file:  # the user's samples, never generated ones beside them
        from .task_metrics import dataset_feeds

        taken = dataset_feeds(request.task, [(s.name, s.type, s.shape) for s in signature], request.frozen,
                              request.inputs)
    feeds, generated = (taken, {}) if taken is not None else make_inputs(signature, source, request.inputs,
                                                                         request.inputs_file, request.frozen)
    del source
    expected, declared_instead = reference_outputs(ort, request, feeds)
    floats, float_note = float_outputs(ort, request, feeds) if request.float_reference else ({}, None)
    # the task's source is the model as the user declared it (the fp32 model before quantization, as MLPerf
    # judges a compiled model against the reference one), whatever the tensors are compared with
    dataset = dataset_outputs(ort, request, signature, request.declared) if request.task else {}
    sampled = f"{DATASET_NOTE} ({len(next(iter(feeds.values())))} sample(s) of validation.dataset)" \
        if taken is not None and feeds else None
    return {"feeds": feeds, "generated": generated, "expected": expected, "floats": floats, "dataset": dataset,
            "notes": [note for note in (sampled, declared_instead, float_note) if note]}


def save_reference(run: dict[str, Any], folder: Path) -> None:
    """The reference into `folder` (REFERENCE_FILES): an .npz numpy reads, written without a timestamp, so that a
    cache entry holds nothing but what its fingerprint names."""
    import zipfile

    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / REFERENCE_FILE, "w") as archive:
        for kind in ("feeds", "expected", "floats", "dataset"):
            for name, value in sorted(run.get(kind, {}).items()):
                with archive.open(zipfile.ZipInfo(f"{kind}/{name}.npy", NO_TIME), "w", force_zip64=True) as out:
                    np.lib.format.write_array(out, np.asanyarray(value), allow_pickle=False)
    (folder / NOTES_FILE).write_text(json.dumps({"generated": run["generated"], "notes": run["notes"]},
                                                sort_keys=True, indent=1))


def load_reference(folder: Path) -> dict[str, Any]:
    import numpy as np

    run: dict[str, Any] = {"feeds": {}, "expected": {}, "floats": {}, "dataset": {},
                           **json.loads((folder / NOTES_FILE).read_text())}
    with np.load(folder / REFERENCE_FILE, allow_pickle=False) as data:
        for key in data.files:
            kind, name = key.split("/", 1)
            run[kind][name] = data[key]
    return run
