"""Which external-data files a model references, and its inputs' shapes, without parsing models at every `doit list`.

The answer for each model is cached in `artifacts/.state/external-data.journaled` under the model's (size, mtime_ns,
inode); a model is read (with `onnx`, tensors not loaded, then `onnx.checker`) only when it changed. The models that
changed are read in one job: in a warm worker of a fork server that is running or starting anyway, which has
`onnx` loaded (importing it here would slow a first build), else in this process. Locations that escape the
model's folder are refused before any of them is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..contracts.jobs import ModelReadJob, ModelsRead
from ..errors import BuildError, UserError
from ..files.entry_lines import LazyEntries
from ..files.layout import stat_key
from ..files.publish import discard
from ..logs import log
from ..state.folder import StateFolder

if TYPE_CHECKING:
    from ..execute.forked_jobs import Handoff
    from ..execute.links import Links
    from ..execute.provenance import Provenance

INDEX = "external-data.journaled"
READ_TIMEOUT_S = 600.0  # a multi-GB protobuf takes seconds to parse and check



def _input_shapes(graph: Any) -> dict[str, list[int | None]]:
    """The true inputs (not weights an old exporter also lists) and their dimensions: a static size (0 included),
    None where symbolic, -1, unnamed or a placeholder."""
    weights = {t.name for t in graph.initializer}
    return {value.name: [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None
                         for d in value.type.tensor_type.shape.dim]
            for value in graph.input if value.name not in weights and value.type.HasField("tensor_type")}


def _ready(model: Any) -> dict[str, Any]:
    """Whether the graph already is what the shape and fold stages would make of it: every true input and every
    node's output has a static shape that ONNX's own inference (strict, on the graph without its weights) agrees
    with, so no stale shape can reach a compiler; whether any node only computes constants; its ai.onnx opset."""
    import onnx

    from ..steps.folding import foldable_nodes, read_in_bodies

    def static(value: Any) -> bool:
        shape = value.type.tensor_type.shape if value.type.HasField("tensor_type") else None
        return shape is not None and value.type.tensor_type.HasField("shape") and all(
            d.HasField("dim_value") and d.dim_value > 0 for d in shape.dim)

    graph = model.graph
    weights = {t.name for t in graph.initializer}
    known = {v.name: v for v in [*graph.value_info, *graph.output]}
    outputs = [name for node in graph.node for name in node.output if name]
    shaped = all(static(v) for v in graph.input if v.name not in weights) and all(
        name in known and static(known[name]) for name in outputs)
    if shaped:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        except Exception:  # noqa: BLE001 - a graph onnx cannot infer, or whose shapes conflict: the stage fixes it
            shaped = False
        else:
            again = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
            shaped = all(name in again and again[name].type == known[name].type for name in outputs)
    opsets = [entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")]
    # the fold stage also gets the initializers subgraphs read to them in a way the EPContext writer keeps
    foldable = bool(foldable_nodes(graph)) or bool(read_in_bodies(graph))
    return {"static": shaped, "foldable": foldable, "opset": opsets[0] if opsets else None}


def _read(model_path: Path) -> dict[str, Any]:
    """{"locations": the external-data files it references, "inputs": `_input_shapes`}, or UserError."""
    import onnx

    if model_path.stat().st_size == 0:
        raise UserError(model_path.name, None, "the model file is empty")
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several types for a file that is not ONNX
        raise UserError(model_path.name, None, f"not a readable ONNX model: {exc}") from None
    found: set[str] = set()
    needs: dict[str, int] = {}  # location -> the bytes its tensors reach (offset + length)

    def visit(graph: Any) -> None:
        tensors = list(graph.initializer) + [node_attr.t for node in graph.node for node_attr in node.attribute
                                             if node_attr.HasField("t")]
        for tensor in tensors:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                fields = {entry.key: entry.value for entry in tensor.external_data}
                if "location" in fields:
                    found.add(fields["location"])
                    end = _data_end(tensor, fields)
                    if end is not None:
                        needs[fields["location"]] = max(end, needs.get(fields["location"], 0))
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    visit(attribute.g)
                for subgraph in attribute.graphs:
                    visit(subgraph)

    visit(model.graph)
    if not model.graph.output:
        raise UserError(model_path.name, None, "the model has no outputs: nothing to compile or compare")
    for location in found:  # refused here, before the checker reads anything
        check_location(model_path, location, needs.get(location))
    ort_only: list[str] = []
    try:
        onnx.checker.check_model(str(model_path))  # by path: external data is checked next to the model
    except onnx.checker.ValidationError as exc:
        ort_only = _checked_with_ort_ops(model)
        if not ort_only:
            raise UserError(model_path.name, None, f"fails onnx.checker: {' '.join(str(exc).split())}") from None
        log(__name__, "info", "%s: onnx.checker does not know %s, which ONNX Runtime registers: accepted",
            model_path.name, ", ".join(ort_only))
    weights = {t.name for t in model.graph.initializer}
    return {"locations": sorted(found), "needs": needs, "inputs": _input_shapes(model.graph),
            "dim_names": {name: [d.dim_param or None for d in value.type.tensor_type.shape.dim]
                          for value in model.graph.input if (name := value.name) not in weights
                          and value.type.HasField("tensor_type")},
            "weights_as_inputs": sorted(v.name for v in model.graph.input if v.name in weights),
            **({"ort_only_ops": ort_only} if ort_only else {}),
            "graph": _ready(model)}


ORT_ONLY_DOMAIN = "epbuild.ort-registered"  # where a copy puts ops ONNX lacks and ONNX Runtime has, for the checker


def _checked_with_ort_ops(model: Any) -> list[str]:
    """The op types onnx.checker does not know at the model's opset and ONNX Runtime's CPU EP registers (what
    onnxruntime-genai's builder writes: SimplifiedLayerNormalization in the default domain), if the model passes
    the checker once those nodes are set aside; else [] (the checker's own complaint stands). The model itself is
    not changed: ONNX Runtime loads it as it is."""
    import copy

    import onnx
    from onnxruntime.capi import onnxruntime_pybind11_state as registry

    opsets = {entry.domain or "": entry.version for entry in model.opset_import}
    registered = {(kernel.domain or "", kernel.op_name) for kernel in registry.get_all_opkernel_def()
                  if kernel.provider == "CPUExecutionProvider"}
    unknown = set()

    def visit(graph: Any, moving: bool) -> None:
        for node in graph.node:
            domain = node.domain or ""
            known = domain in opsets and onnx.defs.has(node.op_type, opsets[domain], domain)
            if not known and (domain, node.op_type) in registered:
                unknown.add(node.op_type)
                if moving:
                    node.domain = ORT_ONLY_DOMAIN
            for attribute in node.attribute:
                for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    visit(sub, moving)

    visit(model.graph, False)
    if not unknown:
        return []
    checked = copy.deepcopy(model)
    visit(checked.graph, True)
    checked.opset_import.append(onnx.helper.make_opsetid(ORT_ONLY_DOMAIN, 1))
    for graph in _graphs(checked.graph):  # external data was checked above (check_location), the rest is here
        for index, tensor in enumerate(graph.initializer):
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                graph.initializer[index].CopyFrom(onnx.helper.make_tensor(tensor.name, tensor.data_type, [0], []))
    try:
        onnx.checker.check_model(checked)
    except onnx.checker.ValidationError:
        return []
    return sorted(unknown)


def _graphs(graph: Any) -> list[Any]:
    return [graph, *(found for node in graph.node for attribute in node.attribute
                     for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)
                     for found in _graphs(sub))]


def _data_end(tensor: Any, fields: dict[str, str]) -> int | None:
    """Where the tensor's bytes end in its data file: offset + length (the length from its shape and type when
    the exporter wrote none); None where that cannot be said (strings)."""
    import math

    from onnx import helper

    try:
        length = int(fields["length"]) if "length" in fields else (
            math.prod(tensor.dims) * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize)
        return int(fields.get("offset", 0)) + length
    except (ValueError, KeyError, TypeError):
        return None


def check_location(model_path: Path, location: str, needs: int | None = None) -> Path:
    """The data file for one location, refusing anything outside the model's folder (symlinks included), and one
    shorter than its tensors reach (`needs` bytes: a copy cut short), which ONNX Runtime reports only as "Failed to
    read" without the file."""
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
    if resolved == model_path.resolve():
        raise UserError(model_path.name, None, f"external data location '{location}' is the model file itself; "
                        "refused (re-save the model with its weights in a .data file of their own)")
    if needs is not None and (size := resolved.stat().st_size) < needs:
        raise UserError(model_path.name, None, f"external data file '{location}' is cut short: its tensors reach "
                        f"byte {needs:,}, the file has {size:,}; copy it whole or export the model again")
    return model_path.parent / candidate


def read_models(paths: list[str], server: str | None, workdir: Path | None = None,
                expect: Provenance | None = None, links: Links | None = None) -> dict[str, dict[str, Any]]:
    """Per model path: {"locations": [...]} or {"error": why it cannot be used}. With `server` (a fork server's
    alias), in one job in its warm worker working in `workdir` (removed after), and in one job per model should
    that job crash or time out, so that the error names its model."""
    job = ModelReadJob(tuple(paths)).to_json()
    if server is None or workdir is None:
        return ModelsRead.from_json(_read_in_child(job)).models
    from ..execute.child import run_child
    from ..manifest.builds import Limits

    try:
        return ModelsRead.from_json(run_child(__name__, job, workdir, Limits(READ_TIMEOUT_S), "reading the models",
                                              ep=server, reuse=True, expect=expect, links=links)).models
    except BuildError as exc:
        if len(paths) == 1:
            return {paths[0]: {"error": f"reading it failed: {exc}"}}
    finally:
        discard(workdir)
    return {path: answer for one in paths
            for path, answer in read_models([one], server, workdir, expect, links).items()}


class ExternalDataIndex:
    """Per-model external-data file lists, cached by file identity; `save()` writes only when something changed."""

    def __init__(self, state_dir: Path, expect: Provenance | None = None, links: Links | None = None):
        self.state = StateFolder(state_dir)
        self.expect = expect  # what the build's reading jobs expect (its Provenance)
        self.links = links  # the build's fork-server leases (`execute.links`)
        # one line per model: a run that read one model rewrites its line, the others' as read (`files.entry_lines`)
        found = self.state.read_entries(INDEX)
        self.entries = found[0] if found is not None else LazyEntries()
        self.errors: dict[str, str] = {}  # not remembered: a model in error is read again next time
        self.current: set[str] = set()  # models whose entry matches the file, checked by this process
        self.changed = False

    def unread(self, model_paths: list[Path]) -> list[Path]:
        """The models that changed since they were last read (each stat'ed once per process)."""
        stale = []
        for path in model_paths:
            key = str(path)
            if key not in self.current:
                entry = self.entries.get(key)
                stat = stat_key(path.stat())
                # entries an older epbuild wrote (without the graph facts, or the opset): read again
                if entry is not None and entry["stat"] == stat and "opset" in entry.get("graph", {}):
                    self.current.add(key)
                else:
                    stale.append(path)
        return stale

    def read(self, model_paths: list[Path], server: str | None = None, workdir: Path | None = None) -> None:
        """Read these models (`read_models`) and remember what they reference."""
        stats = {str(path): stat_key(path.stat()) for path in model_paths}
        for path, answer in read_models(list(stats), server, workdir, self.expect, self.links).items():
            if "error" in answer:
                self.errors[path] = answer["error"]
            else:
                self.entries[path] = {"stat": stats[path], **answer}
                self.current.add(path)
                self.changed = True

    def files(self, model_path: Path) -> list[Path]:
        """The model's external-data files (read here if it changed and `read()` did not read it)."""
        key = str(model_path)
        if key not in self.errors and self.unread([model_path]):
            self.read([model_path])
        if key in self.errors:
            raise UserError(model_path.name, None, self.errors[key])
        entry = self.entries[key]
        needs = entry.get("needs", {})  # entries written by an older epbuild have none
        return [check_location(model_path, location, needs.get(location)) for location in entry["locations"]]

    def inputs(self, model_path: Path) -> tuple[dict[str, list[int | None]], list[str], dict[str, list[str | None]]]:
        """The model's inputs with their dimensions, the weights an old exporter also lists as inputs, and each
        input's dimension names (dim_param, None where there is none), as it was read (`files` reads it first)."""
        entry = self.entries[str(model_path)]
        return entry["inputs"], entry["weights_as_inputs"], entry["dim_names"]

    def graph(self, model_path: Path) -> dict[str, Any]:
        """`_ready`'s answer for the model, as it was read."""
        return self.entries[str(model_path)]["graph"]

    def save(self) -> None:
        """Write the entries of the models this process looked up (every model and reference of the manifest:
        a model removed, renamed or in another checkout's folder is forgotten), when one was read or forgotten."""
        kept = self.entries.only(self.current)
        if not self.changed and len(kept) == len(self.entries):
            return
        self.state.write_entries(INDEX, kept)
        self.entries, self.changed = kept, False


# ---- child process ----

def _read_in_child(request: dict[str, Any]) -> dict[str, Any]:
    answers: dict[str, dict[str, Any]] = {}
    for path in ModelReadJob.from_json(request).models:
        try:
            answers[path] = _read(Path(path))
        except UserError as exc:
            answers[path] = {"error": exc.message}
    return ModelsRead(answers).to_json()


def main(handoff: Handoff | None = None) -> None:
    from ..execute.child import serve

    serve(_read_in_child, handoff)


if __name__ == "__main__":
    main()
