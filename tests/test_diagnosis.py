"""Failures that say what would fix them (graph patterns QNN HTP rejects, fp16 just below a threshold) and the
opt-in `rewrite` stage, on generated models built for real through doit."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort

from conftest import build_report, ran
from epbuild.manifest.schema import REWRITES as REWRITE_NAMES
from epbuild.steps.diagnosis import REWRITES, input_branches, rewrite_rmsnorm, rsqrt_rmsnorms, strided_gathers
from helpers import single_op_model
from real_models import cancellation_chain, rmsnorm_block, sample_rate_branches, strided_after_conv

QNN = """
[targets.qnn-htp]
ep = "qnn"
options = { soc_model = 60 }
"""


def entry(name: str, extra: str = "", path: str | None = None) -> str:
    return f'\n[models.{name}]\npath = "models/{path or name}.onnx"\n{extra}\n'


def reason(project, task: str) -> str:
    return build_report(project)[task]["reason"]


def test_rsqrt_rmsnorm_fails_on_qnn_naming_the_rewrite_which_then_compiles_and_validates(project):
    """LLaMA/T5 RMSNorm as both torch exporters write it fails QNN HTP's finalize; the failure names the pattern
    and `rewrite = ["rmsnorm"]`, whose stage output (x / sqrt) compiles and matches the model as declared."""
    models = project.root / "models"
    rmsnorm_block(models / "rsqrt.onnx", "rsqrt")
    rmsnorm_block(models / "one_over.onnx", "one_over")
    project.manifest(entry("rsqrt") + entry("one_over") + QNN)
    project.doit("--continue", check=False)
    for name in ("rsqrt", "one_over"):
        line = reason(project, f"compile:{name}@qnn-htp")
        assert "QNN_COMMON_ERROR_MEM_ALLOC" in line and "\n" not in line
        assert ("the model writes RMSNorm as x * rsqrt(mean(x^2) + eps) (2 place(s), e.g. 'layers.0.Mul'), which "
                f"QNN HTP is known to fail to finalize: add rewrite = [\"rmsnorm\"] to models.{name}") in line

    project.manifest(entry("rsqrt", 'rewrite = ["rmsnorm"]') + entry("one_over", 'rewrite = ["rmsnorm"]') + QNN)
    done = project.doit()
    assert {"rewrite:rsqrt", "rewrite:one_over", "compile:rsqrt@qnn-htp"} <= ran(done)
    for name in ("rsqrt", "one_over"):
        rewritten = onnx.load(str(project.artifacts / ".stages" / name / "rewrite" / f"{name}.onnx"))
        ops = [node.op_type for node in rewritten.graph.node]
        assert "Reciprocal" not in ops and ops.count("Div") == 2 and not rsqrt_rmsnorms(rewritten.graph)
        validation = json.loads((project.artifacts / "qnn-htp" / name / "validation.json").read_text())
        assert validation["status"] == "passed" and validation["outputs"]["hidden_states"]["snr_db"] > 50


def test_the_rmsnorm_rewrite_keeps_the_value_on_cpu(tmp_path):
    source = rmsnorm_block(tmp_path / "m.onnx", "one_over", hidden=32, tokens=4)
    model = onnx.load(str(source))
    assert rewrite_rmsnorm(model.graph) == 2 and REWRITES["rmsnorm"] is rewrite_rmsnorm
    assert tuple(REWRITES) == REWRITE_NAMES  # the manifest accepts exactly the rewrites that exist
    x = np.random.default_rng(0).standard_normal((1, 4, 32)).astype(np.float32)
    before = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    after = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_a_rewrite_the_model_has_no_place_for_is_refused_naming_the_key(project):
    rmsnorm_block(project.root / "models" / "plain.onnx", "div", hidden=32, tokens=4)
    project.manifest(entry("plain", 'rewrite = ["rmsnorm"]') + QNN)
    project.doit("--continue", check=False)
    line = reason(project, "rewrite:plain")
    assert "models.toml: models.plain.rewrite: the model has no rmsnorm pattern to rewrite" in line
    assert line.endswith("remove it from rewrite")


def test_an_unknown_rewrite_is_a_manifest_error(project):
    project.manifest(entry("tinycnn", 'rewrite = ["layernorm"]') + QNN)
    done = project.doit("list", check=False)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: models.toml: models.tinycnn.rewrite: must list rewrites from "
                                          "rmsnorm"), done.stderr


def test_the_dynamo_as_strided_pattern_is_named_when_qnn_aborts(project):
    strided_after_conv(project.root / "models" / "strided.onnx")
    project.manifest(entry("strided") + QNN)
    project.doit("--continue", check=False)
    line = reason(project, "compile:strided@qnn-htp").splitlines()[0]  # the child's output excerpt follows
    assert "killed by SIGABRT" in line
    assert "as_strided pattern (Conv -> Reshape -> Gather -> Transpose, 1 place(s), e.g. 'node_as_strided')" in line
    assert "torch.onnx.export(..., dynamo=False)" in line


def test_graph_patterns_are_found_only_where_they_are(tmp_path):
    plain = onnx.load(str(rmsnorm_block(tmp_path / "div.onnx", "div", hidden=8, tokens=2)))
    assert not rsqrt_rmsnorms(plain.graph) and not strided_gathers(plain.graph) and not input_branches(plain.graph)
    assert [n.name for n in strided_gathers(onnx.load(str(strided_after_conv(tmp_path / "s.onnx"))).graph)] == [
        "node_as_strided"]
    assert input_branches(onnx.load(str(sample_rate_branches(tmp_path / "vad.onnx"))).graph) == {"branch": ["sr"]}


def test_fp16_just_below_the_threshold_says_so_and_what_to_set(project):
    rmsnorm_block(project.root / "models" / "norm.onnx", "div")
    project.manifest(entry("norm", "validation = { min_snr_db = 66 }") + QNN)
    project.doit("--continue", check=False)
    line = reason(project, "validate:norm@qnn-htp")
    assert "< min_snr_db 66" in line
    assert "this fp32 model runs in fp16 on the HTP (about 3 decimal digits)" in line
    assert "relax this target only (validation.targets = { qnn-htp = { min_snr_db = " in line
    assert "in models.norm), or build a quantized target" in line


def test_a_model_qnn_takes_nothing_of_names_its_op_types(project):
    single_op_model(project.root / "models" / "det.onnx", "Det")
    project.manifest(entry("det") + QNN)
    project.doit("--continue", check=False)
    line = reason(project, "compile:det@qnn-htp")
    assert "QNNExecutionProvider took none of the model's nodes; alone, it takes no node of Det (1 node)" in line


def test_localise_finds_the_node_where_the_ep_departs_from_cpu(project):
    """validation.localise on a failed fp16 validation: a 120-layer chain with one cancellation; two rounds of
    checkpoints find the node (Sub), its SNR there and its input's, in the failure line and validation.json."""
    cancellation_chain(project.root / "models" / "chain.onnx")
    project.manifest(entry("chain", "validation = { localise = true }") + QNN)
    project.doit("--continue", check=False)
    line = reason(project, "validate:chain@qnn-htp")
    assert "snr_db" in line and "localise: first departs at node 'cancel.sub' (Sub), tensor 'cancel.out' at SNR" in line
    divergence = json.loads((project.artifacts / "qnn-htp" / "chain" / "validation.json").read_text())["divergence"]
    assert divergence["found"] and divergence["node"] == "cancel.sub" and divergence["rounds"] == 2
    assert divergence["snr_db"] < 40 and divergence["inputs_snr_db"]["cancel.shifted"] > 40


def test_localise_says_when_every_intermediate_holds(project):
    """The departure in the node that computes the graph's output: said as such, never a made-up node."""
    cancellation_chain(project.root / "models" / "late.onnx", depth=6, at=6)
    project.manifest(entry("late", "validation = { localise = true }") + QNN)
    project.doit("--continue", check=False)
    divergence = json.loads((project.artifacts / "qnn-htp" / "late" / "validation.json").read_text())["divergence"]
    assert divergence == {**divergence, "found": False, "checked": 7, "rounds": 1}
    assert "localise: the 7 intermediate tensors checked all hold; the outputs' own nodes depart" in reason(
        project, "validate:late@qnn-htp")
