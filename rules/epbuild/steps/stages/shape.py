"""`shape`: the inputs fixed to static shapes (the manifest's `inputs`, `dims`) and every intermediate shape
inferred, for an EP that needs them static; what stays dynamic is reported."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from ...contracts.jobs import StageJob
from ...errors import ModelError, located
from ..graph import check_input_names, clear_placeholder_dims, dims
from .output import save


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


def run(job: StageJob) -> dict[str, Any]:
    with located(job.manifest, job.entry):
        return {"dynamic": fix_shapes(job.source, job.output, job.settings["inputs"], job.data_file, job.weights)}
