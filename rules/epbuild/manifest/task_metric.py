"""A validation's task metric as the manifest declares it (`dataset`, `samples`, `metric`, `output` and a gate,
`min_relative` or `max_drop`): the files it names, checked to exist inside the project, and what a build's
validation receives. The metric itself runs in the validating child (`steps.validation.task_metrics`)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from ..errors import UserError
from .roots import not_a_file
from .schema import METRICS

TASK_KEYS = ("dataset", "samples", "metric", "output", "min_relative", "max_drop")
DEFAULT_MIN_RELATIVE = 0.99  # MLPerf's standard: the compiled model keeps 99% of the reference's accuracy


def dataset_files(manifest: Path, where: str, path: Path) -> tuple[Path, ...]:
    """An `.npz` file, or a folder's `.npz` files in name order; one line when it is neither."""
    if path.is_file() and path.suffix == ".npz":
        return (path.resolve(),)
    if path.is_dir():
        files = tuple(sorted(p.resolve() for p in path.glob("*.npz")))
        odd = next((p for p in files if not p.is_file()), None)  # a FIFO would block the reader forever
        if odd is not None:
            raise UserError(manifest.name, where, f"{odd} {not_a_file(odd)}: every .npz of the folder must be a file")
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


MAX_METRIC_FILES = 1000  # a metric's project files followed at most (a bound on what a planning run reads)


def _imported(file: Path, root: Path) -> list[Path]:
    """The project files (under `root`, the metric's import root) that `file`'s import statements may load: each
    module named, its packages' __init__.py and, for `from M import N`, N as a submodule."""
    try:
        tree = ast.parse(file.read_bytes(), str(file))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return []  # the metric's own import says what is wrong with it, in the validation
    names: list[list[str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the file's package, `level - 1` folders up
                base = file.parent.parents[node.level - 2] if node.level > 1 else file.parent
                try:
                    prefix = list(base.relative_to(root).parts)
                except ValueError:
                    continue
            else:
                prefix = []
            module = [*prefix, *(node.module.split(".") if node.module else [])]
            names += [module, *([*module, alias.name] for alias in node.names if alias.name != "*")]
    found = []
    for parts in names:
        for depth in range(1, len(parts) + 1):
            base = root.joinpath(*parts[:depth])
            found += [c for c in (base.with_suffix(".py"), base / "__init__.py") if c.is_file()]
    return found


def metric_sources(root: Path, file: Path) -> tuple[Path, ...]:
    """A `module:function` metric's file and every project file it imports, statically and transitively (a helper
    module edited changes the validation's key as the metric's own file does); an import made at run time by name
    (`importlib`) is not followed. Files resolved, within `root`, at most `MAX_METRIC_FILES`."""
    root = root.resolve()
    seen: dict[Path, None] = {file: None}
    queue = [file]
    while queue and len(seen) < MAX_METRIC_FILES:
        for found in _imported(queue.pop(), root):
            resolved = found.resolve()
            if resolved not in seen and resolved.is_relative_to(root):
                seen[resolved] = None
                queue.append(resolved)
    return tuple(seen)


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
            settings["metric_files"] = tuple(looked_at(p) for p in metric_sources(manifest.parent, found))
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
            "metric_file": str(merged["metric_file"]) if "metric_file" in merged else None,
            "metric_files": [str(p) for p in merged.get("metric_files", ())]}
