"""The artifacts folder: every path under `artifacts/` is spelled here, and the small file helpers every writer
shares (atomic writes, a file's identity).

    artifacts/<target>/<model>/           a published artifact (one compile)
    artifacts/<target>/groups/<group>/    a published shared-context group
    artifacts/build-report.json           what the last runs did, one line per task
    artifacts/report.html, junit.xml      the same for people (one page) and CI systems (validations as tests)
    artifacts/.stages/<model>/<stage>/    stage outputs (shape, optimize, quantize, squash, freeze)
    artifacts/.logs/<target>/             child and tool output, one file per task
    artifacts/.scratch/                   private work folders, renamed into place or deleted
    artifacts/.state/                     host probe, hash memory, external-data index, operator checks,
                                          the settings each task last succeeded with, the no-op stamp, the last
                                          run's record, the reports' remembered parts, the last plan
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, cast

from ..records import record

GROUPS = "groups"  # artifacts/<target>/groups/ holds shared-context groups: no model may be named so
PACKAGES = "packages"  # artifacts/packages/ holds model packages: no target may be named so
STAGES = ".stages"
RECORD = ".epbuild-entry.json"  # in a cache entry: every file's sha256; an entry without one is incomplete


@record
class Layout:
    """Paths inside one project's artifacts folder."""

    root: Path

    @property
    def state(self) -> Path:
        return self.root / ".state"

    @property
    def scratch_root(self) -> Path:
        return self.root / ".scratch"

    @property
    def build_report(self) -> Path:
        return self.root / "build-report.json"

    @property
    def html_report(self) -> Path:
        return self.root / "report.html"

    @property
    def junit_report(self) -> Path:
        return self.root / "junit.xml"

    def build_dir(self, target: str, name: str, shared: bool) -> Path:
        """A published compile (`shared`: a shared-context group)."""
        return self.root / target / GROUPS / name if shared else self.root / target / name

    def package_dir(self, name: str) -> Path:
        """A published model package (`[packages.NAME]`)."""
        return self.root / PACKAGES / name

    def repro_dir(self, build: str) -> Path:
        """`epbuild reduce`'s repro folder of a build (MODEL@TARGET)."""
        return self.root / "repro" / build

    def stage_output(self, model: str, folder: str) -> Path:
        return self.root / STAGES / model / folder / f"{model}.onnx"

    @property
    def logs(self) -> Path:
        return self.root / ".logs"

    def log(self, folder: str, stem: str) -> Path:
        """A task's log: `folder` is the target (or `.stages`), `stem` says the task (`tinycnn.compile`)."""
        return self.logs / folder / f"{stem}.log"

    def scratch(self, label: str) -> Path:
        return self.scratch_root / label


# The kernel stamps ctime from its coarse clock, which ticks every few milliseconds: a file changed within the
# current tick can change again under the same identity, so its identity is not remembered yet (git's "racily
# clean" files). Where there is no coarse clock to read, a margin of several ticks stands in.
COARSE_CLOCK = 5 if sys.platform.startswith("linux") else None  # CLOCK_REALTIME_COARSE (Python names it not)
RACY_NS = 50_000_000


def stat_key(stat: os.stat_result) -> list[int]:
    """A file's identity without reading it: size, mtime, ctime and inode. Equal keys mean unchanged bytes: an
    in-place rewrite that restores size and mtime (`touch -r`, `cp -p`, `rsync -t`) still moves ctime, which no
    user call can set."""
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def file_identity(path: str) -> list[int] | None:
    """A file's identity (`stat_key`), None when it does not exist."""
    try:
        return stat_key(os.stat(path))
    except (OSError, ValueError):  # ValueError: a NUL in a path a record named
        return None


def now_ns() -> int:
    """The clock the kernel stamps ctime with (its coarse tick), or a margin behind the fine one: a file whose
    ctime is below it was last changed before now."""
    if COARSE_CLOCK is not None:
        return time.clock_gettime_ns(COARSE_CLOCK)
    return time.time_ns() - RACY_NS


def settled(stat: os.stat_result) -> bool:
    """Whether the file's identity can be remembered: the clock that stamps changes has moved past its last
    change, so any later change gets another ctime."""
    return now_ns() > stat.st_ctime_ns


def size_of(path: Path) -> int:
    """Bytes a file, or every file under a folder, holds."""
    if not path.is_dir():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file())


def write_atomic(path: Path, data: str | bytes | list[str] | list[bytes]) -> None:
    """Write beside `path` under a private name and rename: readers see the old file or the new one, whole.
    The folder must exist: a writer never creates a folder that looks like an artifact. A list is written piece
    by piece (a page of 10,000 parts is never joined into one string); text as UTF-8."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pieces: list[str] | list[bytes] = [data] if isinstance(data, str) else [data] if isinstance(data, bytes) else data
    try:
        if pieces and isinstance(pieces[0], bytes):
            with open(temporary, "wb") as handle:
                handle.writelines(pieces)
        else:
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.writelines(cast("list[str]", pieces))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    """JSON written atomically, keys sorted so equal data gives equal bytes."""
    write_atomic(path, json.dumps(data, indent=indent, sort_keys=True) + "\n")
