"""What epbuild remembers between runs (`epbuild.state`): every file a build leaves under `artifacts/.state/` is
named in the registry, docs/state.md is the registry, and a folder of another layout is emptied before use."""

from __future__ import annotations

from conftest import REPO, ran
from epbuild.state.registry import FORMAT, FORMAT_FILE, STATE_FILES, settle_format, table, unlisted
from helpers import TINYCNN_LISTED

MANIFEST = TINYCNN_LISTED


def test_every_file_a_build_remembers_is_in_the_registry(project):
    project.manifest(MANIFEST)
    project.doit()
    project.doit("list")
    project.doit("list")
    project.doit()
    project.doit()  # the no-op shortcut: its stamp was written by the full no-op before
    state = project.artifacts / ".state"
    assert unlisted(state) == []
    written = {f.pattern for f in STATE_FILES if any(state.glob(f.pattern))}
    assert {"format", "noop.record", "listing.json", "plan.record", "last-run.journaled", "configs.journaled",
            "settings/*.json", "host.json", "hashes/*.tsv", "external-data.journaled", "report-parts.journaled",
            "build-report.sha256", "records.lock"} <= written


def test_docs_state_page_is_the_registry():
    assert (REPO / "docs" / "state.md").read_text() == table()


def test_a_state_folder_of_another_layout_is_emptied_before_use(project, tmp_path):
    loose = tmp_path / "old"
    (loose / "hashes").mkdir(parents=True)
    (loose / "plan.record").write_bytes(b"an older epbuild's")
    (loose / "hashes" / "00.tsv").write_text("x\n")
    assert settle_format(loose) == "layout"
    assert sorted(p.name for p in loose.iterdir()) == ["format", "owner"]  # marked, and stamped as this user's
    assert (loose / "format").read_text() == f"{FORMAT}\n"
    assert settle_format(loose) is None  # this layout's, this user's: kept
    project.manifest(MANIFEST)
    project.doit()
    state = project.artifacts / ".state"
    (state / "format").write_text("0\n")  # as an older epbuild left it
    (state / "stray.bin").write_bytes(b"?")
    again = project.doit()
    assert not (state / "stray.bin").exists() and (state / "format").read_text() == f"{FORMAT}\n"
    assert ran(again) <= {"unavailable", "compile:tinycnn@cpu", "validate:tinycnn@cpu", "compile:tinycnn@qnn-htp",
                          "validate:tinycnn@qnn-htp"}  # a full check: restored from the cache at most
    assert all("restored" in line or "passed" in line for line in again.stdout.splitlines()
               if line.startswith(("compiled", "passed", "restored")))


def _words(line: str) -> list[str]:
    """What marks a line as prose: a docstring's quotes, a backquoted name, the folder's own name."""
    return [mark for mark in ('"""', "`", "artifacts/.state/") if mark in line]


def test_every_path_under_state_is_made_through_the_registry(tmp_path):
    """`state_file` is the one way to a path under `.state/`: a name the registry does not declare is refused, and
    no module of the package joins a name onto the state folder itself."""
    import re

    import pytest

    from epbuild.state.registry import state_file

    assert state_file(tmp_path, "plan.record") == tmp_path / "plan.record"
    assert state_file(tmp_path, "ops/qaic/m.json") == tmp_path / "ops" / "qaic" / "m.json"
    assert state_file(tmp_path, "hashes") == tmp_path / "hashes"
    with pytest.raises(ValueError, match=r"\.state/cache\.pickle is not declared"):
        state_file(tmp_path, "cache.pickle")
    joined = re.compile(r"(\.state|state_dir|\bstate)\s*/\s*[\"'A-Za-z_]")
    offenders = [f"{path.relative_to(REPO)}:{number}" for path in (REPO / "rules" / "epbuild").rglob("*.py")
                 if path.name != "registry.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if joined.search(line.split("#")[0]) and not {'"""', "`", "artifacts/.state/"} & set(_words(line))]
    assert offenders == []


def test_losing_any_state_file_costs_a_check_never_a_wrong_answer(project):
    """Every file under `.state/` is a shortcut or a record a full check rebuilds (the registry's promise): each one
    deleted in turn after a build, the next run does what the registry's `lost` says (nothing, or every task runs
    again and restores its outputs from the cache, never compiling anew), and every artifact keeps its bytes."""
    from epbuild.state.registry import NOTHING_RUNS
    from helpers import tree_bytes

    project.manifest(MANIFEST)
    project.doit()
    project.doit("list")
    assert ran(project.doit()) <= {"unavailable"}
    state = project.artifacts / ".state"
    artifacts = tree_bytes(project.artifacts)  # the reports aside: they hold timings
    tasks = {"compile:tinycnn@cpu", "validate:tinycnn@cpu", "compile:tinycnn@qnn-htp", "validate:tinycnn@qnn-htp"}
    # the layout marker has a test of its own (above) and a contract row
    present = [f for f in STATE_FILES if f.pattern != FORMAT_FILE and any(state.glob(f.pattern))]
    assert len(present) >= 12, [f.pattern for f in present]
    for entry in present:
        for path in state.glob(entry.pattern):
            path.unlink()
        again = project.doit()
        executed = ran(again) - {"unavailable"}
        lines = [line for line in again.stdout.splitlines() if line.startswith(("compiled ", "staged ", "restored "))]
        if entry.lost == NOTHING_RUNS:
            assert executed == set(), f".state/{entry.pattern} lost: {again.stdout[-2000:]}"
        else:
            assert executed == tasks and all(line.startswith("restored ") for line in lines), again.stdout[-2000:]
        assert tree_bytes(project.artifacts) == artifacts, f".state/{entry.pattern} lost: artifacts changed"
        project.env["EPBUILD_FAST_PATH"] = "0"  # a full load: what a no-op's shortcut skipped is made again
        project.doit("list")
        project.doit()
        project.env.pop("EPBUILD_FAST_PATH")


def test_one_rule_judges_every_record_its_key_and_the_files_it_vouches_for(tmp_path):
    """`state.records.current`, for pickled records and JSON documents alike: a record is read only under the key
    its owner passes and while every file it vouches for (present or absent) is as it was; anything else, torn or
    foreign bytes included, is a miss."""
    from epbuild.files.layout import file_identity
    from epbuild.state.folder import StateFolder
    from epbuild.state.records import VOUCHES, vouch

    state = StateFolder(tmp_path / "state")
    model, absent = tmp_path / "model.onnx", tmp_path / "absent.json"
    model.write_bytes(b"1")
    vouches = vouch({str(model): file_identity(str(model)), str(absent): None})
    state.write_record("plan.record", {"key": "k", VOUCHES: vouches, "plan": 1})
    state.write_document("listing.json", {"key": "k", VOUCHES: vouches, "tasks": {}})
    readers = [lambda key: state.read_record("plan.record", key), lambda key: state.read_document("listing.json", key)]
    assert all(read("k") is not None and read("another key") is None for read in readers)
    absent.write_text("{}")  # a file that was absent appears
    assert all(read("k") is None for read in readers)
    absent.unlink()
    assert all(read("k") is not None for read in readers)
    model.write_bytes(b"2")
    assert all(read("k") is None for read in readers)
    state.path("plan.record").write_bytes(b"torn")
    state.path("listing.json").write_text('{"key": "k", "vouches_for": [')
    assert all(read("k") is None for read in readers)


def test_the_vouched_identities_are_judged_file_by_file_through_one_digest(tmp_path, monkeypatch):
    """`records.vouch` keeps paths and one digest: every way a file can change still breaks it (its bytes with size
    and mtime restored, a replacement under the same name, an absent file appearing), relative paths are judged
    from the working folder, and vouches that are not `vouch`'s, or identities no digest can pack, never hold."""
    import os

    from epbuild.files.layout import file_identity
    from epbuild.state.records import IDENTITIES, PATHS, identities_hold, vouch, vouched_files

    monkeypatch.chdir(tmp_path)
    model, absent = tmp_path / "model.onnx", tmp_path / "absent.json"
    model.write_bytes(b"12345678")
    files = {"model.onnx": file_identity("model.onnx"), str(absent): None, "a\0b": None}
    vouches = vouch(files)
    assert identities_hold(vouches) and vouched_files(vouches) == 2  # the path holding NUL names no file
    assert identities_hold(vouch({})) and vouched_files(vouch({})) == 0
    before = model.stat()
    model.write_bytes(b"87654321")  # same size, mtime put back: ctime still moves
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert not identities_hold(vouches)
    vouches = vouch({**files, "model.onnx": file_identity("model.onnx")})
    assert identities_hold(vouches)
    (tmp_path / "new").write_bytes(b"87654321")
    os.replace(tmp_path / "new", model)  # another file under the same name
    assert not identities_hold(vouches)
    vouches = vouch({**files, "model.onnx": file_identity("model.onnx")})
    absent.write_text("{}")
    assert not identities_hold(vouches)
    absent.unlink()
    assert identities_hold(vouches)
    monkeypatch.chdir(tmp_path.parent)  # the same name from another folder names another file
    assert not identities_hold(vouches)
    monkeypatch.chdir(tmp_path)
    huge = vouch({"model.onnx": [1, 2, 3, 2**64]})
    assert huge[IDENTITIES] == "" and not identities_hold(huge)
    for foreign in (None, [], {"model.onnx": file_identity("model.onnx")}, {PATHS: "model.onnx"},
                    {PATHS: 1, IDENTITIES: vouches[IDENTITIES]}):
        assert not identities_hold(foreign)


def test_every_shortcut_names_its_measured_figure():
    """A file that is a shortcut earns its place by a figure (`bench/bench_state.py`: the run it shortens, with it and
    without it); a file that is not one says why it is kept. No timing is judged here, only that it was measured."""
    import json

    measured = json.loads((REPO / "bench" / "results" / "state.json").read_text())["rows"]
    for entry in STATE_FILES:
        if entry.earned_by.startswith("state.json"):
            assert any(what.startswith(f"`.state/{entry.pattern}` ") for what, _ in measured), entry.pattern
        else:
            assert entry.earned_by.startswith("not a shortcut"), entry.pattern
