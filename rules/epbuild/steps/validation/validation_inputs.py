"""The inputs a validation feeds: the user's `validation.inputs` (.npz) checked against the model, or generated with a
fixed seed as the model accepts them; frozen inputs get the values the artifact was built with."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ...errors import ModelError
from ...records import record
from ..graph import check_input_names, dims, index_bound, known_shapes, true_inputs

GENERATED_LIMIT = 4 * 2**30  # bytes of one generated validation input
SEED = 0


DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
          "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int16)": "int16", "tensor(int8)": "int8",
          "tensor(uint8)": "uint8", "tensor(uint16)": "uint16", "tensor(bool)": "bool"}


def dtype_of(type_name: str) -> Any:
    import numpy as np

    return np.dtype(DTYPES.get(type_name, "float32"))


def read_npz(path: str | Path, what: str) -> dict[str, Any]:
    """The arrays of a user's .npz; one that numpy cannot read (not a zip, truncated, pickled objects) is the
    user's file to fix, named with what it is for (`what`: "validation.inputs", "calibration file")."""
    import zipfile

    import numpy as np

    try:
        _check_sizes(path, what)
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{what} {Path(path).name} cannot be read as .npz ({type(exc).__name__}: {exc}); save it "
                         "with numpy.savez") from None


def _check_sizes(path: str | Path, what: str) -> None:
    """Each array's header (shape and dtype) against the bytes its member of the zip holds, before numpy allocates
    what the header declares: a header of 8 TiB was a MemoryError that named no file. One line naming the array."""
    import math
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version not in ((1, 0), (2, 0)):
                    continue  # 3.0 (a UTF-8 header): numpy reads it and checks nothing more here
                shape, _, dtype = (np.lib.format.read_array_header_1_0(member) if version == (1, 0) else
                                   np.lib.format.read_array_header_2_0(member))
                held = info.file_size - member.tell()
            if dtype.hasobject:
                continue  # refused by numpy itself (never unpickled): its own line
            declared = math.prod(shape) * dtype.itemsize
            if declared > held:
                raise ModelError(f"{what} {Path(path).name}: array '{info.filename[:-4]}' declares {list(shape)} "
                                 f"{dtype} ({declared:,} bytes) but holds {held:,} bytes: its header does not match "
                                 "its data; save it again with numpy.savez")


def _mask(shape: list[int], dtype: Any) -> Any:
    """A padding mask: ones, with the last quarter of the last axis masked out (never a whole row)."""
    import numpy as np

    mask = np.ones(shape, dtype=dtype)
    if shape and shape[-1] >= 4:
        mask[..., -(shape[-1] // 4):] = 0
    return mask


@record
class InputSignature:
    """An input as a session lists it (name, ONNX Runtime's type string, dimensions), read from the graph instead,
    so inputs can be made before any session of the artifact exists."""

    name: str
    type: str
    shape: list[int | str | None]


def signature_of(model: Any) -> list[InputSignature]:
    """The model's true inputs in graph order, as `session.get_inputs()` would list them."""
    from onnx import TensorProto

    def shape(value: Any) -> list[int | str | None]:  # a zero-size dimension stays 0, as a session lists it
        return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else named
                for d, named in zip(value.type.tensor_type.shape.dim, dims(value), strict=True)]

    return [InputSignature(value.name, f"tensor({TensorProto.DataType.Name(value.type.tensor_type.elem_type).lower()})",
                           shape(value)) for value in true_inputs(model.graph)]


def make_inputs(session: Any, source: Any, inputs: dict[str, list[int]], inputs_file: str | None,
                frozen: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Inputs for the true inputs of `session` (a session, or `signature_of` a model): from the user's .npz, or
    generated with a fixed seed as the model accepts them (floats normal; integer indices inside the dimension they
    index; masks as padding masks). Returns (feeds, how each generated integer input was made)."""
    import numpy as np

    signature = {i.name: i for i in (session if isinstance(session, list) else session.get_inputs())}
    shapes = {name: list(shape) for name, shape in inputs.items()}
    if inputs_file:
        file = Path(inputs_file).name
        given = {k: v for k, v in read_npz(inputs_file, "validation.inputs").items() if k not in frozen}
        check_input_names(source.graph, list(given), f"validation.inputs {file}")
        missing = signature.keys() - given.keys()
        if missing:
            raise ModelError(f"validation.inputs {file}: keys {sorted(given)} do not include the model's inputs "
                             f"{sorted(missing)}")
        for name in signature:
            shape = signature[name].shape
            array = given[name]
            if len(shape) != array.ndim or any(
                    isinstance(d, int) and d > 0 and d != s for d, s in zip(shape, array.shape, strict=True)):
                raise ModelError(f"validation.inputs {file}: '{name}' has shape {list(array.shape)}, the model "
                                 f"wants {shape}")
            wanted = DTYPES.get(signature[name].type)
            if wanted is not None and array.dtype != np.dtype(wanted):
                raise ModelError(f"validation.inputs {file}: '{name}' is {array.dtype}, the model's input is "
                                 f"{signature[name].type}: save it as {wanted} (array.astype(numpy.{wanted}))")
        return {name: given[name] for name in signature}, {}
    rng = np.random.default_rng(SEED)
    feeds, notes = {}, {}
    model_shapes = None
    for name, info in signature.items():
        shape = shapes.get(name) or info.shape
        if any(d == 0 for d in shape):
            raise ModelError(f"input '{name}' has a zero-size dimension ({shape}): nothing to generate; give "
                             "validation.inputs or another shape in inputs")
        if not all(isinstance(d, int) and d > 0 for d in shape):
            raise ModelError(f"input '{name}' has symbolic shape {info.shape}: set inputs.{name} in the model's "
                             f"manifest entry or give validation.inputs")
        dtype = dtype_of(info.type)
        size = math.prod(shape) * dtype.itemsize  # before any allocation: a typo in `inputs` can ask for TiBs
        if size > GENERATED_LIMIT:
            raise ModelError(f"input '{name}' of shape {shape} would take {size / 2**30:,.1f} GiB to generate (at "
                             f"most {GENERATED_LIMIT / 2**30:g} GiB); check inputs.{name} or give validation.inputs")
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b" or "mask" in name.lower():
            feeds[name] = _mask(shape, dtype)
            notes[name] = "padding mask"
        else:
            model_shapes = model_shapes or known_shapes(source)
            bound = index_bound(source.graph, name, model_shapes)
            high = bound if bound else 2
            feeds[name] = rng.integers(0, high, shape).astype(dtype)
            notes[name] = (f"indices in [0, {high}) (the dimension it indexes)" if bound else
                           "integers in [0, 2): no Gather shows their range; give validation.inputs for real values")
    return feeds, notes


def listed_weights(model_path: str | Path, names: set[str]) -> dict[str, Any]:
    """The values of `names` among a model's initializers: an IR < 4 model lists its weights in graph.input too, and
    a session of a model made from it may still ask for one (the weight's own value is what it stands for)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_path), load_external_data=False)
    folder = str(Path(model_path).parent)
    return {t.name: numpy_helper.to_array(t, base_dir=folder) for t in model.graph.initializer if t.name in names}


def feeds_for(session: Any, feeds: dict[str, Any], frozen: dict[str, list[float]], what: str,
              weights: dict[str, Any] | None = None) -> dict[str, Any]:
    """The feeds one session takes: its own true inputs, frozen inputs with their frozen values, and listed
    weights (`listed_weights`) with the values the compared model holds for them."""
    import numpy as np

    weights = weights or {}
    chosen = {}
    for value in session.get_inputs():
        if value.name in frozen:
            array = np.array(frozen[value.name], dtype=dtype_of(value.type))
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in value.shape]
            chosen[value.name] = np.full(shape, array[0], dtype=array.dtype) if array.size == 1 else array.reshape(
                shape)
        elif value.name in feeds:
            chosen[value.name] = feeds[value.name]
        elif value.name in weights:
            chosen[value.name] = weights[value.name]
        else:
            raise ModelError(f"the {what} has input '{value.name}', which the model it is compared with does not "
                             "take; compare with a reference of the same inputs (validation.reference) or freeze it")
    return chosen

