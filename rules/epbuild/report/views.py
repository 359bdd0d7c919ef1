"""The build's results as people and CI systems read them: `artifacts/report.html` (one self-contained page),
`artifacts/junit.xml` (each validation a test case) and a Markdown table for `GITHUB_STEP_SUMMARY`.

Everything comes from files a build leaves (`report.cells`); nothing here imports onnxruntime, so the pages are
written after every run, restores included. Each build's parts of both files are kept in
`artifacts/.state/report-parts.journaled` under the digest of what they show, and the files are
assembled from them: a run that changed one model of 10,000 renders that model's parts, not every cell.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import threading
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from markupsafe import Markup, escape

from ..errors import json_value
from ..files.layout import Layout, file_identity, write_atomic
from ..manifest.builds import Build
from ..state.folder import StateFolder
from ..state.records import BLOB
from .build_report import named_statuses
from .cells import PENDING, Cell, source_of

TEMPLATES = Path(__file__).resolve().parent / "templates"
# status -> colour class: compiled/validated/restored/up to date are good, skipped is neutral
TONE = {"compiled": "good", "validated": "good", "restored": "good", "up-to-date": "good", "passed": "good",
        "failed": "bad", "skipped": "muted", "pending": "muted", "not built": "warn", "interrupted": "warn",
        "inconclusive": "unsure", "structural": "checked", "staged": "good", "packaged": "good"}
PARTS = "report-parts.journaled"
BUILD_KINDS = ("compile:", "validate:", "group:", "package:", "reduce:", "ops:")  # the other tasks are stages


def _environment() -> Any:
    """Templates compiled once per machine, like Python's bytecode (jinja2's cache in the user's temporary
    folder, keyed by the template's source): compiling report.html.j2 was a visible share of every build's end."""
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
def _templates() -> Any:
    return _environment()


@functools.cache
def report_template() -> Any:
    """report.html's compiled template, made once per process."""
    return _templates().get_template("report.html.j2")


@functools.cache
def cell_macros() -> Any:
    """The macros that render one build's parts of the page (templates/cell.html.j2)."""
    return _templates().get_template("cell.html.j2").module


def templates_prepared_in_background() -> threading.Thread:
    """Import jinja2 and compile the page's templates in a thread, started where the build is about to wait for
    something else (fork servers starting, a child's job): the end of the build then only renders. The caller
    joins it."""

    def prepare() -> None:
        with contextlib.suppress(Exception):  # a broken template is reported where the page is written
            report_template()
            cell_macros()

    thread = threading.Thread(target=prepare, daemon=True)
    thread.start()
    return thread


@contextmanager
def template_prepared_meanwhile() -> Iterator[None]:
    """The templates prepared while the block waits (a first build waits for its fork servers to start, with a
    core to spare). No thread outlives the block."""
    thread = templates_prepared_in_background()
    try:
        yield
    finally:
        thread.join()


class Part(NamedTuple):
    """One build's rendered parts: its matrix cell, its rows of the task table, its section, its junit test case.
    The HTML is as rendered (safe), encoded as UTF-8 once, and spliced into the page as it is (a Markup per part,
    or decoding parts remembered as str, cost more than the rest of loading them)."""

    row: str
    target: str
    shared: bool
    members: tuple[str, ...]
    summary: bytes
    tasks: bytes
    section: bytes
    case: bytes  # b"" when the build does not validate
    outcome: str  # the test case's: failed, skipped or passed ("" without one)
    markdown: str  # its line of the GitHub job summary


HTML = ("summary", "tasks", "section", "case", "row")  # a part's pieces of the pages, as UTF-8 bytes
PIECES = "@html"  # in the stored parts: each HTML piece's name and size in the record's blob


def render_part(cell: Cell) -> dict[str, Any]:
    macros = cell_macros()
    case, outcome = junit_case(cell)
    return {"summary": str(macros.summary_cell(cell)).encode(), "tasks": str(macros.task_rows(cell)).encode(),
            "section": str(macros.section(cell)).encode(), "case": case.encode(), "outcome": outcome,
            "markdown": markdown_line(cell)}


def _as_json(part: dict[str, Any]) -> dict[str, Any]:
    return {key: bytes(value).decode() if isinstance(value, (bytes, memoryview)) else value
            for key, value in part.items()}


def _from_json(part: dict[str, Any]) -> dict[str, Any]:
    return {key: value.encode() if key in HTML and isinstance(value, str) else value for key, value in part.items()}


def _packed(parts: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], bytes]:
    """Parts as a record's body and blob: the HTML pieces' bytes one after another in the blob, each part's
    `@html` listing its pieces and their sizes (JSON would escape and unescape every quote of 30 MB of HTML)."""
    index: dict[str, Any] = {}
    pieces: list[bytes] = []
    for name, part in parts.items():
        entry = {key: value for key, value in part.items() if key not in HTML}
        entry[PIECES] = [[key, len(part[key])] for key in HTML if key in part]
        pieces.extend(part[key] for key in HTML if key in part)
        index[name] = entry
    return index, b"".join(pieces)


def _unpacked(index: Any, blob: memoryview | None) -> dict[str, dict[str, Any]]:
    """What `_packed` wrote, its HTML as views of the blob (spliced into the pages as they are, never copied); {}
    for anything else (a part is a function of its key: a lost one is rendered again)."""
    if not isinstance(index, dict) or blob is None:
        return {}
    at, size_of_blob = 0, len(blob)
    try:
        for part in index.values():
            for key, size in part.pop(PIECES):
                if key not in HTML or type(size) is not int or not 0 <= size <= size_of_blob - at:
                    return {}
                part[key] = blob[at:at + size]
                at += size
    except (AttributeError, KeyError, TypeError, ValueError):  # not what `_packed` writes
        return {}
    return index if at == size_of_blob else {}


# what XML 1.0 forbids in a document (C0 controls but tab, newline and return; lone surrogates; U+FFFE, U+FFFF):
# ElementTree writes them as they are, and a CI's parser then rejects the whole file, every result with it
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """`text` with each character XML 1.0 forbids written as its escape (`\\x0b`), so the file stays well-formed
    and the name still says which output it was."""
    return NOT_XML.sub(lambda found: f"\\x{ord(found.group()):02x}" if ord(found.group()) < 256 else
                       f"\\u{ord(found.group()):04x}", text)


def junit_case(cell: Cell) -> tuple[str, str]:
    """The validate task as a test case (failed -> <failure> with the metrics, skipped -> <skipped> with why),
    indented for its place in the suite, and its outcome."""
    if cell.validate_task is None:
        return "", ""
    case = ElementTree.Element("testcase", classname=xml_text(f"epbuild.{cell.target}"), name=xml_text(cell.row),
                               time=f"{cell.validate.get('seconds', 0):.3f}")
    status, outcome = cell.validate_status, "passed"
    metrics = xml_text("\n".join(f"{label}: " + ", ".join(f"{k}={v}" for k, v in sorted(m.items())
                                                          if isinstance(v, (int, float)) and not isinstance(v, bool))
                                 for label, m in cell.outputs()))
    task = cell.task
    if task:  # what decided the verdict, first
        metrics = xml_text(f"task {task['metric']}: artifact {task['artifact']:.6g}, source {task['source']:.6g}, "
                           f"needs {task['needed']:.6g} ({task['samples']} samples, gate {task['gate']})\n") + metrics
    reason = xml_text(cell.reason) if cell.reason else None
    if status == "failed":
        outcome = "failed"
        ElementTree.SubElement(case, "failure", message=reason or "validation failed").text = metrics or reason
    elif status.removesuffix(" (restored)") in ("skipped", "not built", "inconclusive", "interrupted", "structural",
                                                PENDING):  # judged nothing: never passed
        outcome = "skipped"
        ElementTree.SubElement(case, "skipped", message=reason or status)
    if metrics and status != "failed":
        ElementTree.SubElement(case, "system-out").text = metrics
    ElementTree.indent(case, space="  ", level=1)
    return "  " + ElementTree.tostring(case, encoding="unicode"), outcome


class PartStore:
    """`.state/report-parts.journaled`: each build's rendered parts under the digest of what they show, and each
    stage's task row under its entry's; dropped whole when the templates or this code change (JSON, its pages as
    text). A run appends the parts it rendered to the record (one JSON line, `state.journaled`) instead of writing
    the whole store again; the base is rewritten, with only the
    parts of this run, when the lines outgrow it or another run wrote it since this one read it. A part is a function
    of its key, so a line read twice, lost or torn (skipped) costs a rendering, never a wrong page.

    Each save also names the build report the pages were made from (its identity) and the parts it could not
    remember (rendered while their files could still change): while that build report is still the current one,
    every other part of that save is the one its page showed, which `current` hands out without keying it."""

    def __init__(self, state: StateFolder, report: Path | None = None, before: list[int] | None = None):
        """`report`: the build report the pages are made from; `before`: its identity when this run read it."""
        self.state = state
        self.version = _renderer_version()
        self.old: dict[str, dict[str, Any]] = {}
        made_from, unsettled = None, []
        found = state.read_journaled(PARTS, self.version)
        self.read_as = found[1] if found is not None else None
        if found is not None:
            stored, read = found
            self.old = _unpacked(stored.get("parts"), stored.get(BLOB))
            made_from, unsettled = stored.get("made_from"), stored.get("unsettled", [])
            for added in read.lines:  # None: a line torn by a killed build
                if isinstance(added, dict) and added.get("key") == self.version:
                    self.old.update({name: _from_json(part) for name, part in added.get("parts", {}).items()})
                    made_from, unsettled = added.get("made_from"), added.get("unsettled", [])
                else:  # what the last save said is not known for sure
                    made_from = None
        self.report = report
        # the last save's parts are those its page showed, and nothing had rewritten its build report since
        self.shown = made_from is not None and made_from == before
        self.unsettled = set(unsettled)
        self.new: dict[str, dict[str, Any]] = {}
        self.rendered = 0  # parts rendered this time (the rest were remembered)
        self.unremembered: list[str] = []  # rendered while their files could still change

    def current(self, name: str) -> dict[str, Any] | None:
        """The part of `name` the last save's page showed, if known: for a build none of whose files and entries
        changed since (the caller knows that)."""
        part = self.old.get(name) if self.shown and name not in self.unsettled else None
        if part is not None:
            self.new[name] = part
        return part

    def get(self, name: str, key: str | None, render: Any) -> dict[str, Any]:
        remembered = self.old.get(name)
        if key is not None and remembered is not None and remembered.get("key") == key:
            self.new[name] = remembered
            return remembered
        self.rendered += 1
        part = {**render(), "key": key}
        if key is not None:
            self.new[name] = part
        else:
            self.unremembered.append(name)
        return part

    def save(self) -> None:
        """After the pages are written from the build report (`report`, as it is now)."""
        added = {name: part for name, part in self.new.items() if self.old.get(name) != part}
        made_from = file_identity(str(self.report)) if self.report else None
        record = {"key": self.version, "made_from": made_from, "unsettled": self.unremembered}
        line = {**record, "parts": {name: _as_json(part) for name, part in added.items()}}
        if self.read_as is not None and self.state.append(PARTS, self.read_as, line):
            return
        parts, blob = _packed(self.new)
        self.state.write_journaled(PARTS, {**record, "parts": parts, BLOB: blob})


@functools.cache
def _renderer_version() -> str:
    digest = hashlib.sha256()
    for path in sorted([*TEMPLATES.iterdir(), *Path(__file__).parent.glob("*.py")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def parts(layout: Layout, builds: list[Build], entries: Mapping[str, dict[str, Any]], store: PartStore,
          entry_text: Callable[[str], str], untouched: AbstractSet[str] = frozenset()) -> list[Part]:
    """Each build's parts, remembered or rendered; `entry_text` gives an entry's JSON (the build report keeps the
    text of entries a run did not change). A build in `untouched` (no task of it ran, none of its entries
    changed) takes the part the last page showed, unkeyed, where the store knows it."""
    found = []
    for build in builds:
        part = store.current(build.name) if build.name in untouched else None
        if part is None:
            source = source_of(layout, build)
            part = store.get(build.name, source.key(entry_text),
                             lambda s=source: render_part(s.cell(layout, entries)))
        found.append(Part(build.name if build.shared else build.members[0].name, build.target.name, build.shared,
                          tuple(m.name for m in build.members), part["summary"], part["tasks"], part["section"],
                          part["case"], part["outcome"], part["markdown"]))
    return found


def stage_rows(entries: Mapping[str, dict[str, Any]], store: PartStore,
               entry_text: Callable[[str], str]) -> list[bytes]:
    rows = []
    for name in sorted(entries):
        if name.startswith(("compile:", "validate:", "group:")):
            continue
        entry = entries[name]
        if entry.get("status") == "compiled":  # a stage that ran: "staged", as the header and console count it
            entry = {**entry, "status": "staged"}
        key = hashlib.blake2b(f"{entry_text(name)}\0{entry.get('status')}".encode(), digest_size=16).hexdigest()
        part = store.get(name, key, lambda n=name, e=entry: {"row": str(cell_macros().task_row(n, e)).encode()})
        rows.append(part["row"])
    return rows


def _matrix(places: list[tuple[str, str]], targets: list[str], by_place: dict[tuple[str, str], Part]) -> list[bytes]:
    """The rows of a models x targets table (each place: its row's header cells)."""
    empty = b'<td class="undeclared" title="not declared in the manifest"></td>'  # not grey: nothing to skip
    lines = []
    for row, head in places:
        cells = b"".join(by_place[(row, t)].summary if (row, t) in by_place else empty for t in targets)
        lines.append(b"<tr>" + head.encode() + cells + b"</tr>\n")
    return lines


def published_packages(layout: Layout) -> list[dict[str, Any]]:
    """The model packages under artifacts/packages/ as their manifest.json describes them (a manifest that cannot
    be read is left out of the page: the package task's own entry says what happened)."""
    found = []
    for manifest in sorted((layout.root / "packages").glob("*/manifest.json")):
        try:
            data = json_value(manifest.read_text())
            components = {name: component.get("variants", {}) for name, component in data["components"].items()}
            left = data.get("additional_metadata", {}).get("epbuild", {}).get("left_out", {})
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            continue
        found.append({"name": manifest.parent.name, "components": components, "left_out": left})
    return found


def render_html(page_parts: list[Part], stages: list[bytes], entries: Mapping[str, dict[str, Any]],
                project: str, packages: list[dict[str, Any]] | None = None) -> list[bytes]:
    """The page as pieces to write one after the other: the template renders its frame around a marker per
    table, and each build's rendered parts are spliced in at the markers (through the template, a page of
    10,000 builds would be copied and escape-checked whole)."""
    rows = list(dict.fromkeys(p.row for p in page_parts if not p.shared))
    groups = {p.row: p.members for p in page_parts if p.shared}
    targets = list(dict.fromkeys(p.target for p in page_parts))
    by_place = {(p.row, p.target): p for p in page_parts}
    # as the console's summary counts them: a stage that ran is "staged", not one of the compiles
    counts = Counter("staged" if status == "compiled" and not name.startswith(BUILD_KINDS) else status
                     for name, status in named_statuses(entries))
    spliced = {
        "matrix": _matrix([(row, f"<th>{escape(row)}</th>") for row in rows], targets, by_place),
        "group_matrix": _matrix([(row, f"<th>{escape(row)}</th><td>{escape(', '.join(members))}</td>")
                                 for row, members in groups.items()], targets, by_place),
        "task_rows": [*(p.tasks for p in page_parts), *stages],
        "sections": [p.section for p in page_parts]}
    marker = f"\0{os.urandom(8).hex()}\0"  # no name, path or status holds a NUL, nor these random digits
    frame = report_template().render(
        project=project, generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), targets=targets,
        groups=groups, counts=counts, packages=packages or [],
        **{name: Markup(f"{marker}{name}{marker}") for name in spliced})
    page: list[bytes] = []
    for at, piece in enumerate(frame.split(marker)):  # text, name, text, name, ..., text
        page.extend(spliced[piece] if at % 2 else [piece.encode()])
    return page


def junit_xml(page_parts: list[Part]) -> bytes:
    """One test case per validate task, in the builds' order."""
    cases = [p.case for p in page_parts if p.case]
    outcomes = Counter(p.outcome for p in page_parts if p.case)
    head = (f'<testsuite name="epbuild validations" tests="{len(cases)}" failures="{outcomes["failed"]}" '
            f'skipped="{outcomes["skipped"]}" errors="0"').encode()
    body = head + b">\n" + b"\n".join(cases) + b"\n</testsuite>" if cases else head + b" />"
    return b"<?xml version='1.0' encoding='utf-8'?>\n" + body + b"\n"


def markdown_line(c: Cell) -> str:
    """The build's line of the table for GitHub's job summary."""
    snr = f"{c.snr_db:.1f}" if c.snr_db is not None else ""
    size = f"{c.size / 1e6:.2f} MB" if c.size is not None else ""
    offload = f"{c.offload * 100:.0f}%" if c.offload is not None else ""
    seconds = f"{c.compile['seconds']:.1f}" if c.compile.get("seconds") is not None else ""
    # `html.escape(quote=False)`, without importing html (its entity table: ~1 ms of every build's start)
    reason = (c.reason or "").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    note = reason.replace("|", "\\|").replace("\n", " ")[:300]
    return (f"| `{c.build}` | {c.compile_status} | {seconds} | {size} | {offload} | {c.validate_status} | {snr} "
            f"| {note} |")


def write_views(layout: Layout, builds: list[Build], entries: Mapping[str, dict[str, Any]],
                entry_text: Callable[[str], str] | None = None, pages: bool = True, step_summary: bool = False,
                untouched: AbstractSet[str] = frozenset(), made_from: list[int] | None = None) -> int:
    """report.html and junit.xml next to build-report.json (`pages`) and the lines GitHub Actions shows, appended
    to the file GITHUB_STEP_SUMMARY names (`step_summary`), from the builds' remembered parts where what they show
    is unchanged; returns how many parts were rendered. `untouched` (`parts`) with `made_from`, the build report's
    identity before this run rewrote it: the last page's parts are those of the build report as it was then."""
    entry_text = entry_text or (lambda name: json.dumps(entries.get(name)))
    store = PartStore(StateFolder(layout.state), layout.build_report, made_from)
    page_parts = parts(layout, builds, entries, store, entry_text, untouched)
    if pages:
        page = render_html(page_parts, stage_rows(entries, store, entry_text), entries, layout.root.parent.name,
                           published_packages(layout))
        write_atomic(layout.html_report, page)
        write_atomic(layout.junit_report, junit_xml(page_parts))
        with contextlib.suppress(OSError):  # not remembered: the next run renders again, the same parts
            store.save()  # only with the stage rows: a store saved without them would render them again
    if step_summary:
        lines = ["### epbuild", "", "| build | compile | seconds | size | offload | validation | SNR dB | note |",
                 "|---|---|---:|---:|---:|---|---:|---|", *(p.markdown for p in page_parts)]
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    return store.rendered
