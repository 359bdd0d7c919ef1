"""A verdict never says more than was checked: an output of small magnitude is judged by its SNR like any other
(it used to be taken for constant and judged against an absolute error 50 times its signal); an output that is
nearly constant for the validation's inputs (relative to its own magnitude) is "inconclusive" when it stays within
the margin (its own verdict in the console line, the summary, build-report.json, junit.xml and report.html, and a
failure with `validation.inconclusive = "fail"`), failed when it departs beyond it, passed only when identical;
and an interrupted validation leaves "interrupted", never an older verdict."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from xml.etree import ElementTree

import numpy as np
import onnx
from onnx import TensorProto, helper

from conftest import build_report
from epbuild.steps.comparison import check, compare
from helpers import WAIT_S, slow_model

THRESHOLDS = {"min_snr_db": 40.0, "min_cosine": 0.9999}


def _judged(want: np.ndarray, got: np.ndarray) -> tuple[list[str], list[str]]:
    return check("y", compare(got, want), 0, THRESHOLDS)


def test_a_small_magnitude_output_is_judged_by_its_snr():
    """A vocoder's waveform: max 2e-4, std 6.7e-5; an artifact 7 dB off fails (it passed as "constant")."""
    rng = np.random.default_rng(0)
    want = (rng.standard_normal(4000) * 6.7e-5).astype(np.float32)
    got = want + (rng.standard_normal(4000) * 3e-5).astype(np.float32)
    failures, undecided = _judged(want, got)
    assert any("snr_db" in f for f in failures) and not undecided


def test_a_nearly_constant_output_within_its_margin_is_inconclusive_beyond_it_failed_identical_passed():
    want = np.full(1000, 0.95, np.float32) + np.linspace(0, 1e-6, 1000, dtype=np.float32)
    failures, undecided = _judged(want, want + np.float32(2e-4))
    assert not failures and len(undecided) == 1 and "nearly constant" in undecided[0]
    failures, undecided = _judged(want, want * np.float32(0.5))
    assert failures and "at its own scale" in failures[0]
    assert _judged(want, want.copy()) == ([], [])
    zeros = np.zeros(1000, np.float32)
    failures, undecided = _judged(zeros, zeros + np.float32(1e-7))
    assert not failures and undecided  # all zeros: nothing to scale a margin by


def _flat_model(path) -> None:
    """Sigmoid(x * 1e-6 + 3): 0.9526 for any generated input, the spread a millionth of it."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "tiny"], ["m"]), helper.make_node("Add", ["m", "three"], ["a"]),
         helper.make_node("Sigmoid", ["a"], ["y"])], "flat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [onnx.numpy_helper.from_array(np.array([1e-6], np.float32), "tiny"),
         onnx.numpy_helper.from_array(np.array([3.0], np.float32), "three")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


FLAT = """
[models.flat]
path = "models/flat.onnx"
targets = ["cpu", "qnn-htp"]
{validation}
[targets.cpu]
ep = "cpu"

[targets.qnn-htp]
ep = "qnn"
options = {{ soc_model = 60 }}
"""


def test_an_inconclusive_validation_has_its_own_verdict_everywhere(project):
    _flat_model(project.root / "models" / "flat.onnx")
    project.manifest(FLAT.format(validation=""))
    done = project.doit()  # inconclusive is not a failure by default
    line = next(line for line in done.stdout.splitlines() if "validate:flat@qnn-htp" in line and
                not line.startswith(".  "))
    assert line.startswith("inconclusive validate:flat@qnn-htp: output 'y' is nearly constant"), done.stdout
    assert "give validation.inputs" in line
    assert "passed validate:flat@cpu" in done.stdout  # identical on CPU: judged
    summary = next(line for line in done.stdout.splitlines() if line.startswith("summary:"))
    assert "1 inconclusive" in summary and "1 validated" in summary
    entries = build_report(project)
    assert entries["validate:flat@qnn-htp"]["status"] == "inconclusive"
    assert "nearly constant" in entries["validate:flat@qnn-htp"]["reason"]  # as failed and skipped entries say why
    assert json.loads((project.artifacts / "qnn-htp" / "flat" / "validation.json").read_text())["status"] == \
        "inconclusive"
    suite = ElementTree.parse(project.artifacts / "junit.xml").getroot()
    case = next(c for c in suite.iter("testcase") if c.get("classname") == "epbuild.qnn-htp")
    skipped = case.find("skipped")
    assert skipped is not None and "nearly constant" in skipped.get("message")
    page = (project.artifacts / "report.html").read_text()
    assert "badge unsure\">inconclusive<" in page

    project.manifest(FLAT.format(validation='validation = { inconclusive = "fail" }'))
    strict = project.doit(check=False)
    assert strict.returncode != 0 and "inconclusive validate:flat@qnn-htp" in strict.stdout
    assert build_report(project)["validate:flat@qnn-htp"]["status"] == "failed"


def test_an_interrupted_validation_keeps_no_older_verdict(project):
    slow_model(project.root / "models" / "slow.onnx", nodes=120000)
    manifest = '[models.slow]\npath = "models/slow.onnx"\ntargets = ["cpu"]\n{v}\n[targets.cpu]\nep = "cpu"\n'
    project.manifest(manifest.format(v=""))
    project.doit()
    assert build_report(project)["validate:slow@cpu"]["status"] == "validated"
    project.manifest(manifest.format(v="validation = { min_snr_db = 50 }"))  # the verdict must be made again
    build = subprocess.Popen([sys.executable, "-m", "doit"], cwd=project.root, env=project.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in build.stdout:  # doit names the task as it starts it
            if line.startswith(".  validate:slow@cpu"):
                break
        time.sleep(1.0)  # its child validating (seconds for 120,000 nodes)
        assert build.poll() is None, build.communicate()
        os.killpg(build.pid, signal.SIGINT)
        build.communicate(timeout=WAIT_S)
    finally:
        if build.poll() is None:
            os.killpg(build.pid, signal.SIGKILL)
            build.wait()
    entry = build_report(project)["validate:slow@cpu"]
    assert entry["status"] == "interrupted", entry
    assert "validated" not in json.dumps(entry)


def test_a_missed_threshold_points_to_bf16_or_to_localise(tmp_path):
    from epbuild.steps.diagnosis import failure_hints

    metrics = {"y": {"snr_db": 43.6}}
    request = {"ep": "openvino", "options": {}, "localise": False, "entry": "models.m"}
    assert "INFERENCE_PRECISION_HINT" in failure_hints(metrics, {"min_snr_db": 60.0}, request, "fp32")[0]
    config = tmp_path / "f32.json"
    config.write_text('{"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}')
    f32 = {**request, "options": {"load_config": str(config)}}
    assert failure_hints(metrics, {"min_snr_db": 60.0}, f32, "fp32") == []  # 43.6 < 60 - 20 does not hold
    far = failure_hints({"y": {"snr_db": 12.0}}, {"min_snr_db": 60.0}, {**request, "ep": "qnn"}, "fp32")
    assert len(far) == 1 and "set validation.localise = true (in models.m)" in far[0]
    assert failure_hints({"y": {"snr_db": 12.0}}, {"min_snr_db": 60.0}, {**request, "localise": True}, "fp32") == []
