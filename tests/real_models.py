"""Small generated models with the shapes real exports have, one per failure class of real models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(0)


def _weights(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _save(model: onnx.ModelProto, path: Path, ir_version: int = 9, **kwargs) -> Path:
    model.ir_version = ir_version
    onnx.checker.check_model(model)
    onnx.save(model, str(path), **kwargs)
    return path


def old_ir_cnn(path: Path) -> Path:
    """IR 3, opset 8: every weight also listed in graph.input (Caffe2-era zoos), names with '/' and ':'."""
    conv_w, fc_w = _weights("conv_1/w:0", 4, 3, 3, 3), _weights("fc_w", 4, 5)
    shape = numpy_helper.from_array(np.array([1, 4], dtype=np.int64), "flat__SHAPE")
    nodes = [helper.make_node("Conv", ["data_0", "conv_1/w:0"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Reshape", ["p", "flat__SHAPE"], ["f"]),
             helper.make_node("MatMul", ["f", "fc_w"], ["prob_1"])]
    inputs = [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 8, 8])] + [
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in (conv_w, fc_w, shape)]
    graph = helper.make_graph(nodes, "old", inputs, [helper.make_tensor_value_info("prob_1", TensorProto.FLOAT,
                                                                                     [1, 5])], [conv_w, fc_w, shape])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)]), path, ir_version=3)


def token_encoder(path: Path, vocab: int = 5) -> Path:
    """int64 token ids into a small vocabulary (ids >= vocab are out of bounds), an int64 attention mask."""
    embedding, positions = _weights("embeddings.word", vocab, 8), _weights("embeddings.position", 6, 8)
    pos_ids = numpy_helper.from_array(np.arange(6, dtype=np.int64)[None], "position_ids")
    nodes = [helper.make_node("Gather", ["embeddings.word", "input_ids"], ["e"]),
             helper.make_node("Gather", ["embeddings.position", "position_ids"], ["p"]),
             helper.make_node("Add", ["e", "p"], ["h"]),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "axes"], ["m3"]),
             helper.make_node("Mul", ["h", "m3"], ["hidden"])]
    axes = numpy_helper.from_array(np.array([2], dtype=np.int64), "axes")
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", 8])],
        [embedding, positions, pos_ids, axes])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def minus_one_batch(path: Path) -> Path:
    """Paddle2ONNX style: the batch dimension stored as dim_value -1, the output's as unnamed."""
    weight = _weights("conv.w", 4, 3, 3, 3)
    nodes = [helper.make_node("Conv", ["x", "conv.w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "paddle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4, 8, 8])], [weight])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def question_mark_dims(path: Path) -> Path:
    """Paddle's OCR exports: `dim_param: "?"` for several independent dimensions of one input, [-1, 3, ?, ?]."""
    conv_w, fc_w = _weights("conv.w", 4, 3, 3, 3), _weights("fc.w", 4, 6)
    nodes = [helper.make_node("Conv", ["x", "conv.w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "fc.w"], ["y"])]
    graph = helper.make_graph(nodes, "paddle_ocr", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  [-1, 3, "?", "?"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["?", 6])], [conv_w, fc_w])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def layernorm_dynamic(path: Path) -> Path:
    """A decomposed LayerNorm (as exporters write it) with symbolic batch/sequence dims and stale symbolic
    value_info on every intermediate: free-dimension overrides leave these dynamic."""
    eps = numpy_helper.from_array(np.array(1e-5, dtype=np.float32), "eps")
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    weight = _weights("dense.w", 16, 16)
    names = ["mean", "centered", "squared", "variance", "shifted", "std", "normed", "y"]
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
             helper.make_node("Sub", ["x", "mean"], ["centered"]),
             helper.make_node("Pow", ["centered", "two"], ["squared"]),
             helper.make_node("ReduceMean", ["squared"], ["variance"], axes=[-1]),
             helper.make_node("Add", ["variance", "eps"], ["shifted"]),
             helper.make_node("Sqrt", ["shifted"], ["std"]),
             helper.make_node("Div", ["centered", "std"], ["normed"]),
             helper.make_node("MatMul", ["normed", "dense.w"], ["y"])]
    graph = helper.make_graph(nodes, "layernorm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", 16])],
                              [eps, two, weight],
                              value_info=[helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", None])
                                          for n in names[:-1]])
    graph.node.append(helper.make_node("Identity", ["y"], ["out"]))
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def partial_offload(path: Path) -> Path:
    """Two float partitions around an op the QNN HTP does not take (Det), which stays on CPU between them."""
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Det", ["r"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["m"]),
             helper.make_node("Sigmoid", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "partial", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def runtime_weights(path: Path) -> Path:
    """A Conv whose weight is computed at run time: ConstantOfShape then Mul by a scalar (torch exports do this)."""
    shape = numpy_helper.from_array(np.array([4, 3, 3, 3], dtype=np.int64), "w_shape")
    scale = numpy_helper.from_array(np.array(0.1, dtype=np.float32), "w_scale")
    nodes = [helper.make_node("ConstantOfShape", ["w_shape"], ["w_ones"],
                              value=numpy_helper.from_array(np.array([1.0], dtype=np.float32))),
             helper.make_node("Mul", ["w_ones", "w_scale"], ["w"]),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "runtime_weights",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [shape, scale])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def odd_names(path: Path) -> Path:
    """Input, output and tensor names with '/', ':', '.', spaces and non-ASCII."""
    weight = _weights("layer 1/weight:0", 6, 6)
    nodes = [helper.make_node("MatMul", ["input:0 /ü", "layer 1/weight:0"], ["hidden état"]),
             helper.make_node("Tanh", ["hidden état"], ["out/put.1 ß"])]
    graph = helper.make_graph(nodes, "odd names", [helper.make_tensor_value_info("input:0 /ü", TensorProto.FLOAT,
                                                                                   [1, 6])],
                              [helper.make_tensor_value_info("out/put.1 ß", TensorProto.FLOAT, [1, 6])], [weight])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def sample_rate_branches(path: Path) -> Path:
    """A voice-activity-style model: an int64 `sr` input selects an If branch (16 kHz or 8 kHz weights)."""
    then_graph = helper.make_graph([helper.make_node("MatMul", ["x", "w16"], ["b16"])], "sr16", [],
                                   [helper.make_tensor_value_info("b16", TensorProto.FLOAT, [1, 4])],
                                   [_weights("w16", 16, 4)])
    else_graph = helper.make_graph([helper.make_node("MatMul", ["x", "w8"], ["b8"])], "sr8", [],
                                   [helper.make_tensor_value_info("b8", TensorProto.FLOAT, [1, 4])],
                                   [_weights("w8", 16, 4)])
    target = numpy_helper.from_array(np.array([16000], dtype=np.int64), "sr16000")
    nodes = [helper.make_node("Equal", ["sr", "sr16000"], ["is16"]),
             helper.make_node("Squeeze", ["is16"], ["cond"]),
             helper.make_node("If", ["cond"], ["branch"], then_branch=then_graph, else_branch=else_graph),
             helper.make_node("Sigmoid", ["branch"], ["speech_prob"])]
    graph = helper.make_graph(nodes, "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
                                             helper.make_tensor_value_info("sr", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("speech_prob", TensorProto.FLOAT, [1, 4])], [target])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def detector_with_branches(path: Path) -> Path:
    """A detector's shape: a backbone the NPU takes, then post-processing in an `If` on a graph input (a mode flag)
    whose branches stay on CPU with their nodes."""
    then_graph = helper.make_graph([helper.make_node("ReduceMax", ["y"], ["top"], keepdims=0),
                                    helper.make_node("Cast", ["top"], ["picked"], to=TensorProto.INT64)], "max", [],
                                   [helper.make_tensor_value_info("picked", TensorProto.INT64, [])])
    else_graph = helper.make_graph([helper.make_node("ReduceMin", ["y"], ["low"], keepdims=0),
                                    helper.make_node("Cast", ["low"], ["chosen"], to=TensorProto.INT64)], "min", [],
                                   [helper.make_tensor_value_info("chosen", TensorProto.INT64, [])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Sigmoid", ["h"], ["y"]),
             helper.make_node("If", ["use_max"], ["best"], then_branch=then_graph, else_branch=else_graph)]
    graph = helper.make_graph(nodes, "detector",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
                               helper.make_tensor_value_info("use_max", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8]),
                               helper.make_tensor_value_info("best", TensorProto.INT64, [])], [_weights("w", 16, 8)])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def saturated_detector(path: Path) -> Path:
    """A text detector's probability map for noise input: a sigmoid driven to ~1e-6 everywhere."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["logit"]),
             helper.make_node("Sigmoid", ["logit"], ["prob_map"])]
    bias = numpy_helper.from_array(np.full((8,), -14.0, np.float32), "bias")  # ~1e-6: fp16 subnormals
    graph = helper.make_graph(nodes, "saturated", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("prob_map", TensorProto.FLOAT, [1, 8])],
                              [_weights("w", 16, 8), bias])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def external_data_mlp(path: Path) -> Path:
    """torch's default exporter layout: weights in `<name>.onnx.data` beside the model."""
    w1, w2 = _weights("fc1.weight", 16, 32), _weights("fc2.weight", 32, 8)
    nodes = [helper.make_node("MatMul", ["x", "fc1.weight"], ["h"]), helper.make_node("Relu", ["h"], ["g"]),
             helper.make_node("MatMul", ["g", "fc2.weight"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w1, w2])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path,
                 save_as_external_data=True, location=f"{path.name}.data", size_threshold=0)


def rmsnorm_block(path: Path, form: str = "rsqrt", hidden: int = 512, tokens: int = 128) -> Path:
    """Two LLaMA/T5-style RMSNorm + Linear layers as the torch exporters write them: `x * rsqrt(mean(x^2) + eps)`
    with the rsqrt as Reciprocal(Sqrt) (dynamo; form "rsqrt") or Div(1, Sqrt) (TorchScript; "one_over"), or as
    `x / sqrt(...)` ("div"); then `weight * normed`, the weight first as in transformers' LlamaRMSNorm (QNN HTP
    finalizes `normed * weight` after an rsqrt, not `weight * normed`)."""
    nodes, weights, current = [], [numpy_helper.from_array(np.array([2.0], np.float32), "two"),
                                    numpy_helper.from_array(np.array([1e-6], np.float32), "eps"),
                                    numpy_helper.from_array(np.array([1.0], np.float32), "one"),
                                    numpy_helper.from_array(np.array([-1], np.int64), "last_axis")], "x"
    for layer in range(2):
        name = f"layers.{layer}."
        weights += [numpy_helper.from_array(RNG.standard_normal(hidden).astype(np.float32), name + "norm.weight"),
                    _weights(name + "proj.weight", hidden, hidden)]
        nodes += [helper.make_node("Pow", [current, "two"], [name + "squared"]),
                  helper.make_node("ReduceMean", [name + "squared", "last_axis"], [name + "variance"]),
                  helper.make_node("Add", [name + "variance", "eps"], [name + "shifted"]),
                  helper.make_node("Sqrt", [name + "shifted"], [name + "rms"])]
        if form == "div":
            nodes.append(helper.make_node("Div", [current, name + "rms"], [name + "normed"], name=name + "Div"))
        else:
            inverse = (helper.make_node("Reciprocal", [name + "rms"], [name + "rsqrt"]) if form == "rsqrt" else
                       helper.make_node("Div", ["one", name + "rms"], [name + "rsqrt"]))
            nodes += [inverse, helper.make_node("Mul", [current, name + "rsqrt"], [name + "normed"], name=name + "Mul")]
        nodes += [helper.make_node("Mul", [name + "norm.weight", name + "normed"], [name + "scaled"]),
                  helper.make_node("MatMul", [name + "scaled", name + "proj.weight"], [name + "out"])]
        current = name + "out"
    nodes.append(helper.make_node("Identity", [current], ["hidden_states"]))
    graph = helper.make_graph(nodes, "rmsnorm", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                [1, tokens, hidden])],
                              [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, [1, tokens, hidden])],
                              weights)
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def strided_after_conv(path: Path) -> Path:
    """What the torch dynamo exporter writes for `conv(x).as_strided(...).transpose(2, 3)`: the Conv's output
    reshaped flat, gathered by index, transposed (QNN HTP's compile aborts on it)."""
    flat = numpy_helper.from_array(np.array([-1], dtype=np.int64), "flat")
    offsets = np.array([c * 64 + r * 16 + k for c in range(8) for r in range(4) for k in range(8)], np.int64)
    indices = numpy_helper.from_array(offsets.reshape(1, 8, 4, 8), "strided_indices")
    nodes = [helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["conv2d"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["conv2d", "flat"], ["flattened"]),
             helper.make_node("Gather", ["flattened", "strided_indices"], ["as_strided"], name="node_as_strided"),
             helper.make_node("Transpose", ["as_strided"], ["y"], perm=[0, 1, 3, 2])]
    graph = helper.make_graph(nodes, "strided", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 4])],
                              [_weights("conv.weight", 8, 3, 3, 3), _weights("conv.bias", 8), flat, indices])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def cancellation_chain(path: Path, depth: int = 120, at: int = 90) -> Path:
    """A deep elementwise chain (a stand-in for many layers) with one catastrophic cancellation at node `at`:
    `(h + 1000) - 1000` keeps ~3 significant bits in fp16, so an fp16 EP departs from CPU exactly there (with
    `at >= depth`, in the node that computes the graph's output)."""
    scale, shift = (numpy_helper.from_array(np.array([v], np.float32), n) for v, n in ((0.9, "scale"), (0.1, "bias")))
    offset = numpy_helper.from_array(np.array([1000.0], np.float32), "offset")
    nodes, current = [], "x"
    for index in range(depth):
        if index == at:
            nodes += [helper.make_node("Add", [current, "offset"], ["cancel.shifted"], name="cancel.add"),
                      helper.make_node("Sub", ["cancel.shifted", "offset"], ["cancel.out"], name="cancel.sub")]
            current = "cancel.out"
        op, operand = ("Mul", "scale") if index % 2 else ("Add", "bias")
        nodes.append(helper.make_node(op, [current, operand], [f"layer{index}"], name=f"layer{index}"))
        current = f"layer{index}"
    if at >= depth:  # the cancellation is the graph's output node
        nodes += [helper.make_node("Add", [current, "offset"], ["cancel.shifted"], name="cancel.add"),
                  helper.make_node("Sub", ["cancel.shifted", "offset"], ["y"], name="cancel.sub")]
    else:
        nodes.append(helper.make_node("Tanh", [current], ["y"], name="head"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [scale, shift, offset])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def rounding_then_overflow(path: Path, depth: int = 24, rounding_at: int = 3, overflow_at: int = 16) -> Path:
    """magika's failure in small: an ordinary fp16 rounding early (`(h + 100) - 100`: a few dB under the HTP's
    40 dB, as LayerNorm_0's Rsqrt was) and, later, a sum of squares that overflows fp16 (as LayerNorm_1's
    ReduceSum did: every output of the model far off). The failure is the overflow; the rounding alone is a
    different, milder one."""
    consts = {name: numpy_helper.from_array(np.array([value], np.float32), name)
              for name, value in (("scale", 0.9), ("bias", 0.1), ("offset", 100.0), ("big", 300.0))}
    nodes, current = [], "x"
    for index in range(depth):
        if index == rounding_at:
            nodes += [helper.make_node("Add", [current, "offset"], ["round.shifted"], name="round.add"),
                      helper.make_node("Sub", ["round.shifted", "offset"], ["round.out"], name="round.sub")]
            current = "round.out"
        if index == overflow_at:
            nodes += [helper.make_node("Mul", [current, "big"], ["norm.scaled"], name="norm.scale"),
                      helper.make_node("Mul", ["norm.scaled", "norm.scaled"], ["norm.squares"], name="norm.square"),
                      helper.make_node("ReduceSum", ["norm.squares"], ["norm.sum"], name="norm.sum", keepdims=1),
                      helper.make_node("Sqrt", ["norm.sum"], ["norm.root"], name="norm.root"),
                      helper.make_node("Div", ["norm.scaled", "norm.root"], ["norm.out"], name="norm.div")]
            current = "norm.out"
        op, operand = ("Mul", "scale") if index % 2 else ("Add", "bias")
        nodes.append(helper.make_node(op, [current, operand], [f"layer{index}"], name=f"layer{index}"))
        current = f"layer{index}"
    nodes.append(helper.make_node("Identity", [current], ["y"], name="head"))
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], list(consts.values()))
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def wide_mlp(path: Path, width: int = 3584, layers: int = 4) -> Path:
    """`layers` square fp32 MatMuls of `width` (4 x 3584^2 x 4 B = 196 MiB) in `<name>.onnx.data`, a symbolic
    batch, and a Shape -> ConstantOfShape bias that the fold stage folds: a large model's shape in small."""
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.standard_normal((width, width), dtype=np.float32) / width**0.5,
                                       f"layers.{i}.weight") for i in range(layers)]
    nodes, current = [], "x"
    for index in range(layers):
        nodes += [helper.make_node("MatMul", [current, f"layers.{index}.weight"], [f"layers.{index}.out"]),
                  helper.make_node("Relu", [f"layers.{index}.out"], [f"layers.{index}.act"])]
        current = f"layers.{index}.act"
    shape = numpy_helper.from_array(np.array([width], np.int64), "bias_shape")
    nodes += [helper.make_node("ConstantOfShape", ["bias_shape"], ["bias"],
                               value=numpy_helper.from_array(np.array([0.5], np.float32))),
              helper.make_node("Add", [current, "bias"], ["y"])]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
                              [*weights, shape])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path,
                 save_as_external_data=True, location=f"{path.name}.data", size_threshold=1024)


def kv_decoder(path: Path, layers: int = 2, hidden: int = 64, heads: int = 4, vocab: int = 96) -> Path:
    """A LLaMA-like decoder with a KV cache, as exporters write one for prompt and token graphs of the same weights
    (onnxruntime-genai's names): `input_ids` [batch_size, sequence_length], `attention_mask` [batch_size,
    total_sequence_length] (1 for filled positions, 0 for empty ones), `past_key_values.L.key/value` [batch_size,
    heads, past_sequence_length, head_dim]; outputs `logits` and `present.L.key/value` (past and new, concatenated).
    The causal mask is computed in the graph from the shapes (folded once they are static). RMSNorm in the
    x / sqrt form, fixed-seed weights in `<name>.onnx.data`."""
    rng = np.random.default_rng(7)
    head_dim = hidden // heads

    def weight(name: str, *shape: int, scale: float | None = None) -> onnx.TensorProto:
        scale = scale if scale is not None else 1 / shape[0] ** 0.5
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    cache = ["batch_size", heads, "past_sequence_length", head_dim]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                            ["batch_size", "total_sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab])]
    initializers = [weight("embed_tokens.weight", vocab, hidden, scale=1.0), weight("lm_head.weight", hidden, vocab),
                    numpy_helper.from_array(np.array([0, 0, heads, head_dim], np.int64), "split_heads"),
                    numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "merge_heads"),
                    numpy_helper.from_array(np.array(head_dim ** -0.5, np.float32), "attention_scale"),
                    numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
                    numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
                    numpy_helper.from_array(np.array(0, np.int64), "zero"),
                    numpy_helper.from_array(np.array(1, np.int64), "one"),
                    numpy_helper.from_array(np.array([0, 1, 3], np.int64), "query_axes"),
                    numpy_helper.from_array(np.array([1, 2], np.int64), "mask_axes"),
                    numpy_helper.from_array(np.array(-10000.0, np.float32), "blocked")]
    # the additive attention bias [batch, 1, sequence, total]: key j is seen by query i when j <= past + i and the
    # application marks j filled
    nodes = [helper.make_node("Gather", ["embed_tokens.weight", "input_ids"], ["embedded"]),
             helper.make_node("Shape", ["input_ids"], ["ids_shape"], start=1, end=2),
             helper.make_node("Squeeze", ["ids_shape"], ["sequence"]),
             helper.make_node("Shape", ["attention_mask"], ["mask_shape"], start=1, end=2),
             helper.make_node("Squeeze", ["mask_shape"], ["total"]),
             helper.make_node("Sub", ["total", "sequence"], ["past"]),
             helper.make_node("Range", ["zero", "sequence", "one"], ["query_index"]),
             helper.make_node("Add", ["query_index", "past"], ["query_position"]),
             helper.make_node("Range", ["zero", "total", "one"], ["key_position"]),
             helper.make_node("Unsqueeze", ["query_position", "query_axes"], ["query_column"]),
             helper.make_node("LessOrEqual", ["key_position", "query_column"], ["causal"]),
             helper.make_node("Cast", ["attention_mask"], ["filled"], to=TensorProto.BOOL),
             helper.make_node("Unsqueeze", ["filled", "mask_axes"], ["filled_keys"]),
             helper.make_node("And", ["causal", "filled_keys"], ["seen"]),
             helper.make_node("Where", ["seen", "zero_bias", "blocked"], ["attention_bias"])]
    initializers.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero_bias"))

    def rms_norm(source: str, name: str) -> str:
        initializers.append(numpy_helper.from_array(np.ones(hidden, np.float32), f"{name}.weight"))
        nodes.extend([helper.make_node("Mul", [source, source], [f"{name}.squared"]),
                      helper.make_node("ReduceMean", [f"{name}.squared", "last_axis"], [f"{name}.mean"]),
                      helper.make_node("Add", [f"{name}.mean", "eps"], [f"{name}.shifted"]),
                      helper.make_node("Sqrt", [f"{name}.shifted"], [f"{name}.rms"]),
                      helper.make_node("Div", [source, f"{name}.rms"], [f"{name}.normed"]),
                      helper.make_node("Mul", [f"{name}.normed", f"{name}.weight"], [f"{name}.out"])])
        return f"{name}.out"

    hidden_state = "embedded"
    for layer in range(layers):
        p = f"layers.{layer}"
        inputs += [helper.make_tensor_value_info(f"past_key_values.{layer}.{kv}", TensorProto.FLOAT, cache)
                   for kv in ("key", "value")]
        outputs += [helper.make_tensor_value_info(f"present.{layer}.{kv}", TensorProto.FLOAT,
                                                  ["batch_size", heads, "total_sequence_length", head_dim])
                    for kv in ("key", "value")]
        initializers += [weight(f"{p}.{w}.weight", hidden, hidden) for w in ("q_proj", "k_proj", "v_proj", "o_proj")]
        initializers += [weight(f"{p}.up_proj.weight", hidden, 2 * hidden), weight(f"{p}.down_proj.weight", 2 * hidden,
                                                                                 hidden)]
        normed = rms_norm(hidden_state, f"{p}.input_layernorm")
        for kv in ("q", "k", "v"):
            nodes += [helper.make_node("MatMul", [normed, f"{p}.{kv}_proj.weight"], [f"{p}.{kv}"]),
                      helper.make_node("Reshape", [f"{p}.{kv}", "split_heads"], [f"{p}.{kv}.heads"]),
                      helper.make_node("Transpose", [f"{p}.{kv}.heads"], [f"{p}.{kv}.t"], perm=[0, 2, 1, 3])]
        nodes += [helper.make_node("Concat", [f"past_key_values.{layer}.key", f"{p}.k.t"], [f"present.{layer}.key"],
                                   axis=2),
                  helper.make_node("Concat", [f"past_key_values.{layer}.value", f"{p}.v.t"],
                                   [f"present.{layer}.value"], axis=2),
                  helper.make_node("Transpose", [f"present.{layer}.key"], [f"{p}.k.tt"], perm=[0, 1, 3, 2]),
                  helper.make_node("MatMul", [f"{p}.q.t", f"{p}.k.tt"], [f"{p}.scores.raw"]),
                  helper.make_node("Mul", [f"{p}.scores.raw", "attention_scale"], [f"{p}.scores.scaled"]),
                  helper.make_node("Add", [f"{p}.scores.scaled", "attention_bias"], [f"{p}.scores"]),
                  helper.make_node("Softmax", [f"{p}.scores"], [f"{p}.probs"], axis=-1),
                  helper.make_node("MatMul", [f"{p}.probs", f"present.{layer}.value"], [f"{p}.context.heads"]),
                  helper.make_node("Transpose", [f"{p}.context.heads"], [f"{p}.context.t"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"{p}.context.t", "merge_heads"], [f"{p}.context"]),
                  helper.make_node("MatMul", [f"{p}.context", f"{p}.o_proj.weight"], [f"{p}.attention"]),
                  helper.make_node("Add", [hidden_state, f"{p}.attention"], [f"{p}.residual"])]
        normed = rms_norm(f"{p}.residual", f"{p}.post_attention_layernorm")
        nodes += [helper.make_node("MatMul", [normed, f"{p}.up_proj.weight"], [f"{p}.up"]),
                  helper.make_node("Relu", [f"{p}.up"], [f"{p}.act"]),
                  helper.make_node("MatMul", [f"{p}.act", f"{p}.down_proj.weight"], [f"{p}.down"]),
                  helper.make_node("Add", [f"{p}.residual", f"{p}.down"], [f"{p}.out"])]
        hidden_state = f"{p}.out"
    nodes.append(helper.make_node("MatMul", [rms_norm(hidden_state, "norm"), "lm_head.weight"], ["logits"]))
    graph = helper.make_graph(nodes, "decoder", inputs, outputs, initializers)
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path,
                 save_as_external_data=True, location=f"{path.name}.data", size_threshold=1024)


def old_ir_shape_inputs(path: Path) -> Path:
    """IR 3, opset 9, as Caffe2's ONNX exporter wrote them: weights, a `*__SHAPE` tensor feeding ConstantOfShape and
    an `OC2_DUMMY_*` shape feeding Reshape, all initializers also listed in graph.input."""
    weight = _weights("fc_w", 4, 4)
    fill = numpy_helper.from_array(np.array([1, 4], dtype=np.int64), "bias__SHAPE")
    dummy = numpy_helper.from_array(np.array([1, 2, 2], dtype=np.int64), "OC2_DUMMY_0")
    nodes = [helper.make_node("ConstantOfShape", ["bias__SHAPE"], ["bias"],
                              value=numpy_helper.from_array(np.array([0.5], np.float32))),
             helper.make_node("MatMul", ["data_0", "fc_w"], ["m"]),
             helper.make_node("Add", ["m", "bias"], ["a"]),
             helper.make_node("Reshape", ["a", "OC2_DUMMY_0"], ["out_1"])]
    inputs = [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 4])] + [
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in (weight, fill, dummy)]
    graph = helper.make_graph(nodes, "caffe2", inputs, [helper.make_tensor_value_info("out_1", TensorProto.FLOAT,
                                                                                       [1, 2, 2])],
                              [weight, fill, dummy])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)]), path, ir_version=3)


def loop_reading_outer_weights(path: Path) -> Path:
    """An EmbeddingBag exported as a Loop (a DLRM-style ranker): the body gathers rows of `table` at `offsets`, both
    initializers of the outer graph read only inside the body; a SequenceEmpty/SequenceInsert/ConcatFromSequence
    chain beside it; a foldable Shape -> Cast in front (so the fold stage has work) and a MatMul for the EP."""
    table = _weights("table", 6, 4)
    offsets = numpy_helper.from_array(np.array([0, 2, 5], dtype=np.int64), "offsets_7")
    trips = numpy_helper.from_array(np.array(3, dtype=np.int64), "trips")
    keep = numpy_helper.from_array(np.array(True), "keep")
    start = numpy_helper.from_array(np.zeros((1, 4), np.float32), "start")
    weight = _weights("fc_w", 4, 4)
    body = helper.make_graph(
        [helper.make_node("Gather", ["offsets_7", "i"], ["at"]),
         helper.make_node("Gather", ["table", "at"], ["row"]),
         helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "bag",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 4])])
    nodes = [helper.make_node("Shape", ["x"], ["x_shape"]),
             helper.make_node("Cast", ["x_shape"], ["x_shape_f"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["x_shape_f"], ["count"], keepdims=0),
             helper.make_node("Loop", ["trips", "keep", "start"], ["bag"], body=body),
             helper.make_node("MatMul", ["x", "fc_w"], ["dense"]),
             helper.make_node("Add", ["dense", "bag"], ["mixed"]),
             helper.make_node("Mul", ["mixed", "count"], ["y"]),
             helper.make_node("SequenceEmpty", [], ["empty"], dtype=TensorProto.FLOAT),
             helper.make_node("SequenceInsert", ["empty", "y"], ["seq"]),
             helper.make_node("ConcatFromSequence", ["seq"], ["stacked"], axis=0)]
    graph = helper.make_graph(nodes, "ranker", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
                               helper.make_tensor_value_info("stacked", TensorProto.FLOAT, [1, 4])],
                              [table, offsets, trips, keep, start, weight])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def topk_detector(path: Path, queries: int = 60, k: int = 30) -> Path:
    """A DETR-style head: half the queries clearly ahead, their scores within fp16's precision of one another; TopK
    keeps k of them and the boxes are gathered at the chosen indices, so an fp16 EP picks the same queries in
    another order."""
    project = _weights("project", 8, 5)
    lead = np.where(np.arange(queries) % 2 == 0, 1.5, 1.0).astype(np.float32)  # every other query clearly ahead
    spread = numpy_helper.from_array(lead.reshape(1, queries), "spread")
    nodes = [helper.make_node("MatMul", ["features", "project"], ["head"]),
             helper.make_node("Split", ["head", "split"], ["logit", "box_raw"], axis=2),
             helper.make_node("Squeeze", ["logit", "last"], ["logit_2d"]),
             helper.make_node("Mul", ["logit_2d", "tiny"], ["close"]),
             helper.make_node("Add", ["close", "spread"], ["score"]),
             helper.make_node("TopK", ["score", "k"], ["scores", "indices"], axis=1),
             helper.make_node("Sigmoid", ["box_raw"], ["box_all"]),
             helper.make_node("Squeeze", ["box_all", "first"], ["box_2d"]),
             helper.make_node("Squeeze", ["indices", "first"], ["chosen"]),
             helper.make_node("Gather", ["box_2d", "chosen"], ["boxes_2d"], axis=0),
             helper.make_node("Unsqueeze", ["boxes_2d", "first"], ["boxes"])]
    constants = [project, spread, numpy_helper.from_array(np.array([1, 4], np.int64), "split"),
                 numpy_helper.from_array(np.array([2], np.int64), "last"),
                 numpy_helper.from_array(np.array([0], np.int64), "first"),
                 numpy_helper.from_array(np.array(1e-3, np.float32), "tiny"),
                 numpy_helper.from_array(np.array([k], np.int64), "k")]
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, queries, 8])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, k]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, [1, k]),
         helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, k, 4])], constants)
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def small_waveform(path: Path, samples: int = 256) -> Path:
    """A HiFi-GAN-style vocoder's last layers: a waveform of small magnitude (max ~2e-4), nowhere near constant;
    judged by its SNR like any output (it was once taken for constant and passed at 7 dB)."""
    scale = numpy_helper.from_array(np.array(2e-5, np.float32), "scale")
    nodes = [helper.make_node("MatMul", ["mel", "upsample"], ["wave_raw"]),
             helper.make_node("Tanh", ["wave_raw"], ["wave_tanh"]),
             helper.make_node("Mul", ["wave_tanh", "scale"], ["wave_scaled"]),
             helper.make_node("MatMul", ["wave_scaled", "smooth"], ["waveform"])]
    graph = helper.make_graph(nodes, "vocoder", [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("waveform", TensorProto.FLOAT, [1, samples])],
                              [_weights("upsample", 32, samples), _weights("smooth", samples, samples), scale])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
