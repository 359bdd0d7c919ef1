"""What a run leaves behind, written in one place when it ends (`RunEnd.commit`), in this order:

1. packages withdrawn whose variants did not all pass in this run (an application would load an artifact older
   than its source);
2. `artifacts/build-report.json`: this run's entries, without those of tasks the manifest no longer declares;
3. the views made from it: `report.html`, `junit.xml`, the GitHub step summary (a warning when they cannot be
   written: they are for people, never a failed build);
4. `.state/configs.journaled`: each task's settings at its last success (`store.task_configs`);
5. the no-op stamp (`fast_path.Stamp`): written when nothing ran or failed, dropped when anything ran;
6. `.state/last-run.journaled`: what was up to date, for the next default run's selection (`tasks.run_record`);
7. the scratch a killed build's jobs left, swept again.

A record that cannot be written (4-7) is one warning: the next run checks, and may re-run, more; never wrong. The
reporter (`tasks.reporter`) says what the run did; this says what it leaves."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..fast_path import STAMP, Stamp
from ..files.owners import sweep
from ..files.publish import discard
from ..manifest.builds import package_task
from ..report.build_report import BuildReport
from ..report.cells import cell_tasks
from ..report.views import write_views
from ..state.folder import StateFolder
from .checker import saw
from .kinds import UNAVAILABLE, is_subtask
from .run_record import RunRecord, next_record
from .selection import Recorded, files_of

if TYPE_CHECKING:
    from .project import Project


def closure(tasks: dict[str, Any], selected: list[str]) -> list[str]:
    """The tasks a run may execute: the selected ones and everything they depend on, named subtasks only."""
    seen: set[str] = set()
    todo = list(selected)
    while todo:
        name = todo.pop()
        if name in seen or name not in tasks:
            continue
        seen.add(name)
        todo.extend(tasks[name].task_dep)
        todo.extend(tasks[name].setup_tasks)
    return sorted(name for name in seen if is_subtask(name) and tasks[name].actions)


class PlanSave:
    """A build's freshly made plan (`plan.saved_plan`), saved in a thread once the build's first job has started
    (doit's workers are forked by then, and the build's process mostly waits on its jobs): at 10,000 targets its JSON
    is the largest part of loading, which would otherwise come before the first job. `finish` waits for it at the end
    of the run, or saves it there when no job ran. A plan that cannot be saved is planned again next run."""

    def __init__(self, save: Callable[[], None] | None):
        self.save = save
        self.thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _run(self) -> None:
        assert self.save is not None
        with contextlib.suppress(OSError):
            self.save()

    def start(self) -> None:
        with self._lock:
            if self.save is not None and self.thread is None:
                thread = threading.Thread(target=self._run, name="epbuild-plan-save", daemon=True)
                thread.start()
                self.thread = thread

    def finish(self) -> None:
        with self._lock:
            if self.thread is not None:
                self.thread.join()
            elif self.save is not None:
                self._run()
            self.save = None


@dataclass(frozen=True)
class RunOutcome:
    """What the reporter saw of one run: doit's tasks and selection, and what became of them."""

    doit_tasks: dict[str, Any]  # doit's Task objects by name
    selected: list[str]
    started: set[str]  # tasks whose action began
    done: set[str]  # finished, failed or not
    failed: set[str]  # failed by their own action
    blocked: set[str]  # not run: a task they need failed
    uptodate: set[str]  # doit's up-to-date ones and those not handed to it
    hidden: list[str]  # not handed to doit, up to date by the last run's record (`tasks.selection`)
    record: Recorded | None  # that record
    looked_at: dict[str, list[int] | None]  # what task creation read besides the tasks' files
    seen: set[str]  # every task the build report speaks of after this run
    clean: bool  # no task failed and doit met no error of its own


class RunEnd:
    """The end-of-run commit of one project's run (see the module's docstring for what, and in which order)."""

    def __init__(self, project: Project, report: BuildReport, write: Callable[[str], None]):
        self.project, self.report, self.write = project, report, write

    def commit(self, run: RunOutcome) -> None:
        layout = self.project.layout
        self._withdraw_packages(run)
        self.report.keep_only(self.project.declared_tasks())  # a removed model's entries would keep CI red
        try:  # the views are for people: one that cannot be written is a warning, never a failed build
            pages = self.report.write() or not layout.html_report.exists()
            step_summary = bool(os.environ.get("GITHUB_STEP_SUMMARY") and run.seen)
            if pages or step_summary:
                # what no task of this run touched shows as the last page showed it
                unchanged = set(run.hidden).difference(self.report.modified)
                untouched = {build.name for build in self.project.builds if unchanged.issuperset(cell_tasks(build))}
                write_views(layout, self.project.builds, self.report.entries, self.report.entry_text, pages,
                            step_summary, untouched, self.report.read_as)
        except Exception as exc:  # noqa: BLE001 - any rendering error, reported with its type
            self.write(f"warning: report.html / junit.xml not written: {type(exc).__name__}: {exc}\n")
        try:  # a record that cannot be written makes the next run check, and possibly re-run, more: never wrong
            self.project.configs.save()
            self._stamp(run)
            if self.project.key and self.project.command != "list":
                self._write_run_record(run)
            if self.project.writable and run.started - {UNAVAILABLE}:
                # again at the end: a killed build's jobs may still have been writing into their folders when
                # this run swept at its start
                sweep([layout.scratch_root])
        except OSError as exc:
            self.write(f"warning: build state not saved ({exc.strerror or exc}: {exc.filename}); the next run "
                       "re-checks the tasks\n")

    def _stamp(self, run: RunOutcome) -> None:
        """The no-op stamp when nothing ran (the `unavailable` listing aside) and nothing failed; dropped when
        anything ran, which changed what it watches (45,000 identities at 10,000 targets: no next run reads it to
        find that out)."""
        layout = self.project.layout
        if self.project.key and run.clean and run.started <= {UNAVAILABLE}:
            up_to_date = [name for name in run.uptodate if is_subtask(name)]
            if run.record is not None:  # the files of those doit was not handed, as the record vouches
                for path in {path for name in run.hidden for path in run.record.tasks[name]}:
                    # None (absent when recorded) stays None: Stamp.write then finds the file differs, no stamp
                    saw(self.project.checked, path, cast("list[int]", run.record.files[path]))
            skipped = self.project.skipped() if UNAVAILABLE in run.seen else {}
            Stamp(layout).write(self.project.key, self.project.checked, self.project.looked_at, len(up_to_date),
                                skipped)
        elif run.started - {UNAVAILABLE}:
            StateFolder(layout.state).drop(STAMP)

    def _write_run_record(self, run: RunOutcome) -> None:
        """The tasks this run found up to date, with their files' identities as doit judged them (or, for those
        not handed to doit, as the last record had them) and the tasks they name: the next default run hands doit
        only the others (tasks.selection). A file seen with two identities is recorded as such, so its tasks are
        handed again."""
        found, found_deps = {}, {}
        for name in run.uptodate.difference(run.hidden):
            task = run.doit_tasks.get(name)
            if task is not None and is_subtask(name):
                found[name] = files_of(task.file_dep, task.targets)
                if task.task_dep:
                    found_deps[name] = list(task.task_dep)
        recorded = next_record(run.record, run.hidden, found, found_deps, self.project.checked)
        # a file some task reads is that task's to check (and a model's, its tasks' suspicion: tasks.selection)
        read = {path for task in run.doit_tasks.values() for path in task.file_dep}
        recorded.looked_at = {path: identity for path, identity in run.looked_at.items()
                              if path not in recorded.files and path not in read}
        RunRecord(self.project.layout).write(self.project.key, recorded, run.record)

    def _withdraw_packages(self, run: RunOutcome) -> None:
        """A package is published only from this build's passed variants: one whose task this run tried and did not
        end built or up to date (a variant failed or was not built, the build stopped before it), or any of whose
        variants' tasks failed in this run, is removed with one line. An application that loads it would otherwise
        get a model older than its source (the encoder retrained, its QNN compile failed: the old one served)."""
        packages = sorted(n for n in run.doit_tasks if n.startswith(package_task("")))
        if not packages:  # (the closure asks doit for every task's actions, which it makes on first asking)
            return
        tried = set(closure(run.doit_tasks, run.selected))
        for name in packages:
            needs = [dep for dep in closure(run.doit_tasks, [name]) if dep in run.failed and dep != name]
            current = name in run.uptodate or (name in run.done and name not in run.failed | run.blocked)
            if current or (name not in tried and not needs):
                continue
            folder = self.project.layout.package_dir(name.split(":", 1)[1])
            if not folder.exists():
                continue
            why = (f"{', '.join(needs)} failed" if needs else f"{name} failed" if name in run.failed
                   else "the build stopped before it")
            discard(folder)
            self.write(f"removed {os.path.relpath(folder)}/: {why}, and it would serve artifacts older than their "
                       "sources; it is published again when every variant passes\n")
