"""Shared-context groups: one binary for a QNN group, incremental rebuilds, errors before any build."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from conftest import REPO, build_report, ran
from epbuild.errors import UserError
from epbuild.manifest.parse import load
from epbuild.plan.targets import plan
from epbuild.steps.validate import validate
from epbuild.tasks.loading import load_project
from helpers import ep_context_nodes, perturb_weights, workspace

MEMBERS = """
[models.tinycnn]
path = "models/tinycnn.onnx"
targets = ["qnn-htp"]

[models.encoder]
path = "models/encoder.onnx"
targets = []

[models.dynbatch]
path = "models/dynbatch.onnx"
inputs = { x = [1, 3, 32, 32] }
targets = []

[targets.qnn-htp]
ep = "qnn"
options = { soc_model = 60 }
"""
TRIO = MEMBERS + '\n[groups.trio]\ntarget = "qnn-htp"\nmodels = ["tinycnn", "encoder", "dynbatch"]\n'


def test_qnn_group_writes_one_binary_referenced_by_every_member(project):
    project.manifest(TRIO)
    done = project.doit()
    folder = project.artifacts / "qnn-htp" / "groups" / "trio"
    assert sorted(p.name for p in folder.iterdir()) == ["artifact.json", "dynbatch.onnx", "encoder.onnx",
                                                         "tinycnn.onnx", "tinycnn_qnn.bin", "validation.json"]
    for member in ("tinycnn", "encoder", "dynbatch"):
        (node,) = ep_context_nodes(folder / f"{member}.onnx")
        assert node["ep_cache_context"] == b"tinycnn_qnn.bin" and node["source"] == b"QNNExecutionProvider"
    sidecar = json.loads((folder / "artifact.json").read_text())
    assert sidecar["order"] == ["tinycnn", "encoder", "dynbatch"]
    assert sidecar["files"] == ["artifact.json", "dynbatch.onnx", "encoder.onnx", "tinycnn.onnx", "tinycnn_qnn.bin"]
    assert sidecar["members"]["dynbatch"]["binaries"] == ["tinycnn_qnn.bin"]
    report = json.loads((folder / "validation.json").read_text())
    assert report["status"] == "skipped" and report["structural"] == "passed"
    assert "multi-graph QNN context crashes the process on x86_64" in report["reason"]
    assert "skipped validate:trio: loading a multi-graph QNN context" in done.stdout
    # the standalone compile of a member is untouched by the group
    assert (project.artifacts / "qnn-htp" / "tinycnn" / "tinycnn_qnn.bin").is_file()


def test_changing_a_member_or_the_order_rebuilds_only_the_group(project):
    project.manifest(TRIO)
    project.doit()
    perturb_weights(project.root / "models" / "encoder.onnx", seed=3)
    assert ran(project.doit()) == {"group:trio", "validate:trio"}  # encoder is static: compiled as it is
    project.manifest(TRIO.replace('["tinycnn", "encoder", "dynbatch"]', '["encoder", "tinycnn", "dynbatch"]'))
    assert ran(project.doit()) == {"group:trio", "validate:trio"}
    folder = project.artifacts / "qnn-htp" / "groups" / "trio"
    assert (folder / "encoder_qnn.bin").is_file() and not (folder / "tinycnn_qnn.bin").exists()


def test_a_member_change_rebuilds_the_group_and_its_standalone_target_only(project):
    project.manifest(TRIO)
    project.doit()
    perturb_weights(project.root / "models" / "tinycnn.onnx", seed=4)
    assert ran(project.doit()) == {"group:trio", "validate:trio",
                                   "compile:tinycnn@qnn-htp", "validate:tinycnn@qnn-htp"}


def test_a_crash_while_loading_the_shared_context_is_contained(project, monkeypatch):
    """Forcing the run part on x86_64, where loading a multi-graph QNN context segfaults: the child dies, the
    report names the signal, the test process (standing in for doit) lives on."""
    project.manifest(TRIO)
    project.doit("group:trio")
    monkeypatch.chdir(project.root)  # planned as the build planned it: with the models' facts (no stage here)
    (group,) = [b for b in load_project(project.root / "models.toml", ["validate:trio"]).builds if b.shared]
    loadable = dataclasses.replace(group.target.ep, shared_context_unloadable={})
    group = dataclasses.replace(group, target=dataclasses.replace(group.target, ep=loadable))
    report = validate(group, workspace(project.artifacts, project.root / "cache.test"), project.root / "work")
    assert report["status"] == "failed" and "killed by SIGSEGV" in report["reason"]


def test_an_openvino_group_builds_and_run_validates(project, openvino_reason):
    if openvino_reason:
        pytest.skip(f"OpenVINO cannot run here: {openvino_reason}")
    shutil.copy(REPO / "models.toml", project.root / "models.toml")
    project.doit("group:cnn-encoder-openvino", "validate:cnn-encoder-openvino")
    folder = project.artifacts / "openvino-cpu" / "groups" / "cnn-encoder-openvino"
    assert (folder / "tinycnn_OpenVINOExecutionProvider.bin").is_file()
    assert (folder / "encoder_OpenVINOExecutionProvider.bin").is_file()
    report = json.loads((folder / "validation.json").read_text())
    assert report["status"] == "passed" and set(report["members"]) == {"tinycnn", "encoder"}
    # the members' CPU references are kept: a standalone validation of one of them restores its own
    assert {m["from"] for m in build_report(project)["validate:cnn-encoder-openvino"]["cpu_reference"][
        "members"].values()} == {"computed"}
    done = project.doit("validate:tinycnn@openvino-cpu")
    assert "(CPU reference from the cache)" in done.stdout
    assert build_report(project)["validate:tinycnn@openvino-cpu"]["cpu_reference"]["from"] == "cache"
    assert "cpu_reference" not in json.loads((folder / "validation.json").read_text())


@pytest.mark.parametrize("group, message", [
    ('target = "qnn-htpp"\nmodels = ["tinycnn", "encoder"]',
     "groups.g.target: unknown target 'qnn-htpp' (did you mean 'qnn-htp'?)"),
    ('target = "qnn-htp"\nmodels = ["tinycnn", "encodr"]',
     "groups.g.models[1]: unknown model 'encodr' (did you mean 'encoder'?)"),
    ('target = "qnn-htp"\nmodels = ["tinycnn"]', "groups.g.models: a shared context needs at least two models"),
    ('target = "qnn-htp"\nmodels = ["tinycnn", "encoder", "tinycnn"]',
     "groups.g.models[2]: model 'tinycnn' is listed twice"),
    ('target = "cpu"\nmodels = ["tinycnn", "encoder"]',
     "groups.g.target: target 'cpu' uses CPUExecutionProvider, which cannot share an EP context; EPs that can: "
     "qnn, openvino"),
    ('target = "qnn-embed"\nmodels = ["tinycnn", "encoder"]', "groups.g.target: target 'qnn-embed' has embed = true"),
    ('target = "qnn-htp"\nmodel = ["tinycnn", "encoder"]', "groups.g.model: unknown key (did you mean 'models'?)"),
    ('target = "qnn-qairt"\nmodels = ["tinycnn", "encoder"]',
     "groups.g.target: target 'qnn-qairt' uses compiler = \"qairt\"; shared contexts are built with ONNX Runtime"),
])
def test_group_errors_stop_before_any_build(project, group, message):
    text = (MEMBERS + '[targets.cpu]\nep = "cpu"\n[targets.qnn-embed]\nextends = "qnn-htp"\nembed = true\n'
            '[targets.qnn-qairt]\nep = "qnn"\ncompiler = "qairt"\n' + f"[groups.g]\n{group}\n")
    project.manifest(text)
    with pytest.raises(UserError) as raised:
        plan(load(project.root / "models.toml"))
    assert str(raised.value).startswith(f"models.toml: {message}"), str(raised.value)
    done = project.doit(check=False)
    assert done.returncode == 2 and message in done.stderr and not (project.artifacts / "qnn-htp").exists()


def test_a_group_with_a_symbolic_member_waits_for_the_fix(project):
    """The group needs the member's static shapes: it and that member's compile wait for the manifest's fix (named
    in the line), and nothing of the group is made."""
    project.manifest(TRIO.replace('inputs = { x = [1, 3, 32, 32] }\n', ''))
    assert "group:trio" in project.doit("list").stdout
    done = project.doit("group:trio", check=False)
    assert done.returncode == 1
    assert ("waits for a fix: models.toml: models.dynbatch.inputs: input 'x' ([?, 3, 32, 32]) has symbolic "
            "dimension 0 ('batch'); target 'qnn-htp' needs static shapes") in done.stdout
    assert not (project.artifacts / "qnn-htp" / "groups").exists()
    scratch = project.artifacts / ".scratch"  # reading the models may have made it, and left it empty
    assert not scratch.exists() or not list(scratch.iterdir())
