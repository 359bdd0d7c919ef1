"""The build's results as people and CI systems read them: `artifacts/report.html` (one self-contained page),
`artifacts/junit.xml` (each validation a test case) and a Markdown table for `GITHUB_STEP_SUMMARY`.

Everything comes from files a build leaves: `build-report.json` entries, and each artifact's `artifact.json` and
`validation.json`; nothing here imports onnxruntime, so the pages are written after every run, restores included.
"""

from __future__ import annotations

import contextlib
import functools
import html
import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..manifest.builds import Build
from ..store.layout import Layout, write_atomic

TEMPLATES = Path(__file__).resolve().parent / "templates"
ARTIFACT, VALIDATION = "artifact.json", "validation.json"
# status -> colour class: compiled/validated/restored/up to date are good, skipped is neutral
TONE = {"compiled": "good", "validated": "good", "restored": "good", "up-to-date": "good", "passed": "good",
        "failed": "bad", "skipped": "muted", "pending": "muted", "not built": "warn"}
PENDING = "pending"  # no run has reached the task yet ("not built": a task it needs failed)


@dataclass
class Cell:
    """One build (a model for a target, or a group) with what the last runs said about it."""

    build: str
    row: str  # the model, or the group's name
    target: str
    ep: str
    shared: bool
    members: list[str]
    compile_task: str
    validate_task: str | None
    compile: dict[str, Any]  # its build-report entry ({} when never run)
    validate: dict[str, Any]
    artifact: dict[str, Any] | None  # artifact.json
    validation: dict[str, Any] | None  # validation.json
    logs: dict[str, str] = field(default_factory=dict)  # step -> log path, relative to the project

    @property
    def compile_status(self) -> str:
        return self.compile.get("status", PENDING)

    @property
    def validate_status(self) -> str:
        if self.validate_task is None:
            return "off"
        status = self.validate.get("status", PENDING)
        if status == "up-to-date" and self.validation:
            return self.validation.get("status", status)
        if status == "restored":  # a result restored from the cache for these very bytes
            return f"{(self.validation or {}).get('status', 'passed')} (restored)"
        return {"validated": "passed"}.get(status, status)

    @property
    def size(self) -> int | None:
        files = self.compile.get("files")
        return sum(f["size"] for f in files) if files else None

    @property
    def offload(self) -> float | None:
        nodes = (self.artifact or {}).get("nodes") or self.compile.get("nodes") or {}
        return nodes.get("offload")

    @property
    def sharing(self) -> float | None:
        """A group's shared binary against its members compiled alone (artifact.json's loading contract)."""
        return ((self.artifact or {}).get("loading") or {}).get("sharing", {}).get("ratio")

    def outputs(self) -> list[tuple[str, dict[str, Any]]]:
        """(label, metrics) of every compared output; a group's labelled by member."""
        report = self.validation or {}
        if "members" in report:
            return [(f"{member} / {name}", metrics) for member, sub in sorted(report["members"].items())
                    for name, metrics in sorted(sub.get("outputs", {}).items())]
        return sorted(report.get("outputs", {}).items())

    @property
    def snr_db(self) -> float | None:
        values = [m["snr_db"] for _, m in self.outputs() if isinstance(m.get("snr_db"), (int, float))]
        return min(values) if values else None

    @property
    def reason(self) -> str | None:
        """Why the compile or the validation did not pass, as the build said it."""
        for entry in (self.compile, self.validate):
            if entry.get("status") in ("failed", "skipped", "not built") and entry.get("reason"):
                return entry["reason"]
        if self.validation and self.validation.get("status") in ("failed", "skipped"):
            return self.validation.get("reason")
        return None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(layout: Layout, builds: list[Build], entries: dict[str, dict[str, Any]]) -> list[Cell]:
    cells = []
    for build in builds:
        folder = build.out_dir(layout)
        validate_task = f"validate:{build.name}" if build.validates else None
        logs = {step: os.path.relpath(path, layout.root.parent) for step in ("compile", "validate", "ops")
                if (path := build.log(layout, step)).is_file() and path.stat().st_size}  # an empty log says nothing
        cells.append(Cell(build.name, build.name if build.shared else build.members[0].name, build.target.name,
                          build.target.ep.name, build.shared, [m.name for m in build.members], build.task,
                          validate_task, entries.get(build.task, {}),
                          entries.get(validate_task, {}) if validate_task else {},
                          _json(folder / ARTIFACT), _json(folder / VALIDATION), logs))
    return cells


def _environment() -> Any:
    """Templates compiled once per machine, like Python's bytecode (jinja2's cache in the user's temporary
    folder, keyed by the template's source): compiling report.html.j2 took ~30 ms of every build."""
    import jinja2

    try:
        compiled = jinja2.FileSystemBytecodeCache()
    except (OSError, RuntimeError):  # no private temporary folder to be had: compile every time
        compiled = None
    # artifact.json differs by backend (a qaic QPC has no EP placement): a missing key renders as nothing
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                                     undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True,
                                     bytecode_cache=compiled)
    environment.filters["megabytes"] = lambda size: "" if size is None else f"{size / 1e6:.2f} MB"
    environment.filters["percent"] = lambda share: "" if share is None else f"{share * 100:.0f}%"
    environment.filters["number"] = lambda value: (f"{value + 0.0:.4g}" if isinstance(value, float) else  # no -0
                                                   "" if value is None else str(value))
    environment.globals["tone"] = lambda status: TONE.get(status.removesuffix(" (restored)"), "muted")
    return environment


@functools.cache
def report_template() -> Any:
    """report.html's compiled template, made once per process."""
    return _environment().get_template("report.html.j2")


@contextmanager
def template_prepared_meanwhile() -> Iterator[None]:
    """Import jinja2 and compile report.html's template in a thread while the block waits for something else (a
    first build waits ~0.2 s for its fork servers to start, with a core to spare): the end of the build then
    renders the page in ~10 ms instead of ~60 ms. No thread outlives the block."""

    def prepare() -> None:
        with contextlib.suppress(Exception):  # a broken template is reported where the page is written
            report_template()

    thread = threading.Thread(target=prepare, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def render_html(cells: list[Cell], entries: dict[str, dict[str, Any]], project: str) -> str:
    rows = list(dict.fromkeys(c.row for c in cells if not c.shared))
    groups = list(dict.fromkeys(c.row for c in cells if c.shared))
    targets = list(dict.fromkeys(c.target for c in cells))
    by_place = {(c.row, c.target): c for c in cells}
    stages = {name: entry for name, entry in sorted(entries.items())
              if not name.startswith(("compile:", "validate:", "group:"))}
    counts = Counter(entry.get("status", "?") for entry in entries.values())
    return report_template().render(
        project=project, generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), rows=rows,
        groups=groups, targets=targets, by_place=by_place, cells=cells, stages=stages, counts=counts)


def junit_xml(cells: list[Cell]) -> bytes:
    """One test case per validate task: failed -> <failure> with the metrics, skipped -> <skipped> with why."""
    import xml.etree.ElementTree as ElementTree  # here: task creation imports this module, a no-op run needs no XML

    suite = ElementTree.Element("testsuite", name="epbuild validations")
    failures = skipped = 0
    for cell in cells:
        if cell.validate_task is None:
            continue
        case = ElementTree.SubElement(suite, "testcase", classname=f"epbuild.{cell.target}", name=cell.row,
                                      time=f"{cell.validate.get('seconds', 0):.3f}")
        status = cell.validate_status
        metrics = "\n".join(f"{label}: " + ", ".join(f"{k}={v}" for k, v in sorted(m.items())
                                                     if isinstance(v, (int, float)) and not isinstance(v, bool))
                            for label, m in cell.outputs())
        if status == "failed":
            failures += 1
            element = ElementTree.SubElement(case, "failure", message=cell.reason or "validation failed")
            element.text = metrics or cell.reason
        elif status in ("skipped", "not built", PENDING):
            skipped += 1
            ElementTree.SubElement(case, "skipped", message=cell.reason or status)
        if metrics and status != "failed":
            ElementTree.SubElement(case, "system-out").text = metrics
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("errors", "0")
    ElementTree.indent(suite)
    return ElementTree.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n"


def markdown_summary(cells: list[Cell]) -> str:
    """A table for GitHub's job summary: one line per build."""
    def escape(text: str) -> str:
        return html.escape(text.replace("|", "\\|").replace("\n", " "), quote=False)[:300]

    lines = ["### epbuild", "", "| build | compile | seconds | size | offload | validation | SNR dB | note |",
             "|---|---|---:|---:|---:|---|---:|---|"]
    for c in cells:
        snr = f"{c.snr_db:.1f}" if c.snr_db is not None else ""
        size = f"{c.size / 1e6:.2f} MB" if c.size is not None else ""
        offload = f"{c.offload * 100:.0f}%" if c.offload is not None else ""
        seconds = f"{c.compile['seconds']:.1f}" if c.compile.get("seconds") is not None else ""
        lines.append(f"| `{c.build}` | {c.compile_status} | {seconds} | {size} | {offload} | {c.validate_status} "
                     f"| {snr} | {escape(c.reason or '')} |")
    return "\n".join(lines) + "\n"


def write_views(layout: Layout, builds: list[Build], entries: dict[str, dict[str, Any]]) -> None:
    """report.html and junit.xml next to build-report.json."""
    cells = collect(layout, builds, entries)
    write_atomic(layout.html_report, render_html(cells, entries, layout.root.parent.name))
    write_atomic(layout.junit_report, junit_xml(cells).decode())


def append_step_summary(layout: Layout, builds: list[Build], entries: dict[str, dict[str, Any]]) -> None:
    """GitHub Actions shows the Markdown appended to the file GITHUB_STEP_SUMMARY names."""
    with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as handle:
        handle.write(markdown_summary(collect(layout, builds, entries)))
