"""OpenVINO on this host: on non-Intel x86-64 CPUs through epbuild's vendor-id shim, which is compiled from
rules/epbuild/steps/shims/openvino_vendor.c with the system C compiler; without the shim or a compiler, a clear
reason."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from conftest import build_report, ran
from epbuild.steps import vendor_shim
from helpers import ep_context_nodes

OPENVINO = """
[models.tinycnn]
path = "models/tinycnn.onnx"

[targets.ov]
ep = "openvino"
options = { load_config = "configs/openvino_f32.json" }
option_files = ["load_config"]
"""

needs_shim = pytest.mark.skipif(not vendor_shim.needed(), reason="an Intel CPU: OpenVINO runs without the shim")


def test_openvino_compiles_and_validates_through_the_shim_or_natively(project):
    """What the shim enables, on every host: natively on an Intel CPU (no shim in the record or the backends),
    through the shim elsewhere."""
    project.manifest(OPENVINO)
    done = project.doit()
    assert {"compile:tinycnn@ov", "validate:tinycnn@ov"} <= ran(done)
    folder = project.artifacts / "ov" / "tinycnn"
    sidecar = json.loads((folder / "artifact.json").read_text())
    if vendor_shim.needed():
        assert sidecar["vendor_shim"] == vendor_shim.identity()
    else:
        assert "vendor_shim" not in sidecar
    assert sidecar["nodes"]["cpu"] == 0 and sidecar["ep_sdk_version"]
    (node,) = ep_context_nodes(folder / "tinycnn.onnx")
    assert node["source"] == b"OpenVINOExecutionProvider"
    report = json.loads((folder / "validation.json").read_text())
    assert report["status"] == "passed" and report["precision"] == "fp32"
    assert report["ran_on"]["OpenVINOExecutionProvider"] == ["EPContext"]
    assert min(o["snr_db"] for o in report["outputs"].values()) >= 60
    backends = project.doit("backends")
    assert ("OpenVINO runs through epbuild's vendor-id shim" in backends.stdout) == vendor_shim.needed()


@needs_shim
def test_switching_the_shim_off_leaves_openvino_unavailable(project):
    project.manifest(OPENVINO)
    project.env["EPBUILD_OPENVINO_VENDOR_SHIM"] = "0"
    project.env.pop("EPBUILD_OPENVINO_SHIM", None)
    done = project.doit("list")
    assert "compile:tinycnn@ov" in done.stdout and "offers no device on this host" in done.stdout
    assert "EPBUILD_OPENVINO_VENDOR_SHIM=0" in done.stdout


@needs_shim
def test_without_a_c_compiler_openvino_says_what_to_install(project, tmp_path):
    project.manifest(OPENVINO)
    project.env["CC"] = str(tmp_path / "no-such-cc")
    done = project.doit("compile:tinycnn@ov", check=False)
    assert done.returncode != 0
    assert "no C compiler" in done.stdout + done.stderr and "apt install gcc" in done.stdout + done.stderr
    assert not (project.artifacts / "ov").exists()


def test_openvino_embedded_context_compiles_and_validates(project):
    project.manifest(OPENVINO + "embed = true\n")
    project.doit()
    folder = project.artifacts / "ov" / "tinycnn"
    assert sorted(p.name for p in folder.iterdir()) == ["artifact.json", "load_config.json", "tinycnn.onnx",
                                                        "validation.json"]
    (node,) = ep_context_nodes(folder / "tinycnn.onnx")
    assert node["embed_mode"] == 1 and node["ep_cache_context"]  # the compiled blob inside the model
    report = json.loads((folder / "validation.json").read_text())
    assert report["status"] == "passed" and min(o["snr_db"] for o in report["outputs"].values()) >= 60


def _contrib_qdq(stage: Path, path: Path) -> Path:
    """The quantize stage's 16-bit QDQ model with its Q/DQ nodes in com.microsoft, as older quantizers wrote them."""
    model = onnx.load(str(stage))
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            node.domain = "com.microsoft"
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(path))
    return path


SIXTEEN_BIT = """
[models.tinycnn]
path = "models/tinycnn.onnx"
quantize = { calibration = "random", activation_type = "uint16", weight_type = "uint8" }
targets = ["ov", "cpu"]

[targets.ov]
ep = "openvino"
quantized = true
options = { load_config = "configs/openvino_f32.json" }
option_files = ["load_config"]
validation = { localise = true }

[targets.cpu]
ep = "cpu"
quantized = true
"""


def test_openvino_on_16_bit_qdq_fails_in_one_line_that_blames_the_plugin(project):
    """OpenVINO computes 16-bit Q/DQ wrongly (the model validates on CPU; QNN passed it at 42 dB) and localise
    crashed inside its QDQ stripping: one line, the evidence being OpenVINO's own plain session of the model, and
    the same for the com.microsoft Q/DQ older quantizers write."""
    project.manifest(SIXTEEN_BIT)
    done = project.doit("--continue", check=False)
    entries = build_report(project)
    assert entries["validate:tinycnn@cpu"]["status"] == "validated", done.stdout
    line = next(x for x in done.stdout.splitlines() if x.startswith("failed validate:tinycnn@ov"))
    assert "OpenVINO computes 16-bit Q/DQ wrongly (15 ai.onnx uint16 QuantizeLinear/DequantizeLinear): a plain " \
           "OpenVINO session of the quantized model is as far from CPU" in line
    assert 'activation_type = "uint8"' in line and "localise could not run" not in line
    assert "Traceback" not in done.stderr
    assert "divergence" not in json.loads((project.artifacts / "ov" / "tinycnn" / "validation.json").read_text())

    stage = project.artifacts / ".stages" / "tinycnn" / "quantize-generic" / "tinycnn.onnx"
    _contrib_qdq(stage, project.root / "models" / "contrib.onnx")
    project.manifest(OPENVINO.replace("tinycnn", "contrib"))
    done = project.doit(check=False)
    line = next(x for x in done.stdout.splitlines() if x.startswith("failed validate:contrib@ov"))
    assert "(15 com.microsoft uint16 QuantizeLinear/DequantizeLinear)" in line, line


def _bf16_in_hardware() -> bool:
    flags = Path("/proc/cpuinfo").read_text().split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def test_an_openvino_miss_that_the_f32_hint_holds_blames_the_precision_default(project):
    """OpenVINO's CPU plugin runs bf16 by default where the CPU has it (avx512_bf16 or AMX, Intel's or AMD's): an
    fp32 target without the f32 hint misses there, and the line says the hinted session holds and names the
    setting, instead of suggesting a bug report. Where the CPU has no bf16 the default is f32 and the target passes."""
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[targets.ov]\nep = "openvino@pypi"\n'
                     'device = "cpu"\n')
    done = project.doit(check=False)
    verdict = json.loads((project.artifacts / "ov" / "tinycnn" / "validation.json").read_text())
    if not _bf16_in_hardware():
        assert done.returncode == 0 and verdict["status"] == "passed", done.stdout
        return
    assert done.returncode == 1 and verdict["status"] == "failed" and verdict["blame"] == "precision default"
    line = next(line for line in done.stdout.splitlines() if line.startswith("failed validate:tinycnn@ov"))
    assert "opened with OpenVINO's f32 hint the artifact holds (worst SNR" in line and "options.load_config" in line
    assert "epbuild reduce" not in line and "what bf16 gives" not in line
