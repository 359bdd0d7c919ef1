"""A validation's task metric as the manifest declares it (`dataset`, `samples`, `metric`, `output` and a gate,
`min_relative` or `max_drop`): the files it names, checked to exist inside the project, and what a build's
validation receives. The metric itself runs in the validating child (`steps.validation.task_metrics`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UserError
from .schema import METRICS

TASK_KEYS = ("dataset", "samples", "metric", "output", "min_relative", "max_drop")
DEFAULT_MIN_RELATIVE = 0.99  # MLPerf's standard: the compiled model keeps 99% of the reference's accuracy


def dataset_files(manifest: Path, where: str, path: Path) -> tuple[Path, ...]:
    """An `.npz` file, or a folder's `.npz` files in name order; one line when it is neither."""
    if path.is_file() and path.suffix == ".npz":
        return (path.resolve(),)
    if path.is_dir():
        files = tuple(sorted(p.resolve() for p in path.glob("*.npz")))
        if files:
            return files
        raise UserError(manifest.name, where, f"folder {path} holds no .npz files; give an .npz whose arrays are "
                        "named after the model's inputs with a leading sample axis, or a folder of them")
    raise UserError(manifest.name, where, f"{path} is not an .npz file or a folder of them (not found, or another "
                    "kind of file)")


def metric_file(manifest: Path, where: str, metric: str) -> Path | None:
    """The project's file of a `module:function` metric (its bytes are in the validation's key), None for a
    built-in one; one line when the module is no file of the project."""
    if metric in METRICS:
        return None
    module = metric.split(":", 1)[0]
    base = manifest.parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    raise UserError(manifest.name, where, f"module '{module}' is no file of the project ({base}.py or "
                    f"{base}/__init__.py): a metric is a built-in one ({', '.join(METRICS)}) or \"module:function\" "
                    "from the project's folder")


def read_task(manifest: Path, where: str, values: dict[str, Any], looked_at: Any) -> dict[str, Any]:
    """The task keys of one `validation` table (`where`: its key path), as settings: the dataset's files, the
    metric's file; `looked_at(path)` records each file read (the saved plan is remade when one changes)."""
    settings: dict[str, Any] = {}
    if values["min_relative"] is not None and values["max_drop"] is not None:
        raise UserError(manifest.name, f"{where}.max_drop", "give one gate: min_relative (a share of the source "
                        "model's score) or max_drop (an absolute drop), not both")
    if values["dataset"] is not None:
        folder = looked_at(manifest.parent / values["dataset"])
        settings["dataset"] = dataset_files(manifest, f"{where}.dataset", folder)
    if values["metric"] is not None:
        settings["metric"] = values["metric"]
        found = metric_file(manifest, f"{where}.metric", values["metric"])
        if found is not None:
            settings["metric_file"] = looked_at(found)
    for key in ("samples", "output"):
        if values[key] is not None:
            settings[key] = values[key]
    for key in ("min_relative", "max_drop"):
        if values[key] is not None:
            settings[key] = float(values[key])
    return settings


def task_settings(merged: dict[str, Any], manifest: str, entry: str) -> dict[str, Any] | None:
    """A build's task metric from its merged validation settings (target's, model's, model's for the target): None
    without a dataset; one line for a dataset without a metric or a metric without a dataset."""
    if "dataset" not in merged and "metric" not in merged:
        return None
    if "metric" not in merged:
        raise UserError(manifest, f"{entry}.validation.metric", "a dataset needs a metric to judge it on: one of "
                        f"{', '.join(METRICS)}, or \"module:function\"")
    if "dataset" not in merged:
        raise UserError(manifest, f"{entry}.validation.dataset", f"metric '{merged['metric']}' needs a dataset: an "
                        ".npz of the model's inputs with a leading sample axis (and `labels`), or a folder of them")
    gate = ({"max_drop": merged["max_drop"]} if "max_drop" in merged else
            {"min_relative": merged.get("min_relative", DEFAULT_MIN_RELATIVE)})
    return {"dataset": [str(p) for p in merged["dataset"]], "samples": merged.get("samples"),
            "metric": merged["metric"], "output": merged.get("output"), "gate": gate,
            "metric_file": str(merged["metric_file"]) if "metric_file" in merged else None}
