"""Real-model classes that broke a stage or a validation, each kept by a test: a Loop body reading the outer
graph's initializers beside a SequenceEmpty chain through the fold stage, and Caffe2-era IR-3 exports whose
weights, `*__SHAPE` and `OC2_DUMMY_*` tensors are listed as graph inputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from failure_classes import unshaped_value_info

from conftest import build_report
from epbuild.errors import ModelError
from real_models import loop_reading_outer_weights, old_ir_shape_inputs, small_waveform

TARGETS = '[targets.cpu]\nep = "cpu"\n[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n'


def test_a_loop_body_reading_outer_initializers_and_a_sequence_survive_the_fold_stage(project):
    loop_reading_outer_weights(project.root / "models" / "ranker.onnx")
    project.manifest('[models.ranker]\npath = "models/ranker.onnx"\ntargets = ["cpu", "qnn-htp"]\n' + TARGETS)
    done = project.doit(check=False)
    entries = build_report(project)
    assert entries["fold:ranker"]["status"] == "compiled", done.stdout
    folded = project.artifacts / ".stages" / "ranker" / "fold" / "ranker.onnx"
    graph = onnx.load(str(folded)).graph
    assert "SequenceEmpty" in {n.op_type for n in graph.node}  # a sequence is no tensor: never folded
    x = np.ones((1, 4), np.float32)
    want = ort.InferenceSession(str(project.root / "models" / "ranker.onnx")).run(None, {"x": x})
    got = ort.InferenceSession(str(folded)).run(None, {"x": x})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert entries["validate:ranker@cpu"]["status"] == "validated", done.stdout
    # read inside the body, they became loop-carried values, explicit inputs of the Loop: ONNX Runtime's EPContext
    # writer drops outer-scope initializers (and writes those moved into a body over 127 bytes as in-memory ones)
    (loop,) = [n for n in graph.node if n.op_type == "Loop"]
    assert {"offsets_7", "table"} <= set(loop.input) and {"offsets_7", "table"} <= {t.name for t in graph.initializer}
    assert entries["validate:ranker@qnn-htp"]["status"] == "validated", done.stdout


def test_an_invalid_model_from_the_epcontext_writer_is_said_to_be_the_writers(project):
    """With optimize = "none" there is no fold stage to move a Loop body's outer initializers into it, and ONNX
    Runtime's EPContext writer emits a model that fails its own check: the line says whose fault it is and what
    avoids it."""
    loop_reading_outer_weights(project.root / "models" / "ranker.onnx")
    project.manifest('[models.ranker]\npath = "models/ranker.onnx"\noptimize = "none"\ntargets = ["qnn-htp"]\n'
                     + TARGETS)
    done = project.doit(check=False)
    line = next(x for x in done.stdout.splitlines() if x.startswith("compile ranker@qnn-htp"))
    assert "ONNX Runtime's EPContext writer wrote an invalid model (onnx.checker accepts the model it compiled " \
           "from): a Loop/If/Scan body reads outer-scope initializers ('table', 'offsets_7')" in line
    assert "remove optimize from models.ranker" in line
    assert not (project.artifacts / "qnn-htp" / "ranker").exists()


@pytest.mark.parametrize("target", ["cpu"])
def test_ir3_weights_and_shape_tensors_listed_as_inputs_validate(project, target):
    old_ir_shape_inputs(project.root / "models" / "caffe2.onnx")
    project.manifest(f'[models.caffe2]\npath = "models/caffe2.onnx"\ntargets = ["{target}"]\n' + TARGETS)
    done = project.doit(check=False)
    assert "does not take" not in done.stdout, done.stdout
    assert build_report(project)[f"validate:caffe2@{target}"]["status"] == "validated", done.stdout


def test_a_stage_output_that_does_not_load_is_the_stages_fault(tmp_path):
    from onnx import TensorProto, helper

    from epbuild.steps.preprocess import _loads_on_cpu

    broken = helper.make_graph([helper.make_node("Add", ["x", "gone"], ["y"])], "g",
                               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(broken, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    with pytest.raises(ModelError, match=r"the fold stage wrote a model ONNX Runtime cannot load on CPU .*a fault of "
                                         r"this stage, not of the model or the EP"):
        _loads_on_cpu(ort, tmp_path / "m.onnx", None, "fold")


def test_an_artifact_its_ep_cannot_open_fails_the_compile_naming_the_partition_and_the_dynamic_input(tmp_path):
    """What a VITS-like model's QNN artifact did (compiled, 32 EPContext nodes, then "The count of graph inputs
    should be at least the count of tensor_wrapper!" at load): the compile opens it first and fails, naming the
    partition fed by a tensor of dynamic shape. The EP is a stand-in that refuses every load, named as such."""
    from onnx import TensorProto, helper

    from epbuild.steps.compile import _opens

    node = helper.make_node("EPContext", ["lengths"], ["y"], domain="com.microsoft", name="QNN_1")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("lengths", TensorProto.INT64, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft",
                                                                                                    1)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m_ctx.onnx"))

    class RefusingStandIn:  # a stand-in for onnxruntime whose EP cannot open anything
        class SessionOptions:
            log_severity_level = 0

            def add_provider_for_devices(self, *_args):
                pass

            def add_session_config_entry(self, *_args):
                pass

        @staticmethod
        def InferenceSession(*_args, **_kwargs):
            raise RuntimeError("The count of graph inputs should be at least the count of tensor_wrapper!")

    info = type("Info", (), {"name": "QNNExecutionProvider"})()
    with pytest.raises(ModelError) as raised:
        _opens(RefusingStandIn, info, None, {}, tmp_path / "m_ctx.onnx")
    message = str(raised.value)
    assert message.startswith("QNNExecutionProvider compiled m_ctx.onnx (1 EPContext partition(s)) but cannot open it")
    assert "tensor_wrapper" in message and "partition 1 of 1 (QNN_1) reads lengths with dynamic dimensions" in message


def test_an_optimized_ir3_model_never_asks_for_a_weight_it_listed_as_input(tmp_path, monkeypatch):
    """What IR-3 zoo models met: ONNX Runtime's optimizer folded a listed weight away but kept its graph.input entry,
    so the artifact asked to be fed `bias__SHAPE`. Unread, the listing goes; still read, the weight comes back."""
    from onnx import numpy_helper

    from epbuild.steps.compile import _settle_listed_weights
    from epbuild.steps.validation.validation_inputs import feeds_for, listed_weights

    source = old_ir_shape_inputs(tmp_path / "caffe2.onnx")
    artifact = onnx.load(str(source))
    kept = [t for t in artifact.graph.initializer if t.name not in ("bias__SHAPE", "OC2_DUMMY_0")]
    del artifact.graph.initializer[:]
    artifact.graph.initializer.extend(kept)  # both lose their values, as the optimizer's fold left them
    artifact.graph.node.remove(artifact.graph.node[0])
    artifact.graph.initializer.append(numpy_helper.from_array(np.full((1, 4), 0.5, np.float32), "bias"))
    onnx.save(artifact, str(tmp_path / "artifact.onnx"))
    assert {i.name for i in ort.InferenceSession(str(tmp_path / "artifact.onnx")).get_inputs()} == {
        "data_0", "bias__SHAPE", "OC2_DUMMY_0"}
    session = ort.InferenceSession(str(tmp_path / "artifact.onnx"))
    x = {"data_0": np.ones((1, 4), np.float32)}
    with pytest.raises(ModelError, match="has input 'bias__SHAPE', which the model it is compared with does not take"):
        feeds_for(session, x, {}, "artifact")
    weights = listed_weights(source, {"bias__SHAPE", "OC2_DUMMY_0"})
    got = session.run(None, feeds_for(session, x, {}, "artifact", weights))[0]
    want = ort.InferenceSession(str(source)).run(None, x)[0]
    np.testing.assert_array_equal(got, want)

    monkeypatch.chdir(tmp_path)  # the compile runs from the model's folder
    _settle_listed_weights(tmp_path / "artifact.onnx", "caffe2.onnx", ".")
    settled = onnx.load(str(tmp_path / "artifact.onnx"))
    assert "bias__SHAPE" not in {i.name for i in settled.graph.input}  # nothing reads it: unlisted
    assert "OC2_DUMMY_0" in {t.name for t in settled.graph.initializer}  # the Reshape reads it: its value is back
    session = ort.InferenceSession(str(tmp_path / "artifact.onnx"))
    assert [i.name for i in session.get_inputs()] == ["data_0"]
    np.testing.assert_array_equal(session.run(None, x)[0], want)


def test_a_small_magnitude_waveform_is_judged_by_its_snr_on_every_target(project):
    """A vocoder's waveform (max ~2e-4) was taken for constant and passed at 7 dB; it is judged by its SNR."""
    small_waveform(project.root / "models" / "vocoder.onnx")
    project.manifest('[models.vocoder]\npath = "models/vocoder.onnx"\ntargets = ["cpu", "qnn-htp"]\n' + TARGETS)
    done = project.doit(check=False)
    entries = build_report(project)
    for target in ("cpu", "qnn-htp"):
        report = json.loads((project.artifacts / target / "vocoder" / "validation.json").read_text())
        (waveform,) = report["outputs"].values()
        assert "near_constant" not in waveform and waveform["reference_max_abs"] < 1e-3
        assert report["status"] == ("passed" if waveform["snr_db"] >= report["thresholds"]["min_snr_db"] else
                                    "failed"), done.stdout
        assert entries[f"validate:vocoder@{target}"]["status"] in ("validated", "failed")


def test_a_shape_of_a_tensor_whose_shape_is_unknown_is_never_folded(project, tmp_path):
    """A value_info without a shape is no static shape (all() over no dimensions was True): its Shape was folded to
    an empty constant and the fold stage stopped on ONNX Runtime's raw "Gather ... idx=1 must be within the
    inclusive range [0,-1]"; now the stage leaves it to run, and a fold that fails names the node and the way round."""
    from epbuild.steps.folding import _fold_failure, foldable_nodes

    unshaped_value_info(tmp_path / "vad.onnx")
    assert foldable_nodes(onnx.load(str(tmp_path / "vad.onnx")).graph) == []
    unshaped_value_info(project.root / "models" / "vad.onnx")
    project.manifest('[models.vad]\npath = "models/vad.onnx"\n\n[targets.qnn-htp]\nep = "qnn"\n'
                     'options = { soc_model = 60 }\n')
    done = project.doit("--continue", check=False)
    assert "idx=1 must be within" not in done.stdout + done.stderr
    assert build_report(project).get("fold:vad", {}).get("status") in (None, "compiled"), done.stdout
    said = _fold_failure("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Gather "
                         "node. Name:'second_dim' Status Message: idx=1 must be within the inclusive range [0,-1]",
                         onnx.load(str(tmp_path / "vad.onnx")).graph.node)
    assert said.startswith("folding constant subgraphs failed at node 'second_dim' (Gather): [ONNXRuntimeError]")
    assert 'optimize = "basic"' in said
