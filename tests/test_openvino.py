"""OpenVINO on this host: on non-Intel x86-64 CPUs through epbuild's vendor-id shim, which is compiled from
rules/epbuild/steps/shims/openvino_vendor.c with the system C compiler; without the shim or a compiler, a clear
reason."""

from __future__ import annotations

import json

import pytest

from conftest import ran
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


@needs_shim
def test_openvino_compiles_and_validates_through_the_shim(project):
    project.manifest(OPENVINO)
    done = project.doit()
    assert {"compile:tinycnn@ov", "validate:tinycnn@ov"} <= ran(done)
    folder = project.artifacts / "ov" / "tinycnn"
    sidecar = json.loads((folder / "artifact.json").read_text())
    assert sidecar["vendor_shim"] == vendor_shim.identity()
    assert sidecar["nodes"]["cpu"] == 0 and sidecar["ep_sdk_version"]
    (node,) = ep_context_nodes(folder / "tinycnn.onnx")
    assert node["source"] == b"OpenVINOExecutionProvider"
    report = json.loads((folder / "validation.json").read_text())
    assert report["status"] == "passed" and report["precision"] == "fp32"
    assert report["ran_on"]["OpenVINOExecutionProvider"] == ["EPContext"]
    assert min(o["snr_db"] for o in report["outputs"].values()) >= 60
    backends = project.doit("backends")
    assert "OpenVINO runs through epbuild's vendor-id shim" in backends.stdout


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


@needs_shim
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
