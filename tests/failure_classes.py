"""Generated models of the classes issue 63 fixed (old PyTorch exports at opset 6, an op no EP takes, a value_info
without a shape, a Loop body reading a weight a compiled node reads too): the corpus (bench/corpus) builds them and
tests/test_real_model_failures.py judges them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(0)
W = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32)
BIAS = RNG.standard_normal(8).astype(np.float32)


def _old_export(path: Path, nodes, weights: dict[str, np.ndarray], opset: int = 6) -> None:
    """An old PyTorch export: IR 3, the weights listed as graph inputs too."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16]),
              *(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape)) for name, a in weights.items())]
    graph = helper.make_graph(nodes, "old", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                   [1, 8, 16, 16])],
                              [numpy_helper.from_array(a, name) for name, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=3)
    model.producer_name, model.producer_version = "pytorch", "0.3"
    onnx.save(model, str(path))
    return path


def opset6_cnn(path: Path) -> Path:
    """Ops ONNX Runtime runs at opset 6 (QNN takes none of them there)."""
    _old_export(path, [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                       helper.make_node("Tanh", ["c"], ["t"]), helper.make_node("Relu", ["t"], ["r"]),
                       helper.make_node("Softmax", ["r"], ["y"], axis=1)], {"w": W, "b": B})
    return path


def legacy_broadcast(path: Path) -> Path:
    """Opset 6's Add with `broadcast = 1, axis = 1`: a per-channel bias (no ONNX Runtime kernel at opset 6)."""
    _old_export(path, [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                       helper.make_node("Add", ["c", "bias"], ["a"], broadcast=1, axis=1),
                       helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=1)],
                {"w": W, "b": B, "bias": BIAS})
    return path


def unconvertible(path: Path) -> Path:
    """Scale, an op ONNX Runtime registers in the default domain and ONNX has no schema for."""
    _old_export(path, [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                       helper.make_node("Scale", ["c"], ["y"], scale=2.0)], {"w": W, "b": B})




def det_only(path: Path) -> Path:
    """Det alone: an op neither QNN nor OpenVINO takes ("Unable to compile any nodes" named nothing)."""
    graph = helper.make_graph([helper.make_node("Det", ["x"], ["y"])], "det",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def ranker_shared_weight(path: Path, body_only: bool = False, size: int = 16) -> Path:
    """A ranker whose Loop body reads the weight a MatMul outside it reads too (`body_only`: a weight of its own,
    read only inside, `size` x `size`)."""
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array((rng.standard_normal((size, size)) / size).astype(np.float32), "W")
    dense = numpy_helper.from_array((rng.standard_normal((16, size)) / 4).astype(np.float32), "V")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("MatMul", ["acc_in", "W"], ["mm"]),
         helper.make_node("Add", ["mm", "h"], ["acc_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, size])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, size])])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "V" if body_only else "W"], ["m"]), helper.make_node("Relu", ["m"], ["h"]),
         helper.make_node("Loop", ["trip", "cond", "zero"], ["y"], body=body)], "ranker",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])],
        [weight, *([dense] if body_only else []), numpy_helper.from_array(np.array(3, np.int64), "trip"),
         numpy_helper.from_array(np.array(True), "cond"),
         numpy_helper.from_array(np.zeros((1, size), np.float32), "zero")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def unshaped_value_info(path: Path) -> Path:
    """silero VAD's class: a value_info that declares an intermediate's type without its shape, read by Shape then
    Gather of its second dimension, feeding a Reshape."""
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"), helper.make_node("Shape", ["h"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "one"], ["n"], name="second_dim"),
             helper.make_node("Unsqueeze", ["n", "zero"], ["n1"], name="unsqueeze"),
             helper.make_node("Concat", ["batch", "n1"], ["to"], axis=0, name="concat"),
             helper.make_node("Reshape", ["h", "to"], ["y"], name="reshape")]
    weights = [numpy_helper.from_array(np.array(1, np.int64), "one"),
               numpy_helper.from_array(np.array([0], np.int64), "zero"),
               numpy_helper.from_array(np.array([1], np.int64), "batch")]
    graph = helper.make_graph(nodes, "vad_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])], weights,
                              value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
