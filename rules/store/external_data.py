"""Which external-data files a model references, without parsing models at every `doit list`.

The answer for each model is cached in `artifacts/.state/external-data.json` under the model's (size, mtime_ns,
inode); a model is parsed (with `onnx`, tensors not loaded) only when it changed. Locations that escape the
model's folder are refused before any of them is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UserError
from .layout import stat_key, write_json


def _locations(model_path: Path) -> set[str]:
    import onnx

    if model_path.stat().st_size == 0:
        raise UserError(model_path.name, None, "the model file is empty")
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types for a file that is not ONNX
        raise UserError(model_path.name, None, f"not a readable ONNX model: {exc}") from None
    found: set[str] = set()

    def visit(graph: Any) -> None:
        tensors = list(graph.initializer) + [node_attr.t for node in graph.node for node_attr in node.attribute
                                             if node_attr.HasField("t")]
        for tensor in tensors:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                found.update(entry.value for entry in tensor.external_data if entry.key == "location")
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    visit(attribute.g)
                for subgraph in attribute.graphs:
                    visit(subgraph)

    visit(model.graph)
    for location in found:  # refused here, before the checker reads anything
        check_location(model_path, location)
    try:
        onnx.checker.check_model(str(model_path))  # by path: external data is checked next to the model
    except onnx.checker.ValidationError as exc:
        raise UserError(model_path.name, None, f"fails onnx.checker: {' '.join(str(exc).split())}") from None
    return found


def check_location(model_path: Path, location: str) -> Path:
    """The data file for one location, refusing anything outside the model's folder (symlinks included)."""
    folder = model_path.parent.resolve()
    candidate = Path(location)
    if candidate.is_absolute() or ".." in candidate.parts:
        raise UserError(model_path.name, None,
                        f"external data location '{location}' escapes the model's folder; refused")
    resolved = (folder / candidate).resolve()
    if folder not in resolved.parents:
        raise UserError(model_path.name, None,
                        f"external data location '{location}' resolves outside the model's folder; refused")
    if not resolved.is_file():
        raise UserError(model_path.name, None, f"external data file '{location}' not found next to the model")
    return model_path.parent / candidate


class ExternalDataIndex:
    """Per-model external-data file lists, cached by file identity; `save()` writes only when something changed."""

    def __init__(self, state_dir: Path):
        self.path = state_dir / "external-data.json"
        try:
            self.entries: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = {}
        self.changed = False

    def files(self, model_path: Path) -> list[Path]:
        key = str(model_path)
        stat = stat_key(model_path.stat())
        entry = self.entries.get(key)
        if entry is None or entry["stat"] != stat:
            entry = {"stat": stat, "locations": sorted(_locations(model_path))}
            self.entries[key] = entry
            self.changed = True
        return [check_location(model_path, location) for location in entry["locations"]]

    def save(self) -> None:
        if not self.changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, self.entries, indent=None)
        self.changed = False
