"""What users asked for on the command line: a mistyped task name gets the closest one, one model's targets by its
name alone, `doit info` / `epbuild explain` saying which setting changed and how, a per-model graph beside the full
one."""

from __future__ import annotations

import subprocess
import sys

from conftest import build_report, ran

MANIFEST = """
[models.tinycnn]
path = "models/tinycnn.onnx"

[models.encoder]
path = "models/encoder.onnx"
targets = ["cpu"]

[targets.cpu]
ep = "cpu"
optimization_level = "extended"

[targets.qnn-htp]
ep = "qnn"
options = { backend_type = "htp", soc_model = 60 }
"""


def test_a_mistyped_task_name_gets_the_closest_one_in_one_line(project):
    project.manifest(MANIFEST)
    done = project.doit("compile:tinycnn@qnn-htq", check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == ("error: no task 'compile:tinycnn@qnn-htq' (did you mean 'compile:tinycnn@qnn-htp'?);"
                                   " `doit list` shows every task")
    assert project.doit("info", "compile:tinycnn@cpux", check=False).returncode == 2
    assert "compile" in project.doit("help", "compile").stdout  # doit's own commands and wildcards still pass
    assert ran(project.doit("compile:encoder@*")) == {"compile:encoder@cpu"}


def test_one_models_targets_by_its_name_alone(project):
    project.manifest(MANIFEST)
    built = ran(project.doit("compile:tinycnn"))
    assert {"compile:tinycnn@cpu", "compile:tinycnn@qnn-htp"} <= built
    assert not any("encoder" in name for name in built)
    assert ran(project.doit("validate:tinycnn")) == {"validate:tinycnn@cpu", "validate:tinycnn@qnn-htp"}
    listing = project.doit("list").stdout  # made when named: the listing keeps one line per (model, target)
    assert "compile:tinycnn@cpu" in listing and "compile:tinycnn " not in listing
    assert not any(line.startswith("ops ") for line in listing.splitlines())  # no qaic model: no operator check
    assert project.doit("list").stdout == listing  # the listing from the cache says the same


def test_info_and_explain_say_which_setting_changed_and_how(project):
    project.manifest(MANIFEST)
    project.doit("compile:tinycnn")
    project.manifest(MANIFEST.replace("soc_model = 60", "soc_model = 69"))
    info = project.doit("info", "compile:tinycnn@qnn-htp", check=False).stdout
    assert "settings changed since its last success: options.soc_model: \"60\" -> \"69\"" in info
    explained = subprocess.run([sys.executable, "-m", "epbuild", "explain", "compile:tinycnn@qnn-htp"],
                               cwd=project.root, env=project.env, capture_output=True, text=True, timeout=300)
    assert "options.soc_model: \"60\" -> \"69\"" in explained.stdout
    assert explained.returncode == 1  # for CI: 1 when it would run, 0 when up to date
    assert "status     : up-to-date" in project.doit("info", "compile:tinycnn@cpu").stdout
    # a nested validation setting: the one value that changed, whole (it showed a truncated list of tables)
    project.manifest(MANIFEST)
    project.doit("validate:encoder@cpu")
    encoder = '[models.encoder]\npath = "models/encoder.onnx"\n'
    project.manifest(MANIFEST.replace(encoder, encoder + "validation = { min_snr_db = 50 }\n"))
    nested = project.doit("info", "validate:encoder@cpu", check=False)
    assert nested.returncode == 1
    assert "settings changed since its last success: members[0].thresholds.min_snr_db: (unset) -> 50.0" in \
        nested.stdout and "..." not in nested.stdout.split("settings changed")[1].splitlines()[0], nested.stdout


def test_explain_takes_the_tasks_a_task_depends_on_into_account(project):
    """doit's `info` judged a task alone: after a compile setting changed, `explain validate:...` said up to date
    (exit 0) and the validation ran next. It is up to date only when nothing it depends on runs first."""
    project.manifest(MANIFEST)
    project.doit()
    project.manifest(MANIFEST.replace("soc_model = 60", "soc_model = 69"))

    def explain(task):
        return subprocess.run([sys.executable, "-m", "epbuild", "explain", task], cwd=project.root, env=project.env,
                              capture_output=True, text=True, timeout=300)

    after = explain("validate:tinycnn@qnn-htp")
    assert after.returncode == 1 and "status     : up-to-date" not in after.stdout, after.stdout
    assert "\nstatus     : run\n * compile:tinycnn@qnn-htp would run first: its outputs are this task's inputs" in \
        after.stdout
    cpu = explain("validate:tinycnn@cpu")
    assert cpu.returncode == 0 and "status     : up-to-date" in cpu.stdout, cpu.stdout  # nothing it needs runs
    assert "validate:tinycnn@qnn-htp" in ran(project.doit())  # as explain said


def test_a_graph_of_one_model_is_written_beside_the_full_graph(project):
    project.manifest(MANIFEST)
    project.doit("graph")
    full = (project.artifacts / "graph.dot").read_text()
    done = project.doit("graph", "--model", "encoder")
    assert "graph-encoder.dot" in done.stdout
    assert (project.artifacts / "graph.dot").read_text() == full
    one = (project.artifacts / "graph-encoder.dot").read_text()
    assert '"compile:encoder@cpu"' in one and "tinycnn" not in one
    assert '"compile:tinycnn"' not in full  # the per-model selections are no nodes of their own


def test_tasks_a_failed_task_kept_from_running_are_not_built_counted_apart_everywhere(project):
    import json

    import numpy as np

    (project.root / "models" / "badcal").mkdir()
    np.savez(project.root / "models" / "badcal" / "0.npz", y=np.zeros((1, 3, 64, 64), np.float32))  # no input y
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\nquantize = { calibration = "models/badcal/" }\n'
                     'targets = ["cpu", "cpu-int8"]\n[targets.cpu]\nep = "cpu"\n'
                     '[targets.cpu-int8]\nep = "cpu"\nquantized = true\n')
    done = project.doit("--continue", check=False)
    assert done.returncode == 1  # tasks failed: one rule, whatever was not built because of them (docs/ci.md)
    assert "not built compile:tinycnn@cpu-int8: quantize:tinycnn[generic] failed" in done.stdout
    assert "not built validate:tinycnn@cpu-int8: quantize:tinycnn[generic] failed" in done.stdout
    summary = next(line for line in done.stdout.splitlines() if line.startswith("summary: "))
    assert summary.startswith("summary: 1 compiled, 1 failed, 2 not built, 1 validated")
    assert done.stdout.splitlines()[-1] == "report: artifacts/report.html"
    tasks = json.loads((project.artifacts / "build-report.json").read_text())["tasks"]
    assert tasks["compile:tinycnn@cpu-int8"] == {"status": "not built", "reason": "quantize:tinycnn[generic] failed"}
    junit = (project.artifacts / "junit.xml").read_text()
    assert 'tests="2" failures="0" skipped="1"' in junit and 'message="quantize:tinycnn[generic] failed"' in junit
    page = (project.artifacts / "report.html").read_text()
    assert '<span class="badge warn">not built</span>' in page and "-0" not in page.split("<h2>Every task</h2>")[1]
    assert "tinycnn.onnx" in page and "EP SDK None" not in page  # a CPU artifact has no EP SDK to name
    assert '<a href="cpu/tinycnn/tinycnn.onnx">tinycnn.onnx</a>' in page  # each file a link beside the page
    project.doit("graph")
    assert '"compile:tinycnn@cpu-int8\\nnot built", shape=box, fillcolor="#fdf0d5"' in (
        project.artifacts / "graph.dot").read_text()


def test_a_restored_validation_reads_passed_restored_and_the_matrix_has_a_legend(project, tmp_path, host_cache):
    from conftest import clone

    manifest = '[models.tinycnn]\npath = "models/tinycnn.onnx"\n[targets.cpu]\nep = "cpu"\n'
    project.manifest(manifest)
    project.doit()
    second = clone(tmp_path, host_cache, "second", manifest, EPBUILD_CACHE_DIR=str(project.cache))
    second.doit()
    page = (second.artifacts / "report.html").read_text()
    assert '<span class="badge good">passed (restored)</span>' in page
    assert "<b>offload</b>, the share of" in page
    assert '<span class="badge warn">not built</span> a task it needs' in page


def test_epbuild_log_shows_what_happened_and_nothing_without_it(project):
    """EPBUILD_LOG=debug: the `epbuild` logger on stderr (the plan, the shortcut not taken); unset: no log line."""
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n\n[targets.cpu]\nep = "cpu"\n')
    quiet = project.doit("list")
    assert "epbuild DEBUG" not in quiet.stderr
    project.env["EPBUILD_LOG"] = "debug"
    try:
        loud = project.doit()
    finally:
        del project.env["EPBUILD_LOG"]
    assert "epbuild DEBUG epbuild.tasks.loading: 1 builds and 0 stages" in loud.stderr, loud.stderr
    assert "compiled compile:tinycnn@cpu" in loud.stdout
    # below the doit layer too: the cache's decision, and where each job ran and how it ended
    assert "epbuild DEBUG epbuild.store.cache: compile:tinycnn@cpu: not in the caches: producing" in loud.stderr
    assert "epbuild DEBUG epbuild.execute.child: compile tinycnn@cpu (CPUExecutionProvider): running " \
           "epbuild.steps.compile in a " in loud.stderr
    assert "epbuild DEBUG epbuild.execute.child: validate tinycnn@cpu (CPUExecutionProvider): exit 0 after" \
        in loud.stderr


def test_a_listing_piped_into_a_reader_that_stops_ends_quietly(project):
    """`epbuild list | head -3` (and `doit list | head`): the reader gone, the listing ends as Unix tools do, killed
    by SIGPIPE without a traceback (doit printed a BrokenPipeError)."""
    import signal

    project.manifest(MANIFEST)
    for command in (["-m", "epbuild", "list"], ["-m", "doit", "list"]):
        listing = subprocess.Popen([sys.executable, *command], cwd=project.root, env=project.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        listing.stdout.close()  # the reader stops before the first line
        _, err = listing.communicate(timeout=300)
        assert listing.returncode == -signal.SIGPIPE and b"Traceback" not in err, err.decode()


def test_a_build_stopped_by_a_failure_says_how_many_tasks_it_never_attempted(project):
    """Without `--continue` doit stops at the first failure: the summary counts what it never reached and says how
    to build the rest (it said only `1 failed, N up-to-date`)."""
    import numpy as np

    (project.root / "models" / "badcal").mkdir()
    np.savez(project.root / "models" / "badcal" / "0.npz", y=np.zeros((1, 3, 64, 64), np.float32))  # no input y
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\nquantize = { calibration = "models/badcal/" }\n'
                     'targets = ["cpu", "cpu-int8"]\n[targets.cpu]\nep = "cpu"\n'
                     '[targets.cpu-int8]\nep = "cpu"\nquantized = true\n')
    done = project.doit(check=False)
    assert done.returncode == 1
    summary = next(line for line in done.stdout.splitlines() if line.startswith("summary: "))
    attempted = ran(done)
    planned = {"quantize:tinycnn[generic]", "compile:tinycnn@cpu", "validate:tinycnn@cpu", "compile:tinycnn@cpu-int8",
               "validate:tinycnn@cpu-int8"}
    assert summary.endswith(f"; {len(planned - attempted)} not tried (the build stopped at the first failure): run "
                            "with --continue to build them"), done.stdout
    assert planned - attempted
    assert "not tried" not in next(line for line in project.doit("--continue", check=False).stdout.splitlines()
                                       if line.startswith("summary: "))


def test_epbuilds_own_help_and_version(project):
    """`epbuild --help`, `-h` and `help` print epbuild's commands and options (doit's banner named none of them;
    `-h` was a doit parse error); `--version` gives epbuild's with ONNX Runtime's and the EP plugins'."""
    from importlib.metadata import version

    for words in (["--help"], ["-h"], ["help"]):
        shown = subprocess.run([sys.executable, "-m", "epbuild", *words], cwd=project.root, env=project.env,
                               capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0 and shown.stderr == "", shown.stderr
        assert shown.stdout.startswith("epbuild: ONNX models compiled per target")
        for named in ("explain TASK", "run MODEL[@TARGET]", "check", "backends", "cache", "graph", "prune",
                      "--manifest PATH", "--version", "doit option"):
            assert named in shown.stdout, named
    told = subprocess.run([sys.executable, "-m", "epbuild", "--version"], cwd=project.root, env=project.env,
                          capture_output=True, text=True, timeout=120)
    assert told.returncode == 0
    assert told.stdout.startswith(f"epbuild {version('epbuild')} (onnxruntime {version('onnxruntime')}, "
                                  f"onnxruntime-qnn {version('onnxruntime-qnn')}, onnxruntime-ep-openvino "
                                  f"{version('onnxruntime-ep-openvino')}"), told.stdout
    doit_help = subprocess.run([sys.executable, "-m", "epbuild", "help", "run"], cwd=project.root, env=project.env,
                               capture_output=True, text=True, timeout=120)
    assert doit_help.returncode == 0 and "--continue" in doit_help.stdout  # doit's own help for a command


def test_a_task_the_stopped_build_never_reached_loses_its_last_verdict(project):
    """An entry of build-report.json says what this run found: a task doit was handed and never reached (the build
    stopped at the first failure) is `pending`, not the `compiled` or `up-to-date` of the run before, which this
    run never checked (its code or inputs may have changed since)."""
    import numpy as np

    (project.root / "models" / "cal").mkdir()
    np.savez(project.root / "models" / "cal" / "0.npz", x=np.zeros((1, 3, 64, 64), np.float32))
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\nquantize = { calibration = "models/cal/" }\n'
                     'targets = ["cpu", "cpu-int8"]\n[targets.cpu]\nep = "cpu"\n'
                     '[targets.cpu-int8]\nep = "cpu"\nquantized = true\n')
    project.doit()
    np.savez(project.root / "models" / "cal" / "0.npz", y=np.zeros((1, 3, 64, 64), np.float32))  # no input y now
    project.env["EPBUILD_FAST_PATH"] = "0"  # every task handed to doit
    done = project.doit(check=False)
    assert done.returncode == 1
    attempted = ran(done) | {line[3:].strip() for line in done.stdout.splitlines() if line.startswith("-- ")}
    entries = build_report(project)
    left = [name for name in entries if name not in attempted and entries[name]["status"] == "pending"]
    assert left, done.stdout
    for name in left:
        assert entries[name]["reason"].startswith("not attempted: the build stopped at the first failure"), name
    assert f"; {len(left)} not tried" in done.stdout
    assert not [name for name, entry in entries.items() if name not in attempted and entry["status"] in
                ("compiled", "validated", "up-to-date")], entries


def _in_order(stdout: str) -> list[str]:
    """Each task's lines that came before its `.  name` line (none where the console is in order)."""
    lines, announced, early = stdout.splitlines(), set(), []
    for line in lines:
        if line.startswith(".  "):
            announced.add(line[3:].strip())
            continue
        for verb in ("compiled", "restored", "passed", "validated"):
            if line.startswith(f"{verb} "):
                name = line.split(" ", 2)[1].rstrip(":")
                if name not in announced:
                    early.append(line)
    return early


def test_each_tasks_lines_follow_its_name_with_worker_processes(project):
    """With doit's worker processes (`-n 1` and more) the main process said `.  validate:m@t` when the worker's
    message reached it, and a task restored from the cache had printed `passed validate:m@t: ... (restored ...)`
    first; prune's `removed ...` lines came before `.  prune`. Now the worker says the name, then its lines; the
    serial runner (`-n 0`) is as it was."""
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n\n[models.encoder]\npath = '
                     '"models/encoder.onnx"\n\n[targets.cpu]\nep = "cpu"\n')
    project.doit("-n", "2")
    for jobs in ("2", "1", "0"):
        (project.artifacts / "cpu").rename(project.root / f"moved-{jobs}")  # restored from the cache next
        (project.artifacts / "old").mkdir()  # left over: prune removes it
        pruned = project.doit("-n", jobs, "prune")
        lines = pruned.stdout.splitlines()
        assert lines[0] == ".  prune" and lines[1] == "removed artifacts/old/", pruned.stdout
        done = project.doit("-n", jobs)
        assert _in_order(done.stdout) == [] and ran(done) >= {"validate:tinycnn@cpu", "compile:encoder@cpu"}, \
            done.stdout
        assert sum(line.startswith(".  ") for line in done.stdout.splitlines()) == len(ran(done))  # said once


def test_the_worker_count_is_read_from_the_command_line():
    from epbuild.invocation import Invocation

    assert Invocation.of(["-n", "3"]).processes == 3 and Invocation.of(["-n2", "x"]).processes == 2
    assert Invocation.of(["--process=4"]).processes == 4 and Invocation.of(["--process", "0"]).processes == 0
    assert Invocation.of(["list"]).processes is None and Invocation.of(["-n"]).processes is None
