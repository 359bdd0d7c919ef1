"""doit's console output and a live status area on a terminal: what each task did, and the summary of the run. What
the run leaves behind (the build report, its views, the records) is written by `tasks.run_end` at its end."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from doit.exceptions import TaskFailed, UnmetDependency
from doit.reporter import ConsoleReporter
from doit.runner import ERROR, FAILURE

from ..contracts.task_result import PUBLISHED
from ..errors import printable
from ..execute.lifelines import WorkerLost, WorkerWatch, tie_forked_children
from ..manifest.builds import REDUCE_PREFIX, package_task
from ..report.build_report import BuildReport
from ..report.progress import LiveProgress, durations
from ..report.views import templates_prepared_in_background
from .actions import fail_blocked
from .announce import announced
from .kinds import BLOCKED, UNAVAILABLE, is_subtask
from .run_end import PlanSave, RunEnd, RunOutcome, closure
from .selection import Recorded

if TYPE_CHECKING:
    from .project import Project


@dataclass(frozen=True)
class ReportedRun:
    """What the reporter of one run is given besides doit's tasks."""

    project: Project
    hidden: list[str]  # tasks not handed to doit, up to date by the last run's record (tasks.selection)
    record: Recorded | None  # that record
    looked_at: dict[str, list[int] | None]  # what task creation read besides the tasks' files, as it found them


class BuildReporter(ConsoleReporter):
    """doit's console output (with a live status area on a terminal), plus `artifacts/build-report.json`,
    `report.html`, `junit.xml` and a summary at the end of every run."""

    run: ReportedRun  # this run's project and records: doit makes the reporter from a class, so `for_run` binds it

    @classmethod
    def for_run(cls, run: ReportedRun) -> type[BuildReporter]:
        """The reporter class doit is handed (`reporter` in DOIT_CONFIG): doit instantiates it with its own output
        stream and options, so what this run knows travels as the one class attribute `run`."""
        return type(cls.__name__, (cls,), {"run": run})

    @property
    def project(self) -> Project:
        return self.run.project

    @property
    def hidden(self) -> list[str]:
        return self.run.hidden

    @property
    def record(self) -> Recorded | None:
        return self.run.record

    @property
    def looked_at(self) -> dict[str, list[int] | None]:
        return self.run.looked_at

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)
        tie_forked_children(os.getpid())  # doit's workers (-n), forked after this, die with this process
        self.watch: WorkerWatch | None = None
        self.done: set[str] = set()  # tasks finished, failed or not
        self.lost_worker = ""
        self.doit_tasks = tasks
        self.selected = list(selected_tasks)  # with `tasks`: what the run would have done (`not_attempted`)
        self.preparing = None  # the page's templates, compiled while the first task that runs waits for its child
        self.plan_save = PlanSave(self.project.save_plan)  # the fresh plan, saved while the jobs run
        self.report = BuildReport(self.project.layout.build_report, self.project.layout.state)
        self.started: dict[str, float] = {}
        self.blocked: set[str] = set()  # not run: a task they need failed
        self.causes: dict[str, list[str]] = {}  # a task not built -> the tasks that failed for it, first cause first
        self.uptodate: set[str] = set()
        self.live = None
        if self.project.live and not {"backends", "cache"} & set(selected_tasks):
            reachable = closure(tasks, selected_tasks)
            self.live = LiveProgress(self.outstream, reachable, durations(self.report.entries, reachable),
                                     catch_prints=self.project.threads)

    def write(self, text):
        text = printable(text)  # a failure's text is the EP's, a name may be a model's: no control codes through
        if self.live is not None:
            self.live.print(text)
        else:
            super().write(text)

    def execute_task(self, task):
        edited = [target for target in task.targets if target in self.project.edited]
        if edited:
            self.write(f"warning: {', '.join(edited)} changed since it was published; restoring or rebuilding "
                       f"it\n")
        if self.live is not None:
            self.live.started(task.name)
        elif task.name != "backends" and not announced(task.actions):  # its worker said it (`announcing`)
            super().execute_task(task)  # the output of `backends`, --json included, stays clean for machines
        if self.preparing is None and is_subtask(task.name):
            self.preparing = templates_prepared_in_background()
            self.plan_save.start()
        self.started[task.name] = time.monotonic()
        if self.watch is None:
            self._watch_workers()

    def _watch_workers(self) -> None:
        """With doit -n, a worker killed by a signal (the out-of-memory killer) would leave doit waiting for its
        answer forever: this (main) thread is interrupted with `WorkerLost` instead, whose line ends the run."""
        workers = [child.pid for child in multiprocessing.active_children() if child.pid]
        if multiprocessing.parent_process() is not None or not workers:
            self.watch = WorkerWatch([], lambda *_: None)  # not doit's main process, or no workers: nothing
            return

        def lost(pid: int, number: int) -> None:
            running = ", ".join(sorted(self.running())) or "no task"
            self.lost_worker = (f"error: doit's worker process {pid} was killed by {signal.Signals(number).name} "
                                f"(the kernel's out-of-memory killer sends SIGKILL) while {running} ran; the build "
                                "stopped: finished tasks are kept, and a rerun does the rest")
            os.kill(os.getpid(), signal.SIGUSR1)

        def interrupt(*_: Any) -> None:
            raise WorkerLost(self.lost_worker)

        signal.signal(signal.SIGUSR1, interrupt)
        self.watch = WorkerWatch(workers, lost)
        self.watch.start()

    def running(self) -> set[str]:
        """Tasks started and not yet finished."""
        return set(self.started) - self.done


    def add_success(self, task):
        super().add_success(task)
        self.done.add(task.name)
        if self.live is not None:
            if not self.project.threads:  # captured (verbosity 1): shown above the status area
                self.write("".join(action.out for action in task.actions if action.out))
            self.live.finished(task.name)
        self.project.configs.success(task.name, task.values.get(PUBLISHED))
        if is_subtask(task.name) and task.values.get("status"):
            self.report.succeeded(task.name, task.values)

    def add_failure(self, task, fail):
        self.done.add(task.name)
        if isinstance(fail, UnmetDependency):  # not run because a task it needs failed: not a failure of its own
            if self.live is not None:
                self.live.finished(task.name, failed=True)
            self.blocked.add(task.name)
            # the task that failed, not the ones between it and this (a fold that failed, not its compile's
            # validation): each blocked task carries its causes
            causes = list(dict.fromkeys(cause for name in str(fail.message).split()
                                        for cause in self.causes.get(name, [name])))
            self.causes[task.name] = causes
            failed = f"{', '.join(causes)} failed{self._left_out_hint(task.name, causes)}"
            self.write(f"not built {task.name}: {failed}\n")
            if is_subtask(task.name):
                self.report.not_built(task.name, failed)
            return
        super().add_failure(task, fail)
        if self.live is not None:
            self.live.finished(task.name, failed=True)
        if is_subtask(task.name) and not task.name.startswith(REDUCE_PREFIX):
            # a reduction that could not run (nothing to reduce) is the command's answer, not a build's outcome: a
            # row no default build would ever clear
            seconds = max(0.0, time.monotonic() - self.started.get(task.name, time.monotonic()))
            self.report.failed(task.name, fail.get_msg().strip(), seconds)

    def skip_uptodate(self, task):
        if self.live is not None:
            self.live.finished(task.name)
        else:
            super().skip_uptodate(task)
        self.uptodate.add(task.name)
        if is_subtask(task.name):
            self.report.up_to_date(task.name)

    def _left_out_hint(self, name: str, causes: list[str]) -> str:
        """For a package a failed variant stops: the manifest line that ships it without the failed targets."""
        if not name.startswith(package_task("")):
            return ""
        package = name.split(":", 1)[1]
        failed = {cause.rsplit("@", 1)[1] for cause in causes if "@" in cause}
        spec = self.project.manifest.packages.get(package)
        if spec is None or not failed:
            return ""
        models = {*spec.models, *(m for group in spec.groups for m in self.project.manifest.groups[group].models)}
        targets = spec.targets if spec.targets is not None else list(dict.fromkeys(
            target for model in models for target in self.project.manifest.models[model].targets))
        # only targets whose every validation of the package's models passed (or stood) in this run: a target
        # that failed beside the one that stopped the package was suggested too
        lost = {r["task"].name for r in self.failures} | self.blocked
        passed = (self.done - lost) | self.uptodate
        builds = {(b.members[0].model.name, b.target.name): b for b in self.project.builds if not b.shared}
        kept = [target for target in targets if target not in failed and all(
            builds[(model, target)].validate_task in passed for model in models if (model, target) in builds)]
        listed = ", ".join(f'"{target}"' for target in kept)
        return f"; to ship it without them: [packages.{package}] targets = [{listed}]" if kept else ""

    def complete_run(self):
        if self.watch is not None:
            self.watch.stop()  # doit ends its workers itself now
        if self.live is not None:
            self.live.stop()
            self.live = None
        if self.preparing is not None:
            self.preparing.join()
        self.plan_save.finish()
        for name in self.hidden:  # up to date without doit's check: as if it had found them so
            self.uptodate.add(name)
            self.report.up_to_date(name)
        for name in self.running():  # the run stopped under them (Ctrl-C, a lost worker)
            if is_subtask(name):
                self.report.interrupted(name)
        seen = set(self.started) | self.uptodate | self.blocked
        if UNAVAILABLE in seen:  # the default run: tasks this host cannot build were skipped
            for name, reason in self.project.skipped().items():
                self.report.skipped(name, reason)
                seen.add(name)
        if BLOCKED in seen:  # a default run: builds that wait for a fix to the manifest were not attempted
            blocked = self.project.blocked_builds()
            for name, why in blocked.items():
                self.report.not_built(name, f"waits for a fix: {why}")
                seen.add(name)
            if BLOCKED not in self.started:  # it did not run (a task before it failed): its lines anyway
                self.write(fail_blocked(blocked).get_msg() + "\n")
        # doit stops at the first failure: what it never reached is said, not silent, and its entry loses what the
        # last run said of it (this run did not check it)
        left = [name for name in closure(self.doit_tasks, self.selected) if name not in seen] if self.failures else []
        for name in left:
            self.report.not_attempted(name)
        layout = self.project.layout
        RunEnd(self.project, self.report, self.write).commit(RunOutcome(
            self.doit_tasks, self.selected, set(self.started), self.done, {r["task"].name for r in self.failures},
            self.blocked, self.uptodate, self.hidden, self.record, self.looked_at, seen,
            not (self.failures or self.runtime_errors)))
        line = self.report.summary(seen, set(self.started), set(self.project.stages))
        if line and left:
            line += (f"; {len(left)} not tried (the build stopped at the first failure): run with --continue to "
                     "build them")
        if line and self.hidden:
            line += (f"; {len(seen) - len(self.hidden)} tasks handed to doit, {len(self.hidden)} unchanged since the "
                     "last run's record")
        if line:
            self.write(line + "\n")
        if layout.html_report.exists() and any(is_subtask(name) for name in self.started):  # a run that built
            self.write(f"report: {os.path.relpath(layout.html_report)}\n")
        super().complete_run()
        self._one_exit_status()

    def _one_exit_status(self) -> None:
        """One rule for the exit status: 1 when tasks failed, whatever was not built because of them; 2 only for an
        error of the build itself (doit's own, a task it could not check). doit calls a task not built for a failed
        one an error (2): a failed validation exited 1, the same with a package after it 2. The runner is doit's
        caller of this method (`Runner.finish`, which returns its result next)."""
        if self.runtime_errors or not self.failures:
            return
        if not all(isinstance(result["exception"], (TaskFailed, UnmetDependency)) for result in self.failures):
            return
        caller = sys._getframe(2)  # Runner.finish -> complete_run -> here
        runner = caller.f_locals.get("self")
        if caller.f_code.co_name == "finish" and runner is not None and getattr(runner, "final_result", None) == ERROR:
            runner.final_result = FAILURE


