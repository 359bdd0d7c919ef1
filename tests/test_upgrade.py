"""Old opsets (issue 63 item 1): a model below the opset its target's EP takes (QNN: 7) gets an `upgrade` stage
(ONNX's version converter) for that target only, validated against the model as declared; a conversion the converter
refuses, and a compile with `upgrade = false`, say so in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import build_report

RNG = np.random.default_rng(0)
W = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32)
BIAS = RNG.standard_normal(8).astype(np.float32)


def _old_export(path, nodes, weights: dict[str, np.ndarray], opset: int = 6) -> None:
    """An old PyTorch export: IR 3, the weights listed as graph inputs too."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16]),
              *(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape)) for name, a in weights.items())]
    graph = helper.make_graph(nodes, "old", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                   [1, 8, 16, 16])],
                              [numpy_helper.from_array(a, name) for name, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=3)
    model.producer_name, model.producer_version = "pytorch", "0.3"
    onnx.save(model, str(path))


def plain(path) -> None:
    """Ops ONNX Runtime runs at opset 6 (QNN takes none of them there)."""
    _old_export(path, [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                       helper.make_node("Tanh", ["c"], ["t"]), helper.make_node("Relu", ["t"], ["r"]),
                       helper.make_node("Softmax", ["r"], ["y"], axis=1)], {"w": W, "b": B})


def legacy_broadcast(path) -> None:
    """Opset 6's Add with `broadcast = 1, axis = 1`: a per-channel bias (no ONNX Runtime kernel at opset 6)."""
    _old_export(path, [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                       helper.make_node("Add", ["c", "bias"], ["a"], broadcast=1, axis=1),
                       helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=1)],
                {"w": W, "b": B, "bias": BIAS})


def same_network_at_opset_11(path) -> None:
    """What the legacy Add means, written at opset 11 (Softmax keeps its opset-1..12 meaning)."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "bias"],
                                                                                              ["a"]),
         helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=1)], "new",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b"),
         numpy_helper.from_array(BIAS.reshape(8, 1, 1), "bias")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)]), str(path))


def unconvertible(path) -> None:
    """Scale, an op ONNX Runtime registers in the default domain and ONNX has no schema for."""
    _old_export(path, [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                       helper.make_node("Scale", ["c"], ["y"], scale=2.0)], {"w": W, "b": B})


def test_legacy_broadcast_is_converted_to_what_it_means(tmp_path):
    """ONNX's adapter (onnx 1.23) unsqueezes a [C] bias to [C, 1, 1, 1] whatever the axis: a [8, 8, 16, 16] sum of
    other values. The stage writes the alignment itself; the result equals the network written at opset 11."""
    import onnxruntime as ort

    from epbuild.steps.preprocess import save
    from epbuild.steps.upgrade import upgrade

    legacy_broadcast(tmp_path / "old.onnx")
    same_network_at_opset_11(tmp_path / "new.onnx")
    said = upgrade(tmp_path / "old.onnx", tmp_path / "up.onnx", 7, None, save, None, "models.old")
    assert said == {"from_opset": 6, "to_opset": 7}
    upgraded = onnx.load(str(tmp_path / "up.onnx"))
    assert upgraded.opset_import[0].version == 7
    assert not any(a.name in ("axis", "broadcast") for n in upgraded.graph.node for a in n.attribute
                   if n.op_type == "Add")
    x = RNG.standard_normal((1, 4, 16, 16)).astype(np.float32)
    got = ort.InferenceSession(str(tmp_path / "up.onnx")).run(None, {"x": x})[0]
    want = ort.InferenceSession(str(tmp_path / "new.onnx")).run(None, {"x": x})[0]
    assert got.shape == want.shape == (1, 8, 16, 16)
    np.testing.assert_array_equal(got, want)


def test_old_opsets_are_upgraded_for_qnn_only_and_judged_against_the_model_as_declared(project):
    models = project.root / "models"
    plain(models / "plain.onnx")
    legacy_broadcast(models / "old.onnx")
    same_network_at_opset_11(models / "new.onnx")
    unconvertible(models / "scale.onnx")
    plain(models / "off.onnx")
    project.manifest("""
[targets.qnn-htp]
ep = "qnn"
[targets.cpu]
ep = "cpu"

[models.plain]
path = "models/plain.onnx"

[models.old]
path = "models/old.onnx"
targets = ["qnn-htp"]
validation = { reference = "models/new.onnx" }

[models.scale]
path = "models/scale.onnx"
targets = ["qnn-htp"]

[models.off]
path = "models/off.onnx"
targets = ["qnn-htp"]
upgrade = false
""")
    listed = project.doit("list", "--all").stdout
    assert {"upgrade:plain", "shape:plain+upgrade", "upgrade:old", "upgrade:scale"} <= {
        line.split()[0] for line in listed.splitlines() if line.strip()}
    assert "upgrade:off" not in listed  # switched off
    done = project.doit("--continue", check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    tasks = build_report(project)

    # the upgraded model compiles for QNN, all of it, and matches the model as declared (opset 6) run on CPU
    assert tasks["upgrade:plain"]["status"] == "compiled", out
    staged = onnx.load(str(project.artifacts / ".stages" / "plain" / "upgrade" / "plain.onnx"))
    assert staged.opset_import[0].version == 7
    assert tasks["validate:plain@qnn-htp"]["status"] == "validated", out
    report = json.loads((project.artifacts / "qnn-htp" / "plain" / "validation.json").read_text())
    assert report["status"] == "passed" and "opset" not in json.dumps(report.get("notes", []))
    artifact = json.loads((project.artifacts / "qnn-htp" / "plain" / "artifact.json").read_text())
    assert artifact["nodes"]["cpu"] == 0 and artifact["nodes"]["in_ep"] == artifact["nodes"]["source"] == 4
    # the CPU target compiles the model as it is: ONNX Runtime's CPU EP runs these ops at opset 6
    assert tasks["validate:plain@cpu"]["status"] == "validated", out
    assert "upgrade" not in json.dumps(tasks["compile:plain@cpu"])

    # a legacy broadcast converted to what it means, judged against the user's reference at opset 11
    assert tasks["validate:old@qnn-htp"]["status"] == "validated", out

    # the converter's refusal, in one line naming the op, the opsets and what to do
    line = next(line for line in out.splitlines() if line.startswith("upgrade:scale: "))
    assert "cannot convert the model from opset 6 to 7" in line and "Scale" in line and "upgrade = false" in line
    assert "Assertion" not in line and "%s" not in line and "convert.cc" not in out
    assert tasks["compile:scale@qnn-htp"]["status"] == "not built"

    # upgrade = false: QNN takes none of the nodes, and the line says it is the opset, with no repro suggested
    line = next(line for line in out.splitlines() if line.startswith("compile off@qnn-htp"))
    assert "the model is at ai.onnx opset 6, below 7, the lowest QNNExecutionProvider takes" in line, line
    assert "remove upgrade = false from models.off" in line and "epbuild reduce" not in line
    assert "took none of the model's nodes" not in line  # not blamed on its ops


def test_a_model_onnx_runtime_cannot_run_says_why_it_cannot_be_the_reference(project):
    """The legacy Add has no kernel in ONNX Runtime at opset 6: the model as declared cannot be the reference, and
    the line says so and what would serve (a CPU target says the same of its compile)."""
    legacy_broadcast(project.root / "models" / "old.onnx")
    project.manifest('[targets.qnn-htp]\nep = "qnn"\n[targets.cpu]\nep = "cpu"\n\n[models.old]\n'
                     'path = "models/old.onnx"\n')
    done = project.doit("--continue", check=False)
    out = done.stdout
    assert done.returncode == 1, out
    line = next(line for line in out.splitlines() if line.startswith("failed validate:old@qnn-htp"))
    assert "could not run on CPU" in line and "Add(6)" in line
    assert "at ai.onnx opset 6, below 7, the oldest ONNX Runtime guarantees" in line
    assert "give validation.reference a model you trust" in line
    line = next(line for line in out.splitlines() if line.startswith("compile old@cpu"))
    assert "export it again at opset 7 or later" in line and "epbuild reduce" not in line
