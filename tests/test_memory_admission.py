"""Memory-aware admission (`execute.memory_ledger`): jobs that allocate what they declare never run together past
the budget; a job above the whole budget runs alone and is never refused; two builds (processes) share one budget;
the expected peak is the task's last recorded one, else the estimate from the model's bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, SOURCE, ran
from epbuild.errors import UserError
from epbuild.execute import memory_ledger
from epbuild.execute.child import run_child
from epbuild.manifest.builds import Limits


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    """A ledger of this test's own (the machine's is shared with every build of this user), and crash_child."""
    folder = tmp_path / "ledger"
    folder.mkdir()
    monkeypatch.setenv(memory_ledger.LEDGER, str(folder))
    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'tests'}{os.pathsep}{SOURCE}")
    return folder


def _jobs(tmp_path: Path, declared: list[tuple[float, int, float]], stagger_s: float = 0.05) -> list[dict]:
    """Run jobs (expected MB, MB they allocate, seconds they hold it) at once from threads, started in this order;
    their answers (with when each child started and ended), in the same order."""
    answers: list[dict] = [{} for _ in declared]

    def one(index: int, expected: float, mb: int, seconds: float) -> None:
        answers[index] = run_child("crash_child", {"action": "allocate", "mb": mb, "seconds": seconds},
                                   tmp_path / f"job{index}", Limits(120, expected_mb=expected), f"compile m{index}@t")

    threads = []
    for index, job in enumerate(declared):
        threads.append(threading.Thread(target=one, args=(index, *job)))
        threads[-1].start()
        time.sleep(stagger_s)  # the order they ask in
    for thread in threads:
        thread.join(timeout=120)
    return answers


def _most_at_once(answers: list[dict], expected: list[float]) -> float:
    """The largest sum of declared peaks among jobs whose children ran at the same time."""
    most = 0.0
    for answer in answers:
        at = answer["started"] + 1e-3
        most = max(most, sum(e for a, e in zip(answers, expected, strict=True) if a["started"] <= at < a["ended"]))
    return most


def test_jobs_that_allocate_what_they_declare_never_exceed_the_budget_together(tmp_path, ledger, monkeypatch):
    monkeypatch.setenv(memory_ledger.SWITCH, str(300 / 1024))  # 300 MB: two of these jobs at once, not three
    declared = [(130.0, 100, 1.0)] * 4
    answers = _jobs(tmp_path, declared)
    assert all("started" in a for a in answers)
    assert _most_at_once(answers, [d[0] for d in declared]) <= 300
    assert all(a["usage"]["peak_mb"] >= 100 for a in answers)  # they did hold what they declared
    overlapping = sum(1 for a in answers for b in answers if a is not b and a["started"] < b["started"] < a["ended"])
    assert overlapping >= 1  # two at a time, not one: admission is not serialisation
    assert memory_ledger.snapshot() == {"running": [], "waiting": []}  # every place given back


def test_a_job_above_the_whole_budget_runs_alone_and_is_never_refused(tmp_path, ledger, monkeypatch):
    monkeypatch.setenv(memory_ledger.SWITCH, str(200 / 1024))
    declared = [(50.0, 10, 0.8), (500.0, 10, 0.8), (50.0, 10, 0.5), (50.0, 10, 0.5)]  # the second asks for 500 MB
    answers = _jobs(tmp_path, declared)
    big = answers[1]
    assert big["ended"] > big["started"]
    others = [a for index, a in enumerate(answers) if index != 1]
    assert not any(a["started"] < big["ended"] and big["started"] < a["ended"] for a in others)
    # in the order they asked: the two after it waited for it, the one before it ran first
    assert answers[0]["started"] < big["started"] < answers[2]["started"]


BUILD = '''
import sys, threading
from pathlib import Path
from epbuild.execute.child import run_child
from epbuild.manifest.builds import Limits
root, label = Path(sys.argv[1]), sys.argv[2]
answers = {}
def one(i):
    answers[i] = run_child("crash_child", {"action": "allocate", "mb": 50, "seconds": 0.8}, root / f"{label}{i}",
                           Limits(120, expected_mb=130.0), f"compile {label}{i}@t")
threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
for t in threads: t.start()
for t in threads: t.join()
import json; print(json.dumps([answers[i] for i in range(2)]))
'''


def test_two_builds_on_one_machine_share_the_budget(tmp_path, ledger, monkeypatch):
    """Two processes (builds) of two jobs each, 130 MB expected per job, a 300 MB budget: never more than two of
    the four at once."""
    monkeypatch.setenv(memory_ledger.SWITCH, str(300 / 1024))
    builds = [subprocess.Popen([sys.executable, "-c", BUILD, str(tmp_path), label], stdout=subprocess.PIPE,
                               text=True, env=dict(os.environ)) for label in ("a", "b")]
    answers = []
    for build in builds:
        out, _ = build.communicate(timeout=120)
        assert build.returncode == 0
        answers += json.loads(out.splitlines()[-1])
    assert _most_at_once(answers, [130.0] * 4) <= 300
    starts = sorted(a["started"] for a in answers)
    assert starts[2] >= min(a["ended"] for a in answers) - 0.05  # the third waited for one of the first two


def test_a_job_of_a_process_that_died_is_not_waited_for(tmp_path, ledger, monkeypatch):
    monkeypatch.setenv(memory_ledger.SWITCH, str(300 / 1024))
    gone = subprocess.run([sys.executable, "-c", "from epbuild.files.owners import owner_tag; print(owner_tag())"],
                          capture_output=True, text=True, check=True, env=dict(os.environ)).stdout.strip()
    claim = {"id": "0", "owner": gone, "mb": 10_000, "what": "x", "since": time.time(), "seen": time.time(),
             "timeout_s": 3600}
    (ledger / "memory.json").write_text(json.dumps({"running": [claim], "waiting": []}))
    started = time.monotonic()
    answer = run_child("crash_child", {"action": "sleep"}, tmp_path / "a", Limits(60, expected_mb=100.0), "compile a@t")
    assert "pid" in answer and time.monotonic() - started < 120  # a wait would never end: any bound shows none
    assert memory_ledger.snapshot() == {"running": [], "waiting": []}


def test_waiting_is_said_on_the_console(tmp_path, ledger, monkeypatch, capsys):
    monkeypatch.setenv(memory_ledger.SWITCH, str(100 / 1024))
    _jobs(tmp_path, [(80.0, 10, 0.6), (80.0, 10, 0.1)])
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("waiting for memory")]
    assert said == ["waiting for memory: compile m1@t expects 80 MB; 1 job(s) hold 80 MB of the 100 MB budget "
                    "(0 s so far)"]


def test_a_budget_that_is_no_number_is_one_line(monkeypatch):
    from epbuild.errors import UserError

    monkeypatch.setenv(memory_ledger.SWITCH, "lots")
    with pytest.raises(UserError, match=r"'lots' is not 0 or a positive number of GB: give the build's memory budget"):
        memory_ledger.budget_mb()
    monkeypatch.setenv(memory_ledger.SWITCH, "0")
    assert memory_ledger.budget_mb() is None  # no admission
    monkeypatch.delenv(memory_ledger.SWITCH)
    assert memory_ledger.budget_mb() == pytest.approx(memory_ledger.host_memory_mb() * memory_ledger.SHARE)


def test_the_expected_peak_is_the_last_recorded_one_else_the_estimate(tmp_path):
    from epbuild.steps.expected_peak import BASE_MB, FACTOR, expected_mb
    from helpers import workspace as make_workspace

    workspace = make_workspace(tmp_path / "artifacts", tmp_path / "cache")
    model = tmp_path / "m.onnx"
    model.write_bytes(b"\0" * (10 << 20))  # 10 MB
    assert expected_mb("compile:m@qnn-htp", "compile", "qnn", [model], workspace) == pytest.approx(
        BASE_MB["qnn"] + FACTOR["compile", "qnn"] * 10)
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "build-report.json").write_text(json.dumps({"format": 1, "tasks": {
        "compile:m@qnn-htp": {"status": "compiled", "child": {"seconds": 3.0, "peak_mb": 5123.4}}}}))
    fresh = make_workspace(tmp_path / "artifacts", tmp_path / "cache")
    assert expected_mb("compile:m@qnn-htp", "compile", "qnn", [model], fresh) == 5123.4
    assert expected_mb("validate:m@qnn-htp", "validate", "qnn", [model], fresh) == pytest.approx(
        BASE_MB["qnn"] + FACTOR["validate", ""] * 10)


def test_one_job_per_core_by_default_and_epbuild_jobs_sets_doits_process_count_without_n():
    from epbuild.errors import UserError

    cores = len(os.sched_getaffinity(0))
    assert memory_ledger.default_jobs({}) == (cores if cores > 1 else 0)  # 0: doit's serial runner
    assert memory_ledger.default_jobs({"EPBUILD_JOBS": "3"}) == 3
    assert memory_ledger.default_jobs({"EPBUILD_JOBS": "1"}) == 0
    assert memory_ledger.default_jobs({"EPBUILD_JOBS": "cores"}) == (cores if cores > 1 else 0)
    with pytest.raises(UserError, match=r"'two': give how many jobs a build runs at once \(1 or more, or `cores`\)"):
        memory_ledger.default_jobs({"EPBUILD_JOBS": "two"})



def test_the_build_table_sets_jobs_and_budget_and_the_environment_wins(monkeypatch):
    assert memory_ledger.default_jobs({}, configured=3) == 3
    assert memory_ledger.default_jobs({}, configured="cores") == memory_ledger.default_jobs({})
    assert memory_ledger.default_jobs({"EPBUILD_JOBS": "2"}, configured=3) == 2
    assert memory_ledger.budget_mb({}, configured_gb=2.0) == 2048
    assert memory_ledger.budget_mb({}, configured_gb=0.0) is None  # 0: no admission
    assert memory_ledger.budget_mb({"EPBUILD_MEMORY_GB": "1"}, configured_gb=2.0) == 1024


def test_a_build_under_a_budget_from_the_manifest_waits_for_memory(project, tmp_path):
    """`[build] jobs = 2, memory_gb = 0.05`: another build's job holds 40 of the 51 MB budget (a claim of this
    process, in a ledger of this test's own), so the build's jobs wait and say so, until that claim is let go: an
    event the test waits on (two tiny compiles doit started together overlapped only when the machine was slow)."""
    from epbuild.files.owners import owner_tag
    from helpers import WAIT_S, wait_for

    ledger = tmp_path / "ledger"
    ledger.mkdir()
    project.env["EPBUILD_MEMORY_LEDGER"] = str(ledger)
    path = ledger / "memory.json"
    claim = {"id": "0", "owner": owner_tag(), "mb": 40, "what": "another build's job", "since": time.time(),
             "seen": time.time(), "timeout_s": 3600}
    path.write_text(json.dumps({"running": [claim], "waiting": []}))
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[models.encoder]\npath = "models/encoder.onnx"\n'
                     '[targets.cpu]\nep = "cpu"\n[build]\njobs = 2\nmemory_gb = 0.05\n')
    build = subprocess.Popen([sys.executable, "-m", "doit", "compile"], cwd=project.root, env=project.env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("a job of the build waiting for memory", lambda: memory_ledger.snapshot(path)["waiting"])
    finally:
        memory_ledger._leave(path, {"id": "0"})
    out, _ = build.communicate(timeout=WAIT_S)
    assert build.returncode == 0, out
    assert "waiting for memory: " in out and "of the 51 MB budget" in out, out
    assert ran(subprocess.CompletedProcess([], 0, out, "")) == {"compile:tinycnn@cpu", "compile:encoder@cpu"}


def test_n_1_runs_one_job_at_a_time_as_before(project):
    """The default is one job per core; `-n 1` (and EPBUILD_JOBS=1) still runs one at a time: under a budget no
    job fits beside another, no job ever waits, since none runs beside it."""
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[models.encoder]\npath = "models/encoder.onnx"\n'
                     '[targets.cpu]\nep = "cpu"\n[build]\nmemory_gb = 0.05\n')
    project.env["EPBUILD_MEMORY_LEDGER"] = str(project.root / "ledger")  # not shared with other builds of the host
    done = project.doit("-n", "1")
    assert "waiting for memory" not in done.stdout, done.stdout
    assert ran(done) == {"compile:tinycnn@cpu", "compile:encoder@cpu", "validate:tinycnn@cpu", "validate:encoder@cpu"}
    import shutil

    shutil.rmtree(project.artifacts)
    project.env.update(EPBUILD_JOBS="1", EPBUILD_CACHE_DIR=str(project.root / "empty-cache"))  # built again
    again = project.doit()
    assert "waiting for memory" not in again.stdout and "compile:encoder@cpu" in ran(again)


def test_a_ledger_folder_is_made_or_refused_in_one_line(tmp_path, monkeypatch):
    from epbuild.errors import UserError

    monkeypatch.setenv("EPBUILD_MEMORY_LEDGER", str(tmp_path / "new" / "ledger"))
    assert memory_ledger.ledger_path() == tmp_path / "new" / "ledger" / "memory.json"
    assert (tmp_path / "new" / "ledger").is_dir()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("EPBUILD_MEMORY_LEDGER", str(tmp_path / "file" / "ledger"))
    with pytest.raises(UserError, match=r"cannot make the ledger's folder \(Not a directory\)"):
        memory_ledger.ledger_path()


def test_a_job_behind_another_in_line_says_so_even_when_nothing_runs(ledger, capsys):
    """First come, first admitted: a job that waits behind another build's queued job (nothing running) names the
    line it waits in, not only what runs (`0 job(s) hold 0 MB` alone read as waiting for nothing)."""
    import threading

    from epbuild.execute.child import _waiting
    from epbuild.files.owners import owner_tag
    from epbuild.manifest.builds import Limits

    path = ledger / "memory.json"
    claim = {"id": "0", "owner": owner_tag(), "mb": 50, "what": "x", "since": time.time(), "seen": time.time(),
             "timeout_s": 60}
    path.write_text(json.dumps({"running": [], "waiting": [claim]}))
    threading.Timer(0.3, lambda: memory_ledger._leave(path, {"id": "0"})).start()
    limits = Limits(60, expected_mb=80.0)
    with memory_ledger.admitted(80.0, "compile m@t", 100.0, path,
                                on_wait=lambda *said: _waiting("compile m@t", limits, 100.0, *said)) as waited:
        assert waited > 0.2
    assert capsys.readouterr().out.splitlines() == [
        "waiting for memory: compile m@t expects 80 MB; 0 job(s) hold 0 MB of the 100 MB budget, 1 job(s) ahead in "
        "line (0 s so far)"]


def _claim(owner: str, mb: float, since_ago: float = 0.0, timeout_s: float = 3600.0, seen_ago: float = 0.0) -> dict:
    now = time.time()
    return {"id": f"{now - since_ago:.6f}", "owner": owner, "mb": mb, "what": "compile x@t", "since": now - since_ago,
            "seen": now - seen_ago, "timeout_s": timeout_s}


@pytest.mark.parametrize("owner", ["~deadbeef-1-1~", "no mark at all"])
def test_no_claim_of_an_owner_this_host_cannot_check_is_waited_for_without_bound(ledger, owner):
    """A ledger shared by containers (`EPBUILD_MEMORY_LEDGER`) holds claims whose owner this host cannot look up: an
    absurd one is honoured at most for its job's own time limit, and never past `UNJUDGED_CLAIM_S` whatever limit it
    names; then it expires and the job runs (before: every build waited forever)."""
    path = ledger / "memory.json"
    absurd = _claim(owner, 1e9, timeout_s=1e12)
    now = time.time()
    assert memory_ledger._entry(absurd, "running", now)  # a fresh claim: honoured for now
    assert not memory_ledger._entry(absurd, "running",
                                    now + memory_ledger.UNJUDGED_CLAIM_S + memory_ledger.GRACE_S + 1)
    assert not memory_ledger._entry(_claim(owner, 1e9, since_ago=120, timeout_s=30), "running", now)
    assert not memory_ledger._entry(_claim(owner, 1e9, seen_ago=memory_ledger.STALE_WAIT_S + 5), "waiting", now)
    late = _claim(owner, 1e9, since_ago=memory_ledger.UNJUDGED_CLAIM_S + memory_ledger.GRACE_S + 5, timeout_s=1e12)
    path.write_text(json.dumps({"running": [late], "waiting": []}))
    with memory_ledger.admitted(100.0, "compile m@t", 1000.0, path) as waited:
        assert waited < 60  # not the claim's hour: a bound far above the milliseconds it takes
    assert memory_ledger.snapshot(path) == {"running": [], "waiting": []}


@pytest.mark.parametrize("ledger_text", [
    "[1, 2]", '{"running": 3, "waiting": []}', '{"running": [{"id": "0", "mb": 10, "what": "x"}]}',
    '{"running": [{"id": "0", "owner": "~deadbeef-1-1~", "mb": "10", "what": "x", "since": 0, "seen": 0, '
    '"timeout_s": 1}]}', '{"running": [{"id": "0", "owner": "o", "mb": NaN, "what": "x", "since": 1, "seen": 1, '
    '"timeout_s": 1}]}', '{"waiting": [[]], "running": [null]}', "[" * 100000])
def test_a_ledger_not_of_this_modules_form_starts_over(ledger, ledger_text):
    path = ledger / "memory.json"
    path.write_text(ledger_text)
    with memory_ledger.admitted(100.0, "compile m@t", 1000.0, path) as waited:
        assert waited < 60  # not the claim's hour: a bound far above the milliseconds it takes
        assert [e["what"] for e in memory_ledger.snapshot(path)["running"]] == ["compile m@t"]


@pytest.mark.parametrize("kind", ["symbolic link", "folder"])
def test_a_ledger_that_is_no_plain_file_is_one_line(project, ledger, kind):
    path = ledger / "memory.json"
    if kind == "symbolic link":
        path.symlink_to(ledger / "elsewhere.json")
    else:
        path.mkdir()
    with pytest.raises(UserError, match=f"EPBUILD_MEMORY_LEDGER: the memory ledger {path} is a {kind}"):
        memory_ledger.check_settings(None)
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n\n[targets.cpu]\nep = "cpu"\n')
    project.env[memory_ledger.LEDGER] = str(ledger)
    done = project.doit(check=False)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("error:")] == [
        f"error: EPBUILD_MEMORY_LEDGER: the memory ledger {path} is a {kind}: it must be a plain file this user may "
        "write (remove it, or name another folder in EPBUILD_MEMORY_LEDGER)"]


@pytest.mark.parametrize("value", ["-1", "nan", "1e400", "inf", "lots"])
def test_a_memory_budget_from_the_environment_is_checked_like_the_manifests(project, value):
    """`EPBUILD_MEMORY_GB=-1` built with admission silently off, where `[build] memory_gb = -1` is refused: one rule
    for both, refused in one line naming the variable before anything is built."""
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n\n[targets.cpu]\nep = "cpu"\n')
    project.env[memory_ledger.SWITCH] = value
    done = project.doit(check=False)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"error: EPBUILD_MEMORY_GB: {value!r} is not 0 or a positive number of GB" in done.stderr
    assert not (project.artifacts / "cpu").exists()
