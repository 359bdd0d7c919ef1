"""Large models and LLM pipelines: stages that never load the weights they keep, on generated models."""

from __future__ import annotations

import filecmp

import onnx

from conftest import build_report, ran
from real_models import wide_mlp

QNN = """
[targets.qnn-htp]
ep = "qnn"
options = { soc_model = 60 }
"""


def test_graph_stages_keep_the_weights_on_disk_and_out_of_memory(project):
    """A 196 MiB model's shape and fold stages read the graph only: each child's peak memory stays well below the
    weights' size, the weights are the source's bytes (a copy of the file, not re-serialized), and the fold still
    folds the small constant subgraph."""
    models = project.root / "models"
    wide_mlp(models / "wide.onnx")
    project.manifest('[models.wide]\npath = "models/wide.onnx"\ninputs = { x = [1, 3584] }\n' + QNN)
    done = project.doit("fold:wide")
    assert {"shape:wide", "fold:wide"} <= ran(done)
    tasks = build_report(project)
    for stage in ("shape", "fold"):
        assert tasks[f"{stage}:wide"]["child"]["peak_mb"] < 150, tasks[f"{stage}:wide"]
        data = project.artifacts / ".stages" / "wide" / stage / "wide.onnx.data"
        assert filecmp.cmp(data, models / "wide.onnx.data", shallow=False)
        assert data.stat().st_ino != (models / "wide.onnx.data").stat().st_ino and data.stat().st_nlink == 1
    folded = onnx.load(str(project.artifacts / ".stages" / "wide" / "fold" / "wide.onnx"))  # loads the weights
    assert "ConstantOfShape" not in [node.op_type for node in folded.graph.node]
    assert [d.dim_value for d in folded.graph.input[0].type.tensor_type.shape.dim] == [1, 3584]
    assert f"peak {tasks['fold:wide']['child']['peak_mb']:.0f} MB -> " in done.stdout
