"""`artifacts/build-report.json` and the summary line: what every task did in the runs so far.

One entry per task (status, fingerprint, files with sha256, seconds, child usage, node placement, reason), kept
across runs while the manifest declares the task: a no-op run marks entries up to date instead of forgetting them.
Written atomically, one line per task so that diffs between CI runs stay readable.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from .. import RULES_FORMAT
from ..errors import plain
from ..fast_path import file_identity
from ..store.layout import write_atomic


def usage_text(usage: dict[str, float] | None) -> str:
    return f", peak {usage['peak_mb']:.0f} MB" if usage else ""


def _quoted(name: str) -> str:
    """`json.dumps(name)`, without encoding plain task names (20,000 encodings took 0.03 s)."""
    plain = name.isascii() and name.isprintable() and '"' not in name and "\\" not in name
    return f'"{name}"' if plain else json.dumps(name)


def _layout(texts: dict[str, str]) -> str:
    lines = ",\n".join(f"  {_quoted(name)}: {texts[name]}" for name in sorted(texts))
    return f'{{"format": {RULES_FORMAT}, "tasks": {{\n{lines}\n}}}}\n'


def _texts(text: str, names: Any) -> dict[str, str]:
    """Each entry's JSON text as the file has it (one line per task, `  "name": {...},`): entries a run did not
    change are written, and keyed by the report's views, without encoding them again (0.4 s at 10,000 tasks).
    A file not exactly in that layout (edited by hand, another format) gives none: every entry is encoded again.
    `names`: the entries' names in the file's order."""
    lines = text.split("\n")[1:-2]
    texts = {name: line[len(_quoted(name)) + 4:].removesuffix(",") for name, line in zip(names, lines, strict=False)}
    return texts if len(texts) == len(lines) and _layout(texts) == text else {}


class BuildReport:
    """The report's entries, read from the last run and updated task by task."""

    def __init__(self, path: Path):
        self.path = path
        self.modified: set[str] = set()  # the tasks whose entries this run changed
        try:
            before = file_identity(str(path))
            self.text = path.read_text()
            # the identity of the file read: None when it was replaced while it was read
            self.read_as = before if file_identity(str(path)) == before else None
            self.entries: dict[str, dict[str, Any]] = json.loads(self.text)["tasks"]
            self.texts = _texts(self.text, self.entries)  # name -> its entry's JSON, while unchanged
        except (OSError, ValueError, KeyError):
            self.read_as, self.text, self.entries, self.texts = None, None, {}, {}

    def _set(self, task: str, entry: dict[str, Any]) -> None:
        if self.entries.get(task) != entry:
            self.entries[task] = entry
            self.texts.pop(task, None)
            self.modified.add(task)

    def entry_text(self, task: str) -> str:
        """The entry's JSON text, as written ('null' for none)."""
        text = self.texts.get(task)
        if text is None:
            text = self.texts[task] = json.dumps(self.entries.get(task))
        return text

    def succeeded(self, task: str, values: dict[str, Any]) -> None:
        self._set(task, {k: v for k, v in values.items() if not k.startswith("_")})

    def failed(self, task: str, reason: str, seconds: float) -> None:
        self._set(task, {"status": "failed", "reason": plain(reason), "seconds": round(seconds, 3)})

    def not_built(self, task: str, reason: str) -> None:
        """Not run because a task it needs failed (`reason` names it)."""
        self._set(task, {"status": "not built", "reason": reason})

    def up_to_date(self, task: str) -> None:
        entry = self.entries.get(task)
        if entry is None or entry.get("status") != "up-to-date":  # 20,000 unchanged entries are not copied
            self._set(task, {**(entry or {}), "status": "up-to-date"})

    def skipped(self, task: str, reason: str) -> None:
        self._set(task, {"status": "skipped", "reason": reason})

    def keep_only(self, tasks: set[str]) -> None:
        """Forget the tasks the manifest no longer declares: the reports describe the current manifest."""
        self.entries = {name: entry for name, entry in self.entries.items() if name in tasks}

    def write(self) -> bool:
        """Write the report; False when it already said exactly this (the pages made from it are current)."""
        text = _layout({name: self.entry_text(name) for name in self.entries})
        if text == self.text:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, text)
        self.text = text
        return True

    def summary(self, seen: set[str], ran: set[str], stages: set[str] = frozenset()) -> str | None:
        """Counts by status over the tasks this run saw (a stage that ran counts as "staged", so "compiled" counts
        compiles), and the three slowest it ran; None when it saw none."""
        counts = Counter("staged" if name in stages and entry["status"] == "compiled" else entry["status"]
                         for name, entry in self.entries.items() if name in seen)
        if not counts:
            return None
        slowest = sorted((e["seconds"], n) for n, e in self.entries.items()
                         if n in ran and e.get("seconds") and e["status"] != "skipped")[::-1][:3]
        text = ", ".join(f"{name} {seconds:.1f} s{usage_text(self.entries[name].get('child'))}"
                         for seconds, name in slowest)
        return (f"summary: {', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}"
                f"{f'; slowest: {text}' if text else ''}{self._remote(ran)}")

    def _remote(self, ran: set[str]) -> str:
        """'; remote cache: 3 hits, 1.2 MB down, 0.4 MB up' over the tasks this run ran, '' when none used it."""
        entries = [self.entries[name] for name in ran if name in self.entries]
        hits = sum(entry.get("from") == "remote" for entry in entries)
        down = sum(entry.get("remote_bytes", {}).get("down", 0) for entry in entries)
        up = sum(entry.get("remote_bytes", {}).get("up", 0) for entry in entries)
        if not (hits or down or up):
            return ""
        return f"; remote cache: {hits} hit{'s' * (hits != 1)}, {down / 1e6:.1f} MB down, {up / 1e6:.1f} MB up"
