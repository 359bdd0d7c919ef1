"""A job runs only in a process whose loaded packages and epbuild code are those its fingerprint names: the fork
server's key holds the toolchain's versions, every job checks what its process loaded, and the code digest that
fingerprints carry covers what the jobs run and nothing else."""

from __future__ import annotations

import shutil

import pytest

from conftest import REPO, SOURCE
from epbuild.errors import BuildError
from epbuild.execute import fork_server, provenance
from epbuild.execute.child import run_child
from epbuild.execute.fork_server import SWITCH
from epbuild.execute.provenance import Provenance
from epbuild.manifest.builds import Limits
from epbuild.steps.job_modules import CODE_ROOTS


@pytest.fixture
def crash_child(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'tests'}")


@pytest.mark.parametrize("mode", ["1", "fork", "0"])
def test_a_job_refuses_a_process_that_loaded_other_versions(tmp_path, monkeypatch, crash_child, mode):
    """The build expects onnxruntime 1.30.0 (the environment was changed under it): a warm worker, a forked
    child and a fresh child each refuse, naming what they loaded."""
    monkeypatch.setenv(SWITCH, mode)
    real = Provenance.read(CODE_ROOTS)
    assert run_child("crash_child", {"action": "sleep"}, tmp_path / "a", Limits(60), "compile m@t", reuse=True,
                     expect=real)
    other = Provenance(real.code, {**real.versions, "onnxruntime": "1.30.0"}, real.roots)
    with pytest.raises(BuildError, match=r"compile m@t: this job's process has onnxruntime 1\.32\.0 \(the build "
                                         r"expects 1\.30\.0\) loaded: .* run it again"):
        run_child("crash_child", {"action": "sleep"}, tmp_path / "b", Limits(60), "compile m@t", reuse=True,
                  expect=other)
    for code, roots in (("0" * 64, real.roots), (real.code, real.roots[:1])):  # other code, or code read elsewhere
        with pytest.raises(BuildError, match="other epbuild code than the build's"):
            run_child("crash_child", {"action": "sleep"}, tmp_path / "c", Limits(60), "compile m@t", reuse=True,
                      expect=Provenance(code, real.versions, roots))


def test_the_fork_server_key_names_the_toolchain_versions(monkeypatch):
    """A server started before onnxruntime was replaced is not the one a later build's jobs go to: the key holds the
    versions this process reads, or those the build names (its Provenance), which give the same key when equal."""
    before = fork_server._server_key("qnn")
    assert fork_server._server_key("qnn", Provenance.read(CODE_ROOTS)) == before
    real = provenance.versions()
    monkeypatch.setattr(fork_server, "versions", lambda: {**real, "onnxruntime": "1.30.0"})
    assert fork_server._server_key("qnn") != before
    named = Provenance.read(CODE_ROOTS)
    assert fork_server._server_key("qnn", Provenance(named.code, {**named.versions, "onnxruntime": "1.30.0"},
                                                     CODE_ROOTS)) != before


def test_the_project_key_hashes_every_file_the_code_digest_reads():
    """So a saved plan, valid under that key, may carry the digest (`execute.provenance.Provenance`)."""
    from epbuild.fast_path import PACKAGE, sources

    hashed = {PACKAGE / path for path in sources()}
    digested = set(provenance.digested_files(CODE_ROOTS))
    assert digested and digested <= hashed
    assert any(path.suffix == ".c" for path in digested)
    templates = {p for p in (PACKAGE / "report" / "templates").iterdir() if p.is_file()}
    assert templates and templates <= hashed  # the report's templates shape what task creation makes
    assert hashed == {p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts} | templates | {
        p for p in (PACKAGE / "steps" / "shims").iterdir() if p.is_file()}


def test_the_code_digest_covers_the_job_modules_and_what_they_import(tmp_path, monkeypatch):
    copy = tmp_path / "epbuild"
    shutil.copytree(SOURCE / "epbuild", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(provenance, "PACKAGE", copy)

    def digest() -> str:
        provenance.code_digest.cache_clear()
        return provenance.code_digest(CODE_ROOTS)

    try:
        original = digest()
        # a module only the compile child reaches through imports, and the shim's C source, shape outputs
        for shaping in ("steps/graph.py", "files/hashing.py", "steps/shims/openvino_vendor.c"):
            path = copy / shaping
            saved = path.read_bytes()
            path.write_bytes(saved + b"\n# changed\n")
            assert digest() != original, shaping
            path.write_bytes(saved)
        # reports and the doit layer do not
        for reporting in ("report/views.py", "tasks/project.py", "dodo.py", "fast_path.py"):
            path = copy / reporting
            path.write_bytes(path.read_bytes() + b"\n# changed\n")
            assert digest() == original, reporting
        # a root that names nothing is refused, not read as a smaller digest
        with pytest.raises(ValueError, match=r"match no file of .*: steps/gone\.py"):
            provenance.digested_files((*CODE_ROOTS, "steps/gone.py"))
    finally:
        provenance.code_digest.cache_clear()
