"""`inputs` checked once, before any task runs, against the models' inputs as the external-data index read them
(`store.external_data`): a wrong name, a wrong rank, a fixed dimension given another value, or a symbolic one an NPU
target needs fixed is one error naming models.toml and the key path, with dimensions counted from 0 as everywhere
in epbuild. The stages and compiles check again (a model can change under a running build), in the same words."""

from __future__ import annotations

from ..errors import UserError
from .builds import Build
from .parse import Manifest

Shapes = dict[str, list[int | None]]  # input -> dimensions: a size, or None where symbolic
ModelInputs = tuple[Shapes, list[str]]  # the true inputs, and the weights an old exporter also lists as inputs


def check_declared_inputs(manifest: Manifest, builds: list[Build], read: dict[str, ModelInputs]) -> None:
    """`read` holds each model's inputs by model name (`store.external_data.ExternalDataIndex.inputs`)."""
    file = manifest.path.name
    shapes = {name: found for name, (found, _) in read.items()}
    for name, model in manifest.models.items():
        found, weights = read[name]
        for input_name, wanted in model.inputs.items():
            where = f"models.{name}.inputs.{input_name}"
            if input_name in weights:
                raise UserError(file, where, f"'{input_name}' is a weight (an initializer that an old exporter "
                                f"also lists in graph.input), not a runtime input; the model's inputs: "
                                f"{', '.join(found) or 'none'}")
            if input_name not in found:
                raise UserError(file, where, f"the model has no input '{input_name}'; its inputs: "
                                f"{', '.join(found) or 'none'}")
            dims = found[input_name]
            if len(dims) != len(wanted):
                raise UserError(file, where, f"the model's input has rank {len(dims)}, the manifest gives "
                                f"{len(wanted)} dimensions {list(wanted)} (the model's: {_shown(dims)})")
            for index, (dim, size) in enumerate(zip(dims, wanted, strict=True)):
                if dim is not None and dim != size:
                    raise UserError(file, where, f"dimension {index} is fixed to {dim} in the model, the manifest "
                                    f"gives {size} (the model's: {_shown(dims)})")
    needs_static: dict[str, str] = {}  # model -> the first of its targets that needs static shapes
    for build in builds:
        if any(stage.kind == "shape" for stage in build.stages):
            for member in build.members:
                needs_static.setdefault(member.name, build.target.name)
    for name, target in needs_static.items():
        model = manifest.models[name]
        for input_name, dims in shapes[name].items():
            if input_name in model.inputs:
                continue
            symbolic = [index for index, dim in enumerate(dims) if dim is None]
            if symbolic:
                raise UserError(file, f"models.{name}.inputs", f"input '{input_name}' ({_shown(dims)}) has symbolic "
                                f"dimension {symbolic[0]}; target '{target}' needs static shapes: set "
                                f"inputs = {{ {input_name} = [...] }}")


def _shown(dims: list[int | None]) -> str:
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in dims) + "]"
