"""LLMs as people build them: onnxruntime-genai's model builder output (opset 22 with SimplifiedLayerNormalization
in the default domain, GroupQueryAttention, SkipSimplifiedLayerNormalization, MatMulNBits and GatherBlockQuantized
for int4; named dims; no position_ids) is accepted, built for cpu, openvino-cpu and qnn-htp, its pipeline validated
as genai decodes it, and its folder published ready for genai. Tiny random-weight checkpoints built by the tests
(`genai_models`)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from conftest import build_report, ran
from epbuild.files.weights import FOLDER_OPTION
from genai_models import built, genai_folder_check, genai_tokens

MISSING = [name for name in ("torch", "transformers", "onnxruntime_genai") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"the genai tests need the test extras (requirements-dev.txt): "
                                                      f"{', '.join(MISSING)} missing")


DIMS = "batch_size = 1, kv_cache_dim = 16, total_sequence_length = 32"  # the issue's: a 32-position window
VARIANTS = f'''
[models.llama]
path = "models/llama/model.onnx"

[models.llama.variants.prompt]
dims = {{ {DIMS}, sequence_length = 8, past_sequence_length = 24 }}

[models.llama.variants.token]
dims = {{ {DIMS}, sequence_length = 1, past_sequence_length = 31 }}

[targets.cpu]
ep = "cpu"

[targets.qnn-htp]
ep = "qnn"
options = {{ soc_model = 60 }}

[groups.llm]
target = "qnn-htp"
models = ["llama.prompt", "llama.token"]
pipeline = {{ tokens = 4 }}
'''


@pytest.fixture(scope="module")
def builder_output(tmp_path_factory):
    folder = tmp_path_factory.mktemp("genai")
    return {"llama": built("llama", "fp32", folder), "qwen-int4": built("qwen2", "int4", folder)}


def _with_model(project, source, name="llama"):
    shutil.copytree(source, project.root / "models" / name)


def test_a_builder_model_builds_into_a_folder_onnxruntime_genai_loads(project, builder_output):
    """Refused before (onnx.checker does not know SimplifiedLayerNormalization at opset 22); now a cpu build
    publishes the model with genai_config.json and the tokenizer, and genai's greedy tokens on that folder equal
    the source's."""
    _with_model(project, builder_output["llama"])
    project.manifest('[models.llama]\npath = "models/llama/model.onnx"\n\n[targets.cpu]\nep = "cpu"\n')
    listed = project.doit("list")
    assert "error" not in listed.stdout + listed.stderr
    done = project.doit(check=False)
    assert build_report(project)["validate:llama@cpu"]["status"] == "validated", done.stdout
    assert "greedy tokens equal the source's" in done.stdout
    folder = project.artifacts / "cpu" / "llama"
    assert {"genai_config.json", "tokenizer.json", "tokenizer_config.json", "llama.onnx"} <= {
        p.name for p in folder.iterdir()}
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "llama.onnx"
    report = json.loads((folder / "validation.json").read_text())["genai"]
    prompt = report["prompt"]
    assert report["tokens_artifact"] == genai_tokens(folder, prompt, 8) == genai_tokens(
        project.root / "models" / "llama", prompt, 8)

    # the tokenizer is part of what the build publishes: a change rebuilds, nothing else does
    assert "-- compile:llama@cpu" in project.doit().stdout
    (project.root / "models" / "llama" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    again = project.doit()
    assert "compiled compile:llama@cpu" in again.stdout
    assert json.loads((folder / "tokenizer_config.json").read_text()) == {"model_max_length": 64}

    # the verdict is genai's generator's: another onnxruntime-genai runs the validation again, not the compile
    meta = project.root.parent / "genai-meta" / "onnxruntime_genai-99.0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-genai\nVersion: 99.0\n")
    project.env["PYTHONPATH"] = f"{meta.parent}{os.pathsep}{project.env['PYTHONPATH']}"
    assert ran(project.doit()) == {"validate:llama@cpu"}


def test_the_pipeline_decodes_as_onnxruntime_genai_does(project, builder_output):
    """Prompt and token variants of the builder's model, on cpu and on the HTP simulator, and a pipeline group:
    the cache is handed on from position 0 as GroupQueryAttention writes it, so the greedy tokens are genai's own
    (the sliding window gave others on both sides and passed); the CPU run is checked against a growing-cache run
    and genai's generator. A sliding window on these graphs departs from the growing-cache run."""
    import numpy as np

    from epbuild.steps.validation.pipeline import SLIDING, cpu_run
    from epbuild.steps.validation.pipeline_checks import growing_run

    _with_model(project, builder_output["llama"])
    project.manifest(VARIANTS)
    done = project.doit("--continue", check=False)
    tasks = build_report(project)
    for variant in ("prompt", "token"):
        for target in ("cpu", "qnn-htp"):
            assert tasks[f"validate:llama.{variant}@{target}"]["status"] == "validated", done.stdout
    compiled = next(line for line in done.stdout.splitlines() if line.startswith("compiled compile:llama.prompt@qnn"))
    assert "partitions with CPU work between them" in compiled and "GroupQueryAttention" in compiled

    pipeline = json.loads((project.artifacts / "qnn-htp" / "groups" / "llm" / "validation.json").read_text())[
        "pipeline"]
    assert pipeline["layout"] == "from-start"
    genai = genai_tokens(project.root / "models" / "llama", pipeline["prompt"], 5)
    assert pipeline["tokens_cpu"] == genai == pipeline["tokens_ep"], done.stdout
    assert [(c["kind"], c["status"]) for c in pipeline["cpu_checked"]] == [
        ("growing cache", "agrees"), ("onnxruntime-genai", "agrees")]

    stages, options = project.artifacts / ".stages", ort.SessionOptions()
    options.add_session_config_entry(FOLDER_OPTION, str(project.root / "models" / "llama"))  # graph-only stages
    prompt, token = (ort.InferenceSession(str(stages / f"llama.{v}" / "fold" / f"llama.{v}.onnx"), options)
                     for v in ("prompt", "token"))
    wrong = cpu_run(prompt, token, 4, SLIDING)
    declared = ort.InferenceSession(str(project.root / "models" / "llama" / "model.onnx"))
    assert growing_run(declared, wrong)["status"] == "departs"
    assert np.isfinite(wrong["logits"][-1]).all()


def test_a_model_the_checker_refuses_for_an_op_nobody_registers_names_the_templates_key_once(project):
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    onnx.save(model, str(project.root / "models" / "bad.onnx"))
    project.manifest('[models.bad]\npath = "models/bad.onnx"\n[models.bad.variants.a]\ndims = { n = 1 }\n'
                     '[models.bad.variants.b]\ndims = { n = 2 }\n\n[targets.cpu]\nep = "cpu"\n')
    listed = project.doit("list", check=False)
    lines = [line for line in (listed.stdout + listed.stderr).splitlines() if "error" in line]
    assert len(lines) == 1 and "models.bad.path: bad.onnx: fails onnx.checker: No Op registered for NoSuchOp" in \
        lines[0], lines


def test_openvino_refusing_int4_ops_says_which_in_one_line(project, builder_output):
    """The int4 Qwen2 (tied embeddings: GatherBlockQuantized) printed 741 characters of plugin text and a stray
    ONNX Runtime log line; one line names each op OpenVINO cannot convert and why."""
    _with_model(project, builder_output["qwen-int4"], "qwen")
    project.manifest('[models.qwen]\npath = "models/qwen/model.onnx"\ndims = { batch_size = 1, sequence_length = 8,'
                     ' past_sequence_length = 32, total_sequence_length = 32, kv_cache_dim = 16 }\n\n'
                     '[targets.ov]\nep = "openvino"\n')
    done = project.doit(check=False)
    text = done.stdout + done.stderr
    line = next(x for x in text.splitlines() if x.startswith("compile qwen@ov"))
    assert "OpenVINO cannot convert 2 op type(s): " in line and "com.microsoft.GatherBlockQuantized (" in line
    assert "[E:onnxruntime:" not in text and "Failed operations detailed log" not in text


SHARED_CACHE = f'''
[models.llama]
path = "models/llama/model.onnx"

[models.llama.variants.prompt]
dims = {{ {DIMS}, sequence_length = 8, past_sequence_length = 32 }}

[models.llama.variants.token]
dims = {{ {DIMS}, sequence_length = 1, past_sequence_length = 32 }}

[targets.ov]
ep = "openvino"
options = {{ load_config = "configs/ov.json" }}
option_files = ["load_config"]

[targets.qnn-htp]
ep = "qnn"
options = {{ soc_model = 60 }}

[groups.llm-ov]
target = "ov"
models = ["llama.prompt", "llama.token"]
pipeline = {{ tokens = 4 }}

[groups.llm-qnn]
target = "qnn-htp"
models = ["llama.prompt", "llama.token"]
pipeline = {{ tokens = 4 }}
'''


def test_a_pipeline_group_of_a_genai_model_is_a_folder_genai_runs(project, builder_output):
    """Prompt and token variants over the whole cache (past = total: genai's static cache is one buffer): the
    group's folder gets a decoder-pipeline genai_config.json (each stage the target's provider options, OpenVINO's
    load_config inline so the folder can move, and ep.share_ep_contexts) and the tokenizer; the validation runs
    genai's generator on the folder with the EP registered and gets the pipeline's tokens, which are genai's own on
    the source. QNN's shared context cannot load on x86_64: its folder is written, genai's run on it not checked."""
    _with_model(project, builder_output["llama"])
    (project.root / "configs").mkdir(exist_ok=True)
    (project.root / "configs" / "ov.json").write_text('{"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}\n')
    project.manifest(SHARED_CACHE)
    done = project.doit("--continue", "group:llm-ov", "validate:llm-ov", "group:llm-qnn", "validate:llm-qnn",
                        check=False)
    tasks = build_report(project)
    assert tasks["validate:llm-ov"]["status"] == "validated", done.stdout
    assert "the folder is what onnxruntime-genai loads" in next(
        line for line in done.stdout.splitlines() if line.startswith("compiled group:llm-ov"))
    folder = project.artifacts / "ov" / "groups" / "llm-ov"
    assert {"genai_config.json", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in folder.iterdir()}
    config = json.loads((folder / "genai_config.json").read_text())
    model = config["model"]
    assert model["type"] == "decoder-pipeline" and model["context_length"] == 32 and "filename" not in model["decoder"]
    assert model["decoder"]["sliding_window"]["window_size"] == 8 and config["search"]["past_present_share_buffer"]
    stages = [next(iter(stage.items())) for stage in model["decoder"]["pipeline"]]
    assert [(name, s["filename"], s["run_on_prompt"], s["run_on_token_gen"]) for name, s in stages] == [
        ("llama.prompt", "llama.prompt.onnx", True, False), ("llama.token", "llama.token.onnx", False, True)]
    session = stages[0][1]["session_options"]
    assert session["ep.share_ep_contexts"] == "1"
    inline = '{"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}'
    assert session["provider_options"] == [{"OpenVINO": {"load_config": inline}}]
    pipeline = json.loads((folder / "validation.json").read_text())["pipeline"]
    assert pipeline["genai_folder"]["status"] == "agrees", pipeline
    assert pipeline["tokens_cpu"] == pipeline["tokens_ep"] == genai_tokens(project.root / "models" / "llama",
                                                                          pipeline["prompt"], 5)

    qnn = project.artifacts / "qnn-htp" / "groups" / "llm-qnn"
    providers = json.loads((qnn / "genai_config.json").read_text())["model"]["decoder"]["pipeline"][0][
        "llama.prompt"]["session_options"]["provider_options"]
    assert list(providers[0]) == ["qnn"]
    report = json.loads((qnn / "validation.json").read_text())
    assert report["status"] == "skipped" and report["pipeline"]["genai_folder"]["status"] == "not checked", report

    # genai's check judges: the folder's own tokens pass, other tokens or a config the graphs cannot take depart
    assert genai_folder_check(folder, pipeline["prompt"], pipeline["tokens_cpu"])["status"] == "agrees"
    other = [(t + 1) % 512 for t in pipeline["tokens_cpu"]]
    assert genai_folder_check(folder, pipeline["prompt"], other)["status"] == "departs"
    wrong = project.root / "wrong"
    shutil.copytree(folder, wrong)
    config["model"]["decoder"]["sliding_window"]["window_size"] = 4  # the prompt graph takes 8 tokens
    (wrong / "genai_config.json").write_text(json.dumps(config))
    checked = genai_folder_check(wrong, pipeline["prompt"], pipeline["tokens_cpu"])
    assert checked["status"] == "departs" and "cannot run the folder" in checked["detail"], checked


def test_a_pipeline_group_whose_cache_genai_cannot_feed_says_why_it_has_no_genai_folder(project, builder_output):
    """past < total (a window the pipeline validation handles): the group builds, and its compile line says why
    its folder has no genai_config.json and what would give it one."""
    _with_model(project, builder_output["llama"])
    project.manifest(VARIANTS)
    done = project.doit("group:llm", check=False)
    line = next(line for line in done.stdout.splitlines() if line.startswith("compiled group:llm"))
    assert "no onnxruntime-genai folder" in line and "past_sequence_length = total_sequence_length" in line, line
    assert not (project.artifacts / "qnn-htp" / "groups" / "llm" / "genai_config.json").exists()
