"""The saved plan (`plan.saved_plan`): taken only while everything it was made from holds, and then equal to a
plan made afresh; made afresh (and saved again) after any change it depends on. The incrementality contract test
runs every kind of change through it on doit's command line; these look at the plan itself."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

import epbuild.tasks.loading as project_module
from conftest import Project
from epbuild.files.layout import now_ns
from epbuild.plan.saved_plan import Plan, SavedPlan
from epbuild.tasks.project import Project as Loaded
from helpers import perturb_weights

MANIFEST = """
[models.tinycnn]
path = "models/tinycnn.onnx"
targets = ["cpu", "npu"]

[models.dyn]
path = "models/dynbatch.onnx"
inputs = { x = [1, 3, 32, 32] }
targets = ["cpu", "npu"]

[targets.cpu]
ep = "cpu"

[targets.npu]
ep = "qnn"
config = "configs/qnn.json"
"""
CONFIG = {"compile": {"provider_options": {"backend_type": "htp", "soc_model": "60"}}}


@pytest.fixture
def folder(tmp_path, host_cache, monkeypatch) -> Project:
    (tmp_path / "proj").mkdir()
    project = Project(tmp_path / "proj", host_cache)
    (project.root / "configs" / "qnn.json").write_text(json.dumps(CONFIG))
    project.manifest(MANIFEST)
    monkeypatch.chdir(project.root)
    monkeypatch.setenv("EPBUILD_CACHE_DIR", str(project.cache))
    monkeypatch.delenv("EPBUILD_FAST_PATH", raising=False)
    time.sleep(0.02)  # the files above were written before the first plan begins (see test_a_file_changed_...)
    return project


def _load(calls: list[int], monkeypatch) -> Loaded:
    """The project as `doit list` loads it; `calls` counts the manifest readings."""
    real = project_module.load

    def counted(path):
        calls.append(1)
        return real(path)
    monkeypatch.setattr(project_module, "load", counted)
    return project_module.load_project(Path.cwd() / "models.toml", ["list"])


def _fresh(monkeypatch) -> Loaded:
    monkeypatch.setenv("EPBUILD_FAST_PATH", "0")
    try:
        return project_module.load_project(Path.cwd() / "models.toml", ["list"])
    finally:
        monkeypatch.delenv("EPBUILD_FAST_PATH")


def _same_plan(taken: Loaded, fresh: Loaded) -> None:
    assert taken.manifest == fresh.manifest
    assert taken.builds == fresh.builds and taken.stages == fresh.stages and taken.external == fresh.external


def _taken(folder: Project, monkeypatch) -> bool:
    calls: list[int] = []
    loaded = _load(calls, monkeypatch)
    taken = not calls
    _same_plan(loaded, _fresh(monkeypatch))
    return taken


def test_a_plan_is_taken_while_nothing_it_was_made_from_changed_and_equals_a_fresh_one(folder, monkeypatch):
    assert not _taken(folder, monkeypatch)  # the first reading saves it
    assert (folder.artifacts / ".state" / "plan.record").is_file()
    assert _taken(folder, monkeypatch)
    perturb_weights(folder.root / "models" / "tinycnn.onnx", 3)  # other weights, the same facts: still taken
    assert _taken(folder, monkeypatch)


def test_planning_writes_nothing_and_starts_nothing(folder, monkeypatch):
    """`plan.planning.planned` is a function (what a run does to the world is `tasks.run_start`'s): from the manifest,
    its targets and the models' facts it makes the loader's builds and stages again, without a file of the project or
    the cache written, removed or touched, and without a process started."""
    import subprocess

    from epbuild.execute.links import Links
    from epbuild.plan.external_data import ExternalDataIndex
    from epbuild.plan.planning import planned
    from epbuild.tasks.loading import read_manifest, read_models

    loaded = _load([], monkeypatch)  # the models read and indexed, the plan saved
    manifest, resolved = read_manifest(folder.root / "models.toml", None)
    provenance = loaded.workspace.provenance
    index = ExternalDataIndex(loaded.layout.state, provenance, Links())
    facts = read_models(manifest, loaded.layout, index, set(), None, Links())  # from the index: no job

    def tree() -> dict[str, tuple[int, int, int]]:
        return {str(p): (s.st_mtime_ns, s.st_ctime_ns, s.st_size) for top in (folder.root, folder.cache)
                for p in top.rglob("*") if (s := p.lstat())}

    def refused(*args, **kwargs):
        raise AssertionError("planning started a process")

    before = tree()
    with monkeypatch.context() as patched:
        patched.setattr(subprocess, "Popen", refused)
        patched.setattr(os, "fork", refused)
        made = planned(manifest, resolved, facts, None, provenance)
    assert tree() == before
    assert made.builds == loaded.builds and made.stages == loaded.stages and made.fresh is not None


def test_a_taken_plan_gives_the_provenance_the_files_give(folder, monkeypatch):
    """The jobs' code digest and distributions' versions are saved with the plan (its key hashes every file the
    digest reads and holds each import folder's identity) and taken with it: the run's Provenance, on its
    workspace, equals what reading the files and distributions gives, and no module keeps a copy."""
    from epbuild.execute.provenance import Provenance
    from epbuild.steps.job_modules import CODE_ROOTS

    first = _load([], monkeypatch).workspace.provenance
    calls: list[int] = []
    taken = _load(calls, monkeypatch).workspace.provenance
    read = Provenance.read(CODE_ROOTS)
    assert not calls and taken == first == read
    assert read.versions["onnxruntime"] and read.versions["onnx"] and read.code


def test_a_changed_config_file_option_file_or_manifest_makes_the_plan_afresh(folder, monkeypatch):
    assert not _taken(folder, monkeypatch)
    config = folder.root / "configs" / "qnn.json"
    config.write_text(json.dumps(CONFIG).replace('"60"', '"69"'))  # same size
    assert not _taken(folder, monkeypatch)
    assert _load([], monkeypatch).builds[1].target.options["soc_model"] == "69"
    before = config.stat()
    config.write_text(config.read_text().replace('"69"', '"68"'))  # size and mtime kept: only ctime moves
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert not _taken(folder, monkeypatch)
    assert _load([], monkeypatch).builds[1].target.options["soc_model"] == "68"
    folder.manifest(MANIFEST.replace('targets = ["cpu", "npu"]\n\n[models.dyn]', 'targets = ["cpu"]\n\n[models.dyn]'))
    assert not _taken(folder, monkeypatch)
    assert [b.name for b in _load([], monkeypatch).builds] == ["tinycnn@cpu", "dyn@cpu", "dyn@npu"]


def test_a_model_whose_facts_changed_is_planned_afresh(folder, monkeypatch):
    from onnx import TensorProto, helper, save

    assert not _taken(folder, monkeypatch)
    assert any(stage.kind == "shape" for stage in _load([], monkeypatch).stages.values())
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])  # now static: no shape stage
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 32, 32])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "models/dynbatch.onnx")
    calls: list[int] = []
    loaded = _load(calls, monkeypatch)
    assert calls == [] and not any(stage.kind == "shape" for stage in loaded.stages.values())  # not read: replanned
    _same_plan(loaded, _fresh(monkeypatch))


@pytest.mark.parametrize("where", ["model", "folder above"])
def test_a_model_or_a_folder_above_it_turned_into_a_symbolic_link_makes_the_plan_afresh(folder, monkeypatch, where):
    assert not _taken(folder, monkeypatch)
    models = folder.root / "models"
    if where == "model":
        os.replace(models / "tinycnn.onnx", models / "real.onnx")
        (models / "tinycnn.onnx").symlink_to("real.onnx")
    else:
        os.replace(models, folder.root / "elsewhere")
        models.symlink_to("elsewhere")
    time.sleep(0.02)  # changed before the reading begins: else that reading does not vouch for them (next test)
    assert not _taken(folder, monkeypatch)
    assert _taken(folder, monkeypatch)  # saved again, with the link's identity


def test_the_host_memory_or_the_full_path_leaves_the_plan_unused(folder, monkeypatch):
    assert not _taken(folder, monkeypatch)
    calls: list[int] = []
    monkeypatch.setenv("EPBUILD_FAST_PATH", "0")
    _load(calls, monkeypatch)
    assert calls == [1]
    monkeypatch.delenv("EPBUILD_FAST_PATH")
    monkeypatch.setattr(project_module, "default_memory_gb", lambda: 1024.0)
    assert not _taken(folder, monkeypatch)


def test_a_torn_or_foreign_plan_file_is_only_a_missing_plan(folder, monkeypatch):
    assert not _taken(folder, monkeypatch)
    saved = folder.artifacts / ".state" / "plan.record"
    saved.write_bytes(saved.read_bytes()[:1000])
    assert not _taken(folder, monkeypatch)
    saved.write_text("not a record")
    assert not _taken(folder, monkeypatch)
    assert _taken(folder, monkeypatch)


def test_a_file_changed_after_the_reading_began_is_not_vouched_for(folder, monkeypatch):
    """Its bytes may not be those read: the plan is not saved (the next reading saves it)."""
    loaded = _load([], monkeypatch)
    saved = folder.artifacts / ".state" / "plan.record"
    saved.unlink()
    plans = SavedPlan(saved.parent, "key")
    plan = Plan(Plan.text(loaded.manifest), {}, None, loaded.manifest, loaded.builds, loaded.stages, "digest", {},
                {})
    plans.save(plan, started_ns=os.stat(folder.root / "configs" / "qnn.json").st_ctime_ns)
    assert not saved.exists()
    plans.save(plan, started_ns=now_ns())
    assert saved.exists() and plans.load() == plan


def test_a_refused_manifest_saves_no_plan(folder, monkeypatch):
    from epbuild.errors import UserError

    folder.manifest(MANIFEST.replace("x = [1, 3, 32, 32]", "x = [1, 3, 32]"))
    with pytest.raises(UserError, match=r"models\.dyn\.inputs\.x"):
        _load([], monkeypatch)
    assert not (folder.artifacts / ".state" / "plan.record").exists()


def test_the_shipped_examples_plan_reads_back_equal_from_typed_json(folder, monkeypatch):
    """The plan is typed JSON, not a pickle (issue 60): every object of the shipped example's plan (stages, groups,
    packages, option files, quantization, symbolic dims) and of a few more keys reads back equal, with the same
    types (repr), and the plan taken from the file equals one made afresh."""
    from conftest import REPO
    from epbuild.plan.saved_plan import PLAN, PLAN_CLASSES
    from epbuild.state import codec
    from epbuild.state.folder import StateFolder

    shipped = (REPO / "models.toml").read_text()
    folder.manifest(shipped + """
[models.encoder_squashed]
path = "models/encoder.onnx"
squash = true
optimize = "basic"
targets = ["cpu", "qnn-htp"]
validation = { max_abs_error = 0.5, timeout_s = 30, targets = { qnn-htp = { min_snr_db = 25 } } }

[build]
reduce_budget_s = 60

[cache]
max_size_mb = 4096
""")
    assert not _taken(folder, monkeypatch)
    state = StateFolder(folder.artifacts / ".state")
    assert state.path(PLAN).read_bytes().startswith(b"epbuild-record 1\n")
    assert _taken(folder, monkeypatch)  # and equal to a plan made afresh
    assert state.read_record(PLAN, "another key", PLAN_CLASSES) is None
    fresh = _fresh(monkeypatch)
    for value in (fresh.manifest, fresh.builds, fresh.stages, fresh.external):
        again = codec.loads(codec.dumps(value, PLAN_CLASSES), PLAN_CLASSES)
        assert again == value and repr(again) == repr(value)
    assert {stage.kind for stage in fresh.stages.values()} >= {"quantize", "shape", "squash", "optimize"}


def test_the_facts_digest_holds_whatever_order_a_dict_lists_its_keys_in():
    """A model read just now lists its graph facts as the reader made them, one from the index in its stored
    (sorted) order: the same facts, and the plan must be taken (it was made anew after every change: 100 ms at
    1,000 targets)."""
    external = {Path("/p/m.onnx"): (Path("/p/m.onnx.data"),)}
    shapes = {"m": ({"x": [1, 3]}, [], {"x": [None, None]})}
    one = Plan.digest((external, shapes, {"m": {"static": True, "foldable": False}}))
    assert one == Plan.digest((external, shapes, {"m": {"foldable": False, "static": True}}))
    assert one != Plan.digest((external, shapes, {"m": {"foldable": True, "static": True}}))
    assert one != Plan.digest(({Path("/p/m.onnx"): ()}, shapes, {"m": {"static": True, "foldable": False}}))


def test_a_full_path_run_leaves_a_record_that_holds_its_plan_alone(folder, monkeypatch):
    """A run without the shortcuts plans afresh; when the saved record was written under this key from the same
    facts and files, it holds this very plan and is not encoded again (at 10,000 targets that was longer than the
    rest of the run's planning). Other facts (a model with other inputs): written again, and taken after."""
    assert not _taken(folder, monkeypatch)
    saved = folder.artifacts / ".state" / "plan.record"
    before = saved.stat()
    _fresh(monkeypatch)
    after = saved.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    (folder.root / "models" / "tinycnn.onnx").write_bytes((folder.root / "models" / "dynbatch.onnx").read_bytes())
    _fresh(monkeypatch)
    assert saved.stat().st_ino != before.st_ino
    assert _taken(folder, monkeypatch)


def test_a_record_under_this_key_that_holds_no_plan_is_written_again(folder, monkeypatch):
    """Its key says it holds this plan, its body is not one (a checkout's, or bytes gone bad): the full path, which
    does not read bodies, keeps it; the next run that reads it writes the plan again, and the one after takes it."""
    assert not _taken(folder, monkeypatch)
    saved = folder.artifacts / ".state" / "plan.record"
    head = saved.read_bytes().split(b"\n")[:3]
    for body in (b'[]{"models":[],"folders":{},"plan":1}', b'[]{"models":[3],"folders":{},"plan":1}'):
        saved.write_bytes(b"\n".join([*head, body]))
        _fresh(monkeypatch)
        assert saved.read_bytes().endswith(body)
        assert not _taken(folder, monkeypatch)
        assert _taken(folder, monkeypatch)


@dataclasses.dataclass
class _Holder:
    settings: object
    empty: tuple[str, ...]
    paths: tuple[Path, ...]


def test_typed_json_names_each_shape_once_and_reads_only_declared_ones():
    """A record's text is its shapes, then its value: each object carries its field values and a shape's index; a
    value class's equal instances are written once and read back as one object; and a shape that names a class
    the reader does not allow, a field its class lacks, an unknown way of writing one, or an index past the table
    is not read (ValueError: a miss)."""
    from epbuild.manifest.builds import Limits, ValidationSettings
    from epbuild.state import codec

    classes = codec.Classes(Limits, ValidationSettings, values=(ValidationSettings,))
    settings = [ValidationSettings("run", None, Path("r.onnx"), {}, 60.0) for _ in range(3)]
    text = codec.dumps([settings, Limits(1.0), Limits(1.0)], classes)
    assert text.count('"r.onnx"') == 1 and text.count('"$s"') == 3 and "ValidationSettings" in text.split("]]")[0]
    (first, *others), one, two = codec.loads(text, classes)
    assert first == settings[0] and all(other is first for other in others)
    assert one == two == Limits(1.0) and one is not two  # not a value class: read back as two objects
    with pytest.raises(TypeError):
        codec.Classes(Limits, values=(ValidationSettings,))
    held = codec.Classes(Limits, ValidationSettings, _Holder, values=(ValidationSettings,))
    holders = [_Holder(settings[i], (), (Path("a"),)) for i in range(3)]
    text = codec.dumps(holders, held)
    assert text.count('"r.onnx"') == 1 and '"$r"' not in text and '"empty":' not in text  # in the shape alone
    back = codec.loads(text, held)
    assert back == holders and back[0].settings is back[2].settings and back[1].empty == ()
    with pytest.raises(ValueError):  # a field its shape says is not written, written
        codec.loads(text.replace('"$s":1,', '"$s":1,"empty":[],', 1), held)
    good = '[["Limits",[]]][{"$s":0,"timeout_s":1.0,"max_memory_gb":null,"expected_mb":0.0,"budget_gb":null}]'
    assert codec.loads(good, classes) == [Limits(1.0)]
    for bad in (good.replace('"Limits"', '"Popen"'), good.replace('[]]]', '["timeout_s","x"]]]'),
                good.replace('[]]]', '["nothing","t"]]]'), good.replace('"$s":0', '"$s":1'),
                good.replace('"$s":0', '"$s":"0"'), good.replace('"expected_mb":0.0,', ''), good[good.index("]]") + 2:],
                good + "[]"):
        with pytest.raises(ValueError):
            codec.loads(bad, classes)


@pytest.mark.parametrize("builds", ["a string", [1, 2, 3]])
def test_a_plan_whose_fields_hold_other_shapes_is_a_missing_plan(folder, monkeypatch, builds):
    """Typed JSON checks the classes a record makes, not what their fields hold: a plan record under this key whose
    `builds` was a string or a list of numbers ended every run in an AttributeError. It is no plan: planned afresh,
    and written again."""
    from epbuild.plan.saved_plan import PLAN, PLAN_CLASSES
    from epbuild.state.folder import StateFolder

    assert not _taken(folder, monkeypatch)
    state = StateFolder(folder.artifacts / ".state")
    key = state.read_key(PLAN)
    saved = state.read_record(PLAN, key, PLAN_CLASSES)
    forged = dataclasses.replace(saved["plan"], builds=builds)
    state.write_record(PLAN, {**{k: v for k, v in saved.items() if k in ("models", "folders")}, "key": key,
                              "plan": forged}, PLAN_CLASSES)
    assert state.read_record(PLAN, key, PLAN_CLASSES)["plan"].builds == builds  # what a run reads
    assert not _taken(folder, monkeypatch)  # planned afresh, no AttributeError
    assert _taken(folder, monkeypatch)  # and written again
