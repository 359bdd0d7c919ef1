"""External toolchains through small STAND-IN executables (tests/standins/, never used outside tests): qaic-compile
and the QAIRT SDK's converter and context-binary generator record their arguments and write fake outputs. They
test this project's adapters (discovery, command lines, outputs, incrementality, failures), not Qualcomm's tools."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest

from conftest import REPO, ran
from epbuild.errors import UserError
from epbuild.manifest.parse import TableReader, load
from epbuild.manifest.qaic import QaicOptions, check_qaic
from epbuild.plan.targets import plan
from epbuild.steps.toolchain.toolchains import qaic_command
from helpers import ep_context_nodes

STANDINS = REPO / "tests" / "standins"


@pytest.fixture
def qaic_root(tmp_path):
    root = tmp_path / "qti-aic"
    shutil.copytree(STANDINS / "qaic", root)
    return root


def calls(root) -> list[list[str]]:
    path = root / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def qaic_manifest(root, qaic: str = "{ num_cores = 14, convert_to_fp16 = true }") -> str:
    return f"""
[toolchains.qaic]
root = "{root}"

[models.dynbatch]
path = "models/dynbatch.onnx"
inputs = {{ x = [1, 3, 32, 32] }}
targets = ["aic100"]

[targets.aic100]
compiler = "qaic"
device = "npu"
qaic = {qaic}
"""


@pytest.mark.parametrize("options, flags", [
    ({}, ["-aic-hw"]),
    ({"num_cores": 14, "convert_to_fp16": True}, ["-aic-hw", "-aic-num-cores=14", "-convert-to-fp16"]),
    ({"stats_level": 70, "stats_batchsize": 4, "ddr_stats": True},
     ["-aic-hw", "-stats-level=70", "-stats-batchsize=4", "-ddr-stats"]),
    ({"pmu_recipe": "KernelUtil", "perf_warnings": True, "perf_metrics": True},
     ["-aic-hw", "-aic-pmu-recipe=KernelUtil", "-aic-perf-warnings", "-aic-perf-metrics"]),
    ({"pmu_events": ["3F", "0x70", "200"]}, ["-aic-hw", "-aic-pmu-events=3F,70,200"]),
    ({"aic_hw": False, "extra_args": ["-mxfp6-matmul", "-retained-state=true"]},
     ["-mxfp6-matmul", "-retained-state=true"]),
])
def test_qaic_command_line_for_each_flag(tmp_path, options, flags):
    checked = check_qaic(TableReader(tmp_path / "models.toml", "targets.t.qaic", options))
    command = qaic_command(tmp_path / "qaic-compile", tmp_path / "m.onnx", tmp_path / "qpc", checked, {"batch": 1})
    assert command[:3] == [str(tmp_path / "qaic-compile"), f"-model={tmp_path / 'm.onnx'}",
                           f"-aic-binary-dir={tmp_path / 'qpc'}"]
    symbol = "-onnx-define-symbol=batch,1"
    rest = command[3:]
    assert symbol in rest
    rest.remove(symbol)
    assert rest == flags


@pytest.mark.parametrize("qaic, key, message", [
    ("{ ddr_stats = true, stats_level = 30 }", "ddr_stats", "needs stats_level >= 40, found 30"),
    ("{ pmu_recipe = \"KernelUtill\" }", "pmu_recipe",
     "'KernelUtill' is not valid (did you mean 'KernelUtil'?); valid: AxiRd, AxiWr"),
    ("{ pmu_recipe = \"AxiRd\", pmu_events = [\"3F\"] }", "pmu_events",
     "pmu_recipe and pmu_events are mutually exclusive"),
    ("{ pmu_events = [\"1\", \"2\", \"3\", \"4\", \"5\", \"6\", \"7\", \"8\", \"9\"] }", "pmu_events",
     "at most 8 events, found 9"),
    ("{ pmu_events = [\"3G\"] }", "pmu_events", "must be hex event ids such as \"3F\", found '3G'"),
    ("{ stats_level = 0 }", "stats_level", "must be a positive integer, found 0"),
    ("{ num_cores = \"14\" }", "num_cores", "must be an integer, found a string '14'"),
    ("{ num_core = 14 }", "num_core", "unknown key (did you mean 'num_cores'?)"),
])
def test_qaic_flag_errors_name_the_key(project, qaic_root, qaic, key, message):
    project.manifest(qaic_manifest(qaic_root, qaic))
    with pytest.raises(UserError) as raised:
        plan(load(project.root / "models.toml"))
    assert f"models.toml: targets.aic100.qaic.{key}: {message}" in str(raised.value)


def test_qaic_build_outputs_incrementality_and_validation_skip(project, qaic_root):
    project.manifest(qaic_manifest(qaic_root))
    done = project.doit()
    assert {"squash:dynbatch", "ops:dynbatch@aic100", "compile:dynbatch@aic100"} <= ran(done)
    folder = project.artifacts / "aic100" / "dynbatch"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "artifact.json", "compile.log", "qpc/constants.bin", "qpc/programqpc.bin", "validation.json"]
    (argv,) = [c for c in calls(qaic_root) if c and c[0].startswith("-model=")]
    squashed = project.artifacts / ".stages" / "dynbatch" / "squash" / "dynbatch.onnx"
    assert argv[0] == f"-model={squashed}" and argv[1].startswith("-aic-binary-dir=")
    assert argv[2:] == ["-aic-hw", "-aic-num-cores=14", "-convert-to-fp16", "-onnx-define-symbol=batch,1"]
    assert "stand-in qaic-compile: done" in (folder / "compile.log").read_text()
    sidecar = json.loads((folder / "artifact.json").read_text())
    assert sidecar["toolchain"] == {"name": "qaic", "version": "1.20.2.0"} and "qpc/programqpc.bin" in sidecar["files"]
    report = json.loads((folder / "validation.json").read_text())
    assert report["status"] == "skipped" and "no Cloud AI device on this host" in report["reason"]
    assert ran(project.doit()) <= {"unavailable"}
    project.manifest(qaic_manifest(qaic_root, "{ num_cores = 8 }"))
    assert "compile:dynbatch@aic100" in ran(project.doit())
    (qaic_root / "versions" / "apps.xml").write_text("<apps><version>1.21.0.0</version></apps>")
    assert "compile:dynbatch@aic100" in ran(project.doit())


def test_qaic_failure_shows_the_compilers_last_lines_and_leaves_nothing(project, qaic_root):
    project.manifest(qaic_manifest(qaic_root))
    project.env["STANDIN_FAIL"] = "1"
    done = project.doit("--continue", check=False)
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "compile dynbatch@aic100 (qaic-compile): qaic-compile exited with status 3" in output
    assert "Error: stand-in failure: unsupported configuration for the requested cores" in output
    assert not (project.artifacts / "aic100" / "dynbatch").exists()
    assert "Error: stand-in failure" in (project.artifacts / ".logs" / "aic100" / "dynbatch.compile.log").read_text()


def test_ops_task_lists_unsupported_operators_before_compiling(project, qaic_root):
    project.manifest(qaic_manifest(qaic_root))
    project.env["STANDIN_UNSUPPORTED"] = "GlobalAveragePool,Gemm"
    done = project.doit("--continue", check=False)
    assert "ops:dynbatch@aic100: qaic-compile does not support GlobalAveragePool (used by dynbatch.onnx)" \
        in done.stdout + done.stderr
    assert not [c for c in calls(qaic_root) if c and c[0].startswith("-model=")]


def test_absent_qaic_toolchain_makes_the_target_unavailable(project, tmp_path):
    project.manifest(qaic_manifest(tmp_path / "nowhere"))
    done = project.doit()
    assert "skipped compile:dynbatch@aic100: qaic-compile not found" in done.stdout
    by_name = project.doit("compile:dynbatch@aic100", check=False)
    assert by_name.returncode == 1 and "cannot be built on this host: qaic-compile not found" in by_name.stdout


def test_qaic_root_from_the_environment(project, qaic_root):
    project.manifest(qaic_manifest(qaic_root).replace(f'[toolchains.qaic]\nroot = "{qaic_root}"\n', ""))
    project.env["QAIC_ROOT"] = str(qaic_root)
    project.doit()
    assert (project.artifacts / "aic100" / "dynbatch" / "qpc" / "programqpc.bin").is_file()


def test_qairt_adapter_runs_the_sdk_tools_and_writes_an_epcontext_model(project, tmp_path):
    sdk = tmp_path / "qairt"
    shutil.copytree(STANDINS / "qairt", sdk)
    project.manifest(f"""
[models.tinycnn]
path = "models/tinycnn.onnx"

[targets.qnn-qairt]
ep = "qnn"
compiler = "qairt"
qnn_sdk_root = "{sdk}"
validate = "structural"
""")
    done = project.doit()
    assert "structural validate:tinycnn@qnn-qairt: structural checks only" in done.stdout
    folder = project.artifacts / "qnn-qairt" / "tinycnn"
    (node,) = ep_context_nodes(folder / "tinycnn.onnx")
    assert node["ep_cache_context"] == b"tinycnn_qnn.bin" and node["source"] == b"QNNExecutionProvider"
    assert (folder / "tinycnn_qnn.bin").read_text() == "stand-in context binary\n"
    tools = [c[0] for c in calls(sdk)]
    assert tools == ["qairt-converter", "qnn-context-binary-generator"]
    generator = calls(sdk)[1]
    assert generator[generator.index("--backend") + 1] == str(sdk / "lib" / "x86_64-linux-clang" / "libQnnHtp.so")
    model = onnx.load(str(folder / "tinycnn.onnx"))
    assert [i.name for i in model.graph.input] == ["x"] and [o.name for o in model.graph.output] == ["logits"]


def test_absent_qairt_sdk_makes_the_target_unavailable(project, monkeypatch):
    project.env.pop("QNN_SDK_ROOT", None)
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[targets.qnn-qairt]\ncompiler = "qairt"\n')
    done = project.doit()
    assert ("skipped compile:tinycnn@qnn-qairt: the QAIRT SDK is not configured: set qnn_sdk_root on the target "
            "or QNN_SDK_ROOT") in done.stdout


def test_backends_lists_what_this_host_can_build(project, openvino_reason):
    shutil.copy(REPO / "models.toml", project.root / "models.toml")
    text = project.doit("backends").stdout
    assert "EP QNNExecutionProvider: devices" in text and "EP CPUExecutionProvider: devices" in text
    assert "toolchain qaic: absent: qaic-compile not found" in text
    assert "target qnn-htp (QNNExecutionProvider, npu, ort): buildable" in text
    data = json.loads(project.doit("backends", "--json").stdout)
    assert data["targets"]["cpu"]["buildable"] and data["targets"]["qnn-htp"]["buildable"]
    assert data["toolchains"]["qairt"]["found"] is False
    assert data["targets"]["openvino-cpu"]["buildable"] is (openvino_reason is None)
    if openvino_reason:
        assert data["targets"]["openvino-cpu"]["reason"] == openvino_reason


def test_winml_build_config_import_and_precedence(project):
    (project.root / "configs" / "winml").mkdir()
    (project.root / "configs" / "winml" / "ov.json").write_text('{"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}')
    (project.root / "configs" / "winml" / "build.json").write_text(json.dumps({"compile": {
        "provider_options": {"soc_model": "60", "htp_performance_mode": "burst", "profiling_file_path": "ov.json"},
        "provider_option_file_keys": ["profiling_file_path"]}}))
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[targets.qnn]\nep = "qnn"\n'
                     'config = "configs/winml/build.json"\noptions = { htp_performance_mode = "high_performance" }\n')
    (build,) = plan(load(project.root / "models.toml"))
    assert build.target.options["soc_model"] == "60"
    assert build.target.options["htp_performance_mode"] == "high_performance"  # the manifest wins per key
    assert build.target.option_files == {"profiling_file_path": (project.root / "configs" / "winml" / "ov.json")}
    assert build.target.options["profiling_file_path"] == "configs/winml/ov.json"


def test_winml_build_config_errors(project):
    (project.root / "configs" / "bad.json").write_text('{"compile": {"provider_options": {}, '
                                                       '"provider_option_file_keys": ["load_config"]}}')
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[targets.ov]\nep = "openvino"\n'
                     'config = "configs/bad.json"\n')
    with pytest.raises(UserError, match=r"^bad\.json: compile\.provider_option_file_keys\[0\]: names 'load_config', "
                                        r"which compile\.provider_options does not set"):
        load(project.root / "models.toml")
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[targets.ov]\nep = "openvino"\n'
                     'config = "configs/missing.json"\n')
    with pytest.raises(UserError, match=r"targets\.ov\.config: WinMLBuildConfig file not found"):
        load(project.root / "models.toml")


def test_qaic_options_dataclass_defaults():
    assert check_qaic(TableReader(REPO / "models.toml", "targets.t.qaic", {})) == QaicOptions()
