"""Artifacts used as an application uses them: `epbuild.open_session` (the README's snippet, run verbatim) and
`epbuild run`, on cpu and on qnn-htp through the HTP simulator."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from conftest import REPO, SOURCE
from epbuild.errors import UserError
from helpers import TINYCNN_CPU_QNN

MANIFEST = TINYCNN_CPU_QNN


@pytest.fixture
def built(project):
    project.manifest(MANIFEST)
    project.doit()
    return project


def _snippet() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Use the artifacts"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_snippet_opens_a_qnn_artifact_in_one_call(built):
    done = subprocess.run([sys.executable, "-c", _snippet()], cwd=built.root, capture_output=True, text=True,
                          env={**built.env, "PYTHONPATH": str(SOURCE)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "QNNExecutionProvider (1, 10)"


def test_open_session_runs_each_artifact_on_its_ep_as_the_source_computes(built):
    import epbuild

    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    want = ort.InferenceSession(str(built.root / "models" / "tinycnn.onnx")).run(None, {"x": x})[0]
    for target, provider in (("cpu", "CPUExecutionProvider"), ("qnn-htp", "QNNExecutionProvider")):
        session = epbuild.open_session(built.artifacts / target / "tinycnn" / "tinycnn.onnx")
        assert session.get_providers()[0] == provider
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=0.02, atol=0.02)
    with pytest.raises(UserError, match=r"no artifact\.json in"):
        epbuild.open_session(built.root / "models")


def test_epbuild_run_prints_outputs_and_latency_or_one_line(built):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "epbuild", "run", *args], cwd=built.root, env=built.env,
                              capture_output=True, text=True, timeout=300)

    done = run("tinycnn@qnn-htp", "--runs", "3")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("qnn-htp/tinycnn: QNNExecutionProvider on QNNExecutionProvider") and "session created" \
        in lines[0]
    assert re.match(r"  logits: \[1, 10\] float32  min \S+, max \S+, mean \S+, std \S+", lines[1])
    assert re.match(r"  latency over 3 runs: p50 [\d.]+ ms, p90 [\d.]+ ms", lines[2])
    np.savez(built.root / "x.npz", x=np.zeros((1, 3, 64, 64), np.float32))
    several = run("tinycnn")
    assert several.returncode == 2 and several.stderr.strip() == (
        "error: tinycnn: built for several targets: name one (tinycnn@cpu, tinycnn@qnn-htp)")
    given = run("tinycnn@cpu", "--inputs", "x.npz", "--runs", "0")
    assert given.returncode == 0 and len(given.stdout.splitlines()) == 2, given.stderr  # no runs: no latency line
    missing = run("tinycnn@openvino-cpu")  # a target the manifest does not declare: said so, with those it does
    assert missing.returncode == 2 and "target 'openvino-cpu' is not declared in the manifest" in missing.stderr
    assert "Traceback" not in missing.stderr
    (built.root / "not.npz").write_text("text")
    np.savez(built.root / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    (built.root / "folder.npz").mkdir()
    for bad in ("absent.npz", "folder.npz", "not.npz", "objects.npz"):  # the user's file: one line, no traceback
        done = run("tinycnn@cpu", "--inputs", bad)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"error: --inputs {bad} cannot be read as .npz") and \
            len(done.stderr.splitlines()) == 1, done.stderr
    endless = run("tinycnn@cpu", "--runs", "99999999999")
    assert endless.returncode == 2 and endless.stderr.strip() == "error: --runs 99999999999: give 0 to 10000 timed runs"


def test_epbuild_run_names_undeclared_and_left_over_targets(tmp_path):
    """A target the manifest does not declare is said so, with the declared ones (it offered `epbuild
    compile:m@qnn`, a task that cannot exist), and artifacts of targets no longer declared are left over, never a
    choice offered."""
    from epbuild.errors import UserError
    from epbuild.runtime.run import declared_targets, find_artifact

    (tmp_path / "models.toml").write_text('[targets.cpu]\nep = "cpu"\n[targets.qnn-htp]\nep = "qnn"\n')
    for target in ("cpu", "old"):
        (tmp_path / "artifacts" / target / "m").mkdir(parents=True)
        (tmp_path / "artifacts" / target / "m" / "artifact.json").write_text("{}")
    declared = declared_targets(tmp_path / "models.toml")
    assert declared == {"cpu", "qnn-htp"}
    with pytest.raises(UserError, match=r"^m@qnn: target 'qnn' is not declared in the manifest \(did you mean "
                                        r"'qnn-htp'\?\); declared targets: cpu, qnn-htp$"):
        find_artifact(tmp_path / "artifacts", "m@qnn", declared)
    with pytest.raises(UserError, match=r"target 'old' is not declared .*left over from an earlier manifest"):
        find_artifact(tmp_path / "artifacts", "m@old", declared)
    assert find_artifact(tmp_path / "artifacts", "m", declared) == tmp_path / "artifacts" / "cpu" / "m"
    (tmp_path / "artifacts" / "cpu" / "m" / "artifact.json").unlink()
    with pytest.raises(UserError, match=r"no artifact of model 'm' .*; left over from targets no longer declared: old "
                                        r"\(`epbuild prune` removes them\)$"):
        find_artifact(tmp_path / "artifacts", "m", declared)


def test_epbuild_check_says_what_onnx_runtime_answers_and_never_more(built):
    """The QNN artifact carries the EP's compatibility string (SDK versions and the soc_model); on this host
    without an NPU the QNN EP refuses to judge it, which is said as such, never as compatible."""
    import json

    record = json.loads((built.artifacts / "qnn-htp" / "tinycnn" / "artifact.json").read_text())
    assert record["compatibility"].startswith("v2:") and ":60:" in record["compatibility"]
    assert "compatibility" not in json.loads((built.artifacts / "cpu" / "tinycnn" / "artifact.json").read_text())
    done = subprocess.run([sys.executable, "-m", "epbuild", "check"], cwd=built.root, env=built.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line and "/" in line.split(":")[0])
    assert lines["cpu/tinycnn"].startswith("a CPU artifact")
    assert lines["qnn-htp/tinycnn"].startswith(("cannot be judged here", "runs", "cannot run"))
    assert "optimally" not in lines["qnn-htp/tinycnn"] or "NPU" in str(ort.get_ep_devices())
    assert f"compatibility <code>{record['compatibility']}</code>" in (built.artifacts / "report.html").read_text()


def test_epbuild_check_names_an_unreadable_artifact_and_escapes_what_it_reads(built):
    """`check` believed what it read: an artifact.json cut short was skipped with exit 0, and a compatibility string
    with terminal escapes cleared the screen and forged a "runs optimally" line. Now the unreadable one is named
    (exit 1) and every control character read from a file reaches the console escaped."""
    import json

    sidecar = built.artifacts / "qnn-htp" / "tinycnn" / "artifact.json"
    record = json.loads(sidecar.read_text())
    record["compatibility"] = "v2:\x1b[2J\x1b[Hcpu/tinycnn: runs optimally\r\n"
    sidecar.write_text(json.dumps(record))
    text = (built.artifacts / "cpu" / "tinycnn" / "artifact.json").read_text()
    (built.artifacts / "cpu" / "tinycnn" / "artifact.json").write_text(text[: len(text) // 2])
    done = subprocess.run([sys.executable, "-m", "epbuild", "check"], cwd=built.root, env=built.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "error: 1 artifact(s) could not be read" in done.stderr
    assert re.search(r"^cpu/tinycnn: unreadable artifact\.json \(.*\): nothing judged", done.stdout, re.M)
    assert "\x1b" not in done.stdout and "\r" not in done.stdout and "\\x1b[2J" in done.stdout
    assert not re.search(r"^cpu/tinycnn: runs optimally", done.stdout, re.M)
    record["compatibility"] = "\x1b[2J\nqnn-htp/tinycnn: runs optimally here\u2028x"  # a newline: a forged line
    sidecar.write_text(json.dumps(record))
    done = subprocess.run([sys.executable, "-m", "epbuild", "check"], cwd=built.root, env=built.env,
                          capture_output=True, text=True, timeout=300)
    assert "\\n" in done.stdout and not re.search(r"^qnn-htp/tinycnn: runs optimally here", done.stdout, re.M)
    assert len([line for line in done.stdout.splitlines() if line.startswith("qnn-htp/tinycnn")]) == 1, done.stdout


def test_printable_escapes_every_control_character_but_newlines_and_tabs():
    from epbuild.errors import UserError, printable

    assert printable("a\x1b[31mb\x07\x7f\x9b\u202ec\td\n") == "a\\x1b[31mb\\x07\\x7f\\x9b\\u202ec\td\n"
    assert printable("plain ünïcode") == "plain ünïcode"
    assert printable("a\nb\rc\td", one_line=True) == "a\\nb\\rc\td"
    assert str(UserError("m.toml", "models.x", "name 'a\x1b[2Jb'")) == "m.toml: models.x: name 'a\\x1b[2Jb'"


def test_epbuild_run_takes_the_recorded_shapes_and_says_a_simulator_is_one(project):
    """A symbolic batch built with `inputs` runs without --inputs (artifact.json records the shape it was built
    with: tf2onnx's `unk__214` refused it before); on the HTP simulator one timed run by default, said to be the
    simulator's latency, with progress on stderr; the EP libraries' own prints never reach stdout."""
    project.manifest('[models.dyn]\npath = "models/dynbatch.onnx"\ninputs = { x = [1, 3, 32, 32] }\n' +
                     MANIFEST[MANIFEST.index("[targets.cpu]"):])
    project.doit()

    def run(*args):
        return subprocess.run([sys.executable, "-m", "epbuild", "run", *args], cwd=project.root, env=project.env,
                              capture_output=True, text=True, timeout=300)

    done = run("dyn@cpu", "--runs", "2")
    assert done.returncode == 0, done.stderr
    assert "latency over 2 runs" in done.stdout
    simulated = run("dyn@qnn-htp")
    assert simulated.returncode == 0, simulated.stderr
    lines = simulated.stdout.splitlines()
    assert lines[0].startswith("qnn-htp/dyn: QNNExecutionProvider") and len(lines) == 3, simulated.stdout
    assert re.match(r"  latency over 1 run: p50 [\d.]+ ms, p90 [\d.]+ ms \(QNN's HTP simulator on this host, not the "
                    r"device's latency\)$", lines[2])
    assert "timed run 1 of 1" in simulated.stderr and "LIBNATIVE" not in simulated.stdout + simulated.stderr


def test_a_placeholder_dimension_in_dims_is_explained(project):
    """tf2onnx names unknown sizes `unk__N`; given in `dims`, it is refused with what to write instead."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("bytes", TensorProto.FLOAT, ["unk__214", 2048])
    graph = helper.make_graph([helper.make_node("Relu", ["bytes"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["unk__214", 2048])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(project.root / "models" / "tf.onnx"))
    project.manifest('[models.tf]\npath = "models/tf.onnx"\ndims = { unk__214 = 1 }\n\n[targets.cpu]\nep = "cpu"\n')
    done = project.doit("list", check=False)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert ("models.tf.dims.unk__214: 'unk__214' is an anonymous placeholder" in done.stderr
            and "e.g. inputs.bytes = [1, 2048] (its shape: ['?', 2048])" in done.stderr), done.stderr
