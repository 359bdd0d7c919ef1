"""What epbuild remembers between runs: every file under `artifacts/.state/`, who owns it, what it holds, what
makes it stale and which measured figure earns its place (`bench/results/`). The folder has one versioned layout
(`format`): a run that finds another format (an older epbuild's, or none in a non-empty folder) empties it first,
so no file is ever read under a layout it was not written in; losing it costs one full check, never a wrong answer
(every file here is a shortcut or a record that a full check rebuilds). `docs/state.md` is this table, generated
(`python -m epbuild.state.registry`), and a test keeps both and a built project's folder in step."""

from __future__ import annotations

import fnmatch
import os
import stat
from contextlib import AbstractContextManager
from pathlib import Path

FORMAT = 3  # 2: journals and digests inside their records (`state.journaled`); 3: records are JSON, never pickles
FORMAT_FILE = "format"
OWNER_FILE = "owner"  # this user's stamp on the folder (`state.owner`)
RECORDS_LOCK = "records.lock"
CONFIGS = "configs.journaled"  # watched by the no-op stamp and the run record: its owner is `store.task_configs`
HOST = "host.json"  # in the project key and watched by the no-op stamp: its owner is `execute.host`


NOTHING_RUNS = "nothing runs"  # what the next run does without the file (tests/test_state.py checks each)
RESTORED = "every task runs again, restoring its outputs from the cache"


class StateFile:
    """One entry of the registry (a plain class: the registry is read by every run, the no-op included)."""

    __slots__ = ("earned_by", "holds", "lost", "owner", "pattern", "stale_when")

    def __init__(self, pattern: str, owner: str, holds: str, stale_when: str, earned_by: str,
                 lost: str = NOTHING_RUNS):
        self.pattern = pattern  # relative to .state/ (glob)
        self.owner = owner  # the module that reads and writes it
        self.holds = holds
        self.stale_when = stale_when
        self.earned_by = earned_by  # the figure that keeps it (bench/results/...), or why it is not a shortcut
        self.lost = lost  # what a run does when it is missing: never a wrong answer


STATE_FILES = (
    StateFile(RECORDS_LOCK, "state.registry", "the lock a build holds while it merges into the run record or the "
              "settings record (two builds ending together)", "never read", "not a shortcut: concurrent builds"),
    StateFile(OWNER_FILE, "state.registry", "this folder's owner stamp: an HMAC of its layout under a key this user "
              "keeps outside every project and cache (`~/.local/state/epbuild/owner.key`)",
              "another user or machine wrote the folder (a checkout, a pull request that commits it), or the "
              "key is gone",
              "not a shortcut: what lets the other files vouch for artifacts at all (a checkout cannot bring it)",
              "the next full load takes the folder for another's and empties it, setting doit's database aside: "
              + RESTORED),
    StateFile(FORMAT_FILE, "state.registry", "this folder's layout version", "epbuild changes the layout",
              "not a shortcut: what makes every other file safe to read",
              "the next full load takes the folder for another layout's and empties it: " + RESTORED),
    StateFile("noop.record", "fast_path", "the last full no-op: its project key and every checked file's identity",
              "the key (manifest, epbuild's code, environment, host probe) or any file's identity differs",
              "state.json: a no-op `doit` with it and without (scale.json: the fast path against the full path)"),
    StateFile("listing.json", "fast_path", "the last full `doit list` output by generator",
              "the project key differs, or a model's (or probed file's) identity: its shapes decide the stages",
              "state.json: `doit list` with it and without"),
    StateFile("plan.record", "plan.saved_plan", "the last plan: the manifest as read and checked, resolved targets, "
              "builds and stages; its key names what it was made from (a run that planned the same does not write "
              "it again)", "the project key, or any file the plan was made from",
              "state.json: a full-path no-op with it and without; scale.json: the full-path no-op and list at "
              "10,000 targets (not encoding the plan again)"),
    StateFile("last-run.journaled", "tasks.run_record", "the last default run's record (what it found up to date), "
              "with a line per run since of what changed", "its key (its format and the project key), or the "
              "identity of the settings record, the build report or doit's database; rewritten whole when its lines "
              "outgrow it", "state.json: a full-path no-op with it and without (scale-change.json: the tasks "
              "handed to doit after one change)"),
    StateFile(CONFIGS, "store.task_configs", "each task's settings digest at its last success and the "
              "files it published, one line per task (decoded only for the tasks a run creates), with a line per "
              "run since of the tasks it changed", "a task's settings or published files change",
              "not a shortcut: the settings doit's own record does not hold (incremental contract rows)", RESTORED),
    StateFile("settings/*.json", "store.task_configs", "each task's settings themselves, for `epbuild explain`",
              "the task's settings change", "not a shortcut: what explain shows"),
    StateFile("build-report.sha256", "report.build_report", "build-report.json's per-entry digests (the report "
              "is the user's file: its digest stays out of it)", "the report is rewritten",
              "state.json: the first run after one model changed, with it and without"),
    StateFile("report-parts.journaled", "report.views", "each build's rendered report parts under the digest of "
              "what they show, with a line per run since of the parts it rendered", "its key (the renderer's "
              "version: templates and code), or a part's inputs change",
              "state.json: the first run after one model changed, with it and without"),
    StateFile("external-data.journaled", "plan.external_data", "each model's external-data files, inputs and graph "
              "facts, one line per model, by the model file's identity", "the model file's identity (ctime "
              "included) changes", "state.json: a full-path no-op without the saved plan, with it and without (a "
              "3 GiB model is read again without it)"),
    StateFile(HOST, "execute.host", "the EP probe of this host (devices, packages)",
              "its key: package versions, Python, the machine",
              "state.json: a full-path no-op with it and without (the probe is a child process)"),
    StateFile("hashes/*.tsv", "state.hash_memory", "the sha256 of each file hashed, by its identity (ctime "
              "included)", "the file's identity changes", "state.json: a full-path no-op after every model was "
              "touched, with it and without (cache.json: files hashed by a no-op)"),
    StateFile("ops/*/*.json", "tasks.actions", "a qaic target's operator check result", "the model or qaic changes",
              "not a shortcut: the `ops:` task's output"),
)


_EXACT = frozenset(f.pattern for f in STATE_FILES if "*" not in f.pattern)
_FOLDERS = frozenset(f.pattern.split("/", 1)[0] for f in STATE_FILES if "/" in f.pattern)
_GLOBS = tuple(f.pattern for f in STATE_FILES if "*" in f.pattern)


def state_file(state: Path, name: str) -> Path:
    """The one way to a path under `.state/`: a file (or a folder of files) this registry declares, so that nothing
    is remembered that the page does not name. Its owner reads and writes it through `state.StateFolder`, never
    another module."""
    if name not in _EXACT and name not in _FOLDERS and not any(fnmatch.fnmatchcase(name, p) for p in _GLOBS):
        raise ValueError(f".state/{name} is not declared in epbuild.state.registry.STATE_FILES")
    return state / name


def records_lock(state: Path) -> AbstractContextManager[None]:
    """Held while a build writes a record other builds merge into (`tasks.run_record`, `store.task_configs`): one
    lock for both, taken one after the other, never nested."""
    from ..files.locks import file_lock

    return file_lock(state_file(state, RECORDS_LOCK))


def unlisted(state: Path) -> list[str]:
    """Files under `state` no entry names (a test keeps this empty for a built project)."""
    names = [p.relative_to(state).as_posix() for p in state.rglob("*") if p.is_file()]
    return sorted(n for n in names if not any(fnmatch.fnmatch(n, f.pattern) for f in STATE_FILES))


def owned(state: Path, layout: int = FORMAT) -> bool:
    """Whether `state` carries this user's stamp for `layout` (`state.owner`). A FIFO or a link
    in the stamp's place is no stamp: never waited on, never followed."""
    import hmac

    from .owner import stamp

    expected = stamp(state, layout)
    if expected is None:
        return False
    try:
        descriptor = os.open(state_file(state, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return False
        found = os.read(descriptor, 256).strip()  # a stamp is 64 hex digits: never read past that
    finally:
        os.close(descriptor)
    return hmac.compare_digest(found, expected.encode())


def write_stamp(state: Path, layout: int = FORMAT) -> None:
    """Mark `state` as this user's (a folder just emptied or made)."""
    from .owner import stamp

    expected = stamp(state, layout)
    if expected is not None:
        target = state_file(state, OWNER_FILE)
        if target.is_symlink() or (target.exists() and not target.is_file()):
            target.unlink()
        target.write_text(expected + "\n", encoding="ascii")


def settle_format(state: Path) -> str | None:
    """Make `state` this layout's and this user's: an existing folder of another format (or of none), or one that
    does not carry this user's stamp (`state.owner`: a checkout's, another user's or machine's), is
    emptied, marked and stamped. Why, when it was emptied ("layout"; "owner": another's stamp; "unstamped": none, an
    older epbuild's folder or a checkout's), else None. Before anything
    under it is read or written in a run that writes."""
    marker = state / FORMAT_FILE
    try:
        found = marker.read_text().strip() if not state.is_symlink() else None
    except (OSError, UnicodeDecodeError):
        found = None
    if found == str(FORMAT) and owned(state, FORMAT):
        return None
    had_stamp = (state / OWNER_FILE).exists() and not state.is_symlink()  # another's stamp, or none at all
    import shutil

    emptied = False
    if state.is_symlink() or (state.exists() and not state.is_dir()):  # a checkout's link or file: never followed
        state.unlink()
        emptied = True
    if state.is_dir() and any(state.iterdir()):
        for entry in state.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        emptied = True
    state.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{FORMAT}\n")
    write_stamp(state, FORMAT)
    if not emptied:
        return None
    if found != str(FORMAT):
        return "layout"
    return "owner" if had_stamp else "unstamped"


def table() -> str:
    """docs/state.md's body."""
    rows = "\n".join(f"| `{f.pattern}` | `{f.owner}` | {f.holds} | {f.stale_when} | {f.earned_by} | {f.lost} |"
                     for f in STATE_FILES)
    return ("# What epbuild remembers between runs\n\nEverything under `artifacts/.state/` (generated from "
            "`rules/epbuild/state/registry.py`: `python -m epbuild.state.registry > docs/state.md`). Deleting the "
            "folder is always safe: the next run checks everything in full and writes it again; the last column says "
            "what a run does without each file (`tests/test_state.py` deletes each in turn after a build and checks "
            "it, and that every artifact keeps its bytes). Every path under it is made through `state.StateFolder` "
            "(`state.registry.state_file`), which refuses a name this table does not declare, and every file is read "
            "and written there in one of four forms: a record (JSON: its key, the files it vouches for, its body), a "
            "journaled record (its base, then a line per "
            "run that changed it: `state.journaled`), a JSON document, the hash memory's shards. Every form is data: a "
            "checkout can bring any file here, so nothing is unpickled, imported or run (the saved plan is typed JSON "
            "that makes only epbuild's own record classes: `state.codec`). A record is read by "
            "one rule (`state.records.current`): its key is the one its reader passes (the column *stale when* says "
            "what each key holds) and every file it vouches for still has the identity it had (ctime included); the "
            "settings and the external-data index are judged entry by entry. A shortcut earns its place by a figure "
            "in `bench/results/state.json` (`bench/bench_state.py`: the run it shortens, with it and without it; "
            "the performance page lists them). Layout format "
            f"{FORMAT}.\n\n| file | owner | holds | stale when | earns its place | when lost |\n"
            f"|---|---|---|---|---|---|\n{rows}\n")


if __name__ == "__main__":
    print(table(), end="")
