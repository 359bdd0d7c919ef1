"""A no-op `doit` and a `doit list` answered without loading the project, when provably nothing changed.

doit creates and checks every task on every run, which at a thousand targets costs several times doit's own
start, most of it inside doit. Both shortcuts below are keyed by everything task creation reads: the manifest's
bytes, epbuild's sources and dodo.py (bytes), the host probe (bytes), the Python environment (interpreter, import
path and the identity of each import folder, so an installed or upgraded package changes it), the working folder
and the variables epbuild reads. Standard library only: this runs before anything heavy is imported.

- `doit list` (no options): the names and docs the last full `doit list` produced under the same key, printed as
  doit prints them, without doit creating a task (creating 25,000 tasks from the cached names took longer than a
  bare dodo.py's listing of 10,000).
- `doit` (the default tasks; `-n`, `-P`, `--continue` allowed): the last run under the same key was a full no-op
  (nothing executed, nothing failed), and every file doit then judged unchanged (each file_dep and target of each
  task), the state files and doit's own database still have the size, mtime and inode they had. Then doit would
  run nothing, so no task is created. Any difference, or any other command line, takes the full path; a full
  no-op writes a new stamp.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from .files.layout import Layout, file_identity, settled, stat_key
from .invocation import Invocation
from .logs import log
from .state.folder import StateFolder
from .state.records import VOUCHES, vouch, vouched_files
from .state.registry import CONFIGS, HOST, OWNER_FILE

PACKAGE = Path(__file__).resolve().parent
# not doit's default name: a dodo.py without epbuild's DOIT_CONFIG opens `.doit.db` with doit's default dbm backend,
# which cannot read an sqlite file (a DatabaseException before epbuild could say what is wrong with the dodo.py)
DEP_FILE = ".doit.db.epbuild"
LEGACY_DEP_FILE = ".doit.db"  # where epbuild kept it before: moved on the next full run (store.doit_database)
# doit settings every run shares: sqlite3 keeps concurrent results, one canonical database file
DOIT_BASE = {"backend": "sqlite3", "dep_file": DEP_FILE, "verbosity": 2, "subtasks": True}
ENVIRONMENT = ("EPBUILD_", "QAIC_ROOT", "QNN_SDK_ROOT", "XDG_CACHE_HOME", "HOME", "PYTHONPATH", "PATH")
OUTPUT_ONLY = ("EPBUILD_FAST_PATH", "EPBUILD_PROGRESS")  # change what a run prints, not its tasks
FORMAT = 2
# epbuild's files the key hashes: its code, the report's templates, the shim's C source (every file the jobs' code
# digest reads is among them: `execute.provenance.digested_files`): every .py file, and every file of these folders
DATA_FOLDERS = (os.path.join("report", "templates"), os.path.join("steps", "shims"))


def _file_bytes(path: Path | str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return b""


def sources() -> list[str]:
    """epbuild's files the key hashes, relative to the package, sorted (one `os.walk`: pathlib's glob and
    `relative_to` took most of the key's time on every run)."""
    root, found = str(PACKAGE), list[str]()
    for folder, folders, files in os.walk(root):
        folders[:] = [name for name in folders if name != "__pycache__"]
        relative = os.path.relpath(folder, root)
        data = relative in DATA_FOLDERS
        found.extend(os.path.normpath(os.path.join(relative, name)) for name in files
                     if data or name.endswith(".py"))
    return sorted(found)


def project_key(manifest: Path) -> str:
    """Everything task creation reads, as one digest (see the module's docstring)."""
    digest, root = hashlib.sha256(), str(PACKAGE)
    for source in sources():
        digest.update(source.encode() + b"\0" + _file_bytes(os.path.join(root, source)) + b"\0")
    layout = Layout(manifest.parent / "artifacts")
    for path in (manifest, manifest.parent / "dodo.py", StateFolder(layout.state).path(HOST)):
        digest.update(str(path).encode() + b"\0" + _file_bytes(path) + b"\0")
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith(ENVIRONMENT) and k not in OUTPUT_ONLY)
    # an import folder's identity changes when a package is installed, upgraded or removed there; the project's
    # own folders change with every build (doit's journal), and epbuild's sources are hashed above
    own = {os.path.abspath(p) for p in (".", manifest.parent)}
    folders = [(entry, None if os.path.abspath(entry or ".") in own else file_identity(entry)) for entry in sys.path]
    digest.update(json.dumps([FORMAT, sys.executable, sys.version, platform.node(), os.getcwd(), environment,
                              folders]).encode())
    return digest.hexdigest()


STAMP, LISTING = "noop.record", "listing.json"


class Stamp:
    """`artifacts/.state/noop.record`: the key and file identities of the last full no-op (a record: its key is
    compared before its identities are decoded)."""

    def __init__(self, layout: Layout):
        self.state = StateFolder(layout.state)
        # the owner stamp too: a no-op vouched for by a folder that is no longer this user's is no no-op
        self.watched = [self.state.path(CONFIGS), layout.build_report, layout.html_report,
                        layout.junit_report, self.state.path(HOST), Path(DEP_FILE), self.state.path(OWNER_FILE)]

    def still_valid(self, key: str) -> dict[str, Any] | None:
        """The stamp when the key and every file's identity still match, else None."""
        return self.state.read_record(STAMP, key)

    def write(self, key: str, checked: dict[str, list[int]], looked_at: list[Path], tasks: int,
              skipped: dict[str, str]) -> None:
        """Record a full no-op: `checked` are the files doit judged unchanged, with the identity it saw;
        `looked_at` every other file and folder task creation read or probed, present or not (a folder's identity
        changes when an entry is added or removed)."""
        files: dict[str, list[int] | None] = {**{str(p): file_identity(str(p)) for p in looked_at}, **checked}
        for path in self.watched:
            identity = file_identity(str(path))
            if identity is None:
                return  # a run without them is not a steady state
            files[str(path)] = identity
        for name in checked:
            try:
                stat = os.stat(name)
            except OSError:
                return
            if stat_key(stat) != checked[name] or not settled(stat):
                return  # a file changed while this run checked it, or may still change under the same identity
        # one name per file: doit names a task's files relative to the working folder, task creation absolute (the
        # working folder is in the key)
        here = os.getcwd() + os.sep
        files = {path[len(here):] if path.startswith(here) else path: identity for path, identity in files.items()}
        self.state.write_record(STAMP, {"key": key, VOUCHES: vouch(files), "tasks": tasks, "skipped": skipped})


class Listing:
    """`artifacts/.state/listing.json`: every task's name and doc from the last full `doit list`, by generator, and
    the identity of every file task creation read besides the key's (the models and their external data, probed
    toolchains): a model re-exported with other shapes changes which stages exist."""

    def __init__(self, layout: Layout):
        self.state = StateFolder(layout.state)

    def load(self, key: str) -> dict[str, list[dict[str, Any]]] | None:
        listing = self.state.read_document(LISTING, key)
        return listing["tasks"] if listing is not None else None

    def write(self, key: str, tasks: dict[str, list[dict[str, Any]]], read: list[Path]) -> None:
        """`read`: the files task creation read, present or not; none written while one may still change under
        the identity it has now (changed within the clock's last tick)."""
        files: dict[str, list[int] | None] = {}
        for path in read:
            try:
                stat = os.stat(path)
            except OSError:
                files[str(path)] = None
                continue
            if not settled(stat):
                self.state.drop(LISTING)
                return
            files[str(path)] = stat_key(stat)
        self.state.write_document(LISTING, {"key": key, "tasks": tasks, VOUCHES: vouch(files)})


def listed(task: dict[str, Any]) -> dict[str, Any]:
    """What `doit list` shows of a task."""
    return {key: task[key] for key in ("basename", "name", "doc") if key in task}


def first_line(doc: str | None) -> str:
    """doit's: a task's doc is its first non-blank line, stripped."""
    return next((line.strip() for line in (doc or "").splitlines() if line.strip()), "")


def listing_text(listing: dict[str, list[dict[str, Any]]]) -> str:
    """What doit 0.37's `doit list` prints for these tasks with subtasks shown: private ones (`_...`) left out,
    sorted by name, each padded to the longest name plus three, then its doc (tests/test_fast_path.py compares it
    with doit's own)."""
    rows = sorted((f"{t['basename']}:{t['name']}" if t.get("name") else t["basename"], first_line(t.get("doc")))
                  for tasks in listing.values() for t in tasks)
    rows = [(name, doc) for name, doc in rows if not name.startswith("_")]
    width = max((len(name) for name, _ in rows), default=0) + 3
    return "".join(f"{name:<{width}}{doc}\n" for name, doc in rows)


class UpToDate:
    """Stands in for the project when the no-op stamp holds: it wants no task of any kind made (`tasks.entry`
    reads `wants`), and its reporter says what was checked."""

    def __init__(self, stamp: dict[str, Any]):
        self.stamp = stamp

    def wants(self, kind: str) -> bool:
        return False

    def doit_config(self) -> dict[str, Any]:
        return {**DOIT_BASE, "default_tasks": [], "reporter": _reporter(self.stamp)}


def _reporter(stamp: dict[str, Any]) -> type:
    from doit.reporter import ConsoleReporter

    class UpToDateReporter(ConsoleReporter):
        """doit's console reporter, ending with what the stamp vouched for."""

        def complete_run(self) -> None:
            for task, reason in stamp["skipped"].items():
                self.write(f"skipped {task}: {reason}\n")
            counts = f"{len(stamp['skipped'])} skipped, " if stamp["skipped"] else ""
            self.write(f"summary: {counts}{stamp['tasks']} up-to-date (no input, output or setting changed since the "
                       f"last full check of {vouched_files(stamp[VOUCHES])} files)\n")
            super().complete_run()

    return UpToDateReporter


def enabled() -> bool:
    """The shortcuts (and a default run's selection, `tasks.selection`) unless EPBUILD_FAST_PATH=0."""
    return os.environ.get("EPBUILD_FAST_PATH", "1") != "0"


def shortcut(manifest: Path, invocation: Invocation, key: str) -> UpToDate | str | None:
    """When this run is a plain `doit list` or a default run and its shortcut holds: the listing's text, or the
    stand-in project of a no-op run. `key`: `project_key(manifest)`, which the full load reads too (made once)."""
    if not enabled() or os.environ.get("GITHUB_STEP_SUMMARY"):
        return None
    listing_asked = invocation.listing
    if not listing_asked and not invocation.default_run:
        return None
    layout = Layout(manifest.parent / "artifacts")
    if listing_asked:
        listing = Listing(layout).load(key)
        return listing_text(listing) if listing is not None else None
    stamp = Stamp(layout).still_valid(key)
    if stamp is None:
        log(__name__, "debug", "no-op shortcut not taken: no stamp of a full no-op under this project key")
    return UpToDate(stamp) if stamp is not None else None
