"""The real-model corpus: small models with the architectures and export quirks users bring, generated offline and
deterministically (fixed seeds, random weights, no hub downloads). Each entry says where its structure comes from
and what it exercises.

    python bench/corpus/generate.py [--no-torch] OUT_FOLDER

`--no-torch` builds only the models made with onnx.helper and ONNX Runtime's tools (the subset `pytest -m corpus`
runs in CI); the torch models need `pip install torch==2.13.0 transformers` (torch's CPU build on Python 3.11).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import failure_classes  # noqa: E402 - the issue-63 classes of the tests are corpus members too

import real_models  # noqa: E402 - the failure-class models of the tests are corpus members too


@dataclass(frozen=True)
class Entry:
    name: str
    origin: str  # where the structure comes from and what it exercises
    make: Callable[[Path], Path]
    inputs: str = ""  # the manifest's model keys beyond path
    torch: bool = False


def _export(module, args: tuple, path: Path, names: list[str], outputs: list[str], opset: int = 17,
            dynamic: dict | None = None, dynamo: bool = False) -> Path:
    import torch

    module.eval()
    torch.manual_seed(0)
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), input_names=names, output_names=outputs, opset_version=opset,
                          dynamic_axes=dynamic, dynamo=dynamo)
    return path


def _seeded() -> None:
    import torch

    torch.manual_seed(0)


def _hidden(model, *names: str):
    """A transformers model called by keyword, returning its last hidden state (exporters pass positionally)."""
    from torch import nn

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(**dict(zip(names, args, strict=True))).last_hidden_state

    return Wrapper()


def resnet(path: Path) -> Path:
    import torch
    from torch import nn

    _seeded()

    class Block(nn.Module):
        def __init__(self, channels: int, stride: int):
            super().__init__()
            out = channels * stride
            self.conv1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(out)
            self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(out)
            self.down = nn.Sequential(nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out)) \
                if stride > 1 else nn.Identity()

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + self.down(x))

    model = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU(), Block(16, 1), Block(16, 2), Block(32, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    return _export(model, (torch.randn(1, 3, 32, 32),), path, ["image"], ["logits"],
                   dynamic={"image": {0: "batch"}})


def mobilenet(path: Path) -> Path:
    import torch
    from torch import nn

    _seeded()

    def inverted(cin: int, cout: int, stride: int) -> nn.Module:
        hidden = cin * 4
        return nn.Sequential(nn.Conv2d(cin, hidden, 1), nn.BatchNorm2d(hidden), nn.ReLU6(),
                             nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden), nn.BatchNorm2d(hidden),
                             nn.ReLU6(), nn.Conv2d(hidden, cout, 1), nn.BatchNorm2d(cout))

    model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU6(), inverted(16, 24, 2), inverted(24, 32, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    return _export(model, (torch.randn(1, 3, 32, 32),), path, ["input"], ["output"])


def efficientnet(path: Path) -> Path:
    import torch
    from torch import nn

    _seeded()

    class SqueezeExcite(nn.Module):
        def __init__(self, channels: int):
            super().__init__()
            self.reduce, self.expand = nn.Conv2d(channels, channels // 4, 1), nn.Conv2d(channels // 4, channels, 1)

        def forward(self, x):
            scale = torch.sigmoid(self.expand(nn.functional.silu(self.reduce(x.mean((2, 3), keepdim=True)))))
            return x * scale

    model = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.SiLU(),
                          nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16), nn.SiLU(), SqueezeExcite(16),
                          nn.Conv2d(16, 24, 1), nn.BatchNorm2d(24), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Dropout(0.2), nn.Linear(24, 10))
    return _export(model, (torch.randn(1, 3, 32, 32),), path, ["pixel_values"], ["logits"])


def densenet(path: Path) -> Path:
    import torch
    from torch import nn

    _seeded()

    class Dense(nn.Module):
        def __init__(self, channels: int, growth: int = 8, layers: int = 3):
            super().__init__()
            self.layers = nn.ModuleList(nn.Sequential(nn.BatchNorm2d(channels + i * growth), nn.ReLU(),
                                                      nn.Conv2d(channels + i * growth, growth, 3, 1, 1))
                                        for i in range(layers))

        def forward(self, x):
            for layer in self.layers:
                x = torch.cat([x, layer(x)], 1)
            return x

    model = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), Dense(16), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(40, 10))
    return _export(model, (torch.randn(1, 3, 32, 32),), path, ["data"], ["prob"], opset=13)


def segmenter(path: Path) -> Path:
    import torch
    from torch import nn

    _seeded()

    class Segmenter(nn.Module):  # FCN/U-Net style decoder head: ConvTranspose and Resize
        def __init__(self):
            super().__init__()
            self.encode = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU())
            self.up = nn.ConvTranspose2d(32, 16, 2, 2)
            self.head = nn.Conv2d(16, 5, 1)

        def forward(self, x):
            y = self.head(torch.relu(self.up(self.encode(x))))
            return nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)

    return _export(Segmenter(), (torch.randn(1, 3, 32, 32),), path, ["image"], ["masks"])


def vit(path: Path) -> Path:
    import torch
    from transformers import ViTConfig, ViTModel

    _seeded()
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64)
    return _export(_hidden(ViTModel(config, add_pooling_layer=False), "pixel_values"), (torch.randn(1, 3, 32, 32),),
                   path,
                   ["pixel_values"], ["last_hidden_state"])


def bert(path: Path) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    _seeded()
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    ids = torch.randint(0, 100, (1, 8))
    return _export(_hidden(BertModel(config, add_pooling_layer=False), "input_ids", "attention_mask"),
                   (ids, torch.ones_like(ids)), path,
                   ["input_ids", "attention_mask"], ["last_hidden_state"],
                   dynamic={"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}})


def bert_external(path: Path) -> Path:
    """torch's default (dynamo) exporter: weights in `<name>.onnx.data`."""
    import torch
    from transformers import BertConfig, BertModel

    _seeded()
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    ids = torch.randint(0, 100, (1, 8))
    model = _hidden(BertModel(config, add_pooling_layer=False), "input_ids", "attention_mask").eval()
    with torch.no_grad():
        program = torch.onnx.export(model, (ids, torch.ones_like(ids)), input_names=["input_ids", "attention_mask"],
                                    output_names=["last_hidden_state"], dynamo=True, opset_version=18)
    program.save(str(path), external_data=True)
    return path


def gpt2(path: Path) -> Path:
    import torch
    from transformers import GPT2Config, GPT2Model

    _seeded()
    config = GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2, use_cache=False)
    model = _hidden(GPT2Model(config), "input_ids").eval()
    with torch.no_grad():  # the TorchScript exporter lacks aten::diff, which the causal-mask code uses
        program = torch.onnx.export(model, (torch.randint(0, 100, (1, 8)),), input_names=["input_ids"],
                                    output_names=["last_hidden_state"], dynamo=True, opset_version=18)
    program.save(str(path), external_data=False)
    return path


def speech(path: Path) -> Path:
    import torch
    from torch import nn

    _seeded()

    class Speech(nn.Module):  # conv front end + GRU (keyword spotting / VAD style)
        def __init__(self):
            super().__init__()
            self.front = nn.Sequential(nn.Conv1d(16, 24, 3, 1, 1), nn.ReLU(), nn.Conv1d(24, 24, 3, 2, 1), nn.ReLU())
            self.gru = nn.GRU(24, 32, batch_first=True)
            self.out = nn.Linear(32, 4)

        def forward(self, features):
            y, _ = self.gru(self.front(features).transpose(1, 2))
            return self.out(y[:, -1])

    return _export(Speech(), (torch.randn(1, 16, 20),), path, ["features"], ["scores"])


def lstm(path: Path) -> Path:
    import torch
    from torch import nn

    _seeded()

    class Tagger(nn.Module):  # embedding + bidirectional LSTM (sequence tagging)
        def __init__(self):
            super().__init__()
            self.embed, self.lstm = nn.Embedding(50, 16), nn.LSTM(16, 16, batch_first=True, bidirectional=True)
            self.out = nn.Linear(32, 5)

        def forward(self, tokens):
            return self.out(self.lstm(self.embed(tokens))[0])

    return _export(Tagger(), (torch.randint(0, 50, (1, 10)),), path, ["tokens"], ["tags"])


def loop_model(path: Path) -> Path:
    """An ONNX Loop that iterates a recurrent cell a fixed number of times (decoders, iterative refinement)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), "cell.w")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["state_in", "cell.w"], ["m"]), helper.make_node("Tanh", ["m"], ["state_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [1, 8])])
    trips = numpy_helper.from_array(np.array(3, dtype=np.int64), "trips")
    cond = numpy_helper.from_array(np.array(True), "keep_going")
    graph = helper.make_graph([helper.make_node("Loop", ["trips", "keep_going", "x"], ["y"], body=body)], "loop",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [weight, trips, cond])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _calibration(model_path: Path):
    import onnx
    from onnxruntime.quantization import CalibrationDataReader

    model = onnx.load(str(model_path))
    shape = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    name = model.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.samples = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.samples, None)

    return Reader()


def qdq_cnn(path: Path) -> Path:
    """A QDQ uint8 CNN as ORT's static quantizer writes it (the old-IR CNN's structure, opset 13)."""
    from onnxruntime.quantization import QuantFormat, quantize_static

    source = real_models.runtime_weights(path.with_name("qdq_source.onnx"))
    quantize_static(str(source), str(path), _calibration(source), quant_format=QuantFormat.QDQ)
    source.unlink()
    return path


def qdq16_cnn(path: Path) -> Path:
    """A QDQ model with 16-bit activations (uint16 Q/DQ, uint8 weights), as ORT's static quantizer writes it for
    accuracy-sensitive layers: OpenVINO computes it wrongly (its plain session too), QNN and CPU right."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    source = REPO / "models" / "tinycnn.onnx"  # the shipped example: Conv, Relu, pooling, Gemm
    quantize_static(str(source), str(path), _calibration(source), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8)
    return path


def qoperator_cnn(path: Path) -> Path:
    """QOperator format (QLinearConv, QLinearMatMul): what older quantizers and TFLite converters emit."""
    from onnxruntime.quantization import QuantFormat, quantize_static

    source = real_models.minus_one_batch(path.with_name("qop_source.onnx"))
    import onnx

    model = onnx.load(str(source))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(model, str(source))
    quantize_static(str(source), str(path), _calibration(source), quant_format=QuantFormat.QOperator)
    source.unlink()
    return path


def fp16_mlp(path: Path) -> Path:
    """An fp16 model (float16 inputs, weights and outputs), as half-precision exports ship."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    source = real_models.external_data_mlp(path.with_name("fp16_source.onnx"))
    model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=False)
    onnx.save(model, str(path))
    for file in (source, source.with_name(f"{source.name}.data")):
        file.unlink()
    return path


CORPUS = [
    Entry("resnet", "ResNet-18-style basic blocks with BatchNorm and projection shortcuts (torch, TorchScript exporter)"
          "; symbolic batch", resnet, "inputs = { image = [1, 3, 32, 32] }", torch=True),
    Entry("mobilenet", "MobileNetV2 inverted residuals: depthwise convs, ReLU6 (torch)", mobilenet, torch=True),
    Entry("efficientnet", "EfficientNet-B0-style MBConv with squeeze-excite and SiLU (torch)", efficientnet,
          torch=True),
    Entry("densenet", "DenseNet dense block: concatenated features, opset 13 (torch)", densenet, torch=True),
    Entry("segmenter", "FCN/U-Net decoder head: ConvTranspose and bilinear Resize (torch)", segmenter, torch=True),
    Entry("vit", "ViT encoder from transformers' ViTConfig: patch conv, attention, GELU (transformers)", vit,
          torch=True),
    Entry("bert", "BERT encoder from transformers' BertConfig: int64 token ids, attention mask, symbolic batch and "
          "sequence", bert, "inputs = { input_ids = [1, 8], attention_mask = [1, 8] }", torch=True),
    Entry("bert_external", "BERT via torch's default (dynamo) exporter: weights in bert_external.onnx.data",
          bert_external, torch=True),
    Entry("gpt2", "GPT-2 decoder from transformers' GPT2Config: causal mask, int64 ids (transformers)", gpt2,
          torch=True),
    Entry("speech", "keyword-spotting model: Conv1d front end + GRU (torch)", speech, torch=True),
    Entry("lstm", "sequence tagger: Embedding + bidirectional LSTM (torch)", lstm, torch=True),
    Entry("loop", "ONNX Loop iterating a recurrent cell (onnx.helper)", loop_model),
    Entry("vad_if", "voice-activity model whose sample-rate input selects If branches, frozen to 16 kHz "
          "(onnx.helper)", real_models.sample_rate_branches, "freeze = { sr = 16000 }"),
    Entry("old_ir", "Caffe2-era export: IR 3, opset 8, weights listed as graph inputs, names with '/' and ':' "
          "(onnx.helper)", real_models.old_ir_cnn),
    Entry("paddle_minus1", "Paddle2ONNX style: batch stored as dim_value -1 (onnx.helper)",
          real_models.minus_one_batch, "inputs = { x = [1, 3, 8, 8] }"),
    Entry("paddle_ocr", "Paddle OCR style: dim_param '?' for several independent dimensions, [-1, 3, ?, ?] "
          "(onnx.helper)", real_models.question_mark_dims, "inputs = { x = [1, 3, 48, 192] }"),
    Entry("detector_if", "detector whose post-processing If (on a mode-flag input) stays on CPU with its branches' "
          "nodes (onnx.helper)", real_models.detector_with_branches),
    Entry("constant_weights", "Conv weights from ConstantOfShape (exports that build weights at run time), folded by "
          "the fold stage NPU targets get by default (onnx.helper)", real_models.runtime_weights),
    Entry("qdq", "QDQ uint8 model from ORT's static quantizer", qdq_cnn),
    Entry("qoperator", "QOperator uint8 model (QLinearConv) from ORT's static quantizer", qoperator_cnn),
    Entry("fp16", "fp16 MLP (float16 weights and I/O, converted by ORT's float16 tool)", fp16_mlp),
    Entry("partial", "two partitions around an op the HTP lacks (Det): partial offload (onnx.helper)",
          real_models.partial_offload),
    Entry("tokens", "token ids into a 5-entry vocabulary with an int64 mask (onnx.helper)", real_models.token_encoder,
          "inputs = { input_ids = [2, 6], attention_mask = [2, 6] }"),
    Entry("odd_names", "input/output names with '/', ':', spaces and non-ASCII (onnx.helper)", real_models.odd_names),
    Entry("layernorm", "decomposed LayerNorm with stale symbolic value_info (onnx.helper)",
          real_models.layernorm_dynamic, "inputs = { x = [1, 4, 16] }"),
    Entry("rmsnorm_rsqrt", "LLaMA/T5 RMSNorm as torch's dynamo exporter writes it, weight * (x * Reciprocal(Sqrt(mean("
          "x^2) + eps))): QNN HTP fails to finalize it (onnx.helper)", real_models.rmsnorm_block),
    Entry("rmsnorm_rewrite", "the same RMSNorm block (the TorchScript exporter's Div(1, Sqrt) form) with rewrite = "
          "[\"rmsnorm\"]: x / sqrt(...) compiles (onnx.helper)",
          lambda path: real_models.rmsnorm_block(path, "one_over"), 'rewrite = ["rmsnorm"]'),
    Entry("as_strided", "the torch dynamo exporter's as_strided after a Conv (Reshape -> Gather -> Transpose), "
          "on which QNN HTP's compile aborts (onnx.helper)", real_models.strided_after_conv),
    Entry("saturated", "a text detector's sigmoid map driven to ~1e-6 by generated noise: a nearly constant reference "
          "(onnx.helper)", real_models.saturated_detector),
    Entry("vocoder_small", "a vocoder's waveform of small magnitude (max ~2e-4), judged by its SNR, never taken for "
          "constant (onnx.helper)", real_models.small_waveform),
    Entry("ranker_loop", "DLRM-style ranker: EmbeddingBag as a Loop whose body reads outer initializers, plus a "
          "SequenceEmpty chain (onnx.helper)", real_models.loop_reading_outer_weights),
    Entry("caffe2_shape", "Caffe2 export: IR 3, opset 9, weights, a *__SHAPE tensor feeding ConstantOfShape and an "
          "OC2_DUMMY_* shape, all listed as graph inputs (onnx.helper)", real_models.old_ir_shape_inputs),
    Entry("topk_detector", "DETR-style head: TopK keeps 30 of 60 queries whose scores tie within fp16, boxes gathered "
          "at the chosen indices (onnx.helper)", real_models.topk_detector),
    Entry("qdq16", "QDQ model with uint16 activations from ORT's static quantizer", qdq16_cnn),
    Entry("opset6", "old PyTorch export: opset 6, IR 3, weights listed as inputs; QNN takes no node below opset 7, "
          "so its targets get the upgrade stage (onnx.helper)", failure_classes.opset6_cnn),
    Entry("vad_unshaped", "silero VAD's class: a value_info with a type and no shape, read by Shape -> Gather "
          "(onnx.helper)", failure_classes.unshaped_value_info),
    Entry("det_only", "an op no EP takes (Det) alone: the line names it (onnx.helper)", failure_classes.det_only),
    Entry("ranker_shared", "ranker whose Loop body reads the weight a compiled MatMul reads too: ONNX Runtime's "
          "EPContext writer's invalid graph on QNN (onnx.helper)", failure_classes.ranker_shared_weight),
]


def manifest(entries: list[Entry]) -> str:
    lines = ["# The real-model corpus (bench/corpus/generate.py): every model for cpu, openvino-cpu and qnn-htp.\n"]
    for entry in entries:
        lines.append(f"# {entry.origin}\n[models.{entry.name}]\npath = \"models/{entry.name}.onnx\"\n"
                     f"{entry.inputs}\n")
    lines.append('[targets.cpu]\nep = "cpu"\n\n'
                 '[targets.openvino-cpu]\nep = "openvino@pypi"\ndevice = "cpu"\n'
                 'options = { load_config = "openvino_f32.json" }\noption_files = ["load_config"]\n\n'
                 '[targets.qnn-htp]\nep = "qnn"\n'
                 'options = { backend_type = "htp", soc_model = 60 }\ntimeout_s = 900\nmax_memory_gb = 8\n')
    return "\n".join(lines)


def generate(folder: Path, with_torch: bool) -> list[Entry]:
    """Write the corpus models and models.toml into `folder`; returns the entries built."""
    (folder / "models").mkdir(parents=True, exist_ok=True)
    entries = [e for e in CORPUS if with_torch or not e.torch]
    for entry in entries:
        entry.make(folder / "models" / f"{entry.name}.onnx")
    (folder / "models.toml").write_text(manifest(entries))
    (folder / "openvino_f32.json").write_text(json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}))
    return entries


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--no-torch", action="store_true")
    arguments = parser.parse_args()
    built = generate(arguments.folder, not arguments.no_torch)
    print(f"{len(built)} models in {arguments.folder / 'models'}")
