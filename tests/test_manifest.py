"""Manifest errors: each names the file, the key path and what would be valid; nothing is built."""

from __future__ import annotations

import pytest

from conftest import REPO
from epbuild.errors import UserError
from epbuild.manifest.parse import load
from epbuild.plan.targets import plan

MODEL = '[models.m]\npath = "models/tinycnn.onnx"\n'


def build_plan(tmp_path, text: str):
    (tmp_path / "models").mkdir(exist_ok=True)
    (tmp_path / "models" / "tinycnn.onnx").write_bytes((REPO / "models" / "tinycnn.onnx").read_bytes())
    (tmp_path / "configs").mkdir(exist_ok=True)
    (tmp_path / "configs" / "ov.json").write_text("{}")
    path = tmp_path / "models.toml"
    path.write_text(text)
    return plan(load(path))


@pytest.mark.parametrize("text, message", [
    ("[models.m\npath = 1", "models.toml: TOML syntax error: "),
    (MODEL + "[targets.t]\nep = \"qnn\"\nembedd = true\n",
     "models.toml: targets.t.embedd: unknown key (did you mean 'embed'?); valid keys: ep, device, compiler"),
    (MODEL + "[modles.x]\n", "models.toml: modles: unknown key (did you mean 'models'?)"),
    (MODEL + "[targets.t]\nep = \"qnn\"\nembed = \"yes\"\n",
     "models.toml: targets.t.embed: must be a boolean, found a string 'yes'"),
    (MODEL + "[targets.t]\nep = \"qnnn\"\n",
     "models.toml: targets.t.ep: unknown EP 'qnnn' (did you mean 'qnn'?); valid: cpu, qnn, openvino, dml"),
    (MODEL + "[targets.t]\nep = \"openvino@pipy\"\n",
     "models.toml: targets.t.ep: unknown EP source 'pipy' (did you mean 'pypi'?); valid: pypi, bundled"),
    (MODEL + "[targets.t]\nep = \"qnn\"\ndevice = \"fpga\"\n",
     "models.toml: targets.t.device: 'fpga' is not valid; valid: npu, gpu, cpu"),
    (MODEL + "[targets.t]\nep = \"dml\"\ndevice = \"npu\"\n",
     "models.toml: targets.t.device: DmlExecutionProvider does not build for 'npu'; valid devices: gpu"),
    (MODEL + "[targets.t]\nep = \"qnn\"\ncompiler = \"qairt2\"\n",
     "models.toml: targets.t.compiler: 'qairt2' is not valid (did you mean 'qairt'?); valid: ort, ort_session, "
     "qaic, qairt"),
    (MODEL + "[targets.t]\nep = \"qnn\"\noptions = { soc_modle = 60 }\n",  # the closest named, not all 40
     "models.toml: targets.t.options.soc_modle: unknown QNNExecutionProvider option (did you mean 'soc_model'?); "
     "every option it takes: epbuild's docs, targets/qnn.md"),
    (MODEL + "[targets.t]\nep = \"qnn\"\noptions = { backend_type = \"npu\" }\n",  # not "did you mean 'gpu'"
     "models.toml: targets.t.options.backend_type: 'npu' is not a value QNNExecutionProvider knows (the NPU is "
     "QNN's HTP: backend_type = \"htp\")"),
    (MODEL + "[targets.t]\nep = \"openvino\"\noptions = { precision = \"FP32\" }\n",
     "models.toml: targets.t.options.precision: the OpenVINO plugin EP ignores it; set it in the load_config JSON"),
    (MODEL + "[targets.t]\nep = \"qnn\"\noptions = { soc_model = [60] }\n",
     "models.toml: targets.t.options.soc_model: a list of one SoC is a plain target: write soc_model = 60"),
    (MODEL + "[targets.t]\nep = \"qnn\"\noptions = { soc_model = [] }\n",
     "models.toml: targets.t.options.soc_model: an empty list names no SoC: give one"),
    (MODEL + "[targets.t]\nep = \"qnn\"\noptions = { vtcm_mb = [4, 8] }\n",
     "models.toml: targets.t.options.vtcm_mb: a list is taken only by QNN's soc_model"),
    (MODEL + "[targets.t]\nep = \"qnn\"\noptions = { soc_model = { a = 1 } }\n",
     "models.toml: targets.t.options.soc_model: must be a string, number or boolean, found dict"),
    (MODEL + "[targets.t]\nep = \"cpu\"\nembed = true\n", "models.toml: targets.t.embed: does not apply to ep"),
    (MODEL + "[targets.t]\nep = \"qnn\"\noptimization_level = \"all\"\n",
     "models.toml: targets.t.optimization_level: applies only to ep = \"cpu\""),
    (MODEL + "[targets.t]\nep = \"openvino\"\noptions = { load_config = \"configs/missing.json\" }\n"
             "option_files = [\"load_config\"]\n",
     "models.toml: targets.t.options.load_config: option file not found: "),
    (MODEL + "[targets.t]\nep = \"openvino\"\noptions = { load_config = \"configs\" }\n"
             "option_files = [\"load_config\"]\n",
     "models.toml: targets.t.options.load_config: option file is a folder: "),
    (MODEL + "[targets.t]\nep = \"openvino\"\noption_files = [\"load_config\"]\n",
     "models.toml: targets.t.option_files[0]: names option 'load_config', but options has no such key"),
    ('[models.m]\npath = "models/nothere.onnx"\n', "models.toml: models.m.path: model file not found: "),
    ('[models.m]\ninputs = { x = [1] }\n', "models.toml: models.m.path: is required"),
    (MODEL + 'targets = ["qnn-htpp"]\n[targets.qnn-htp]\nep = "qnn"\n',
     "models.toml: models.m.targets[0]: unknown target 'qnn-htpp' (did you mean 'qnn-htp'?); declared targets: "
     "qnn-htp"),
    (MODEL + 'inputs = { x = [1, -3] }\n', "models.toml: models.m.inputs.x: must be a list of positive integers"),
    ('[models."../escape"]\npath = "models/tinycnn.onnx"\n',
     "models.toml: models.../escape: invalid name '../escape': use letters, digits, '-', '_' and '.' only"),
    (MODEL + '[targets."a b"]\nep = "cpu"\n', "models.toml: targets.a b: invalid name 'a b'"),
    (MODEL + '[targets.a]\nextends = "b"\n[targets.b]\nextends = "a"\n',
     "models.toml: targets.a.extends: extends cycle: a -> b -> a"),
    (MODEL + '[targets.a]\nextends = "nothing"\n', "models.toml: targets.a.extends: unknown target 'nothing'"),
    ('[targets.a]\nep = "cpu"\n', "models.toml: models: declares no models"),
])
def test_manifest_errors(tmp_path, text, message):
    with pytest.raises(UserError) as raised:
        build_plan(tmp_path, text)
    assert str(raised.value).startswith(message), str(raised.value)


@pytest.mark.parametrize("kind, message", [
    ("link inside", None),
    ("link outside", "models.toml: models.m.path: {named} (a link to {outside}) is outside the project"),
    ("dangling link", "model file not found"),
    ("folder", "model file is a folder"), ("fifo", "model file is not a regular file (a FIFO"),
    ("link to a folder", "model file is a folder"),
    ("its folder a link outside", "models.toml: models.m.path: {named} (a link to {outside_folder}/named.onnx) is "
                                  "outside the project"),
])
def test_a_model_path_is_a_regular_file_inside_the_project(tmp_path, kind, message):
    """One `lstat` says both whether a model path is a regular file and whether it is a link to resolve
    (`manifest.roots.Roots.check_file`): each kind of path gets the line it got when each was asked apart."""
    import os

    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "outside.onnx").write_bytes((REPO / "models" / "tinycnn.onnx").read_bytes())
    named = project / "models" / "named.onnx"
    if kind == "its folder a link outside":
        (tmp_path / "models").mkdir()
        named.parent.symlink_to(tmp_path / "models")
    else:
        named.parent.mkdir()
    if kind == "its folder a link outside":
        (tmp_path / "models" / "named.onnx").write_bytes((REPO / "models" / "tinycnn.onnx").read_bytes())
    elif kind == "link inside":
        (project / "real.onnx").write_bytes((REPO / "models" / "tinycnn.onnx").read_bytes())
        named.symlink_to(project / "real.onnx")
    elif kind == "link outside":
        named.symlink_to(tmp_path / "outside.onnx")
    elif kind == "dangling link":
        named.symlink_to(project / "gone.onnx")
    elif kind == "folder":
        named.mkdir()
    elif kind == "fifo":
        os.mkfifo(named)
    else:
        (project / "folder.onnx").mkdir()
        named.symlink_to(project / "folder.onnx")
    text = '[models.m]\npath = "models/named.onnx"\n[models.m.variants.v]\n[targets.t]\nep = "cpu"\n'
    if message is None:
        assert [b.name for b in build_plan(project, text)] == ["m.v@t"]
        return
    with pytest.raises(UserError) as raised:
        build_plan(project, text)
    expected = message.format(named=named, outside=tmp_path / "outside.onnx", outside_folder=tmp_path / "models")
    if not expected.startswith("models.toml"):
        expected = f"models.toml: models.m.path: {expected}"
    assert str(raised.value).startswith(expected), str(raised.value)


def test_extends_merges_options_per_key_and_infers_device(tmp_path):
    builds = build_plan(tmp_path, MODEL + """
[targets.base]
ep = "qnn"
options = { soc_model = 60, htp_performance_mode = "burst" }

[targets.child]
extends = "base"
embed = true
options = { soc_model = 69 }

[targets.default-npu]
""")
    by_target = {b.target.name: b.target for b in builds}
    child = by_target["child"]
    assert child.options == {"backend_type": "htp", "htp_performance_mode": "burst", "soc_model": "69"}
    assert child.embed and child.device == "npu" and child.ep.name == "QNNExecutionProvider"
    assert by_target["base"].options["soc_model"] == "60" and not by_target["base"].embed
    assert by_target["default-npu"].ep.name == "QNNExecutionProvider" and by_target["default-npu"].device == "npu"


def test_option_values_are_normalised_to_strings(tmp_path):
    (target,) = [b.target for b in build_plan(tmp_path, MODEL + """
[targets.t]
ep = "QNNExecutionProvider"
options = { soc_model = 60, enable_htp_fp16_precision = true, vtcm_mb = 8 }
""")]
    assert target.options == {"backend_type": "htp", "enable_htp_fp16_precision": "1", "soc_model": "60",
                              "vtcm_mb": "8"}


def test_dodo_reports_a_manifest_error_in_one_line(project):
    project.manifest(MODEL.replace("tinycnn", "tinycnn") + '[targets.t]\nep = "qnn"\noptions = { soc_modle = 60 }\n')
    for args in ((), ("list",)):
        done = project.doit(*args, check=False)
        assert done.returncode == 2
        assert done.stderr.strip() == ("error: models.toml: targets.t.options.soc_modle: unknown QNNExecutionProvider "
                                       "option (did you mean 'soc_model'?); every option it takes: "
                                       "epbuild's docs, targets/qnn.md")
        assert "Traceback" not in done.stderr and not (project.artifacts / "t").exists()


def test_a_file_that_is_not_onnx_is_refused_before_any_build(project):
    (project.root / "models" / "broken.onnx").write_bytes(b"this is not a protobuf")
    project.manifest('[models.broken]\npath = "models/broken.onnx"\n[targets.cpu]\nep = "cpu"\n')
    done = project.doit(check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("error: models.toml: models.broken.path: broken.onnx: not a readable ONNX model")
