"""Generate the shipped example models, deterministically (fixed seeds): `python models/generate.py [DIR]`.

- tinycnn:     a small float CNN, input x [1, 3, 64, 64]
- encoder:     one transformer encoder block (attention + FFN), input x [1, 16, 64]
- dynbatch:    a CNN whose batch dimension is symbolic ('batch'); the manifest fixes it with `inputs`
- tinycnn_qdq: tinycnn quantized to QDQ (uint8) with QNN's quantization config and fixed calibration data
- calib/tinycnn/*.npz: calibration samples for the manifest's own `quantize` stage of tinycnn
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _weights(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="epbuild")
    model.ir_version = 9
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model)
    return model


def cnn(batch: int | str, seed: int, name: str) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    init = [
        _weights(rng, "w1", (16, 3, 3, 3), 0.3), _weights(rng, "b1", (16,), 0.1),
        _weights(rng, "w2", (16, 16, 3, 3), 0.1), _weights(rng, "b2", (16,), 0.1),
        _weights(rng, "w3", (16, 10), 0.3), _weights(rng, "b3", (10,), 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "w3"], ["m"]),
        helper.make_node("Add", ["m", "b3"], ["logits"]),
    ]
    side = 64 if batch == 1 else 32
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, side, side])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])], init,
    )
    return _finish(graph)


def encoder(seed: int = 2, seq: int = 16, hidden: int = 64, heads: int = 2) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    head = hidden // heads
    init = [
        numpy_helper.from_array(np.ones(hidden, np.float32), "ln_g"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "ln_b"),
        *(_weights(rng, f"w{n}", (hidden, hidden), hidden ** -0.5) for n in "qkvo"),
        _weights(rng, "w_up", (hidden, 2 * hidden), hidden ** -0.5),
        _weights(rng, "w_down", (2 * hidden, hidden), (2 * hidden) ** -0.5),
        numpy_helper.from_array(np.array([1, seq, heads, head], np.int64), "split_shape"),
        numpy_helper.from_array(np.array([1, seq, hidden], np.int64), "merge_shape"),
        numpy_helper.from_array(np.array(head ** -0.5, np.float32), "scale"),
    ]
    nodes = [helper.make_node("LayerNormalization", ["x", "ln_g", "ln_b"], ["h"], axis=-1)]
    for n in "qkv":
        nodes += [
            helper.make_node("MatMul", ["h", f"w{n}"], [f"{n}_flat"]),
            helper.make_node("Reshape", [f"{n}_flat", "split_shape"], [f"{n}_split"]),
            helper.make_node("Transpose", [f"{n}_split"], [f"{n}_heads"],
                             perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3]),
        ]
    nodes += [
        helper.make_node("MatMul", ["q_heads", "k_heads"], ["scores_raw"]),
        helper.make_node("Mul", ["scores_raw", "scale"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["attn"], axis=-1),
        helper.make_node("MatMul", ["attn", "v_heads"], ["ctx_heads"]),
        helper.make_node("Transpose", ["ctx_heads"], ["ctx_split"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_split", "merge_shape"], ["ctx"]),
        helper.make_node("MatMul", ["ctx", "wo"], ["attn_out"]),
        helper.make_node("Add", ["x", "attn_out"], ["res1"]),
        helper.make_node("MatMul", ["res1", "w_up"], ["up"]),
        helper.make_node("Relu", ["up"], ["act"]),
        helper.make_node("MatMul", ["act", "w_down"], ["down"]),
        helper.make_node("Add", ["res1", "down"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])], init,
    )
    return _finish(graph)


class _Calibration:
    """Fixed calibration samples for the QDQ model (a CalibrationDataReader)."""

    def __init__(self, count: int = 8, seed: int = 7):
        rng = np.random.default_rng(seed)
        self.samples = iter([{"x": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)} for _ in range(count)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.samples, None)


def quantize(float_path: Path, out_path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    config = get_qnn_qdq_config(str(float_path), _Calibration(), activation_type=QuantType.QUInt8,
                                weight_type=QuantType.QUInt8)
    quantize(str(float_path), str(out_path), config)


def generate(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in (("tinycnn", cnn(1, 1, "tinycnn")), ("encoder", encoder()),
                        ("dynbatch", cnn("batch", 3, "dynbatch"))):
        path = folder / f"{name}.onnx"
        onnx.save(model, str(path))
        written.append(path)
    quantize(folder / "tinycnn.onnx", folder / "tinycnn_qdq.onnx")
    written.append(folder / "tinycnn_qdq.onnx")
    calibration = folder / "calib" / "tinycnn"
    calibration.mkdir(parents=True, exist_ok=True)
    for index, sample in enumerate(_Calibration(count=4, seed=11).samples):
        np.savez(calibration / f"{index}.npz", **sample)
        written.append(calibration / f"{index}.npz")
    return written


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
