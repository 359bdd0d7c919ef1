"""`inputs` checked once, before any task runs, against the models' inputs as the external-data index read them
(`plan.external_data`): a wrong name, a wrong rank, a fixed dimension given another value, or a symbolic one an NPU
target needs fixed is one error naming models.toml and the key path, with dimensions counted from 0 as everywhere
in epbuild. The stages and compiles check again (a model can change under a running build), in the same words."""

from __future__ import annotations

import dataclasses

from ..errors import UserError, closest
from ..manifest.builds import Build
from ..manifest.parse import Manifest
from ..records import record
from ..steps.graph import PLACEHOLDER

Shapes = dict[str, list[int | None]]  # input -> dimensions: a size, or None where symbolic
Names = dict[str, list[str | None]]  # input -> each dimension's dim_param (None where there is none)
# the true inputs, the weights an old exporter also lists as inputs, the dimensions' names
ModelInputs = tuple[Shapes, list[str], Names]


def _named(names: list[str | None]) -> list[str | None]:
    return [None if name is None or PLACEHOLDER.match(name) else name for name in names]


def resolve_dims(manifest: Manifest, read: dict[str, ModelInputs]) -> Manifest:
    """The manifest with each model's `dims` turned into `inputs`: every input whose symbolic dimensions the
    named sizes fix completely gets that shape (an input given in `inputs` keeps it). A name no input has is
    refused, listing the model's names."""
    models = {}
    for name, model in manifest.models.items():
        if not model.dims:
            models[name] = model
            continue
        found, _, names = read[name]
        known = sorted({dim for dims in names.values() for dim in _named(dims) if dim})
        for dim in model.dims:
            if dim not in known and PLACEHOLDER.match(dim):
                open_inputs = [(n, shape) for n, shape in found.items() if any(d is None for d in shape)]
                example = "; ".join(f"inputs.{n} = {[1 if d is None else d for d in shape]} (its shape: "
                                    f"{['?' if d is None else d for d in shape]})" for n, shape in open_inputs[:2])
                raise UserError(manifest.path.name, f"{model.key}.dims.{dim}", f"'{dim}' is an anonymous "
                                "placeholder (an exporter's or shape inference's name for an unknown size, not a "
                                "name that ties dimensions together): give the input's whole shape instead"
                                f"{', e.g. ' + example if example else ''}")
            if dim not in known:
                raise UserError(manifest.path.name, f"{model.key}.dims.{dim}", f"no input of the model has a "
                                f"dimension named '{dim}'{closest(dim, known)}; its named dimensions: "
                                f"{', '.join(known) or 'none'}")
        derived: dict[str, tuple[int, ...]] = {}
        for input_name, dims in names.items():
            named = _named(dims)
            if input_name in model.inputs or not any(dim in model.dims for dim in named if dim):
                continue
            shape = [size if size is not None else model.dims.get(dim) if dim else None
                     for size, dim in zip(found[input_name], named, strict=True)]
            if all(size is not None for size in shape):
                derived[input_name] = tuple(size for size in shape if size is not None)
        models[name] = dataclasses.replace(model, inputs={**derived, **model.inputs})
    return dataclasses.replace(manifest, models=models)


@record
class Blocked:
    """Why a model's builds that need static shapes wait: the manifest key to fix, and the one line that says how
    (what every message and report shows: `str`)."""

    key_path: str
    line: str

    def __str__(self) -> str:
        return self.line


def check_declared_inputs(manifest: Manifest, builds: list[Build],
                          read: dict[str, ModelInputs]) -> dict[str, Blocked]:
    """`read` holds each model's inputs by model name (`plan.external_data.ExternalDataIndex.inputs`). A mistake in
    `inputs` or `freeze` is refused (UserError); a model that leaves open a dimension its NPU targets need fixed is
    not: why is returned by model name, so only those targets' tasks wait for the fix (`blocked_tasks`)
    while every other build goes on."""
    file = manifest.path.name
    shapes = {name: found for name, (found, _, _) in read.items()}
    for name, model in manifest.models.items():
        found, weights, _ = read[name]
        for input_name, wanted in model.inputs.items():
            where = f"{model.key}.inputs.{input_name}"
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
        for input_name in model.freeze or {}:
            if input_name not in found:
                what = (f"'{input_name}' is a weight, not a runtime input" if input_name in weights else
                        f"the model has no input '{input_name}'")
                raise UserError(file, f"{model.key}.freeze.{input_name}", f"{what}; its inputs: "
                                f"{', '.join(found) or 'none'}")
    blocked: dict[str, Blocked] = {}
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
            dim_names = _named(read[name][2][input_name])
            # the symbolic dimensions `dims` leaves open (one it sets is not the one to name)
            given = model.dims or {}
            left = [index for index, dim in enumerate(dims) if dim is None and dim_names[index] not in given]
            if left:
                which = ", ".join(f"{index}" + (f" ('{dim_names[index]}')" if dim_names[index] else "")
                                  for index in left)
                keys = list(dict.fromkeys(dim_names[index] for index in left))
                those = "that dimension" if len(keys) == 1 else "those dimensions"
                fix = (f"dims = {{ {', '.join(f'{_toml_key(key)} = ...' for key in keys if key)} }} (every input with "
                       f"{those}) or inputs = {{ {input_name} = [...] }}" if None not in keys
                       else f"inputs = {{ {input_name} = [...] }}")
                key = f"{model.key}.inputs"
                blocked[name] = Blocked(key, str(UserError(file, key, f"input '{input_name}' ({_shown(dims)}) has "
                                                           f"symbolic dimension{'s' * (len(left) > 1)} {which}; "
                                                           f"target '{target}' needs static shapes: set {fix}")))
                break
    return blocked


def blocked_tasks(builds: list[Build], blocked: dict[str, Blocked]) -> dict[str, Blocked]:
    """Task name -> the manifest line it waits for: each build that needs static shapes of a model in `blocked`
    (its compile, validation and operator check), and the stages only such builds use."""
    waiting: dict[str, Blocked] = {}
    used: set[str] = set()
    for build in builds:
        why = next((blocked[m.name] for m in build.members if m.name in blocked), None)
        if why is None or not any(stage.kind == "shape" for stage in build.stages):
            used.update(stage.task for stage in build.stages)
            continue
        waiting.update(dict.fromkeys((build.task, build.validate_task, build.ops_task), why))
        for stage in build.stages:
            waiting.setdefault(stage.task, why)
    return {task: why for task, why in waiting.items() if task not in used}


def _toml_key(name: str) -> str:
    """A dimension's name as a TOML key: bare where TOML reads it as one key, else quoted (`"p2o.Dim.0"`: bare, its
    dots would make nested tables)."""
    return name if name and all(c.isascii() and (c.isalnum() or c in "-_") for c in name) else f'"{name}"'


def _shown(dims: list[int | None]) -> str:
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in dims) + "]"
