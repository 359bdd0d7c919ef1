"""More real models build, and every EP failure is named (issue 63): old opsets get an `upgrade` stage for targets
whose EP takes none below some opset (QNN: 7), validated against the model as declared; a converter refusal, a
compile with `upgrade = false`, an EP that takes no node, a zero-size input and the EPContext writer's invalid graph
each say so in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
from failure_classes import BIAS, RNG, B, W, legacy_broadcast, ranker_shared_weight, unconvertible
from failure_classes import opset6_cnn as plain
from onnx import TensorProto, helper, numpy_helper

from conftest import build_report


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


def test_legacy_broadcast_is_converted_to_what_it_means(tmp_path):
    """ONNX's adapter (onnx 1.23) unsqueezes a [C] bias to [C, 1, 1, 1] whatever the axis: a [8, 8, 16, 16] sum of
    other values. The stage writes the alignment itself; the result equals the network written at opset 11."""
    import onnxruntime as ort

    from epbuild.steps.stages.output import save
    from epbuild.steps.stages.upgrade import upgrade

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


def _tiny(path, nodes, x_shape, y_shape) -> None:
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_compile_that_takes_no_node_names_what_the_ep_refuses(project, openvino_reason):
    """Issue 63 item 3: "Unable to compile any nodes" named nothing; the EP is asked about each op type alone. A
    model folded to nothing says so (QNN said "took none of the model's nodes ()"); a static zero-size input is
    called what it is, not a symbolic dimension in a line worded as a manifest error."""
    models = project.root / "models"
    _tiny(models / "det.onnx", [helper.make_node("Det", ["x"], ["y"])], [2, 3, 3], [2])
    _tiny(models / "const.onnx",
          [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["y"], to=1)], [2, 3], [2])
    _tiny(models / "zero.onnx", [helper.make_node("Relu", ["x"], ["y"])], [2, 0, 4], [2, 0, 4])
    targets = '[targets.qnn-htp]\nep = "qnn"\n' + ('' if openvino_reason else '[targets.ov]\nep = "openvino"\n')
    project.manifest(targets + "".join(f'[models.{m}]\npath = "models/{m}.onnx"\n' for m in ("det", "const", "zero")))
    done = project.doit("--continue", check=False)
    lines = {line.split(" (")[0]: line for line in done.stdout.splitlines() if line.startswith("compile ")}
    for target, ep in [("qnn-htp", "QNNExecutionProvider"), *([] if openvino_reason else
                                                              [("ov", "OpenVINOExecutionProvider")])]:
        line = lines[f"compile det@{target}"]
        assert f"{ep} took none of the model's nodes; alone, it takes no node of Det (1 node)" in line, line
        assert "Unable to compile any nodes" not in line and "epbuild reduce" not in line
        line = lines[f"compile zero@{target}"]
        assert "input 'x' is declared [2, 0, 4] in the model: a zero-size dimension" in line, line
        assert "symbolic" not in line and "models.toml" not in line and "epbuild reduce" not in line
    line = lines["compile const@qnn-htp"]
    assert "the model has none left to compile (every output is an input or a constant" in line, line
    assert "()" not in line


def test_ep_chatter_stays_out_of_a_failure_s_lines():
    from epbuild.execute.child import _tail

    printed = (" # LIBNATIVE: No alternate configuration present in libnative_tls.conf - using default\n"
               "\x1b[0;93m2026-12-05 15:05:59.53 [W:onnxruntime:, model.cc:290 Model] only guarantees opset 7\x1b[m\n"
               "\x1b[1;31m2026-12-05 15:05:59.53 [E:onnxruntime:, qnn_model.cc:12 Finalize] graph finalize failed: "
               "1002\x1b[m\n")
    assert _tail(printed) == "    onnxruntime: graph finalize failed: 1002"
    assert _tail(" # LIBNATIVE: x\nthe EP's own words\n") == "    the EP's own words"


def test_a_loop_body_reading_weights_from_outside_compiles_for_qnn(project):
    """Issue 63 item 4: a ranker whose Loop body reads the weight a compiled MatMul outside reads too, and one whose
    body alone reads a 16 KiB table. ONNX Runtime's EPContext writer dropped the first with the MatMul ("INVALID_GRAPH
    ... not output of any previous nodes"), and wrote the second, moved into the body, as an in-memory reference it
    could not load. The fold stage passes both to the Loop as loop-carried values: they compile and validate; with
    optimize (no fold stage) the line says it is the writer's invalid graph, not ONNX Runtime's raw words."""
    ranker_shared_weight(project.root / "models" / "shared.onnx")
    ranker_shared_weight(project.root / "models" / "table.onnx", body_only=True, size=64)
    project.manifest('[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n\n'
                     '[models.shared]\npath = "models/shared.onnx"\n[models.table]\npath = "models/table.onnx"\n'
                     '[models.unfolded]\npath = "models/shared.onnx"\noptimize = "none"\n')
    done = project.doit("--continue", check=False)
    tasks = build_report(project)
    for model in ("shared", "table"):
        assert tasks[f"validate:{model}@qnn-htp"]["status"] == "validated", done.stdout
        folded = onnx.load(str(project.artifacts / ".stages" / model / "fold" / f"{model}.onnx"))
        (loop,) = [n for n in folded.graph.node if n.op_type == "Loop"]
        assert "W" in loop.input
    line = next(line for line in done.stdout.splitlines() if line.startswith("compile unfolded@qnn-htp"))
    assert line.startswith("compile unfolded@qnn-htp (QNNExecutionProvider): ONNX Runtime's EPContext writer produced "
                           "an invalid graph"), line
    assert "reads the outer-scope initializer(s) 'W'" in line and "remove optimize from models.unfolded" in line
    assert "[ONNXRuntimeError]" not in line and "topologically sorted" not in line


def test_carried_weights_go_before_a_loop_s_scan_outputs(tmp_path):
    """Loop outputs are its loop-carried values, then its scan outputs: a carried weight goes between them, and the
    model computes what it did (to a float's last bit: a MatMul of a weight read at run time is not pre-packed)."""
    import onnxruntime as ort

    from epbuild.steps.folding import carry_into_loops

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("MatMul", ["acc_in", "W"], ["mm"]),
         helper.make_node("Add", ["mm", "x"], ["acc_out"]), helper.make_node("Mul", ["acc_out", "W1"], ["scan"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, 8])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trip", "", "zero"], ["acc", "scans"], body=body)], "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("scans", TensorProto.FLOAT, [4, 1, 8])],
        [numpy_helper.from_array((RNG.standard_normal((8, 8)) / 8).astype(np.float32), "W"),
         numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32), "W1"),
         numpy_helper.from_array(np.array(4, np.int64), "trip"),
         numpy_helper.from_array(np.zeros((1, 8), np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((1, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    assert carry_into_loops(model.graph) == ["W", "W1"]
    onnx.checker.check_model(model)
    (loop,) = model.graph.node
    assert list(loop.input) == ["trip", "", "zero", "W", "W1"] and loop.output[0] == "acc" and loop.output[3] == "scans"
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert carry_into_loops(model.graph) == []  # nothing read from outside any more


def test_a_model_onnx_runtime_cannot_run_is_judged_against_onnx_reference_implementation(project):
    """Gemm at opset 6 has no ONNX Runtime kernel: the model as declared cannot run on CPU, but ONNX's reference
    implementation computes it (a small model: bounded), and the verdict says its reference came from there."""
    weights = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], broadcast=1)], "gemm6",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [16, 8]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.ones(8, np.float32),
                                                                                              "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    model.ir_version = 3
    onnx.save(model, str(project.root / "models" / "gemm6.onnx"))
    project.manifest('[targets.qnn-htp]\nep = "qnn"\n\n[models.gemm6]\npath = "models/gemm6.onnx"\n')
    done = project.doit(check=False)
    assert (project.artifacts / "qnn-htp" / "gemm6" / "validation.json").is_file(), done.stdout + done.stderr
    verdict = json.loads((project.artifacts / "qnn-htp" / "gemm6" / "validation.json").read_text())
    assert verdict["status"] == "passed", done.stdout + json.dumps(verdict)
    assert any("computed by ONNX's reference implementation (onnx.reference.ReferenceEvaluator)" in note
               for note in verdict["notes"]), verdict["notes"]
