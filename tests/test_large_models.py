"""Large models and LLM pipelines: stages that never load the weights they keep, on generated models."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import onnx
import pytest

from conftest import build_report, ran
from real_models import kv_decoder, wide_mlp

QNN = """
[targets.qnn-htp]
ep = "qnn"
options = { soc_model = 60 }
"""


def test_graph_stages_keep_the_weights_on_disk_and_out_of_memory(project):
    """A 196 MiB model's shape and fold stages read the graph only: each child's peak memory stays well below the
    weights' size, each writes its graph alone (its references name the source's weights file, read where it is:
    no copy per stage), and the fold still folds the small constant subgraph."""
    models = project.root / "models"
    wide_mlp(models / "wide.onnx")
    project.manifest('[models.wide]\npath = "models/wide.onnx"\ninputs = { x = [1, 3584] }\n' + QNN)
    done = project.doit("fold:wide")
    assert {"shape:wide", "fold:wide"} <= ran(done)
    tasks = build_report(project)
    for stage in ("shape", "fold"):
        assert tasks[f"{stage}:wide"]["child"]["peak_mb"] < 150, tasks[f"{stage}:wide"]
        folder = project.artifacts / ".stages" / "wide" / stage
        assert [p.name for p in folder.iterdir()] == ["wide.onnx"]
        assert (folder / "wide.onnx").stat().st_size < 100_000
    folded = onnx.load(str(project.artifacts / ".stages" / "wide" / "fold" / "wide.onnx"), load_external_data=False)
    assert {entry.value for tensor in folded.graph.initializer for entry in tensor.external_data
            if entry.key == "location"} == {"wide.onnx.data"}
    assert "ConstantOfShape" not in [node.op_type for node in folded.graph.node]
    assert [d.dim_value for d in folded.graph.input[0].type.tensor_type.shape.dim] == [1, 3584]
    assert f"peak {tasks['fold:wide']['child']['peak_mb']:.0f} MB -> " in done.stdout


DECODER = '''
[models.decoder]
path = "models/decoder.onnx"
dims = { batch_size = 1 }

[models.decoder.variants.prompt]
dims = { sequence_length = 8, past_sequence_length = 24, total_sequence_length = 32 }

[models.decoder.variants.token]
dims = { sequence_length = 1, past_sequence_length = 31, total_sequence_length = 32 }

[targets.cpu]
ep = "cpu"

[targets.qnn-htp]
ep = "qnn"
options = { soc_model = 60 }

[groups.llm]
target = "qnn-htp"
models = ["decoder.prompt", "decoder.token"]
pipeline = { tokens = 4 }
'''


def test_prompt_and_token_variants_of_one_decoder_share_one_qnn_context(project):
    """One dynamic decoder with a KV cache declared once with `dims` and two `variants`: each variant builds and
    validates alone on cpu and on the HTP simulator, and the group puts both graphs in one binary, smaller than the
    two alone, with the loading contract in artifact.json. (QNN's weight-shared binaries differ from compile to
    compile: nothing here compares their bytes.)"""
    kv_decoder(project.root / "models" / "decoder.onnx")
    project.manifest(DECODER)
    done = project.doit("--continue", check=False)
    tasks = build_report(project)
    for variant in ("prompt", "token"):
        for target in ("cpu", "qnn-htp"):
            report = json.loads((project.artifacts / target / f"decoder.{variant}" / "validation.json").read_text())
            assert report["status"] == "passed", report
        assert json.loads((project.artifacts / "qnn-htp" / f"decoder.{variant}" / "validation.json").read_text())[
            "outputs"]["logits"]["snr_db"] > 40
    staged = onnx.load(str(project.artifacts / ".stages" / "decoder.token" / "shape" / "decoder.token.onnx"),
                       load_external_data=False)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in staged.graph.input}
    assert shapes["input_ids"] == [1, 1] and shapes["past_key_values.0.key"] == [1, 4, 31, 16]
    assert shapes["attention_mask"] == [1, 32]
    contract = json.loads((project.artifacts / "qnn-htp" / "groups" / "llm" / "artifact.json").read_text())["loading"]
    assert contract["order"] == ["decoder.prompt", "decoder.token"] and contract["one_binary"]
    assert contract["session_options"] == {"ep.share_ep_contexts": "1"}
    graphs = [json.loads((project.artifacts / "qnn-htp" / "groups" / "llm" / "artifact.json").read_text())[
        "members"][m]["graphs"] for m in ("decoder.prompt", "decoder.token")]
    assert all(len(g) == 1 and g[0].startswith("QNNExecutionProvider_") for g in graphs) and graphs[0] != graphs[1]
    sharing = contract["sharing"]
    assert set(sharing["alone_bytes"]) == {"decoder.prompt", "decoder.token"}
    assert sharing["shared_bytes"] < sum(sharing["alone_bytes"].values()) and 0 < sharing["ratio"] < 1
    assert f"{sharing['ratio']:.2f} of the members compiled alone" in done.stdout
    # the pipeline ran on the members compiled alone (the simulator cannot load the shared binary): real numbers,
    # and the group stays skipped, never passed
    validation = json.loads((project.artifacts / "qnn-htp" / "groups" / "llm" / "validation.json").read_text())
    assert tasks["validate:llm"]["status"] == "skipped" and validation["status"] == "skipped"
    pipeline = validation["pipeline"]
    assert pipeline["ran_on"] == "the members compiled alone" and len(pipeline["steps"]) == 5
    assert pipeline["tokens_ep"] == pipeline["tokens_cpu"] and min(s["snr_db"] for s in pipeline["steps"]) > 40
    assert validation["reason"].startswith("the shared binary itself needs the device (")
    assert "pipeline on the members compiled alone: prompt + 4 token steps, logits SNR >= " in done.stdout
    assert "one binary, " in (project.artifacts / "report.html").read_text()


def test_a_pipelines_cpu_run_is_computed_once_and_restored_when_only_its_judgement_changes(project):
    """The prompt + token steps on CPU depend on the source models alone: a validation whose thresholds changed
    restores them and runs only the EP's side, with the same figures."""
    kv_decoder(project.root / "models" / "decoder.onnx")
    project.manifest(DECODER)
    project.doit("validate:llm")
    folder = project.artifacts / "qnn-htp" / "groups" / "llm"
    assert build_report(project)["validate:llm"]["cpu_reference"]["from"] == "computed"
    before = json.loads((folder / "validation.json").read_text())
    project.manifest(DECODER.replace("options = { soc_model = 60 }",
                                     "options = { soc_model = 60 }\nvalidation = { min_snr_db = 30 }"))
    done = project.doit("validate:llm")
    assert ran(done) == {"validate:llm"} and "(CPU reference from the cache)" in done.stdout, done.stdout[-600:]
    entry = build_report(project)["validate:llm"]
    assert entry["cpu_reference"] == {"from": "cache", "fingerprint": entry["cpu_reference"]["fingerprint"]}
    after = json.loads((folder / "validation.json").read_text())
    assert after["pipeline"] == before["pipeline"] and after["thresholds"]["min_snr_db"] == 30
    assert "cpu_reference" not in after  # the build report's, not the published validation's


@pytest.mark.parametrize("model, message", [
    ('dims = { seq_len = 8 }', "models.decoder.dims.seq_len: no input of the model has a dimension named 'seq_len'"),
    ('variants = { prompt = { dims = { sequence_lenght = 8 } } }',
     "models.decoder.variants.prompt.dims.sequence_lenght: no input of the model has a dimension named "
     "'sequence_lenght' (did you mean 'sequence_length'?)"),
    ('variants = { prompt = { dim = { sequence_length = 8 } } }',
     "models.decoder.variants.prompt.dim: unknown key (did you mean 'dims'?)"),
    ('dims = { sequence_length = 0 }', "models.decoder.dims.sequence_length: must be a positive integer"),
    ('variants = { token = { dims = { sequence_length = 1 } } }\n[models."decoder.token"]\npath = '
     '"models/decoder.onnx"', "models.decoder.variants.token: a variant of 'decoder' is named 'decoder.token'"),
])
def test_dims_and_variants_mistakes_are_one_line_before_any_build(project, model, message):
    kv_decoder(project.root / "models" / "decoder.onnx")
    project.manifest(f'[models.decoder]\npath = "models/decoder.onnx"\n{model}\n[targets.cpu]\nep = "cpu"\n')
    done = project.doit("list", check=False)
    assert done.returncode == 2 and done.stderr.startswith(f"error: models.toml: {message}"), done.stderr


def test_a_pipeline_of_graphs_without_its_conventions_fails_in_one_line(project):
    project.manifest('''
[models.tinycnn]
path = "models/tinycnn.onnx"

[models.encoder]
path = "models/encoder.onnx"
''' + QNN + '''
[groups.pair]
target = "qnn-htp"
models = ["tinycnn", "encoder"]
pipeline = { tokens = 2 }
''')
    project.doit("--continue", check=False)
    reason = build_report(project)["validate:pair"]["reason"]
    assert reason == ("failed validate:pair: the prompt graph does not follow the pipeline's conventions (input_ids, "
                      "attention_mask, position_ids, past_key_values.*; logits, present.*): inputs x"), reason


def test_an_openvino_group_ships_the_weights_its_binaries_refer_to_and_runs_as_a_pipeline(project, openvino_reason):
    """OpenVINO's weight-shared binaries hold no weights: they name the compiled models' external-data file, which
    the group publishes beside them; the pipeline then runs on the shared context itself and passes."""
    if openvino_reason:
        pytest.skip(openvino_reason)
    kv_decoder(project.root / "models" / "decoder.onnx")
    group = DECODER.replace('target = "qnn-htp"', 'target = "openvino-cpu"').replace("[groups.llm]", "[groups.llm-ov]")
    project.manifest(group + '''
[targets.openvino-cpu]
ep = "openvino@pypi"
device = "cpu"
options = { load_config = "configs/openvino_f32.json" }
option_files = ["load_config"]
''')
    project.doit("validate:llm-ov")
    folder = project.artifacts / "openvino-cpu" / "groups" / "llm-ov"
    sidecar = json.loads((folder / "artifact.json").read_text())
    assert "decoder.onnx.data" in sidecar["files"] and (folder / "decoder.onnx.data").is_file()
    assert sidecar["loading"]["weights"] == {"decoder.onnx.data": (folder / "decoder.onnx.data").stat().st_size}
    validation = json.loads((folder / "validation.json").read_text())
    assert validation["status"] == "passed" and validation["pipeline"]["ran_on"] == "the shared context"
    assert validation["pipeline"]["tokens_ep"] == validation["pipeline"]["tokens_cpu"]
    assert min(step["snr_db"] for step in validation["pipeline"]["steps"]) > 60
    project.manifest(project.root.joinpath("models.toml").read_text().replace("tokens = 4", "tokens = 2"))
    assert ran(project.doit("validate:llm-ov")) == {"validate:llm-ov"}  # the pipeline's setting is the validation's
    assert len(json.loads((folder / "validation.json").read_text())["pipeline"]["steps"]) == 3


def test_graph_only_stages_read_the_sources_weights_where_they_are(project):
    """A chain of graph-only stages (shape, fold) holds no copy of the weights, in the artifacts or the cache; the
    compile after them, a quantize and an optimize stage after them, and the validations (the float model's
    comparison included) read the source's weights file where it is; a restore brings back the graph alone; and
    editing the weights rebuilds every task of the chain (the weights are each one's input)."""
    models = project.root / "models"
    wide_mlp(models / "wide.onnx", width=512)
    wide_mlp(models / "opt.onnx", width=512)
    project.manifest('''
[models.wide]
path = "models/wide.onnx"
inputs = { x = [1, 512] }
targets = ["qnn-htp", "qnn-int8"]
quantize = { calibration = "random", activation_type = "uint16" }

[models.opt]
path = "models/opt.onnx"
inputs = { x = [1, 512] }
optimize = "basic"
targets = ["qnn-htp"]

[targets.qnn-int8]
ep = "qnn"
quantized = true
''' + QNN)
    project.doit("fold:wide", "shape:opt")
    cached = [p for p in project.cache.rglob("*") if p.is_file()]
    assert not [p for p in cached if p.name.endswith(".data")], cached
    project.doit()
    stages = project.artifacts / ".stages"
    assert sorted(f"{p.parent.parent.name}/{p.parent.name}" for p in stages.rglob("*.data")) == [
        "opt/optimize+shape", "wide/quantize-qnn+fold"]  # the stages that change weights; shape and fold: graphs alone
    for name, target in (("wide", "qnn-htp"), ("wide", "qnn-int8"), ("opt", "qnn-htp")):
        folder = project.artifacts / target / name
        validation = json.loads((folder / "validation.json").read_text())
        assert validation["status"] == "passed", (name, target, validation)
        assert json.loads((folder / "artifact.json").read_text())["nodes"]["in_ep"] > 0
    assert json.loads((project.artifacts / "qnn-int8" / "wide" / "validation.json").read_text())[
        "against_float_model"]  # the float model, fold's graph alone, ran with the source's weights
    shape = stages / "wide" / "shape" / "wide.onnx"
    before = shape.read_bytes()
    shutil.rmtree(stages / "wide")
    assert "restored shape:wide" in project.doit("shape:wide").stdout
    assert [p.name for p in shape.parent.iterdir()] == ["wide.onnx"] and shape.read_bytes() == before
    with (models / "wide.onnx.data").open("r+b") as file:  # one weight scaled in place, the size kept
        file.seek(4096)
        (value,) = struct.unpack("<f", file.read(4))
        file.seek(4096)
        file.write(struct.pack("<f", value * 1.5))
    again = ran(project.doit())
    assert {"shape:wide", "fold:wide", "quantize:wide[qnn]+fold", "compile:wide@qnn-htp", "compile:wide@qnn-int8",
            "validate:wide@qnn-htp", "validate:wide@qnn-int8"} <= again, again
    assert not any(task.endswith(":opt") or ":opt@" in task for task in again), again


def test_weights_in_a_subfolder_one_file_per_tensor_stay_where_they_are(project):
    """External data as some exporters lay it out (one file per tensor, in a folder beside the model) goes through
    the graph-only stages untouched: the compile and the validation read each file where it is, and an edit of one
    of them rebuilds the chain."""
    models = project.root / "models"
    wide_mlp(models / "split.onnx", width=256)
    model = onnx.load(str(models / "split.onnx"))
    (models / "split.onnx.data").unlink()
    (models / "weights").mkdir()
    for tensor in model.graph.initializer:
        if tensor.HasField("raw_data") and len(tensor.raw_data) > 1024:
            (models / "weights" / f"{tensor.name}.bin").write_bytes(tensor.raw_data)
            size = len(tensor.raw_data)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", f"weights/{tensor.name}.bin"), ("offset", "0"), ("length", str(size))):
                tensor.external_data.add(key=key, value=value)  # as onnx writes them (QNN needs the length)
    onnx.save(model, str(models / "split.onnx"))
    project.manifest('[models.split]\npath = "models/split.onnx"\ninputs = { x = [1, 256] }\n' + QNN)
    done = project.doit()
    assert {"shape:split", "fold:split", "compile:split@qnn-htp", "validate:split@qnn-htp"} <= ran(done)
    assert [p.name for p in (project.artifacts / ".stages" / "split" / "fold").iterdir()] == ["split.onnx"]
    validation = json.loads((project.artifacts / "qnn-htp" / "split" / "validation.json").read_text())
    assert validation["status"] == "passed", validation
    weight = models / "weights" / "layers.1.weight.bin"
    # another weight, the same size (halved: bytes reversed made NaN in the CPU reference, where the HTP computes
    # numbers, which position-by-position comparison rightly fails)
    weight.write_bytes((np.frombuffer(weight.read_bytes(), np.float32) * np.float32(0.5)).tobytes())
    assert {"shape:split", "fold:split", "compile:split@qnn-htp", "validate:split@qnn-htp"} <= ran(project.doit())
