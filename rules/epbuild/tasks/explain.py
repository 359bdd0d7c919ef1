"""`epbuild explain TASK`: doit's `info` (why TASK would run, exit 1; up to date, exit 0), which judges TASK alone,
made to take the tasks it depends on into account: a validation whose compile will run is no more up to date than
the compile (its artifact is about to change), so a CI gate on the exit code must not read "up to date" there."""

from __future__ import annotations

import io
from typing import Any

from doit.cmd_info import Info
from doit.doit_cmd import DoitMain


def first_to_run(tasks: dict[str, Any], name: str, status: Any) -> list[str]:
    """The tasks `name` depends on (through task_dep, setup and the files other tasks make) that would run, deepest
    first: the first of them runs first. `status(task)`: doit's status word for one task."""
    made_by = {target: task.name for task in tasks.values() for target in task.targets}
    order: list[str] = []
    seen: set[str] = set()

    def visit(current: str) -> None:
        task = tasks.get(current)
        if task is None or current in seen:
            return
        seen.add(current)
        needed = [*task.task_dep, *task.setup_tasks, *(made_by[f] for f in task.file_dep if f in made_by)]
        for dependency in needed:
            visit(dependency)
        if current != name:
            order.append(current)

    visit(name)
    return [each for each in order if status(tasks[each]) != "up-to-date"]


UP_TO_DATE = "\nstatus     : up-to-date\n"  # doit's line for a task whose own inputs are unchanged


class ExplainingInfo(Info):
    """doit's `info`, whose up-to-date verdict also asks the tasks TASK depends on."""

    name = "info"  # doit names a command by its class otherwise

    def _execute(self, pos_args: list[str], hide_status: bool = False) -> int:
        shown, stream = io.StringIO(), self.outstream  # type: ignore[has-type]
        self.outstream = shown
        try:
            code: int = super()._execute(pos_args, hide_status)
        finally:
            self.outstream = stream
        text = shown.getvalue()
        if not code and not hide_status and len(pos_args) == 1:
            tasks = {task.name: task for task in self.task_list}
            running = first_to_run(tasks, pos_args[0], lambda task: self.dep_manager.get_status(task, tasks).status)
            if running:
                more = f" (and {len(running) - 1} more it depends on)" if len(running) > 1 else ""
                text = text.replace(UP_TO_DATE, f"\nstatus     : run\n * {running[0]} would run first{more}: its "
                                    f"outputs are this task's inputs (`epbuild explain {running[0]}` says why)\n", 1)
                code = 1
        stream.write(text)
        return code


class EpbuildMain(DoitMain):
    """doit's command line for the `epbuild` command, with `info` as `explain` needs it."""

    DOIT_CMDS = tuple(ExplainingInfo if command is Info else command for command in DoitMain.DOIT_CMDS)
