"""Stages before compile: static shapes, optimization, QDQ quantization with calibration data, squash."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ran
from epbuild.errors import ModelError, UserError
from epbuild.manifest.parse import load
from epbuild.steps.stages.squash import squash

TARGETS = """
[targets.qnn-htp]
ep = "qnn"
options = { soc_model = 60 }

[targets.qnn-int8]
ep = "qnn"
quantized = true

[targets.cpu]
ep = "cpu"
"""


def calibration(folder, count=4, seed=1, shape=(1, 3, 64, 64), key="x"):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        np.savez(folder / f"{i}.npz", **{key: rng.standard_normal(shape).astype(np.float32)})


def report(project, target, model):
    return json.loads((project.artifacts / target / model / "validation.json").read_text())


def test_symbolic_batch_fixed_by_a_shape_stage_then_optimized_compiles_for_qnn(project):
    project.manifest('[models.dynbatch]\npath = "models/dynbatch.onnx"\ninputs = { x = [1, 3, 32, 32] }\n'
                     'optimize = "basic"\ntargets = ["qnn-htp"]\n' + TARGETS)
    done = project.doit()
    assert {"shape:dynbatch", "optimize:dynbatch+shape", "compile:dynbatch@qnn-htp"} <= ran(done)
    shaped = onnx.load(str(project.artifacts / ".stages" / "dynbatch" / "shape" / "dynbatch.onnx"))
    assert [d.dim_value for d in shaped.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 32, 32]
    assert report(project, "qnn-htp", "dynbatch")["status"] == "passed"


def test_float_cnn_quantized_with_calibration_files_compiles_for_qnn_and_validates(project):
    calibration(project.root / "data" / "calib")
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n'
                     'quantize = { calibration = "data/calib/", activation_type = "uint8", weight_type = "uint8" }\n'
                     'targets = ["qnn-int8", "cpu"]\n' + TARGETS)
    done = project.doit()
    assert {"quantize:tinycnn[qnn]", "compile:tinycnn@qnn-int8", "compile:tinycnn@cpu"} <= ran(done)
    assert "quantize:tinycnn[generic]" not in ran(done)  # the float cpu target consumes the float model
    quantized = onnx.load(str(project.artifacts / ".stages" / "tinycnn" / "quantize-qnn" / "tinycnn.onnx"))
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in quantized.graph.node}
    result = report(project, "qnn-int8", "tinycnn")
    assert result["status"] == "passed" and result["precision"] == "qdq"
    assert "EPContext" in result["ran_on"]["QNNExecutionProvider"]
    assert 10 < result["against_float_model"]["logits"]["snr_db"] < result["outputs"]["logits"]["snr_db"] + 30
    assert report(project, "cpu", "tinycnn")["precision"] == "fp32"


def test_changing_one_calibration_file_requantizes_and_recompiles_exactly_its_targets(project):
    calibration(project.root / "data" / "calib")
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\nquantize = { calibration = "data/calib/" }\n'
                     'targets = ["qnn-int8", "qnn-htp"]\n[models.encoder]\npath = "models/encoder.onnx"\n'
                     'targets = ["qnn-int8"]\n' + TARGETS)
    project.doit()
    np.savez(project.root / "data" / "calib" / "2.npz",
             x=np.random.default_rng(7).standard_normal((1, 3, 64, 64)).astype(np.float32) * 3)
    assert ran(project.doit()) - {"unavailable"} == {"quantize:tinycnn[qnn]", "compile:tinycnn@qnn-int8",
                                                     "validate:tinycnn@qnn-int8"}


def test_optimize_folds_constant_nodes_before_quantization(project):
    """Quantizing a graph whose weights are Constant nodes leaves them as float constants quantized at run time;
    `optimize` folds them into initializers first, and the result quantizes and compiles for QNN."""
    rng = np.random.default_rng(0)

    def constant(name, array):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array.astype(np.float32)))

    nodes = [constant("w", rng.standard_normal((8, 3, 3, 3)) * 0.3), constant("b", rng.standard_normal(8) * 0.1),
             helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             constant("s", np.array([0.5])), helper.make_node("Mul", ["c", "s"], ["y"])]
    graph = helper.make_graph(nodes, "constcnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(project.root / "models" / "constcnn.onnx"))
    calibration(project.root / "data" / "c16", shape=(1, 3, 16, 16))
    project.manifest('[models.constcnn]\npath = "models/constcnn.onnx"\noptimize = "basic"\n'
                     'quantize = { calibration = "data/c16/" }\ntargets = ["qnn-int8"]\n' + TARGETS)
    project.doit()
    optimized = onnx.load(str(project.artifacts / ".stages" / "constcnn" / "optimize+shape" / "constcnn.onnx"))
    assert "Constant" not in {n.op_type for n in optimized.graph.node}
    assert report(project, "qnn-int8", "constcnn")["status"] == "passed"


def test_squash_inlines_external_data_and_the_compile_consumes_it(project):
    source = onnx.load(str(project.root / "models" / "tinycnn.onnx"))
    (project.root / "models" / "ext").mkdir()
    onnx.save(source, str(project.root / "models" / "ext" / "big.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="big.data", size_threshold=0)
    project.manifest('[models.big]\npath = "models/ext/big.onnx"\nsquash = true\ntargets = ["cpu"]\n' + TARGETS)
    done = project.doit()
    assert {"squash:big", "compile:big@cpu"} <= ran(done)
    squashed = project.artifacts / ".stages" / "big" / "squash" / "big.onnx"
    assert sorted(p.name for p in squashed.parent.iterdir()) == ["big.onnx"]
    model = onnx.load(str(squashed), load_external_data=False)
    assert all(t.data_location == TensorProto.DEFAULT for t in model.graph.initializer)
    x = np.ones((1, 3, 64, 64), np.float32)
    want = ort.InferenceSession(str(project.root / "models" / "tinycnn.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(ort.InferenceSession(str(squashed)).run(None, {"x": x})[0], want, rtol=1e-6)
    data = project.root / "models" / "ext" / "big.data"
    data.write_bytes(b"\0" * data.stat().st_size)  # other weights, the same size
    assert "squash:big" in ran(project.doit("--continue", check=False))  # the external data is a dependency


def test_squash_refuses_a_model_over_the_limit_naming_its_size(tmp_path, project):
    with pytest.raises(ModelError, match=r"tinycnn.onnx is [\d,]+ bytes with its external data inlined, over the "
                                         r"1,000-byte protobuf limit"):
        squash(project.root / "models" / "tinycnn.onnx", tmp_path / "out.onnx", limit_bytes=1000)
    assert not (tmp_path / "out.onnx").exists()


def test_random_calibration_warns(project):
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\nquantize = { calibration = "random" }\n'
                     'targets = ["qnn-int8"]\n' + TARGETS)
    done = project.doit()
    assert "warning: quantize:tinycnn[qnn] calibrated on fixed-seed random data" in done.stdout


@pytest.mark.parametrize("quantize, message", [
    ('{ calibration = "data/nothere/" }', "models.tinycnn.quantize.calibration: calibration folder not found"),
    ('{ calibration = "data/empty/" }', "models.tinycnn.quantize.calibration: calibration folder "),
    ('{ calibration = "random", activation_type = "uint4" }',
     "models.tinycnn.quantize.activation_type: 'uint4' is not valid (did you mean 'uint8'?); valid: uint8, int8"),
    ('{ calibration = "random", per_chanel = true }',
     "models.tinycnn.quantize.per_chanel: unknown key (did you mean 'per_channel'?)"),
])
def test_quantize_manifest_errors(project, quantize, message):
    (project.root / "data" / "empty").mkdir(parents=True)
    project.manifest(f'[models.tinycnn]\npath = "models/tinycnn.onnx"\nquantize = {quantize}\n' + TARGETS)
    with pytest.raises(UserError) as raised:
        load(project.root / "models.toml")
    assert str(raised.value).startswith(f"models.toml: {message}"), str(raised.value)


@pytest.mark.parametrize("sample, message", [
    ({"y": (1, 3, 64, 64)}, "calibration file 0.npz: keys ['y'] do not match the model's inputs ['x']"),
    ({"x": (1, 3, 32, 32)}, "calibration file 0.npz: 'x' has shape [1, 3, 32, 32], the model's input is "
                            "[1, 3, 64, 64]"),
])
def test_calibration_files_that_do_not_fit_the_model(project, sample, message):
    ((key, shape),) = sample.items()
    calibration(project.root / "data" / "calib", count=1, shape=shape, key=key)
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\nquantize = { calibration = "data/calib/" }\n'
                     'targets = ["qnn-int8"]\n' + TARGETS)
    done = project.doit(check=False)
    assert done.returncode == 1 and message in done.stdout + done.stderr
    assert not (project.artifacts / ".stages" / "tinycnn" / "quantize-qnn").exists()


def test_a_stage_that_needs_a_static_shape_the_manifest_does_not_give(project):
    project.manifest('[models.dynbatch]\npath = "models/dynbatch.onnx"\nquantize = { calibration = "random" }\n'
                     'targets = ["qnn-int8"]\n' + TARGETS)
    done = project.doit(check=False)
    assert done.returncode == 1 and ran(done) == {"blocked"}  # its stages wait with its compile
    assert ("error: models.toml: models.dynbatch.inputs: input 'x' ([?, 3, 32, 32]) has symbolic dimension 0 "
            "('batch'); target 'qnn-int8' needs static shapes: set dims = { batch = ... } (every input with that "
            "dimension) or inputs = { x = [...] }") in done.stdout
    assert not (project.artifacts / ".stages" / "dynbatch").exists()


STATIC = """
[models.tinycnn]
path = "models/tinycnn.onnx"
targets = ["qnn-htp"]
"""


def _stages(project) -> set[str]:
    listed = project.doit("list", "--all").stdout.split()
    return {name for name in listed if name.startswith(("shape:", "fold:"))}


def test_a_model_already_static_with_nothing_to_fold_is_compiled_as_it_is(project):
    """tinycnn's inputs and every tensor are static and ONNX's inference agrees: no shape or fold stage (no copy of
    the model), its compile reads the source, and it validates."""
    project.manifest(STATIC + TARGETS)
    assert _stages(project) == set()
    project.doit()
    assert not (project.artifacts / ".stages").exists()
    report = json.loads((project.artifacts / "qnn-htp" / "tinycnn" / "validation.json").read_text())
    assert report["status"] == "passed"


def test_stale_static_shapes_or_constant_nodes_keep_their_stages(project):
    """A static shape that ONNX's inference contradicts (an edited graph) goes through the shape stage; a static
    model with nodes that only compute constants gets the fold stage alone."""
    from real_models import runtime_weights

    models = project.root / "models"
    stale = onnx.load(str(models / "tinycnn.onnx"))
    stale.graph.value_info[0].type.tensor_type.shape.dim[1].dim_value += 1
    onnx.save(stale, str(models / "stale.onnx"))
    runtime_weights(models / "weights.onnx")
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(models / "weights.onnx")))
    onnx.save(inferred, str(models / "weights.onnx"))
    project.manifest(STATIC.replace("tinycnn", "stale") + STATIC.replace("tinycnn", "weights") + TARGETS)
    assert _stages(project) == {"shape:stale", "fold:stale", "fold:weights"}
    project.doit()
    for model in ("stale", "weights"):
        assert json.loads((project.artifacts / "qnn-htp" / model / "validation.json").read_text())["status"] == "passed"


def test_group_members_compiled_from_files_of_one_name_are_refused(project):
    (project.root / "models" / "copies").mkdir()
    (project.root / "models" / "copies" / "tinycnn.onnx").write_bytes((project.root / "models" / "tinycnn.onnx")
                                                                     .read_bytes())
    project.manifest(STATIC + '[models.copy]\npath = "models/copies/tinycnn.onnx"\ntargets = ["qnn-htp"]\n' + TARGETS
                     + '[groups.g]\ntarget = "qnn-htp"\nmodels = ["tinycnn", "copy"]\n')
    done = project.doit("list", check=False)
    assert done.returncode == 2 and done.stderr.startswith(
        "error: models.toml: groups.g.models[1]: models 'tinycnn' and 'copy' are compiled from files both named "
        "tinycnn.onnx; ONNX Runtime names compiled graphs after it"), done.stderr


def test_a_stage_after_shape_or_fold_is_its_own_task_beside_the_same_kind_of_a_chain_without_them(project):
    """A CPU target's squash reads the dynamic model as declared, an NPU target's the shaped and folded one: two
    tasks, and each compile gets its own chain's model (before, one task served both, and the CPU artifact was
    compiled from the NPU's static model)."""
    project.manifest('[models.dynbatch]\npath = "models/dynbatch.onnx"\ninputs = { x = [1, 3, 32, 32] }\n'
                     'squash = true\ntargets = ["cpu", "qnn-htp"]\n' + TARGETS)
    done = project.doit()
    assert {"squash:dynbatch", "shape:dynbatch", "fold:dynbatch", "squash:dynbatch+fold"} <= ran(done)

    def batch(folder: str) -> onnx.TensorShapeProto.Dimension:
        squashed = onnx.load(str(project.artifacts / ".stages" / "dynbatch" / folder / "dynbatch.onnx"))
        return squashed.graph.input[0].type.tensor_type.shape.dim[0]

    assert batch("squash").dim_param == "batch" and batch("squash+fold").dim_value == 1  # each its chain's input
    assert report(project, "cpu", "dynbatch")["status"] == report(project, "qnn-htp", "dynbatch")["status"] == "passed"


def test_every_stage_kind_runs_in_its_own_module():
    """One module per stage kind (`steps.stages`): the child dispatches every kind a plan can make to its `run`."""
    from epbuild.manifest.stage import StageKind
    from epbuild.steps.stages.runners import RUNNERS

    assert set(RUNNERS) == {kind.value for kind in StageKind}
    assert all(runner.__module__ == f"epbuild.steps.stages.{kind}" for kind, runner in RUNNERS.items())
