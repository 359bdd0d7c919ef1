"""Faults of the machine around a build: what killed builds leave behind (scratch folders name their owner, and a
build removes those whose owner is gone; `doit prune` says what it freed), and a local cache that is read-only or
full (one warning, the build goes on without storing)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import clone, ran
from epbuild.files.owners import owner_gone, owner_tag

MANIFEST = '[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n[targets.cpu]\nep = "cpu"\n'


DEAD = owner_tag().split("-")[0] + "-999999-1~"  # this host; no process started one tick after boot builds now


def test_a_build_removes_the_scratch_of_killed_builds_and_keeps_live_ones(project):
    project.manifest(MANIFEST)
    project.doit()
    dead, alive = DEAD, owner_tag()
    assert owner_gone(f"compile.x.{dead}.abc") and not owner_gone(f"compile.x.{alive}.abc")
    leftovers = [project.artifacts / ".scratch" / f"compile.tinycnn.cpu.{dead}.k1",
                 project.cache / "tmp" / f"0123456789abcdef.{dead}.k2"]
    for folder in leftovers:
        folder.mkdir(parents=True)
        (folder / "tinycnn.onnx").write_bytes(b"x" * 100_000)
    live = project.artifacts / ".scratch" / f"compile.tinycnn.cpu.{alive}.k3"
    live.mkdir()
    project.doit("forget", "compile:tinycnn@cpu")
    project.doit()
    assert not any(folder.exists() for folder in leftovers) and live.is_dir()
    (project.artifacts / ".scratch" / f"shape.m.{dead}.k4").mkdir()
    pruned = project.doit("prune").stdout
    assert "prune: removed 1 scratch folder(s) of killed builds" in pruned


def _mount(args: list[str], where: Path) -> None:
    done = subprocess.run(["mount", *args, str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting inside the test's folder is not permitted here: {done.stderr.strip()}")


def test_a_read_only_cache_restores_what_it_has_and_stores_nothing_with_one_warning(tmp_path, host_cache):
    first = clone(tmp_path, host_cache, "a", MANIFEST)
    first.doit()
    cache = tmp_path / "a-cache"
    _mount(["--bind", "-o", "ro", str(cache)], cache)
    subprocess.run(["mount", "-o", "remount,ro,bind", str(cache)], capture_output=True)
    try:
        second = clone(tmp_path, host_cache, "b", MANIFEST + '[models.encoder]\npath = "models/encoder.onnx"\n'
                       'targets = ["cpu"]\n', EPBUILD_CACHE_DIR=str(cache))
        done = second.doit()
        assert "restored compile:tinycnn@cpu" in done.stdout and "compiled compile:encoder@cpu" in done.stdout
        warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: local cache")]
        assert len(warnings) == 1 and "Read-only file system" in warnings[0], done.stderr
    finally:
        subprocess.run(["umount", str(cache)], capture_output=True)


def test_a_full_cache_builds_without_storing(tmp_path, host_cache):
    cache = tmp_path / "small-cache"
    cache.mkdir()
    _mount(["-t", "tmpfs", "-o", "size=64k", "tmpfs"], cache)
    try:
        project = clone(tmp_path, host_cache, "a", MANIFEST.replace('targets = ["cpu"]', 'targets = ["cpu"]\n')
                        + '[models.encoder]\npath = "models/encoder.onnx"\ntargets = ["cpu"]\n',
                        EPBUILD_CACHE_DIR=str(cache))
        done = project.doit()
        assert ran(done) >= {"compile:tinycnn@cpu", "compile:encoder@cpu"} and "failed" not in done.stdout
        assert "No space left on device" in done.stderr and (project.artifacts / "cpu" / "encoder").is_dir()
    finally:
        subprocess.run(["umount", str(cache)], capture_output=True)


def test_the_openvino_vendor_shim_is_built_where_it_can_be(tmp_path):
    from epbuild.steps import vendor_shim

    if not vendor_shim.needed():
        pytest.skip("this host's CPU needs no vendor-id shim for OpenVINO")
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")  # a cache folder that cannot be written
    found = vendor_shim.prepare(blocked / "cache", tmp_path / "state")
    assert found["library"].startswith(str(tmp_path / "state"))
