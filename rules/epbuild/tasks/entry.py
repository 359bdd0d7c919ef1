"""How doit reaches epbuild's tasks, both ways: a project's one-line dodo.py (`epbuild.dodo`, doit's module
protocol: its namespace) and the `epbuild` command (`EpbuildLoader`, doit's loader API, which is handed this run's
command line instead of reading the process's arguments). Either way the run's command line is read once
(`Invocation`); when a shortcut holds (`fast_path`: a no-op run or an unchanged listing) nothing heavy is imported
and no task is made, else the project is loaded in full (`definitions.load_full_project`)."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..fast_path import project_key, shortcut
from ..invocation import Invocation
from ..logs import configure as configure_logging

if TYPE_CHECKING:
    from ..execute.warm_start import Candidate
    from .kinds import TaskKind



def interrupted(kind: type[BaseException], value: BaseException, trace: Any) -> None:
    """Ctrl-C: one line instead of a traceback (the exit status stays 130). doit has saved what finished, and
    the fork servers end the jobs of this build once its process is gone."""
    if kind.__name__ == "WorkerLost":  # a worker killed mid-build (`execute.lifelines`): its line, exit status 1
        sys.stdout.flush()
        sys.stderr.write(f"{value}\n")
        sys.stderr.flush()
        os._exit(1)
    if issubclass(kind, KeyboardInterrupt):
        sys.stderr.write("interrupted: the build stopped; finished tasks are kept, and a rerun does the rest\n")
        return
    sys.__excepthook__(kind, value, trace)


def quiet_when_piped(invocation: Invocation) -> None:
    """A listing or help piped into a reader that stops (`epbuild list | head`) ends quietly with it, as Unix
    tools do (killed by SIGPIPE; doit printed a BrokenPipeError traceback). Builds keep Python's default."""
    if invocation.inspecting and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def whole_lines(stream: Any) -> None:
    """Flush at every line: doit's `-n` workers (forked from this process, with this stream) and this process
    write to one stdout, which is a pipe in CI and block-buffered there, so a block could end mid-line and another
    process's line land inside it (a task's `.  name` line lost from the log). A whole line is one write, and a
    pipe never splits a write that small."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        with contextlib.suppress(ValueError, OSError):  # a closed or foreign stream: as it is
            reconfigure(line_buffering=True)


def load(manifest: Path, invocation: Invocation, early: Candidate | None = None) -> Any:
    """The tasks' source for this run: the shortcut's stand-in, or the full project's tasks. A listing the
    shortcut answers is printed here and the run ends (doit has nothing left to do). Inside doit, Python's cyclic
    collector is off from here until doit has made every task (`namespace` turns it on again after the last task
    generator): what loading makes, the plan, the records, the task dicts, lives as long as doit and holds no cycle
    worth the collector's passes over it; then, at one young collection per 100,000 objects instead of 700, the
    full collections over doit's records of every task stay few and still collect what the run's own actions
    leave."""
    sys.excepthook = interrupted
    quiet_when_piped(invocation)
    whole_lines(sys.stdout)
    configure_logging()
    if "doit.loader" in sys.modules:  # a doit process, which consumes the generators
        gc.disable()
        gc.set_threshold(100_000, 50, 100)
    key = project_key(manifest)  # the shortcuts' and the saved plan's: read once (it hashes epbuild's sources)
    quick = shortcut(manifest, invocation, key)
    if quick is not None and early is not None:  # a shortcut holds: no server to start
        early.discard()
    if isinstance(quick, str):  # `doit list` unchanged
        sys.stdout.write(quick)
        sys.stdout.flush()
        raise SystemExit(0)
    if quick is not None:
        return quick
    from .definitions import load_full_project

    return load_full_project(manifest, invocation, early, key)


def namespace(source: Any) -> dict[str, Any]:
    """What doit reads from a dodo module: DOIT_CONFIG and a `task_NAME` generator per task kind. doit runs every
    one of them (in its order, which a star import sorts); the last to finish turns the collector on again and
    freezes what loading made (it lives as long as doit: later collections skip it)."""
    from .kinds import KINDS  # not for a listing the shortcut answers: it prints and ends before this

    kinds = [kind for kind in KINDS if getattr(source, "wants", lambda _: True)(kind.name)]
    pending = {kind.name for kind in kinds}
    if not kinds:  # nothing to make (the no-op stamp holds): collect as usual from here
        gc.enable()

    from .announce import announcing

    config = source.doit_config()
    announced = getattr(source, "announced_by_workers", lambda _: False)(config)

    def generator(kind: TaskKind) -> Callable[[], Iterator[dict[str, Any]]]:
        def task() -> Iterator[dict[str, Any]]:  # a generator, as doit requires of a task_ function
            yield from (map(announcing, kind.tasks(source)) if announced else kind.tasks(source))
            pending.discard(kind.name)
            if not pending and not gc.isenabled():
                gc.enable()
                gc.freeze()

        return task

    return {"DOIT_CONFIG": config, **{f"task_{kind.name}": generator(kind) for kind in kinds}}


def task_loader(manifest: Path, invocation: Invocation, early: Candidate | None = None) -> Any:
    """doit's loader (API 2) for the `epbuild` command: this run's command line handed over, not read from the
    process's arguments."""
    from doit import loader
    from doit.cmd_base import TaskLoader2

    class EpbuildLoader(TaskLoader2):
        def load_doit_config(self) -> dict[str, Any]:
            self.namespace = namespace(load(manifest, invocation, early))
            return self.namespace["DOIT_CONFIG"]

        def load_tasks(self, cmd: Any, pos_args: list[str]) -> list[Any]:
            return loader.load_tasks(self.namespace, self.cmd_names, allow_delayed=cmd.execute_tasks,
                                     args=pos_args, config=self.config, task_opts=self.task_opts)

    return EpbuildLoader()
