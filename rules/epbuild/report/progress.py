"""Live progress on a terminal: done/total per kind of task, the running tasks with their elapsed time, and an ETA
from how long each task took when it last ran (the build report's `seconds`).

Drawn with `rich` by the build reporter in doit's main process, so it works with `-n N` in both `-P process` and
`-P thread`. On anything but a terminal (CI logs, pipes) nothing here runs and the output stays plain lines.
`EPBUILD_PROGRESS=live|plain` overrides the choice.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import IO, Any

from ..errors import UserError

MODE_VARIABLE = "EPBUILD_PROGRESS"
STAGE_KINDS = frozenset({"freeze", "shape", "fold", "optimize", "quantize", "squash"})
KIND_ORDER = ("stage", "ops", "compile", "group", "validate", "package")
# statuses of work actually done, for durations
SUCCESS = ("compiled", "restored", "validated", "packaged", "skipped", "inconclusive", "structural")


def live_wanted(stream: IO[str]) -> bool:
    """Live progress on a terminal unless EPBUILD_PROGRESS says otherwise."""
    mode = os.environ.get(MODE_VARIABLE, "auto")
    if mode not in ("auto", "live", "plain"):
        raise UserError(MODE_VARIABLE, None, f"must be live, plain or auto, found {mode!r}")
    if mode != "auto":
        return mode == "live"
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def kind_of(task: str) -> str:
    basename = task.split(":", 1)[0]
    return "stage" if basename in STAGE_KINDS else basename


def durations(entries: Mapping[str, Any], tasks: list[str]) -> dict[str, float]:
    """How long each of `tasks` took when it last did its work, as the build report's entries hold it (read only
    for the live status area, so only on a terminal, and only the entries of this run's tasks)."""
    known = {}
    for task in tasks:
        entry = entries.get(task)
        if isinstance(entry, dict) and entry.get("status") in SUCCESS and isinstance(entry.get("seconds"),
                                                                                   (int, float)):
            known[task] = float(entry["seconds"])
    return known


def memory_line() -> str:
    """`3 running, 2 waiting for memory` while jobs wait for memory admission (this user's builds on this host share
    the budget: `execute.memory_ledger`), else ""."""
    from ..execute.memory_ledger import snapshot

    try:
        now = snapshot()
    except OSError:
        return ""
    return f"{len(now['running'])} running, {len(now['waiting'])} waiting for memory" if now["waiting"] else ""


def clock(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class LiveProgress:
    """The status area under the scrolling task lines. Thread-safe: with `-P thread` doit reports from threads."""

    def __init__(self, stream: IO[str], tasks: list[str], durations: dict[str, float], catch_prints: bool = False):
        """`catch_prints`: route this process's sys.stdout above the area (tasks running in threads print)."""
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.pending = set(tasks)
        self.totals = Counter(kind_of(t) for t in tasks)
        self.done: Counter[str] = Counter()
        self.failed = 0
        self.running: dict[str, float] = {}
        self.parallel = 1  # the most tasks seen running at once: doit's -n, as far as this run shows
        self.durations = durations
        self.lock = threading.Lock()
        self.live = Live(console=self.console, get_renderable=self.render, refresh_per_second=4, transient=True,
                         redirect_stdout=False, redirect_stderr=False)
        self.live.start()
        self.saved_stdout = None
        if catch_prints:
            self.saved_stdout, sys.stdout = sys.stdout, _LineWriter(self)

    def started(self, task: str) -> None:
        with self.lock:
            self.running[task] = time.monotonic()
            self.parallel = max(self.parallel, len(self.running))

    def finished(self, task: str, failed: bool = False) -> None:
        with self.lock:
            self.running.pop(task, None)
            if task in self.pending:
                self.pending.discard(task)
                self.done[kind_of(task)] += 1
                self.failed += failed

    def print(self, text: str) -> None:
        """A line (or several) above the status area."""
        if text:
            self.console.print(text, end="" if text.endswith("\n") else "\n", markup=False, highlight=False)

    def stop(self) -> None:
        if self.saved_stdout is not None:
            sys.stdout = self.saved_stdout
        self.live.stop()

    def eta(self) -> float | None:
        """Seconds left: remaining tasks at their last durations (unknown ones at their kind's mean), running
        ones less their elapsed time, spread over the tasks seen running at once; None with nothing to go on."""
        known = list(self.durations.values())
        if not known:
            return None
        means = {kind: sum(v) / len(v) for kind in self.totals
                 if (v := [d for t, d in self.durations.items() if kind_of(t) == kind])}
        fallback = sum(known) / len(known)
        now = time.monotonic()
        left = 0.0
        for task in self.pending:
            estimate = self.durations.get(task, means.get(kind_of(task), fallback))
            left += max(0.0, estimate - (now - self.running[task])) if task in self.running else estimate
        return left / self.parallel

    def render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        with self.lock:
            now = time.monotonic()
            order = {kind: place for place, kind in enumerate(KIND_ORDER)}
            counts = "  ".join(f"{kind} {self.done[kind]}/{self.totals[kind]}"
                               for kind in sorted(self.totals, key=lambda k: (order.get(k, len(order)), k)))
            eta = self.eta()
            header = Text(f"{sum(self.done.values())}/{sum(self.totals.values())} done  {counts}", style="bold")
            if self.failed:
                header.append(f"  {self.failed} failed", style="bold red")
            header.append(f"  ETA {clock(eta)}" if eta is not None else "  ETA: no earlier build to go on",
                          style="cyan")
            waiting = memory_line()
            if waiting:
                header.append(f"  {waiting}", style="yellow")
            lines = [Text(f"  {clock(now - start)}  {task}") for task, start in
                     sorted(self.running.items(), key=lambda item: item[1])]
        return Group(header, *lines)


class _LineWriter(io.TextIOBase):
    """sys.stdout while tasks print from threads: each thread's lines, whole, above the status area."""

    def __init__(self, progress: LiveProgress):
        self.progress = progress
        self.local = threading.local()

    def write(self, text: str) -> int:
        *lines, self.local.rest = (getattr(self.local, "rest", "") + text).split("\n")
        for line in lines:
            self.progress.print(line + "\n")
        return len(text)

    def isatty(self) -> bool:
        return False
