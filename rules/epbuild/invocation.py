"""doit's command line, read once per run (from the process's arguments by `epbuild.dodo`, or as the `epbuild`
command hands it over) into one record that is handed to everything that asks what this run is: the shortcuts
(`fast_path`), the project's loading (`tasks`) and the task-name check. Standard library only: it is read before
anything heavy is imported."""

from __future__ import annotations

import os
from pathlib import Path

from .records import record

# options of a default run that cannot change which tasks run or how they are checked: name -> takes a value
RUN_OPTIONS = {"-n": 1, "--process": 1, "-P": 1, "--parallel-type": 1, "--continue": 0, "-c": 0}
DOIT_COMMANDS = {"run", "list", "info", "clean", "forget", "ignore", "strace", "reset-dep"}  # those taking tasks
VALUE_OPTIONS = {"-n", "--process", "-P", "--parallel-type", "-f", "--file", "-d", "--dir", "--db-file",
                 "--backend", "--check_file_uptodate", "--reporter", "-v", "--verbosity", "-o", "--output-file",
                 "--model", "--codec-cls", "--template", "--status", "-s"}
# doit commands, and epbuild tasks named first, that build nothing
INSPECTING = {"list", "info", "help", "clean", "forget", "ignore", "dumpdb", "strace", "tabcompletion", "reset-dep",
              "backends", "cache", "unavailable", "graph", "prune"}


@record
class Invocation:
    """doit's arguments (without the program name), and what they say."""

    argv: tuple[str, ...]

    @classmethod
    def of(cls, argv: list[str] | tuple[str, ...]) -> Invocation:
        return cls(tuple(argv))

    @property
    def first(self) -> str | None:
        """The first word: doit's command, a task name or an option (None: plain `doit`)."""
        return self.argv[0] if self.argv else None

    @property
    def inspecting(self) -> bool:
        """A command (or epbuild task) that builds nothing: listing, inspecting, cleaning."""
        return self.first in INSPECTING

    @property
    def listing(self) -> bool:
        """A plain `doit list`, whose output a shortcut may give."""
        return self.argv == ("list",)

    @property
    def default_run(self) -> bool:
        """`doit` with no task names and only options that cannot change which tasks run or how they are
        checked."""
        at = 0
        while at < len(self.argv):
            word = self.argv[at]
            name, _, attached = word.partition("=")
            if name in RUN_OPTIONS:
                at += 1 if attached or not RUN_OPTIONS[name] else 2
            elif (word.startswith("-n") and word[2:].isdigit()) or (word.startswith("-P") and len(word) > 2):
                at += 1
            else:
                return False
        return True

    @property
    def threads(self) -> bool:
        """Whether doit runs tasks in threads (`-P thread` / `--parallel-type thread`)."""
        for at, word in enumerate(self.argv):
            if word in ("-P", "--parallel-type") and self.argv[at + 1:at + 2] == ("thread",):
                return True
            if word in ("-Pthread", "--parallel-type=thread"):
                return True
        return False

    @property
    def processes(self) -> int | None:
        """doit's `-n N` / `--process N` (None: not given, the configured number holds)."""
        found = None
        for at, word in enumerate(self.argv):
            name, equals, attached = word.partition("=")
            value = attached if equals else (word[2:] if word.startswith("-n") and len(word) > 2 else
                                             self.argv[at + 1] if word in ("-n", "--process") and at + 1 < len(
                                                 self.argv) else None)
            if (name in ("-n", "--process") or word.startswith("-n")) and value is not None and value.isdigit():
                found = int(value)
        return found

    @property
    def tasks(self) -> list[str]:
        """The task names (after doit's command, if any), without options and their values."""
        words = list(self.argv)
        if words and words[0] in ("help", "dumpdb", "tabcompletion"):
            return []
        if words and words[0] in DOIT_COMMANDS:
            words = words[1:]
        names, skip = [], False
        for word in words:
            if skip:
                skip = False
            elif word.startswith("-"):
                skip = word in VALUE_OPTIONS
            elif "=" not in word:
                names.append(word)
        return names


def manifest_path() -> Path:
    """The manifest of the project in doit's working folder: models.toml, or EPBUILD_MANIFEST (relative to it)."""
    return Path.cwd() / (os.environ.get("EPBUILD_MANIFEST") or "models.toml")
