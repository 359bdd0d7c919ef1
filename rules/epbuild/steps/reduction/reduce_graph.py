"""Subgraphs of a model for `epbuild reduce`: any set of its nodes as a model of its own, the weights kept as they
are, and what a failure's message says once the names and numbers of one graph are taken out of it.

A subgraph's inputs are the tensors its nodes read that no node of it makes and no weight holds (their types and
shapes from shape inference on the whole model, so a subgraph of a static model is static); its outputs are the
tensors its nodes make that the model outputs or that a node outside it reads, else those no node of it reads. A
node with a body (If, Loop, Scan) counts the outer tensors its body reads as read by the node.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ...errors import ModelError

# what differs between two failures that are the same one: numbers, hex addresses, quoted names, paths
_NOISE = ((re.compile(r"0x[0-9a-fA-F]+"), "0x#"), (re.compile(r"(['\"`]).*?\1"), "'…'"),
          (re.compile(r"(/[\w.+-]+)+"), "/…"), (re.compile(r"\d+"), "#"), (re.compile(r"\s+"), " "))
STEM_CHARS = 120


def stem(message: str) -> str:
    """The failure's kind, as a reduction compares it: its first line without the task's name, names, paths and
    numbers, cut to its first STEM_CHARS characters."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = re.sub(r"^[\w-]+:[\w.@-]+:\s*", "", first)  # "compile:m@t: " in front of a job's failure
    first = re.sub(r"\s*\(full output: [^)]*\)", "", first)  # where this probe's log was
    for pattern, replacement in _NOISE:
        first = pattern.sub(replacement, first)
    return first.strip()[:STEM_CHARS]


def _body_reads(node: Any) -> set[str]:
    """The outer tensors a node's bodies read (names no body node makes nor a body takes as input)."""
    import onnx

    reads: set[str] = set()
    for attribute in node.attribute:
        graphs = ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else
                  list(attribute.graphs) if attribute.type == onnx.AttributeProto.GRAPHS else [])
        for graph in graphs:
            made = {i.name for i in graph.input} | {t.name for t in graph.initializer}
            for inner in graph.node:
                reads.update(name for name in [*inner.input, *_body_reads(inner)] if name and name not in made)
                made.update(inner.output)
    return reads


class Subgraphs:
    """A model's nodes in order, ready to be cut into subgraph models."""

    def __init__(self, path: Path, weights: Path | None = None):
        """`weights`: the folder the model's external data resolves in, when not its own (`files.weights`)."""
        import onnx
        from onnx.external_data_helper import load_external_data_for_model

        model = onnx.load(str(path), load_external_data=False)  # then its weights: a subgraph carries those it uses
        load_external_data_for_model(model, str(weights or path.parent))
        try:
            typed = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:  # noqa: BLE001 - a model ONNX cannot infer keeps the types it declares
            typed = model
        self.model = model
        self.nodes = list(model.graph.node)
        graph = typed.graph
        self.types = {v.name: v for v in [*graph.value_info, *graph.input, *graph.output]}
        self.weights = {t.name: t for t in model.graph.initializer}
        self.outputs = [o.name for o in model.graph.output]
        self.reads = [[n for n in [*node.input, *_body_reads(node)] if n] for node in self.nodes]

    def __len__(self) -> int:
        return len(self.nodes)

    def model_of(self, indices: Sequence[int]) -> Any:
        """The subgraph of the nodes at `indices` (in model order) as a model with the source's opsets and IR."""
        from onnx import helper

        chosen = sorted(set(indices))
        inside = set(chosen)
        made = {name for i in chosen for name in self.nodes[i].output if name}
        read_outside = {name for i, reads in enumerate(self.reads) if i not in inside for name in reads}
        read_inside = {name for i in chosen for name in self.reads[i]}
        inputs = list(dict.fromkeys(name for i in chosen for name in self.reads[i]
                                    if name not in made and name not in self.weights))
        outputs = [name for name in dict.fromkeys(o for i in chosen for o in self.nodes[i].output if o)
                   if name in self.outputs or name in read_outside] or \
                  [name for name in dict.fromkeys(o for i in chosen for o in self.nodes[i].output if o)
                   if name not in read_inside]
        missing = [name for name in [*inputs, *outputs] if name not in self.types]
        if missing:
            raise ModelError(f"shape inference gives no type for {', '.join(missing[:5])}: the model cannot be cut "
                             "there")
        weights = [self.weights[name] for name in dict.fromkeys(n for i in chosen for n in self.reads[i])
                   if name in self.weights]
        graph = helper.make_graph([self.nodes[i] for i in chosen], f"{self.model.graph.name}_reduced",
                                  [self.types[name] for name in inputs], [self.types[name] for name in outputs],
                                  weights)
        model = helper.make_model(graph, opset_imports=list(self.model.opset_import))
        model.ir_version = self.model.ir_version
        return model

    def key(self, indices: Iterable[int]) -> str:
        """A subgraph's content key: the nodes it holds, as the model orders them (weights are named by them; the
        probes of one build's model share a repro folder)."""
        digest = hashlib.sha256()
        for index in sorted(set(indices)):
            digest.update(self.nodes[index].SerializeToString())
        return digest.hexdigest()


def save_model(model: Any, path: Path) -> Path:
    """Write a subgraph with its weights (beside it, as external data, past protobuf's 2 GiB limit)."""
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    large = model.ByteSize() > 1_900_000_000
    onnx.save(model, str(path), save_as_external_data=large, all_tensors_to_one_file=True,
              location=f"{path.name}.data" if large else None)
    return path
