"""Running the stages before compile, each in a fresh child: opset upgrade, static shapes, graph optimization, QDQ
quantization with calibration data, external-data squash. Outputs go through the artifact cache like compiles.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import ModelError, located
from ..execute.child import run_child, serve
from ..execute.fork_server import SHAPE_STAGE
from ..execute.forked_jobs import Handoff
from ..files.layout import STAGES
from ..files.publish import discard
from ..files.weights import load_with_weights, read_weights_from
from ..manifest.stage import PROTOBUF_LIMIT, Stage
from ..store.cache import Workspace
from .diagnosis import PATTERNS, REWRITES
from .expected_peak import stage_limits
from .folding import fold_constants, into_bodies
from .graph import check_input_names, clear_placeholder_dims, dims, missing_files, refuse_zero_size, true_inputs
from .upgrade import upgrade
from .validation_inputs import read_npz

RANDOM_SAMPLES, RANDOM_SEED = 8, 0
STAGE_TIMEOUT_S = 3600


def squash(source: Path, output: Path, limit_bytes: int = PROTOBUF_LIMIT, weights: Path | None = None) -> int:
    """Write a single-file ONNX model with every external tensor inlined (read from `weights`, None: beside the
    source); refuse beyond `limit_bytes`."""
    import onnx

    model = load_with_weights(source, weights)
    size = model.ByteSize()
    if size > limit_bytes:
        raise ModelError(f"squash: {source.name} is {size:,} bytes with its external data inlined, over the "
                         f"{limit_bytes:,}-byte protobuf limit of a single-file ONNX model; keep external data")
    for tensor in model.graph.initializer:
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    onnx.save(model, str(output))
    return size


def save(model: Any, output: Path, data_file: str | None) -> None:
    """Save a stage's output; with `data_file`, every initializer goes to that one file beside it."""
    import onnx

    if data_file:
        working = Path.cwd()
        os.chdir(output.parent)  # onnx refuses a location that exists relative to the working folder
        try:
            onnx.save(model, output.name, save_as_external_data=True, all_tensors_to_one_file=True,
                      location=data_file)
        finally:
            os.chdir(working)
        always_written(output.with_name(data_file))
    else:
        onnx.save(model, str(output))


def dynamic_tensors(model: Any) -> list[str]:
    """Tensors whose inferred shape still has a symbolic dimension: what an NPU EP would refuse."""
    found = {}
    for value in [*model.graph.value_info, *model.graph.output]:
        if not value.type.HasField("tensor_type"):
            continue
        raw = value.type.tensor_type.shape.dim  # a static 0 is static (`dims` reads it as unknown)
        shape = [0 if d.HasField("dim_value") and d.dim_value == 0 else found_dim
                 for d, found_dim in zip(raw, dims(value), strict=True)]
        if not all(isinstance(d, int) for d in shape):  # once per tensor (an output may have a value_info too)
            found[value.name] = f"{value.name} {['?' if d is None else d for d in shape]}"
    return list(found.values())


def ort_tool(name: str) -> Any:
    """A module of `onnxruntime.tools` loaded on its own: the package's `__init__` imports torch whenever it is
    installed (slow, for an export helper we never use), and neither module needs the package."""
    qualified = f"epbuild._ort_tools.{name}"
    if qualified not in sys.modules:
        import onnxruntime

        spec = importlib.util.spec_from_file_location(qualified, Path(onnxruntime.__file__).parent / "tools" /
                                                      f"{name}.py")
        if spec is None or spec.loader is None:
            raise ModuleNotFoundError(f"onnxruntime ships no tools/{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        spec.loader.exec_module(module)
    return sys.modules[qualified]


def shape_tools() -> tuple[Any, Any]:
    """onnxruntime's shape helpers: (onnx_model_utils, symbolic_shape_infer); the shape stage's fork server loads
    them once."""
    return ort_tool("onnx_model_utils"), ort_tool("symbolic_shape_infer")


def fix_shapes(source: Path, output: Path, inputs: dict[str, list[int]], data_file: str | None,
               weights: bool = True) -> list[str]:
    """Fix the inputs in the file (-1 and unnamed dimensions too, which free-dimension overrides cannot reach by
    name), then infer every intermediate shape; returns the tensors that stay dynamic. Without `weights` the
    graph is read and written without its external data (shape inference needs dimensions, not values)."""
    import onnx

    model_utils, symbolic = shape_tools()
    make_input_shape_fixed = model_utils.make_input_shape_fixed
    SymbolicShapeInference = symbolic.SymbolicShapeInference

    model = onnx.load(str(source), load_external_data=weights)
    check_input_names(model.graph, list(inputs), "inputs")
    clear_placeholder_dims(model.graph)
    for name, shape in inputs.items():
        try:
            make_input_shape_fixed(model.graph, name, shape)
        except ValueError as exc:
            raise ModelError(str(exc), f"inputs.{name}") from None
    del model.graph.value_info[:]  # stale symbolic shapes would survive inference
    failed = []
    try:
        inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # noqa: BLE001 - symbolic inference gives up on some graphs; ONNX's own inference is next
        inferred = None
    if inferred is None:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception as exc:  # noqa: BLE001 - without inference the inputs are still fixed; say so
            failed = [f"(shape inference failed: {' '.join(str(exc).split())[:200]})"]
    model = inferred or model
    _fix_output_shapes(model, model_utils.is_fixed_size_tensor)
    save(model, output, data_file)
    return failed + dynamic_tensors(model)


def _fix_output_shapes(model: Any, fixed: Any) -> None:
    """The graph outputs' shapes where inference fixed them: ONNX Runtime's `fix_output_shapes` without its
    onnx.checker call, which refuses ops ONNX Runtime registers and ONNX does not (onnxruntime-genai's
    SimplifiedLayerNormalization at opset 22)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - the outputs keep the shapes they have
        return
    for output, found in zip(model.graph.output, inferred.graph.output, strict=True):
        if not fixed(output) and fixed(found):
            output.type.tensor_type.shape.CopyFrom(found.type.tensor_type.shape)


def freeze(source: Path, output: Path, values: dict[str, list[float]], data_file: str | None) -> None:
    """Turn configuration inputs into constants and fold what they select (If branches on a sample rate, a mode
    flag) with ONNX Runtime's basic optimization."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    model = onnx.load(str(source), load_external_data=False)
    check_input_names(model.graph, list(values), "freeze")
    for name, given in values.items():
        value = next(v for v in model.graph.input if v.name == name)
        shape = [d if isinstance(d, int) else 1 for d in dims(value)]
        count = int(np.prod(shape)) if shape else 1
        if len(given) not in (1, count):
            raise ModelError(f"the input has shape {dims(value)}, so it takes 1 or {count} values, the "
                             f"manifest gives {len(given)}", f"freeze.{name}")
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        array = np.full(shape, given[0]) if len(given) == 1 else np.array(given).reshape(shape)
        model.graph.input.remove(value)
        model.graph.initializer.append(numpy_helper.from_array(array.astype(dtype), name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(output)
    external_output(options, data_file)
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def external_output(options: Any, data_file: str | None) -> None:
    """An ONNX Runtime optimized model writes its initializers to `data_file` beside it, not to the source's.
    Small ones (shapes, scalars) stay inline: ONNX Runtime cannot read a Reshape's shape from external data."""
    if data_file:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_file)


def always_written(data_file: Path) -> None:
    """The external-data file is an output known before the run: a model whose initializers all stayed inline
    (below the size threshold) gets an empty one."""
    if not data_file.exists():
        data_file.touch()


def require_static(model: Any, task: str) -> dict[str, tuple[int, ...]]:
    """The model's input shapes, or a ModelError naming the first symbolic dimension."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in true_inputs(model.graph):
        found = dims(value)
        for index, dim in enumerate(found):
            if not isinstance(dim, int):
                refuse_zero_size(value)
                raise ModelError(f"{task} needs static shapes: input '{value.name}' has symbolic dimension {index} "
                                 f"('{dim or '-1'}'); set inputs.{value.name} in the model's manifest entry")
        shapes[value.name] = tuple(dim for dim in found if isinstance(dim, int))
    return shapes


class _Calibration:
    """A CalibrationDataReader over .npz samples (checked against the model's inputs) or a fixed-seed set."""

    def __init__(self, files: list[str], shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any]):
        import numpy as np

        samples = []
        if files:
            for file in files:
                sample = read_npz(file, "calibration file")
                if set(sample) != set(shapes):
                    raise ModelError(f"calibration file {Path(file).name}: keys {sorted(sample)} do not match the "
                                     f"model's inputs {sorted(shapes)}")
                for key, array in sample.items():
                    if tuple(array.shape) != shapes[key]:
                        raise ModelError(f"calibration file {Path(file).name}: '{key}' has shape "
                                         f"{list(array.shape)}, the model's input is {list(shapes[key])}")
                    wanted = np.dtype(dtypes[key])
                    if array.dtype.kind.replace("u", "i") != wanted.kind.replace("u", "i"):  # ints for a float
                        # input (or floats for indices): a cast would hide a wrong file
                        raise ModelError(f"calibration file {Path(file).name}: '{key}' is {array.dtype}, the "
                                         f"model's input is {wanted}: save it as {wanted}")
                    if array.dtype.kind == "f" and not np.isfinite(array).all():
                        raise ModelError(f"calibration file {Path(file).name}: '{key}' holds NaN or infinite "
                                         "values, from which no quantization range can be computed")
                samples.append({key: array.astype(dtypes[key]) for key, array in sample.items()})
        else:
            rng = np.random.default_rng(RANDOM_SEED)
            samples = [{key: rng.standard_normal(shape).astype(dtypes[key]) for key, shape in shapes.items()}
                       for _ in range(RANDOM_SAMPLES)]
        self.samples = iter(samples)

    def get_next(self) -> dict[str, Any] | None:
        return next(self.samples, None)

    def rewind(self) -> None:  # part of the reader interface; each stage run reads once
        pass


def quantize(source: Path, output: Path, flavour: str, settings: dict[str, Any], files: list[str], task: str,
             data_file: str | None, weights: Path | None = None) -> None:
    """QDQ quantization; a graph whose weights are in another folder (`weights`) is handed to the quantizers with
    its tensors read from there (they resolve external data beside the file they are given)."""
    import onnx
    from onnx import helper
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization import quantize as quantize_with_config
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    model = onnx.load(str(source), load_external_data=False)
    shapes = require_static(model, task)
    dtypes = {v.name: helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type) for v in model.graph.input}
    del model
    reader = _Calibration(files, shapes, dtypes)
    types = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8, "uint16": QuantType.QUInt16,
             "int16": QuantType.QInt16}
    activation, weight = types[settings["activation_type"]], types[settings["weight_type"]]
    external = data_file is not None  # the quantizers write <output>.data, which is `data_file`
    given = load_with_weights(source, weights) if weights else str(source)
    os.chdir(output.parent)  # onnx refuses to save a data file whose name exists in the working folder
    if flavour == "qnn":
        config = get_qnn_qdq_config(given, reader, activation_type=activation, weight_type=weight,
                                    per_channel=settings["per_channel"])
        config.use_external_data_format = external
        quantize_with_config(given, str(output), config)
    else:
        quantize_static(given, str(output), reader, quant_format=QuantFormat.QDQ, activation_type=activation,
                        weight_type=weight, per_channel=settings["per_channel"], use_external_data_format=external)


def _run_stage(request: dict[str, Any]) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    source, output, settings = Path(request["input"]), Path(request["output"]), request["settings"]
    data_file, graph_only = request["data_file"], request["graph_only"]
    elsewhere = Path(request["weights"]) if request["weights"] else None  # the input's weights, not beside it
    weights = not graph_only  # a graph-only stage reads and writes the graph alone
    os.chdir(elsewhere or source.parent)  # external data read from bytes resolves in the working folder
    kind, result = request["kind"], {}
    if kind == "freeze":
        with located(request["manifest"], request["entry"]):
            freeze(source, output, settings["values"], data_file)
        if data_file:
            always_written(output.with_name(data_file))
    elif kind == "upgrade":
        result = upgrade(source, output, settings["opset"], elsewhere, save, data_file, request["entry"])
    elif kind == "shape":
        with located(request["manifest"], request["entry"]):
            result["dynamic"] = fix_shapes(source, output, settings["inputs"], data_file, weights)
    elif kind == "fold":
        model = onnx.load(str(source), load_external_data=weights)  # values it folds: from the working folder
        result["folded"] = fold_constants(model)
        result["into_bodies"] = into_bodies(model.graph)
        save(model, output, data_file)
    elif kind == "rewrite":
        model = onnx.load(str(source), load_external_data=weights)
        result["rewritten"] = {rule: REWRITES[rule](model.graph) for rule in settings["rules"]}
        missing = [rule for rule, count in result["rewritten"].items() if not count]
        if missing:
            with located(request["manifest"], request["entry"]):
                raise ModelError(f"the model has no {', '.join(missing)} pattern to rewrite ({PATTERNS[missing[0]]}"
                                 "): remove it from rewrite", "rewrite")
        save(model, output, data_file)
    elif kind == "optimize":
        options = ort.SessionOptions()
        options.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[
            settings["level"]]
        options.optimized_model_filepath = str(output)
        external_output(options, data_file)
        read_weights_from(options, elsewhere)
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        if data_file:
            always_written(output.with_name(data_file))
    elif kind == "quantize":
        quantize(source, output, request["flavour"], settings, request["calibration"], request["task"], data_file,
                 elsewhere)
    else:
        squash(source, output, settings["limit_bytes"], elsewhere)
    written = {output.name, data_file}
    for leftover in output.parent.iterdir():  # quantizers may leave helper models next to the output
        if leftover.is_file() and leftover.name not in written:
            leftover.unlink()
    # a graph-only output references its input's files, where they are
    problems = missing_files(output, onnx.load(str(output), load_external_data=False),
                             (elsewhere or source.parent) if graph_only else None)
    if problems:
        raise ModelError("; ".join(problems))
    if not graph_only:  # a graph-only stage keeps a large model's weights on disk and out of memory: not loaded
        _loads_on_cpu(ort, output, None, kind)
    return result


def _loads_on_cpu(ort: Any, output: Path, weights: Path | None, kind: str) -> None:
    """The stage's output opens in a plain CPU session (no optimization) before it is published: a stage that broke
    the graph (a body's outer-scope value dropped) says so here, instead of the EP's compile being blamed."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    read_weights_from(options, weights)
    try:
        ort.InferenceSession(str(output), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - whatever ONNX Runtime raises, the stage is at fault
        text = " ".join(str(exc).split())[:300]
        raise ModelError(f"the {kind} stage wrote a model ONNX Runtime cannot load on CPU ({text}): a fault of this "
                         "stage, not of the model or the EP") from None


def stage_request(stage: Stage, output: Path) -> dict[str, Any]:
    return {"kind": str(stage.kind), "task": stage.task, "flavour": stage.flavour, "input": str(stage.input),
            "manifest": stage.manifest, "entry": f"models.{stage.model}",
            "output": str(output), "settings": stage.settings, "calibration": [str(p) for p in stage.calibration],
            "data_file": stage.output_data.name if stage.output_data else None, "graph_only": stage.graph_only,
            "weights": str(stage.input_folder) if stage.input_weights else None}


def produce_stage(stage: Stage, workspace: Workspace, scratch: Path) -> dict[str, Any]:
    """Run the stage's child, writing its output into `scratch`; the child's answer."""
    workdir = workspace.layout.scratch(f"{scratch.name}.child")
    try:
        log = workspace.layout.log(STAGES, stage.task.replace(":", "."))
        return run_child("epbuild.steps.preprocess", stage_request(stage, scratch / stage.output.name), workdir,
                         stage_limits(stage, workspace, STAGE_TIMEOUT_S), stage.task, log,
                         ep=SHAPE_STAGE if stage.kind == "shape" else "", expect=workspace.provenance,
                         links=workspace.links)
    finally:
        discard(workdir)


def main(handoff: Handoff | None = None) -> None:
    """`python -m` this module, or a fork server's child or warm worker, runs this."""
    serve(_run_stage, handoff)


if __name__ == "__main__":
    main()
