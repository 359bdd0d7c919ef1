"""What people see: report.html in a real headless Chromium, junit.xml, the GitHub step summary, the task graph,
and the live progress on a pseudo-terminal against plain lines elsewhere."""

from __future__ import annotations

import html
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

import pytest

from conftest import Project, build_report
from helpers import OPENVINO_CPU_TARGET, perturb_weights

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SMALL = '[models.tinycnn]\npath = "models/tinycnn.onnx"\n[models.encoder]\npath = "models/encoder.onnx"\n' \
        '[targets.cpu]\nep = "cpu"\n'
MANIFEST = """
[models.tinycnn]
path = "models/tinycnn.onnx"

[models.encoder]
path = "models/encoder.onnx"
targets = ["cpu", "openvino-cpu"]

[targets.cpu]
ep = "cpu"

[targets.strict]
ep = "cpu"
validation = { min_snr_db = 500 }   # the CPU caps SNR at 200 dB: this validation fails

""" + OPENVINO_CPU_TARGET + """

[groups.pair]
target = "openvino-cpu"
models = ["tinycnn", "encoder"]
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory, host_cache):
    """One build, shared by the report tests: cpu and OpenVINO compiles, a group, one failed validation."""
    root = tmp_path_factory.mktemp("views")
    project = Project(root, host_cache)
    project.manifest(MANIFEST)
    summary = root.parent / "step-summary.md"
    project.env["GITHUB_STEP_SUMMARY"] = str(summary)
    done = project.doit("--continue", check=False)
    assert done.returncode == 1 and "failed validate:tinycnn@strict" in done.stdout, done.stdout + done.stderr
    return project, summary


def test_report_html_renders_every_task_and_the_failed_metrics_without_network(built, tmp_path):
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        pytest.fail("headless Chromium is needed: apt install chromium (.ci/run installs it)")
    project, _ = built
    entries = build_report(project)
    page_url = (project.artifacts / "report.html").as_uri()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            requests: list[str] = []
            page.on("request", lambda request: requests.append(request.url))
            page.goto(page_url)
            rows = {row.get_attribute("data-task"): row.get_attribute("data-status")
                    for row in page.query_selector_all("tr[data-task]")}
            failed = page.query_selector('section[data-build="tinycnn@strict"]')
            failed_text = failed.inner_text()
            breaches = [cell.inner_text() for cell in failed.query_selector_all("td.breach")]
            group_text = page.query_selector('section[data-build="pair"]').inner_text()
            matrix_cell = page.query_selector('table.matrix td[data-build="tinycnn@openvino-cpu"]').inner_text()
            cpu_text = page.query_selector('section[data-build="tinycnn@cpu"]').inner_text()
            undeclared = page.query_selector_all("table.matrix td.undeclared")
            grey = page.query_selector_all("table.matrix td.muted")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert rows == {name: entry["status"] for name, entry in entries.items()}  # every task, with its status
    assert "failed" in rows.values() and rows["validate:tinycnn@strict"] == "failed"
    assert "snr_db 200 < min_snr_db 500" in failed_text and breaches == ["200"]  # the metric against its threshold
    log = project.artifacts / ".logs" / "strict" / "tinycnn.validate.log"
    assert "min_snr_db 500" in failed_text
    assert (".logs/strict/tinycnn.validate.log" in failed_text) == (log.stat().st_size > 0)  # empty logs unlinked
    assert "members: tinycnn, encoder" in group_text and "shared context binary" in group_text
    assert "offload 100%" in matrix_cell and "passed" in matrix_cell
    # a CPU target: what its model is, not a placement table of every op type "left on CPU"
    assert "an offline-optimized model for CPU" in cpu_text and "op type left on CPU" not in cpu_text
    assert "EPContext node(s)" not in cpu_text
    # encoder@strict, and the group at cpu and strict: not declared, so not grey like a skipped or pending one
    assert len(undeclared) == 3 and not grey
    assert requests == [page_url]  # the page itself, nothing else
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_junit_counts_match_the_build_report(built):
    project, _ = built
    entries = build_report(project)
    suite = ElementTree.parse(project.artifacts / "junit.xml").getroot()
    validations = {name: e for name, e in entries.items() if name.startswith("validate:")}
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) == len(validations)
    assert int(suite.get("failures")) == sum(e["status"] == "failed" for e in validations.values()) == 1
    assert int(suite.get("skipped")) == sum(e["status"] == "skipped" for e in validations.values())
    (failure,) = suite.iter("failure")
    case = next(c for c in cases if c.find("failure") is not None)
    assert (case.get("classname"), case.get("name")) == ("epbuild.strict", "tinycnn")
    assert "snr_db 200 < min_snr_db 500" in failure.get("message") and "snr_db=200.0" in failure.text


def test_step_summary_has_a_line_per_build(built):
    _, summary = built
    text = summary.read_text()
    assert text.startswith("### epbuild\n") and "| build | compile |" in text
    for build in ("tinycnn@cpu", "tinycnn@strict", "encoder@openvino-cpu", "pair"):
        assert f"| `{build}` |" in text
    assert re.search(r"\| `tinycnn@strict` \| (compiled|restored) \|.*\| failed \| 200\.0 \| failed validate", text)


def test_graph_has_every_task_and_dependency_doit_knows(built):
    project, _ = built
    done = project.doit("graph")
    assert "graph: " in done.stdout
    dot = (project.artifacts / "graph.dot").read_text()
    nodes = set(re.findall(r'^  "([^"]+)" \[label', dot, re.M))
    edges = set(re.findall(r'^  "([^"]+)" -> "([^"]+)";', dot, re.M))
    script = ("import json, sys; sys.argv = ['doit', 'list']; import dodo; from doit.loader import load_tasks\n"
              "tasks = [t for t in load_tasks(vars(dodo)) if ':' in t.name and t.actions]\n"
              "print(json.dumps([[t.name, sorted(t.task_dep), sorted(t.file_dep), sorted(t.targets)] for t in tasks]))")
    listed = json.loads(subprocess.run([sys.executable, "-c", script], cwd=project.root, env=project.env,
                                       capture_output=True, text=True, check=True).stdout)
    producer = {target: name for name, _, _, targets in listed for target in targets}
    expected = {(dep, name) for name, task_deps, _, _ in listed for dep in task_deps if ":" in dep}
    expected |= {(producer[f], name) for name, _, file_deps, _ in listed for f in file_deps if f in producer}
    building = {name for name, *_ in listed if name.split(":")[0] not in ("backends", "cache", "graph")}
    assert nodes == building and edges == expected
    assert ("compile:tinycnn@openvino-cpu", "validate:tinycnn@openvino-cpu") in edges
    assert '"validate:tinycnn@strict" [label="validate:tinycnn@strict\\nfailed"' in dot
    if shutil.which("dot") is None:
        pytest.fail("Graphviz's dot is needed for graph.svg: apt install graphviz (.ci/run installs it)")
    svg = html.unescape((project.artifacts / "graph.svg").read_text())  # Graphviz writes '-' as &#45;
    assert svg.lstrip().startswith("<?xml") and all(name in svg for name in nodes)
    one = project.doit("graph", "--model", "encoder").stdout
    assert "graph: " in one and "compile:tinycnn@cpu" not in (project.artifacts / "graph-encoder.dot").read_text()
    assert "no model 'encodr' (did you mean 'encoder'?)" in project.doit("graph", "--model", "encodr",
                                                                          check=False).stdout


def run_on_terminal(project: Project, *args: str) -> str:
    """doit on a pseudo-terminal, as a person runs it; everything it wrote."""
    import pty

    leader, follower = pty.openpty()
    env = {k: v for k, v in project.env.items() if k != "EPBUILD_PROGRESS"} | {"TERM": "xterm", "COLUMNS": "150"}
    process = subprocess.Popen([sys.executable, "-m", "doit", *args], cwd=project.root, env=env, stdin=follower,
                               stdout=follower, stderr=follower)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + 600
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal closed: the process is done
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    process.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.parametrize("parallel", ["process", "thread"])
def test_progress_on_a_terminal_and_plain_lines_elsewhere(tmp_path, host_cache, parallel):
    project = Project(tmp_path, host_cache)
    project.manifest(SMALL)
    live = run_on_terminal(project, "-n", "2", "-P", parallel)
    assert "\x1b[" in live and "compile 2/2" in live and "validate 2/2" in live and "ETA" in live, live
    for task in ("compile:tinycnn@cpu", "compile:encoder@cpu", "validate:encoder@cpu"):
        assert len(re.findall(rf"(compiled|passed) {task}:", live)) == 1, live  # each task's line, once
    assert "summary: " in live
    seconds = json.loads((project.artifacts / "build-report.json").read_text())["tasks"]
    assert all(isinstance(seconds[task]["seconds"], float) for task in ("compile:tinycnn@cpu", "validate:encoder@cpu"))
    assert not (project.artifacts / ".state" / "durations.json").exists()  # the report holds them
    project.doit("forget")
    again = run_on_terminal(project, "-n", "2", "-P", parallel)
    assert re.search(r"ETA \d+:\d\d", again), again  # from the first build's durations in the report
    project.doit("forget")
    plain = project.doit("-n", "2", "-P", parallel)  # a pipe: CI logs
    assert "\x1b" not in plain.stdout + plain.stderr and "\r" not in plain.stdout
    assert ".  compile:tinycnn@cpu" in plain.stdout and "summary: " in plain.stdout


def test_a_wrong_progress_setting_is_one_error(tmp_path, host_cache):
    project = Project(tmp_path, host_cache)
    project.manifest(SMALL)
    project.env["EPBUILD_PROGRESS"] = "fancy"
    done = project.doit(check=False)
    assert done.returncode == 2 and "EPBUILD_PROGRESS: must be live, plain or auto, found 'fancy'" in done.stderr



def test_a_report_that_cannot_be_written_is_a_warning_not_a_failed_build(tmp_path, host_cache):
    project = Project(tmp_path, host_cache)
    project.manifest(SMALL)
    (project.artifacts / "report.html").mkdir(parents=True)  # in the way of the page
    done = project.doit()
    assert "warning: report.html / junit.xml not written: IsADirectoryError" in done.stdout
    assert build_report(project)["validate:tinycnn@cpu"]["status"] == "validated"


def test_with_threads_doit_does_not_swap_sys_stdout_per_task(tmp_path, host_cache, monkeypatch):
    """CPython 3.11's print() borrows sys.stdout: doit swapping it per task in another thread crashed builds with
    `-P thread` about once in 50 runs (segfault). Capture is off there; processes keep it."""
    from epbuild.tasks.definitions import Tasks
    from epbuild.tasks.loading import load_project as Loaded

    project = Project(tmp_path, host_cache)
    project.manifest(SMALL)
    monkeypatch.chdir(tmp_path)
    threads = Tasks(Loaded(tmp_path / "models.toml", ["-n", "2", "-P", "thread"])).all_tasks()
    processes = Tasks(Loaded(tmp_path / "models.toml", ["-n", "2"])).all_tasks()
    assert {str(t.get("io")) for t in threads if t.get("name")} == {"{'capture': False}"}
    assert all("io" not in t for t in processes)


def test_the_page_template_is_compiled_while_a_first_build_waits_and_no_thread_outlives_the_wait():
    import threading

    from epbuild.report.views import report_template, template_prepared_meanwhile

    report_template.cache_clear()
    before = threading.active_count()
    with template_prepared_meanwhile():
        time.sleep(0.01)  # the build waits for its fork servers here
    assert report_template.cache_info().currsize == 1 and threading.active_count() == before
    assert "<html" in report_template().render(matrix="", groups={}, targets=[], group_matrix="", task_rows="",
                                               sections="", counts={}, project="p", generated="now")


def _written(project) -> tuple[str, str]:
    """report.html without its time of writing, and junit.xml."""
    page = (project.artifacts / "report.html").read_text()
    return re.sub(r"Written .* UTC", "", page), (project.artifacts / "junit.xml").read_text()


def test_the_page_assembled_from_remembered_parts_equals_one_rendered_whole(tmp_path, host_cache, monkeypatch):
    """Each build's parts of report.html and junit.xml are rendered again only when what they show changed; the
    page made from remembered parts is the page a first rendering makes."""
    from epbuild.report.views import PARTS, write_views
    from epbuild.tasks.loading import load_project as Loaded

    project = Project(tmp_path, host_cache)
    project.manifest(SMALL)
    project.doit()
    perturb_weights(project.root / "models" / "encoder.onnx", 7)
    project.doit()  # the encoder's compile and validation ran, the tinycnn's parts were remembered
    time.sleep(0.1)  # every file settled: a part whose files may still change is never remembered

    by_the_build = _written(project)
    monkeypatch.chdir(tmp_path)
    loaded = Loaded(tmp_path / "models.toml", [])
    entries = build_report(project)
    # a part whose files the build wrote within the clock's last tick was rendered, not remembered: rendered now
    assert write_views(loaded.layout, loaded.builds, entries) <= 1 and _written(project) == by_the_build
    assert write_views(loaded.layout, loaded.builds, entries) == 0 and _written(project) == by_the_build
    (project.artifacts / ".state" / PARTS).unlink()
    # rendered whole
    assert write_views(loaded.layout, loaded.builds, entries) == 2 and _written(project) == by_the_build
    entries["validate:encoder@cpu"] = {**entries["validate:encoder@cpu"], "seconds": 12.5}
    assert write_views(loaded.layout, loaded.builds, entries) == 1  # only the encoder's parts
    assert 'data-task="validate:encoder@cpu"' in _written(project)[0] and ">12.5<" in _written(project)[0]


def test_a_build_no_task_of_which_ran_shows_the_part_the_last_page_showed_without_keying_it(tmp_path, host_cache,
                                                                                           monkeypatch):
    """After a run that changed one model, the other model's builds (none of their tasks ran, none of their entries
    changed) take the part the last page showed without stat'ing their files; the page is the one a full rendering
    makes. A torn last journal line, or a build report rewritten since, makes every part keyed again."""
    from epbuild.files.layout import stat_key
    from epbuild.report import cells
    from epbuild.report.views import PARTS, write_views
    from epbuild.state.folder import StateFolder
    from epbuild.tasks.loading import load_project as Loaded

    project = Project(tmp_path, host_cache)
    project.manifest(SMALL)
    project.doit()
    for seed in (7, 8):  # the second change run: the tinycnn's entries were already "up-to-date"
        perturb_weights(project.root / "models" / "encoder.onnx", seed)
        project.doit()
    time.sleep(0.1)

    by_the_build = _written(project)
    monkeypatch.chdir(tmp_path)
    loaded = Loaded(tmp_path / "models.toml", [])
    entries, keyed = build_report(project), []
    original = cells.Sources.key
    monkeypatch.setattr(cells.Sources, "key", lambda self, text: keyed.append(self.build.name) or original(self, text))
    report = project.artifacts / "build-report.json"
    now = stat_key(os.stat(report))
    assert write_views(loaded.layout, loaded.builds, entries, untouched={"tinycnn@cpu"}, made_from=now) <= 1
    assert keyed == ["encoder@cpu"] and _written(project) == by_the_build
    with open(StateFolder(loaded.layout.state).path(PARTS), "a") as handle:  # a torn line, after the base or lines
        handle.write('{"version": "torn')
    keyed.clear()
    write_views(loaded.layout, loaded.builds, entries, untouched={"tinycnn@cpu"}, made_from=now)
    assert sorted(keyed) == ["encoder@cpu", "tinycnn@cpu"] and _written(project) == by_the_build
    keyed.clear()
    write_views(loaded.layout, loaded.builds, entries, untouched={"tinycnn@cpu"}, made_from=[0, 0, 0, 0])
    assert sorted(keyed) == ["encoder@cpu", "tinycnn@cpu"] and _written(project) == by_the_build


def test_a_part_rendered_while_its_files_could_change_is_never_taken_as_shown(tmp_path):
    from epbuild.report.views import PARTS, PartStore
    from epbuild.state.folder import StateFolder
    from epbuild.state.journaled import read_journaled

    state, report = StateFolder(tmp_path), tmp_path / "build-report.json"
    report.write_text("{}")
    store = PartStore(state, report)
    store.get("a", "a1", lambda: {"html": "a"})
    store.get("b", None, lambda: {"html": "b"})  # rendered, not remembered
    store.save()
    identity = json.loads(read_journaled(state.path(PARTS)).base.split(b"\n")[3])["made_from"]
    again = PartStore(state, report, identity)
    assert again.current("a") == {"html": "a", "key": "a1"} and again.current("b") is None
    assert PartStore(state, report, None).current("a") is None  # no build report was read: nothing is known


def test_a_run_appends_the_parts_it_rendered_and_the_base_is_rewritten_when_the_lines_outgrow_it(tmp_path):
    """10,000 builds' parts are 30 MB: a run that rendered two appends them to the record as a line; a torn line (a
    killed build) is skipped; a record of another renderer is not read."""
    from epbuild.report.views import PARTS, PartStore
    from epbuild.state.folder import StateFolder
    from epbuild.state.journaled import read_journaled, write_journaled
    from epbuild.state.records import encode_record

    state = StateFolder(tmp_path)
    path = state.path(PARTS)
    store = PartStore(state)
    names = "abcdefghijklmnop"
    for name in names:
        store.get(name, f"{name}1", lambda n=name: {"html": n * 400})
    store.save()
    base = path.read_bytes()
    assert read_journaled(path).lines == [] and store.rendered == len(names)  # the first save writes the base
    store = PartStore(state)
    assert store.get("a", "a1", lambda: pytest.fail("remembered")) == {"html": "a" * 400, "key": "a1"}
    store.get("b", "b2", lambda: {"html": "B" * 400})
    store.save()
    assert path.read_bytes().startswith(base) and len(read_journaled(path).lines) == 1  # appended, not rewritten
    with open(path, "a") as handle:
        handle.write('{"key": "torn')
    store = PartStore(state)
    assert store.get("b", "b2", lambda: pytest.fail("remembered")) == {"html": "B" * 400, "key": "b2"}
    store.get("c", "c2", lambda: {"html": "C" * 400})  # this line takes the lines past an eighth of the base
    store.save()
    read = read_journaled(path)
    assert read.lines == [] and set(json.loads(read.base.split(b"\n")[3])["parts"]) == {"b", "c"}  # this run's
    write_journaled(path, encode_record({"key": "another renderer", "parts": {"x": {"key": "x1"}}}))
    store = PartStore(state)
    store.get("x", "x1", lambda: {"html": "x"})
    assert store.rendered == 1


def test_the_build_report_keeps_unchanged_entries_text_and_reads_a_file_of_any_layout(tmp_path):
    from epbuild.report.build_report import BuildReport

    path = tmp_path / "build-report.json"
    path.write_text(json.dumps({"format": 1, "tasks": {"compile:a@cpu": {"status": "compiled", "seconds": 1.5},
                                                       "validate:a@cpu": {"status": "validated"}}}, indent=4))
    report = BuildReport(path)  # laid out by hand: every entry is encoded again
    assert report.texts == {} and report.write()
    written = path.read_text()
    assert written.splitlines()[1] == '  "compile:a@cpu": {"status": "compiled", "seconds": 1.5},'
    again = BuildReport(path)
    assert again.entry_text("validate:a@cpu") == '{"status": "validated"}' and not again.write()
    again.up_to_date("compile:a@cpu")
    assert again.write() and json.loads(path.read_text())["tasks"] == {
        "compile:a@cpu": {"status": "up-to-date", "seconds": 1.5}, "validate:a@cpu": {"status": "validated"}}


def test_the_build_report_takes_entry_texts_only_from_its_own_exact_layout(tmp_path):
    from epbuild.report.build_report import BuildReport

    path = tmp_path / "build-report.json"
    names = ["compile:a@cpu", 'compile:b"q@cpu', "compile:modèle@cpu", "validate:a@cpu"]
    report = BuildReport(path)
    for at, name in enumerate(names):
        report.failed(name, f"reason {at}", at)
    assert report.write()
    again = BuildReport(path)  # names that JSON escapes are spelled as json.dumps spells them
    assert set(again.texts) == set(names) and all(json.loads(again.texts[n]) == again.entries[n] for n in names)
    lines = path.read_text().split("\n")
    for edited in ([lines[0], lines[2], lines[1], *lines[3:]],  # entries out of order
                   [lines[0], lines[1] + " " + lines[2], "", *lines[3:]],  # two entries on one line
                   [lines[0], lines[1], lines[2].replace(": {", ": {\n", 1), *lines[3:]]):  # one over two lines
        path.write_text("\n".join(edited))
        found = BuildReport(path)
        assert found.texts == {} and found.entries == again.entries


def test_the_job_summary_line_escapes_a_reason_as_html_escape_does():
    import html

    from epbuild.report.cells import Cell
    from epbuild.report.views import markdown_line

    reason = "a <b>bold</b> & 'quoted' | piped\nsecond line"
    cell = Cell("m@cpu", "m", "cpu", "cpu", False, ["m"], "compile:m@cpu", None,
                {"status": "failed", "reason": reason}, {}, None, None)
    expected = html.escape(reason, quote=False).replace("|", "\\|").replace("\n", " ")
    assert markdown_line(cell).endswith(f"| {expected} |")


def test_a_build_report_vouched_by_its_digest_decodes_only_the_entries_asked_for(tmp_path, monkeypatch):
    """What the last write left (its sha256 in the state folder) is read entry by entry; any other text, even
    in the exact layout, is decoded whole first, so an entry that is not JSON is never written on."""
    import epbuild.report.build_report as build_report
    from epbuild.report.build_report import BuildReport

    path, state = tmp_path / "build-report.json", tmp_path / ".state"
    first = BuildReport(path, state)
    first.succeeded("compile:a@cpu", {"status": "compiled", "seconds": 1.5, "_published": {}})
    first.failed("compile:b@cpu", "it broke", 0.5)
    first.up_to_date("validate:a@cpu")
    assert first.write() and (state / "build-report.sha256").is_file()
    decoded: list[str] = []
    real = build_report.json.loads
    monkeypatch.setattr(build_report.json, "loads", lambda text: decoded.append(text) or real(text))
    again = BuildReport(path, state)
    assert again.vouched and decoded == []
    assert [again.entries.status(n) for n in again.entries] == ["compiled", "failed", "up-to-date"] and decoded == []
    for name in again.entries:
        again.up_to_date(name)
    assert again.summary(set(again.entries), set()) == "summary: 3 up-to-date" and len(decoded) == 2
    assert again.write() and json.loads(path.read_text())["tasks"]["compile:a@cpu"] == {
        "status": "up-to-date", "seconds": 1.5}
    good = path.read_text()
    # a line that is not JSON, in the exact layout: not vouched, decoded whole, refused as a whole
    path.write_text(good.replace('"seconds": 1.5}', '"seconds": 1.5'))
    broken = BuildReport(path, state)
    assert not broken.vouched and broken.read_as is None and dict(broken.entries) == {}
    # a report without its digest (an older epbuild's) is decoded whole, and vouched for once written as it is
    path.write_text(good)
    (state / "build-report.sha256").unlink()
    decoded.clear()
    older = BuildReport(path, state)
    assert not older.vouched and len(decoded) == 1 and not older.write()
    assert BuildReport(path, state).vouched and len(decoded) == 1


def test_a_stage_that_ran_is_staged_in_every_task_as_in_the_header(project):
    import re

    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\nquantize = { calibration = '
                     '"models/calib/tinycnn/" }\ntargets = ["cpu-int8"]\n'
                     '[targets.cpu-int8]\nep = "cpu"\nquantized = true\n')
    project.doit()
    page = (project.artifacts / "report.html").read_text()
    assert re.search(r'<span class="badge good">1 staged</span>', page)
    row = re.search(r'<tr[^>]*data-task="quantize:tinycnn\[generic\]"[^>]*>', page)
    assert row is not None and 'data-status="staged"' in row.group(0), row
