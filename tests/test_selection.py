"""Which tasks a default run hands doit when the last run's record holds (`epbuild.tasks.selection`): the rule on
task dicts and real files, the record's validity, and a build that takes it. `test_incremental_contract.py` proves
on every kind of file edit that what executes equals the full path's set."""

from __future__ import annotations

import os

import pytest

from conftest import Project, build_report, ran
from epbuild.store.layout import stat_key
from epbuild.tasks.checker import SEEN_CHANGING, HashChecker
from epbuild.tasks.selection import Recorded, files_of
from epbuild.tasks.selection import runnable as select
from helpers import perturb_weights, single_op_model

HANDED = "unchanged since the last run's record"


def _task(name: str, file_dep=(), targets=(), task_dep=(), uptodate=True) -> dict:
    basename, _, rest = name.partition(":")
    return {"basename": basename, "name": rest, "file_dep": list(file_dep), "targets": list(targets),
            "task_dep": list(task_dep), "uptodate": [uptodate]}


def _chain(folder) -> list[dict]:
    """m.onnx -> shape:m -> compile:m@a, compile:m@b -> validate:m@a; group:g waits for compile:m@a by name;
    other.onnx -> compile:o@a."""
    path = {name: str(folder / name) for name in ("m.onnx", "s.onnx", "a.ctx", "b.ctx", "a.json", "g.ctx",
                                                   "other.onnx", "o.ctx")}
    for file in path.values():
        with open(file, "w") as handle:
            handle.write(file)
    return [_task("shape:m", [path["m.onnx"]], [path["s.onnx"]]),
            _task("compile:m@a", [path["s.onnx"]], [path["a.ctx"]]),
            _task("compile:m@b", [path["s.onnx"]], [path["b.ctx"]]),
            _task("validate:m@a", [path["a.ctx"], path["m.onnx"]], [path["a.json"]]),
            _task("group:g", [path["s.onnx"]], [path["g.ctx"]], task_dep=["compile:m@b"]),
            _task("compile:o@a", [path["other.onnx"]], [path["o.ctx"]])]


def _recorded(tasks: list[dict]) -> tuple[dict, dict, dict]:
    names = {f"{t['basename']}:{t['name']}": files_of(t["file_dep"], t["targets"]) for t in tasks}
    files = {path: stat_key(os.stat(path)) for listed in names.values() for path in listed}
    return names, files, {f"{t['basename']}:{t['name']}": t["task_dep"] for t in tasks if t["task_dep"]}


def runnable(tasks: list[dict], names: dict, files: dict, task_deps: dict | None = None,
             suspects: set[str] | None = None, made: list[str] | None = None) -> set[str]:
    """The selection over these task dicts and this record; `made` collects the names whose dicts were made."""
    by_name = {f"{t['basename']}:{t['name']}": t for t in tasks}

    def make(name: str) -> dict | None:
        if made is not None:
            made.append(name)
        return by_name.get(name)

    return select(by_name, make, Recorded(names, files, task_deps or {}), suspects)[0]


def test_nothing_changed_hands_doit_nothing(tmp_path):
    tasks = _chain(tmp_path)
    assert runnable(tasks, *_recorded(tasks)) == set()


@pytest.mark.parametrize("suspects", [None, set()], ids=["every-dict-made", "only-stale-dicts-made"])
def test_a_changed_file_hands_its_readers_and_everything_downstream_and_what_they_name(tmp_path, suspects):
    tasks = _chain(tmp_path)
    recorded = _recorded(tasks)
    (tmp_path / "a.ctx").write_text("edited")
    made: list[str] = []
    assert runnable(tasks, *recorded, suspects, made) == {"compile:m@a", "validate:m@a"}
    if suspects is not None:  # the record's files and task_deps stand for the rest
        assert sorted(made) == ["compile:m@a", "validate:m@a"]
    (tmp_path / "m.onnx").write_text("retrained")
    assert runnable(tasks, *recorded, suspects) == {"shape:m", "compile:m@a", "compile:m@b", "validate:m@a",
                                                    "group:g"}


def test_a_suspect_is_compared_with_the_record_and_a_task_not_suspected_is_taken_from_it(tmp_path):
    """A model whose file changed can plan other files for its tasks (a stage added or dropped): those tasks'
    dicts are made and compared even where their own recorded files are unchanged."""
    tasks = _chain(tmp_path)
    recorded = _recorded(tasks)
    (tmp_path / "extra.json").write_text("{}")
    replanned = [dict(t, file_dep=[*t["file_dep"], str(tmp_path / "extra.json")]) if t["name"] == "o@a" else t
                 for t in tasks]
    assert runnable(replanned, *recorded, {"compile:o@a"}) == {"compile:o@a"}
    made: list[str] = []
    assert runnable(replanned, *recorded, set(), made) == set() and made == []


def test_a_task_named_in_task_dep_is_handed_with_the_task_that_names_it(tmp_path):
    tasks = _chain(tmp_path)
    recorded = _recorded(tasks)
    (tmp_path / "g.ctx").unlink()  # the group's output is gone: it runs, and doit must know compile:m@b
    assert runnable(tasks, *recorded) == {"group:g", "compile:m@b"}


def test_settings_a_new_task_another_file_list_or_an_unknown_identity_hand_that_task(tmp_path):
    tasks = _chain(tmp_path)
    names, files, _ = _recorded(tasks)
    settings = [dict(t, uptodate=[False]) if t["name"] == "o@a" else t for t in tasks]
    assert runnable(settings, names, files) == {"compile:o@a"}
    assert runnable(tasks, {k: v for k, v in names.items() if k != "compile:o@a"}, files) == {"compile:o@a"}
    assert runnable(tasks, {**names, "compile:o@a": [str(tmp_path / "o.ctx")]}, files) == {"compile:o@a"}
    assert runnable(tasks, names, {**files, str(tmp_path / "other.onnx"): None}) == {"compile:o@a"}


def test_a_file_seen_with_two_identities_in_one_run_is_recorded_as_neither(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_text("one")
    checker = type("Checker", (HashChecker,), {"checked": {}, "published": {}, "edited": set()})()
    assert checker.exists(str(path))
    path.write_text("two, longer")  # changed between two tasks' checks
    assert checker.exists(str(path))
    assert checker.checked[str(path)] == SEEN_CHANGING != stat_key(os.stat(path))


def test_a_build_after_one_change_hands_doit_that_models_tasks_and_a_named_run_between_voids_the_record(
        tmp_path, host_cache):
    project = Project(tmp_path, host_cache)
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[models.encoder]\npath = '
                     '"models/encoder.onnx"\n[targets.cpu]\nep = "cpu"\n')
    project.env.pop("EPBUILD_FAST_PATH", None)
    project.doit()
    assert HANDED not in project.doit().stdout  # no task was up to date in the first build: no record of any
    perturb_weights(project.root / "models" / "encoder.onnx", 3)
    done = project.doit()
    assert ran(done) == {"compile:encoder@cpu", "validate:encoder@cpu"}
    assert f"2 tasks handed to doit, 2 {HANDED}" in done.stdout  # the tinycnn's two were not
    assert build_report(project)["compile:tinycnn@cpu"]["status"] == "up-to-date"
    perturb_weights(project.root / "models" / "tinycnn.onnx", 4)
    named = project.doit("compile:tinycnn@cpu")  # doit's database changes under the record
    assert ran(named) == {"compile:tinycnn@cpu"}
    done = project.doit()
    assert ran(done) == {"validate:tinycnn@cpu"} and HANDED not in done.stdout  # the full path, every task checked


def test_a_model_whose_new_bytes_drop_its_shape_stage_hands_the_new_plan_and_hides_no_stale_task(tmp_path, host_cache):
    """The stage exists only for a dynamic model: made static, the compile reads the model itself. The record
    cannot know that, so every task of a changed model is made again and compared (not only those reading it)."""
    from onnx import TensorProto, helper, save

    project = Project(tmp_path, host_cache)
    project.env.pop("EPBUILD_FAST_PATH", None)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 8, 8])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9),
         str(project.root / "models" / "relu.onnx"))
    project.manifest('[models.relu]\npath = "models/relu.onnx"\ninputs = { x = [1, 3, 8, 8] }\ntargets = ["npu"]\n'
                     '[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["npu"]\n'
                     '[targets.npu]\nep = "qnn"\noptions = { soc_model = 60 }\n')
    project.doit()
    project.doit()
    assert any(name.startswith("shape:relu") for name in build_report(project))
    single_op_model(project.root / "models" / "relu.onnx", "Relu", shape=(1, 3, 8, 8))  # now static
    done = project.doit()
    assert ran(done) == {"compile:relu@npu", "validate:relu@npu"} and HANDED in done.stdout, done.stdout[-800:]
    report = build_report(project)
    assert not any(name.startswith("shape:") for name in report)
    assert report["compile:tinycnn@npu"]["status"] == "up-to-date"
    project.env["EPBUILD_FAST_PATH"] = "0"
    assert ran(project.doit()) == set()  # the full path agrees: nothing left to run


def test_the_tasks_of_a_target_this_host_cannot_build_are_always_compared(tmp_path, host_cache, monkeypatch):
    """Such a task is a refusal now, whatever the record says it was: its dict is made, never taken from it."""
    from epbuild.tasks.definitions import Tasks
    from epbuild.tasks.project import Project as Loaded

    project = Project(tmp_path, host_cache)
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[targets.cpu]\nep = "cpu"\n'
                     '[targets.dml-gpu]\nep = "dml"\n')
    monkeypatch.chdir(tmp_path)
    loaded = Loaded(tmp_path / "models.toml", [])
    model = "models/tinycnn.onnx"
    record = Recorded({}, {model: stat_key(os.stat(model))})
    assert "dml-gpu" in loaded.unavailable
    assert Tasks(loaded)._suspects(record) == {"compile:tinycnn@dml-gpu", "validate:tinycnn@dml-gpu",
                                               "ops:tinycnn@dml-gpu"}
