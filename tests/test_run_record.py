"""The last run's record as base and lines (`epbuild.tasks.run_record`, `state.journaled`): what is loaded is
exactly what the last run recorded, whether it appended a line or rewrote the whole; a torn or foreign line, or a
change to what the record watches, leaves no record (the full path). `test_selection.py` and the incrementality
contract test take it through real builds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from epbuild.fast_path import DEP_FILE
from epbuild.files.layout import Layout
from epbuild.state.journaled import outgrown, read_journaled, write_journaled
from epbuild.state.registry import CONFIGS
from epbuild.tasks.checker import SEEN_CHANGING, saw
from epbuild.tasks.run_record import FORMAT, RECORD, RunRecord, _changes, next_record, packed, unpacked
from epbuild.tasks.selection import Recorded


@pytest.fixture
def layout(tmp_path, monkeypatch) -> Layout:
    monkeypatch.chdir(tmp_path)
    found = Layout(tmp_path / "artifacts")
    found.state.mkdir(parents=True)
    for path in (found.state / CONFIGS, found.build_report, Path(DEP_FILE)):
        path.write_text("{}")
    return found


def _record(count: int, changed: int = -1) -> Recorded:
    tasks = {f"compile:m{i}@cpu": [f"models/m{i}.onnx", f"artifacts/cpu/m{i}/m{i}.onnx"] for i in range(count)}
    files = {path: [i, 2, 3, 4] for i, listed in enumerate(tasks.values()) for path in listed}
    if changed >= 0:
        files[f"models/m{changed}.onnx"] = [99, 9, 9, 9]
    return Recorded(tasks, files, {"group:g": ["compile:m0@cpu"]} if count else {}, {"configs/x.json": [1, 2, 3, 4]})


def _lines(records: RunRecord) -> list:
    return read_journaled(records.state.path(RECORD)).lines


def _same(loaded: Recorded | None, written: Recorded) -> None:
    assert loaded is not None
    assert (loaded.tasks, loaded.files, loaded.task_deps, loaded.looked_at) == \
        (written.tasks, written.files, written.task_deps, written.looked_at)


def test_a_run_that_read_the_record_appends_what_changed_and_the_next_loads_exactly_that(layout):
    records = RunRecord(layout)
    first = _record(200)
    records.write("key", first, None)
    path = records.state.path(RECORD)
    assert _lines(records) == []
    base = path.read_bytes()
    loaded = records.load("key")
    _same(loaded, first)
    second = _record(199, changed=5)  # one task gone, one file's identity changed
    second.task_deps.clear()
    second.looked_at["configs/y.json"] = None
    records.write("key", second, loaded)
    assert path.read_bytes().startswith(base) and len(_lines(records)) == 1
    again = records.load("key")
    _same(again, second)
    third = _record(201)
    records.write("key", third, again)
    assert len(_lines(records)) == 2
    _same(records.load("key"), third)
    assert records.load("other key") is None


def test_a_torn_or_foreign_line_leaves_no_record(layout):
    records = RunRecord(layout)
    records.write("key", _record(200), None)
    records.write("key", _record(200, changed=1), records.load("key"))
    path = records.state.path(RECORD)
    whole = path.read_bytes()
    cut = len(whole) - read_journaled(path).lines_size  # where the lines begin
    path.write_bytes(whole[:-20])  # a killed writer
    assert records.load("key") is None
    generation = _lines_of(whole)["base"]
    path.write_bytes(whole[:cut] + whole[cut:].replace(generation.encode(), b"0" * 16))  # a line of another base
    assert records.load("key") is None
    write_journaled(path, read_journaled(path).base)  # the base alone: the watched files are as the line has them
    assert records.load("key") is not None


def _lines_of(data: bytes) -> dict:
    return json.loads(data.rstrip(b"\n").rsplit(b"\n", 1)[1])


def test_a_record_another_run_wrote_meanwhile_is_rewritten_whole(layout):
    records = RunRecord(layout)
    records.write("key", _record(200), None)
    ours, theirs = records.load("key"), records.load("key")
    records.write("key", _record(200, changed=1), theirs)  # the other run appended first
    mine = _record(200, changed=2)
    records.write("key", mine, ours)
    assert _lines(records) == []
    _same(records.load("key"), mine)


def test_a_journal_outgrowing_the_record_is_merged_into_it(layout):
    records = RunRecord(layout)
    records.write("key", _record(200), None)
    rewritten = 0
    for count in range(201, 240):
        records.write("key", _record(count), records.load("key"))
        read = read_journaled(records.state.path(RECORD))
        if not read.lines:
            rewritten += 1
        else:
            assert not outgrown(len(read.base), read.lines_size)
        _same(records.load("key"), _record(count))
    assert 1 <= rewritten < 39


@pytest.mark.parametrize("written", ["build report", "settings record"])
def test_a_watched_file_written_since_leaves_no_record(layout, written):
    records = RunRecord(layout)
    records.write("key", _record(20), None)
    records.write("key", _record(20, changed=3), records.load("key"))
    assert records.load("key") is not None
    if written == "build report":
        layout.build_report.write_text('{"tasks": {}}')
    else:  # a line appended to it
        with open(layout.state / CONFIGS, "a") as handle:
            handle.write("{}\n")
    assert records.load("key") is None


def _reference_record(old: Recorded, kept: list[str], found: dict, found_deps: dict, checked: dict) -> Recorded:
    """The record as the reporter computed it before `next_record`: every kept file's identity merged into what
    doit saw (`saw`), then every task's files looked up one by one."""
    checked = dict(checked)
    tasks = {name: old.tasks[name] for name in kept}
    task_deps = {name: old.task_deps[name] for name in kept if name in old.task_deps}
    tasks.update(found)
    task_deps.update(found_deps)
    for path in {path for name in kept for path in old.tasks[name]}:
        saw(checked, path, old.files[path])
    return Recorded(tasks, {path: checked.get(path) for listed in tasks.values() for path in listed}, task_deps)


@pytest.mark.parametrize("seed", range(40))
def test_the_next_record_is_the_full_computations_and_a_journal_line_carries_exactly_the_difference(layout, seed):
    rng = random.Random(seed)
    shared = [f"configs/o{i}.json" for i in range(3)]  # read by many tasks: kept and handed ones share them
    old_tasks = {f"compile:m{i}@cpu": [f"models/m{i}.onnx", *rng.sample(shared, rng.randint(0, 2)),
                                       f"artifacts/cpu/m{i}/m{i}.onnx"] for i in range(30)}
    old = Recorded(old_tasks, {path: [rng.randint(1, 3), 2, 3, 4] for listed in old_tasks.values() for path in listed},
                   {name: ["stages:x"] for name in old_tasks if rng.random() < 0.3})
    names = list(old_tasks)
    kept = rng.sample(names, rng.randint(0, len(names)))
    handed = [name for name in names if name not in kept] + ["compile:new@cpu"]  # one gone: neither kept nor found
    found = {name: [*old_tasks.get(name, ["models/new.onnx"])[:-1], rng.choice(shared), "artifacts/x.onnx"]
             for name in handed[1:] if rng.random() < 0.7}
    found_deps = {name: ["stages:y"] for name in found if rng.random() < 0.5}
    paths = sorted({path for listed in [*old_tasks.values(), *found.values()] for path in listed})
    checked = {path: rng.choice([old.files.get(path), [9, 9, 9, 9], SEEN_CHANGING])
               for path in rng.sample(paths, len(paths) // 2)}
    made = next_record(old, kept, found, found_deps, checked)
    expected = _reference_record(old, kept, found, found_deps, checked)
    assert (made.tasks, made.files, made.task_deps) == (expected.tasks, expected.files, expected.task_deps)
    records = RunRecord(layout)
    records.write("key", old, None)
    made.looked_at = {}
    records.write("key", made, records.load("key"))
    _same(records.load("key"), made)


def test_changes_are_found_by_value_where_the_objects_differ():
    same = [1, 2, 3, 4]
    before = {"a": same, "b": [1, 2], "c": [5], "gone": [0]}
    after = {"a": same, "b": [1, 2], "c": [6], "new": None}  # a new None entry is a change
    assert _changes(before, after) == ({"c": [6], "new": None}, ["gone"])


def test_packed_files_read_back_exactly_whatever_their_identities():
    """The base packs identities as 64-bit numbers (`packed`): every identity of another form (absent, seen
    changing, an inode past 2**63, a time before 1970) comes back as it was, by position, and so does every path."""
    files = {"models/a.onnx": [10, 1_796_000_000_000_000_000, 1_796_000_000_000_000_001, 42],
             "gone.onnx": None, "seen.onnx": list(SEEN_CHANGING), "big inode": [1, 2, 3, 2**64 - 1],
             "old": [0, -5_000_000_000, -1, 7], "dïr ü/m.onnx": [5, 6, 7, 8],
             "bad\udcff.onnx": [1, 1, 1, 1], "too wide": [2**63, 0, 0, 0], "": [9, 9, 9, 9]}
    form = json.loads(json.dumps(packed(files)))  # as the record holds it
    assert unpacked(form) == files and list(unpacked(form)) == list(files)
    assert unpacked(json.loads(json.dumps(packed({})))) == {}
    plain = {f"p{i}": [i, i + 1, i + 2, i + 3] for i in range(1000)}
    assert unpacked(packed(plain)) == plain and packed(plain)["others"] == []


@pytest.mark.parametrize("forged", ["not a dict", "short", "bad base64", "negative position", "past the end",
                                    "missing key"])
def test_a_packed_form_that_is_not_what_packed_wrote_is_refused(forged):
    form = packed({"a": [1, 2, 3, 4], "b": None})
    if forged == "not a dict":
        form = [form]
    elif forged == "short":
        form["paths"] += "\0c"
    elif forged == "bad base64":
        form["identities"] = "!!!!"
    elif forged == "negative position":
        form["others"] = [[-1, None]]
    elif forged == "past the end":
        form["others"] = [[5, None]]
    else:
        del form["others"]
    with pytest.raises((ValueError, IndexError)):
        unpacked(form)


def test_a_base_whose_files_are_not_packed_leaves_no_record(layout):
    """A record of the previous format, or one edited by hand, is a miss (the full path), never a traceback."""
    records = RunRecord(layout)
    records.write("key", _record(20), None)
    path = records.state.path(RECORD)
    base = json.loads(read_journaled(path).base.split(b"\n", 3)[3])
    base["files"] = {"models/m0.onnx": [0, 2, 3, 4]}  # the previous form: a list per file
    from epbuild.state.records import encode_record

    write_journaled(path, encode_record({"key": f"{FORMAT}:key", **base}))
    assert records.load("key") is None
