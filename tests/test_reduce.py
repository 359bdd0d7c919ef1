"""`epbuild reduce`: a failing QNN compile, or an artifact that departs from CPU under fp16, reduced to the few
nodes that still fail the same way, each probe a real compile (and run); the repro folder's `repro.py` reproduces
the failure in a fresh process with onnxruntime and the plugin only; the reduction is said on the console and kept
in the build report; known probes are not asked again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import onnx
import pytest

from conftest import build_report
from epbuild.steps.reduction.reduce import SIGNATURE_DB
from real_models import cancellation_chain, kv_decoder, rmsnorm_block, rounding_then_overflow, strided_after_conv

QNN = '[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n[targets.cpu]\nep = "cpu"\n'


def _epbuild(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "epbuild", *args], cwd=project.root, env=project.env,
                          capture_output=True, text=True, timeout=900)


def _repro(folder) -> subprocess.CompletedProcess:
    """repro.py run as a vendor would: a fresh Python, without epbuild on its path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",) and not k.startswith("EPBUILD_")}
    return subprocess.run([sys.executable, "-I", "repro.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def rmsnorm(project):
    """Two RMSNorm + Linear layers with the rsqrt QNN HTP fails to finalize, 17 nodes."""
    rmsnorm_block(project.root / "models" / "rms.onnx")
    project.manifest('[models.rms]\npath = "models/rms.onnx"\ntargets = ["qnn-htp"]\n' + QNN)
    return project


def test_a_qnn_finalize_failure_reduces_to_the_rmsnorm_and_its_repro_reproduces(rmsnorm):
    project = rmsnorm
    failed = project.doit("compile:rms@qnn-htp", check=False)
    assert failed.returncode == 1
    assert "reduce it to a repro for a bug report: epbuild reduce compile:rms@qnn-htp" in failed.stdout
    reason = build_report(project)["compile:rms@qnn-htp"]["reason"]  # the failure's one line ends with it
    assert "\n" not in reason and reason.endswith("; reduce it to a repro for a bug report: epbuild reduce "
                                                    "compile:rms@qnn-htp")
    done = _epbuild(project, "reduce", "compile:rms@qnn-htp")
    assert done.returncode == 0, done.stdout + done.stderr
    folder = project.artifacts / "repro" / "rms@qnn-htp"
    reduction = json.loads((folder / "reduction.json").read_text())
    assert reduction["nodes_before"] == 17 and reduction["nodes_after"] <= 8 and reduction["complete"]
    assert {"Sqrt", "Reciprocal", "Mul"} <= set(reduction["ops"]) and "MatMul" not in reduction["ops"]
    assert "Failed to finalize QNN graph" in reduction["stem"]
    assert (f"reduced compile:rms@qnn-htp: 17 -> {reduction['nodes_after']} nodes" in done.stdout
            and "repro: artifacts/repro/rms@qnn-htp/ (python repro.py)" in done.stdout)
    model = onnx.load(str(folder / "model.onnx"))
    assert len(model.graph.node) == reduction["nodes_after"]
    onnx.checker.check_model(model, full_check=True)  # weights included, a model of its own
    assert {"options.json", "versions.json", "failure.log", "inputs.npz", "README.md"} <= {
        p.name for p in folder.iterdir()}
    options = json.loads((folder / "options.json").read_text())
    assert options["ep"] == "QNNExecutionProvider" and options["provider_options"]["soc_model"] == "60"
    assert "Failed to finalize QNN graph" in (folder / "failure.log").read_text()
    assert "epbuild" not in (folder / "repro.py").read_text().split('"""', 2)[2]  # no import of epbuild
    reproduced = _repro(folder)
    assert reproduced.returncode == 1 and "reproduced:" in reproduced.stdout, reproduced.stdout + reproduced.stderr
    assert "Failed to finalize QNN graph" in reproduced.stdout
    entry = build_report(project)["reduce:rms@qnn-htp"]
    assert entry["status"] == "reduced" and entry["reduction"]["nodes_after"] == reduction["nodes_after"]
    again = _epbuild(project, "reduce", "rms@qnn-htp")  # every probe known by its subgraph's content
    assert f"17 -> {reduction['nodes_after']} nodes" in again.stdout and " in 0 compiles" in again.stdout
    assert json.loads((folder / "reduction.json").read_text())["kept"] == reduction["kept"]


def _decoder_with_rsqrt_norms(path) -> None:
    """The tests' LLaMA-like decoder (hidden 512) with each RMSNorm as torch's dynamo exporter writes it:
    pow(x, 2), x * Reciprocal(Sqrt(...)), weight * normed: QNN HTP fails to finalize it."""
    import numpy as np
    from onnx import helper, numpy_helper

    kv_decoder(path, hidden=512, heads=8)
    model = onnx.load(str(path))
    model.graph.initializer.append(numpy_helper.from_array(np.array([2.0], np.float32), "two"))
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Mul" and node.output[0].endswith(".squared"):
            nodes.append(helper.make_node("Pow", [node.input[0], "two"], list(node.output)))
        elif node.op_type == "Div" and node.input[1].endswith(".rms"):
            rsqrt = f"{node.input[1][:-4]}.rsqrt"
            nodes += [helper.make_node("Reciprocal", [node.input[1]], [rsqrt]),
                      helper.make_node("Mul", [node.input[0], rsqrt], list(node.output))]
        elif node.op_type == "Mul" and node.input[0].endswith(".normed"):
            nodes.append(helper.make_node("Mul", [node.input[1], node.input[0]], list(node.output)))
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(path), save_as_external_data=True, location=f"{path.name}.data")


def test_the_rsqrt_rmsnorm_inside_a_decoder_reduces_to_one_norm(project):
    _decoder_with_rsqrt_norms(project.root / "models" / "dec.onnx")
    project.manifest('[models.dec]\npath = "models/dec.onnx"\ntargets = ["qnn-htp"]\ndims = { batch_size = 1, '
                     'sequence_length = 128, past_sequence_length = 128, total_sequence_length = 256 }\n' + QNN)
    done = _epbuild(project, "reduce", "compile:dec@qnn-htp")
    assert done.returncode == 0, done.stdout + done.stderr
    folder = project.artifacts / "repro" / "dec@qnn-htp"
    reduction = json.loads((folder / "reduction.json").read_text())
    assert reduction["nodes_before"] > 80 and reduction["nodes_after"] <= 8 and "Reciprocal" in reduction["ops"]
    assert not {"MatMul", "Softmax", "Gather"} & set(reduction["ops"])  # no attention, no embedding: one norm
    assert _repro(folder).returncode == 1


def _inside_a_larger_graph(path) -> None:
    """Elementwise layers before and after the model's own nodes (shapes kept)."""
    from onnx import helper

    model = onnx.load(str(path))
    graph = model.graph
    first, last = graph.input[0].name, graph.output[0].name
    for node in graph.node:
        node.input[:] = [f"{first}.in" if name == first else name for name in node.input]
        node.output[:] = [f"{last}.out" if name == last else name for name in node.output]
    before = [helper.make_node("Relu", [first], ["pre.0"]), helper.make_node("Sigmoid", ["pre.0"], ["pre.1"]),
              helper.make_node("Abs", ["pre.1"], [f"{first}.in"])]
    after = [helper.make_node("Relu", [f"{last}.out"], ["post.0"]), helper.make_node("Neg", ["post.0"], ["post.1"]),
             helper.make_node("Abs", ["post.1"], [last])]
    nodes = [*before, *graph.node, *after]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(path))


def test_a_compile_that_aborts_reduces_to_the_strided_gather(project):
    """torch dynamo's as_strided after a Conv, inside other layers: QNN's compile aborts the process; the crash is
    the failure kept, and its output goes to failure.log."""
    strided_after_conv(project.root / "models" / "strided.onnx")
    _inside_a_larger_graph(project.root / "models" / "strided.onnx")
    project.manifest('[models.strided]\npath = "models/strided.onnx"\ntargets = ["qnn-htp"]\n' + QNN)
    done = _epbuild(project, "reduce", "compile:strided@qnn-htp")
    assert done.returncode == 0, done.stdout + done.stderr
    folder = project.artifacts / "repro" / "strided@qnn-htp"
    reduction = json.loads((folder / "reduction.json").read_text())
    assert reduction["nodes_before"] == 10 and reduction["nodes_after"] <= 4 and "Gather" in reduction["ops"]
    assert "killed by SIGABRT" in reduction["stem"] and "full output" not in reduction["stem"]
    reproduced = _repro(folder)
    assert reproduced.returncode != 0, reproduced.stdout + reproduced.stderr  # an exception, or the abort itself


def test_a_validation_departing_under_fp16_reduces_to_the_cancelling_subtraction(project):
    """(h + 1000) - 1000 deep inside a 123-node chain: on the HTP's fp16 the validation fails; the reduction feeds
    each subgraph the values it has in the whole model on CPU, and keeps the node that departs."""
    cancellation_chain(project.root / "models" / "chain.onnx")
    project.manifest('[models.chain]\npath = "models/chain.onnx"\ntargets = ["qnn-htp"]\n' + QNN)
    failed = project.doit("validate:chain@qnn-htp", check=False)
    assert failed.returncode == 1
    assert "reduce it to a repro for a bug report: epbuild reduce validate:chain@qnn-htp" in failed.stdout
    done = _epbuild(project, "reduce", "validate:chain@qnn-htp")
    assert done.returncode == 0, done.stdout + done.stderr
    folder = project.artifacts / "repro" / "chain@qnn-htp"
    reduction = json.loads((folder / "reduction.json").read_text())
    assert reduction["kind"] == "divergence" and reduction["task"] == "validate:chain@qnn-htp"
    assert reduction["nodes_before"] == 123 and reduction["nodes_after"] <= 2 and "Sub" in reduction["ops"]
    assert "reduced validate:chain@qnn-htp: 123 -> " in done.stdout
    options = json.loads((folder / "options.json").read_text())
    assert options["thresholds"]["min_snr_db"] == 40.0  # the failed validation's
    import numpy as np

    with np.load(folder / "inputs.npz") as inputs:  # the values the subgraph reads in the whole model
        assert {v.name for v in onnx.load(str(folder / "model.onnx")).graph.input} == set(inputs.files)
    reproduced = _repro(folder)
    assert reproduced.returncode == 1 and "reproduced: output" in reproduced.stdout, reproduced.stdout
    assert build_report(project)["reduce:chain@qnn-htp"]["reduction"]["kind"] == "divergence"


def test_a_reduction_keeps_the_failures_signature_not_a_milder_miss_before_it(project):
    """magika on qnn-htp fp16: every output off by an overflow (localise: LayerNorm_1's ReduceSum), but the
    reduction handed over LayerNorm_0's Rsqrt, 37.7 dB, ordinary rounding, under a README claiming the whole
    model's -129.3 dB. A subgraph fails the same way only when its worst SNR is within a few dB of the whole
    model's (and keeps the node localise named, where it ran); the README's figures are the repro's own."""
    rounding_then_overflow(project.root / "models" / "mixed.onnx")
    project.manifest('[models.mixed]\npath = "models/mixed.onnx"\ntargets = ["qnn-htp"]\n'
                     'validation = { localise = true }\n' + QNN)
    failed = project.doit("validate:mixed@qnn-htp", check=False)
    assert failed.returncode == 1 and "first departs at node 'round.sub' (Sub)" in failed.stdout, failed.stdout
    done = _epbuild(project, "reduce", "validate:mixed@qnn-htp")
    assert done.returncode == 0, done.stdout + done.stderr
    folder = project.artifacts / "repro" / "mixed@qnn-htp"
    reduction = json.loads((folder / "reduction.json").read_text())
    assert "ReduceSum" in reduction["ops"] and "Sub" not in reduction["ops"], reduction  # the overflow, alone
    readme = (folder / "README.md").read_text()
    kept, whole = (float(x) for x in re.search(r"worst SNR (\S+) dB \(the whole model's: (\S+) dB\)", readme).groups())
    assert kept <= whole + SIGNATURE_DB and abs(whole - 2.6) < 1, readme  # the validation's own 2.6 dB
    reproduced = _repro(folder)
    assert reproduced.returncode == 1 and "dB from CPU" in reproduced.stdout, reproduced.stdout
    assert float(re.search(r"is (\S+) dB from CPU", reproduced.stdout).group(1)) == pytest.approx(kept, abs=0.1)


def test_the_node_localise_named_stays_where_its_departure_is_the_failures(tmp_path):
    """Where the validation's localise found a first departure as far off as the whole model (magika: the overflowing
    ReduceSum), the reduction keeps that node; a milder miss it found first (ordinary rounding, 30 dB above the
    whole model's) is not kept for its own sake, nor is anything where localise did not run."""
    from epbuild.contracts.statuses import Verdict
    from epbuild.contracts.validation import ValidationRecord
    from epbuild.steps.reduction.reduce import _localised_node
    from epbuild.steps.reduction.reduce_graph import Subgraphs

    graph = Subgraphs(rounding_then_overflow(tmp_path / "mixed.onnx"), None)

    def record(node: str, snr: float) -> ValidationRecord:
        return ValidationRecord(Verdict.FAILED, figures={"divergence": {"found": True, "node": node, "snr_db": snr}})

    overflow = next(i for i, node in enumerate(graph.nodes) if node.name == "norm.sum")
    assert _localised_node(record("norm.sum", -120.0), graph, -125.0) == overflow
    assert _localised_node(record("round.sub", 33.8), graph, 2.6) is None
    assert _localised_node(ValidationRecord(Verdict.FAILED), graph, 2.6) is None
    assert _localised_node(record("no.such.node", -120.0), graph, -125.0) is None


def test_what_cannot_be_reduced_says_why_in_one_line(rmsnorm):
    project = rmsnorm
    project.manifest('[models.rms]\npath = "models/rms.onnx"\nrewrite = ["rmsnorm"]\n' + QNN)
    compiles = _epbuild(project, "reduce", "compile:rms@qnn-htp")
    assert compiles.returncode == 1 and ("compile:rms@qnn-htp compiles now and validate:rms@qnn-htp has not failed "
                                         "(run it first): nothing to reduce") in compiles.stdout
    cpu = _epbuild(project, "reduce", "compile:rms@cpu")
    assert cpu.returncode == 1 and "reduce:rms@cpu: a CPU target compiles nothing to reduce" in cpu.stdout
    # the command's answer, not a build's outcome: no failed row a later build would never clear
    assert not any(name.startswith("reduce:") for name in build_report(project))
    assert "reduce:rms" not in (project.artifacts / "report.html").read_text()
    bare = _epbuild(project, "reduce")
    assert bare.returncode == 2 and bare.stderr.strip() == (
        "error: epbuild reduce TASK: name the failing compile or validation, e.g. epbuild reduce validate:MODEL@TARGET")


def test_a_reduction_past_its_time_budget_keeps_the_smallest_failing_subgraph_found(rmsnorm):
    project = rmsnorm
    project.manifest('[build]\nreduce_budget_s = 0.5\n' + project.root.joinpath("models.toml").read_text())
    done = _epbuild(project, "reduce", "compile:rms@qnn-htp")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(its time budget ran out: smaller may exist)" in done.stdout
    reduction = json.loads((project.artifacts / "repro" / "rms@qnn-htp" / "reduction.json").read_text())
    assert not reduction["complete"] and reduction["nodes_after"] <= reduction["nodes_before"]
