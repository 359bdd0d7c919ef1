"""A checkout's files are data, never code (issue 60): whatever a pull request force-adds under `artifacts/` (a
pickle where a state record was, a journaled record with a pickled base, a typed record that names a class it may
not hold) is never run by `epbuild list`, `epbuild` or `doit`, on a fresh clone or a built one; each is a miss."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from conftest import ran
from epbuild.state.registry import STATE_FILES

MANIFEST = """
[models.tinycnn]
path = "models/tinycnn.onnx"

[targets.cpu]
ep = "cpu"
"""


class _Payload:
    """What an attacker pickles: unpickling it runs a command (it writes the marker file)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (subprocess.call, (["touch", self.marker],))


def _plant(state, marker) -> list[str]:
    """A payload in every file the registry names (and the names older epbuilds pickled), in each form a reader
    could take it for: a bare pickle, a journaled record whose base is a pickle, a record whose body is one."""
    payload = pickle.dumps(_Payload(str(marker)))
    journaled = b"epbuild-journaled %d -\n" % len(payload) + payload
    record = b"epbuild-record 1\n\"k\"\nnull\n" + payload
    names = ["noop.pickle", "plan.pickle", "last-run.pickle", "report-parts.pickle", "noop.record", "plan.record"]
    names += [f.pattern for f in STATE_FILES if "*" not in f.pattern and f.pattern not in ("format", "records.lock")]
    state.mkdir(parents=True, exist_ok=True)
    for name in dict.fromkeys(names):
        data = journaled if name.endswith(".journaled") else record if name.endswith(".record") else payload
        (state / name).write_bytes(data)
    (state / "hashes").mkdir(exist_ok=True)
    (state / "hashes" / "00.tsv").write_bytes(payload)
    return names


def _epbuild(project, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "epbuild", *args], cwd=project.root, env=project.env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("when", ["fresh clone", "built"])
def test_a_pickle_planted_under_state_never_runs(project, tmp_path, when):
    project.manifest(MANIFEST)
    state = project.artifacts / ".state"
    marker = tmp_path / "payload-ran"
    if when == "built":
        project.doit()
        project.doit()  # a full no-op: every record written
    else:  # as a clone has it: no state layout marker either
        for entry in state.iterdir():
            entry.unlink()
    _plant(state, marker)
    listed = _epbuild(project, "list")
    assert listed.returncode == 0, listed.stderr
    assert "compile:tinycnn@cpu" in listed.stdout
    for run in (_epbuild(project), project.doit(), _epbuild(project, "list")):
        assert run.returncode == 0, run.stdout + run.stderr
    assert not marker.exists()


def test_a_typed_record_naming_a_class_it_may_not_hold_is_a_miss(project, tmp_path):
    """The saved plan is typed JSON: a planted one that is current by its key and files but names another class
    (anything a pickle could, here `subprocess.Popen`) or a class with fields it lacks is read as no plan."""
    from epbuild.plan.saved_plan import PLAN, PLAN_CLASSES
    from epbuild.state import codec
    from epbuild.state.records import decode_record

    body = b'{"models":[],"folders":{},"plan":{"$t":"Popen","args":["touch","%s"]}}' % str(tmp_path / "m").encode()
    assert decode_record(b'epbuild-record 1\n"k"\nnull\n' + body, "k", PLAN_CLASSES) is None
    assert decode_record(b'epbuild-record 1\n"k"\nnull\n{"plan":{"$t":"Plan","read":1}}', "k", PLAN_CLASSES) is None
    assert decode_record(b'epbuild-record 1\n"k"\nnull\n{"plan":{"$t":"EpInfo","v":"nope"}}', "k",
                         PLAN_CLASSES) is None
    assert decode_record(b'epbuild-record 1\n"k"\nnull\n{"plan":{"$t":"StageKind","v":"x"}}', "k",
                         PLAN_CLASSES) is None
    with pytest.raises(ValueError):
        codec.loads('{"$t":"map","v":[[[1],2]]}', PLAN_CLASSES)  # an unhashable key
    assert PLAN == "plan.record" and not (tmp_path / "m").exists()
    # the key is compared before the body is decoded: a body no reader could decode costs nothing under another key
    assert decode_record(b'epbuild-record 1\n"other"\nnull\n\x80\x04not json', "k") is None
    project.manifest(MANIFEST)
    project.doit()
    run = project.doit()
    assert ran(run) <= {"unavailable"}


OUTSIDE = """
[models.tinycnn]
path = "models/tinycnn.onnx"
targets = ["ov"]

[targets.ov]
ep = "openvino@pypi"
device = "cpu"
options = {{ load_config = "{config}" }}
option_files = ["load_config"]
"""


@pytest.mark.parametrize("how", ["absolute", "relative", "symbolic link"])
def test_an_option_file_outside_the_project_is_refused_before_anything_is_built(project, tmp_path, how):
    """A secrets file named as an option file would be copied into the artifact, the package and the cache entry
    (and a push build's remote): refused in one line naming the key, however it is named (a link is judged by where
    it points)."""
    secret = tmp_path / "secrets" / "credentials.json"
    secret.parent.mkdir()
    secret.write_text('{"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}')
    named = {"absolute": str(secret), "relative": "../secrets/credentials.json",
             "symbolic link": "configs/innocent.json"}[how]
    if how == "symbolic link":
        (project.root / "configs" / "innocent.json").symlink_to(secret)
    project.manifest(OUTSIDE.format(config=named))
    done = project.doit(check=False)
    assert done.returncode != 0
    line = [row for row in done.stderr.splitlines() if row.startswith("error:")]
    assert len(line) == 1 and "targets.ov.options.load_config" in line[0] and "outside the project" in line[0]
    assert "EPBUILD_ROOTS" in line[0] and "Traceback" not in done.stderr
    published = [p for p in project.artifacts.rglob("*") if p.is_file() and ".state" not in p.parts]
    assert published == [] and not any(p.is_file() for p in project.cache.rglob("*"))
    # a root the user names (in the environment, not the manifest a pull request can edit) admits it
    project.env["EPBUILD_ROOTS"] = str(secret.parent)
    listed = project.doit("list", check=False)
    assert listed.returncode == 0, listed.stderr
    project.env["EPBUILD_ROOTS"] = "relative/folder"
    refused = project.doit("list", check=False)
    assert refused.returncode != 0 and "EPBUILD_ROOTS: 'relative/folder' is not an absolute path to a folder" in \
        refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize("key", ["path", "validation.inputs", "validation.reference", "quantize.calibration",
                                 "config"])
def test_every_file_the_manifest_names_stays_inside_the_project(project, tmp_path, key):
    import shutil

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(project.root / "models" / "tinycnn.onnx", outside / "tinycnn.onnx")
    (outside / "calib").mkdir()
    shutil.copy(next((project.root / "models" / "calib" / "tinycnn").glob("*.npz")), outside / "calib" / "a.npz")
    (outside / "in.npz").write_bytes(b"")
    (outside / "qnn.json").write_text('{"compile": {"provider_options": {"backend_type": "htp"}}}')
    model = {"path": f'path = "{outside / "tinycnn.onnx"}"'}.get(key, 'path = "models/tinycnn.onnx"')
    extra = {"validation.inputs": f'validation = {{ inputs = "{outside / "in.npz"}" }}',
             "validation.reference": f'validation = {{ reference = "{outside / "tinycnn.onnx"}" }}',
             "quantize.calibration": f'quantize = {{ calibration = "{outside / "calib"}" }}'}.get(key, "")
    target = f'config = "{outside / "qnn.json"}"' if key == "config" else 'ep = "cpu"'
    project.manifest(f"[models.tinycnn]\n{model}\n{extra}\n\n[targets.t]\n{target}\n")
    done = project.doit("list", check=False)
    where = f"targets.t.{key}" if key == "config" else f"models.tinycnn.{key}"
    assert done.returncode != 0 and f"{where}: " in done.stderr and "outside the project" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("planted", ["artifacts/cpu", "artifacts/.logs/cpu/tinycnn.compile.log", "artifacts/.state",
                                     "artifacts/.state/hashes/00.tsv", "artifacts/packages"])
def test_a_symbolic_link_planted_under_artifacts_is_never_written_through(project, tmp_path, planted):
    """git commits links: `artifacts/cpu -> ~` would have a publish move `~/tinycnn` aside and delete it, a log
    link would have a compile overwrite its target. A build removes every such link before it writes, with a line,
    and the files they pointed to keep their bytes."""
    home = tmp_path / "home"
    (home / "tinycnn").mkdir(parents=True)
    (home / "tinycnn" / "precious.txt").write_text("keep me")
    (home / "bashrc").write_text("keep me too")
    project.manifest(MANIFEST)
    if planted.endswith("cpu"):
        project.artifacts.mkdir(exist_ok=True)
        (project.root / planted).symlink_to(home)
    else:
        project.doit()
        link = project.root / planted
        if link.is_dir():
            import shutil

            shutil.rmtree(link)
        link.unlink(missing_ok=True)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(home / "bashrc" if link.suffix else home)
        (project.root / "models" / "tinycnn.onnx").write_bytes((project.root / "models" / "tinycnn.onnx").read_bytes())
    done = project.doit()
    assert f"warning: removed {planted}: a symbolic link under artifacts/" in done.stderr
    assert (home / "tinycnn" / "precious.txt").read_text() == "keep me" and (home / "bashrc").read_text() == \
        "keep me too"
    assert sorted(p.name for p in home.iterdir()) == ["bashrc", "tinycnn"]
    assert (project.artifacts / "cpu" / "tinycnn" / "artifact.json").is_file()


@pytest.mark.parametrize("path", ["external-data.journaled", "plan.record", "noop.record", "last-run.journaled"])
def test_a_state_file_replaced_by_a_folder_is_rewritten_not_a_traceback(project, path):
    project.manifest(MANIFEST)
    project.doit()
    project.doit()  # a full no-op: its stamp written
    state = project.artifacts / ".state"
    (state / path).unlink()
    (state / path / "inner").mkdir(parents=True)
    project.env["EPBUILD_FAST_PATH"] = "0"  # the full path, which reads and writes every record
    for _ in range(2):
        done = project.doit()
        assert "Traceback" not in done.stderr and "warning: build state not saved" not in done.stdout
    assert (state / path).is_file()


def test_a_state_folder_that_is_a_file_is_replaced(project):
    project.manifest(MANIFEST)
    state = project.artifacts / ".state"
    import shutil

    shutil.rmtree(state)
    state.write_text("not a folder")
    done = project.doit()
    assert "Traceback" not in done.stderr and state.is_dir()
    assert ran(project.doit()) <= {"unavailable"}


def test_a_committed_build_state_vouches_for_nothing(project, tmp_path):
    """A pull request commits `artifacts/` with its `.state/` records and doit's database, one artifact's bytes
    swapped and every hash of it rewritten to match, built where CI builds (the same path): its records vouched for
    the swapped bytes (`4 up-to-date`). They were written under its author's key, not this user's, so the first build
    here empties them and checks every artifact afresh."""
    import hashlib

    two = MANIFEST + '\n[models.encoder]\npath = "models/encoder.onnx"\n'
    project.manifest(two)
    author = {**project.env, "XDG_STATE_HOME": str(tmp_path / "author"),
              "EPBUILD_CACHE_DIR": str(tmp_path / "author-cache")}
    assert subprocess.run([sys.executable, "-m", "doit"], cwd=project.root, env=author, capture_output=True,
                          timeout=600).returncode == 0
    artifact = project.artifacts / "cpu" / "tinycnn" / "tinycnn.onnx"
    honest = artifact.read_bytes()
    swapped = (project.artifacts / "cpu" / "encoder" / "encoder.onnx").read_bytes()
    artifact.write_bytes(swapped)
    forged = 0
    for old, new in ((hashlib.sha256(honest).hexdigest(), hashlib.sha256(swapped).hexdigest()),
                     (hashlib.md5(honest).hexdigest(), hashlib.md5(swapped).hexdigest())):
        for path in [*project.artifacts.rglob("*"), *project.root.glob(".doit.db*")]:
            if path.is_file() and old.encode() in path.read_bytes():
                path.write_bytes(path.read_bytes().replace(old.encode(), new.encode()))
                forged += 1
    assert forged >= 3  # the published files' record, the hash memory, the build report
    ci = {**project.env, "XDG_STATE_HOME": str(tmp_path / "ci"), "EPBUILD_CACHE_DIR": str(tmp_path / "ci-cache")}
    done = subprocess.run([sys.executable, "-m", "doit"], cwd=project.root, env=ci, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "artifacts/.state was not written by this user here" in done.stderr, done.stderr
    assert "compile:tinycnn@cpu" in ran(done) and artifact.read_bytes() == honest
    again = subprocess.run([sys.executable, "-m", "doit"], cwd=project.root, env=ci, capture_output=True, text=True,
                           timeout=600)
    assert ran(again) == set() and "not written by this user" not in again.stderr  # its own state holds
