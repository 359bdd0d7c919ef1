"""`artifacts/build-report.json` and the summary line: what every task did in the runs so far.

One entry per task (status, fingerprint, files with sha256, seconds, child usage, node placement, reason), kept
across runs while the manifest declares the task: a no-op run marks entries up to date instead of forgetting them.
Written atomically, one line per task so that diffs between CI runs stay readable.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from ..contracts.statuses import TaskStatus
from ..errors import json_value, plain
from ..files.entry_lines import LazyEntries, entry_lines, plain_texts, quoted, vouch, vouched
from ..files.layout import file_identity, write_atomic
from ..state.folder import StateFolder
from ..version import RULES_FORMAT


def usage_text(usage: dict[str, float] | None) -> str:
    return f", peak {usage['peak_mb']:.0f} MB" if usage else ""


def _layout(texts: dict[str, str]) -> str:
    return f'{{"format": {RULES_FORMAT}, "tasks": {{\n{entry_lines(texts)}\n}}}}\n'


def _texts(text: str, names: Any) -> dict[str, str]:
    """Each entry's JSON text as the file has it (one line per task, `  "name": {...},`): entries a run did not change
    are written, and keyed by the report's views, without encoding them again (encoding every entry showed at many
    tasks). A file not exactly in that layout (edited by hand, another format) gives none: every entry is encoded again.
    `names`: the entries' names in the file's order."""
    lines = text.split("\n")[1:-2]
    texts = {name: line[len(quoted(name)) + 4:].removesuffix(",") for name, line in zip(names, lines, strict=False)}
    return texts if len(texts) == len(lines) and _layout(texts) == text else {}


STATUS = '{"status": "'


def _status_of(entry: Any) -> str | None:
    """An entry's status: read from its JSON text where that starts with it (every entry this module writes does),
    else from the decoded entry (None: it has none)."""
    if isinstance(entry, str):
        if entry.startswith(STATUS):
            status = entry[len(STATUS):entry.find('"', len(STATUS))]
            if "\\" not in status:
                return status
        entry = json_value(entry)
    return entry.get("status") if isinstance(entry, dict) else None


class Entries(LazyEntries):
    """The report's entries (`files.entry_lines.LazyEntries`), with each one's status read once: a run reads the
    status of every entry but the whole of only the few it changes."""

    def __init__(self, texts: dict[str, str] | None = None, decoded: dict[str, Any] | None = None):
        super().__init__(texts, decoded)
        self._statuses = {name: _status_of(entry) for name, entry in self._items.items()}

    def __setitem__(self, name: str, entry: Any) -> None:
        super().__setitem__(name, entry)
        self._statuses[name] = _status_of(entry)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        del self._statuses[name]

    def status(self, name: str, missing: str = "?") -> str:
        """The entry's status (`missing` when it has none)."""
        found = self._statuses[name]
        return missing if found is None else found


def named_statuses(entries: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(task, status) of every entry ("?" for none), of an `Entries` without decoding them."""
    if isinstance(entries, Entries):
        return ((name, "?" if status is None else status) for name, status in entries._statuses.items())
    return ((name, entry.get("status", "?")) for name, entry in entries.items())


NOT_ATTEMPTED = "not attempted: the build stopped at the first failure (`--continue` builds the rest)"


class BuildReport:
    """The report's entries, read from the last run and updated task by task.

    With `state` (the project's state folder), each write also leaves the sha256 of the text written there
    (`build-report.sha256`): a report read whose text has that digest is exactly what a run wrote, every line an
    entry json.dumps made, so its entries are decoded only when asked for (`Entries`). Any other text (edited, torn,
    another format) is decoded whole first, as it always was."""

    def __init__(self, path: Path, state: Path | None = None):
        self.path = path
        self.digest_path = StateFolder(state).path("build-report.sha256") if state is not None else None
        self.modified: set[str] = set()  # the tasks whose entries this run changed
        self.text: str | None = None  # as read; None: nothing readable
        try:
            before = file_identity(str(path))
            self.text = path.read_text()
            # the identity of the file read: None when it was replaced while it was read
            self.read_as = before if file_identity(str(path)) == before else None
            texts = plain_texts(self.text) if vouched(self.digest_path, self.text) else None
            self.vouched = texts is not None  # by the digest
            if texts is not None:  # name -> its entry's JSON, while unchanged
                self.entries, self.texts = Entries(texts), texts
            else:
                decoded = json_value(self.text)["tasks"]
                self.entries, self.texts = Entries(decoded=decoded), _texts(self.text, decoded)
        except (OSError, ValueError, KeyError, TypeError):
            self.read_as, self.text, self.entries, self.texts, self.vouched = None, None, Entries(), {}, False

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
        self._set(task, {"status": TaskStatus.FAILED, "reason": plain(reason), "seconds": round(seconds, 3)})

    def not_built(self, task: str, reason: str) -> None:
        """Not run because a task it needs failed (`reason` names it)."""
        self._set(task, {"status": TaskStatus.NOT_BUILT, "reason": reason})

    def interrupted(self, task: str) -> None:
        """Started and never finished: the run stopped under it, so it has no verdict (not an older one)."""
        self._set(task, {"status": TaskStatus.INTERRUPTED,
                         "reason": "the run stopped while it ran (Ctrl-C, a signal, a lost worker): no verdict; a "
                                   "rerun makes it"})

    def not_attempted(self, task: str) -> None:
        """Handed to doit, never reached: the build stopped at the first failure. Its last run's entry would claim
        a state this run never checked (up to date with code or inputs that have changed since): pending."""
        self._set(task, {"status": TaskStatus.PENDING, "reason": NOT_ATTEMPTED})

    def up_to_date(self, task: str) -> None:
        # 20,000 unchanged entries are not copied
        if task not in self.entries or self.entries.status(task, "") != TaskStatus.UP_TO_DATE:
            self._set(task, {**(self.entries.get(task) or {}), "status": TaskStatus.UP_TO_DATE})

    def skipped(self, task: str, reason: str) -> None:
        self._set(task, {"status": TaskStatus.SKIPPED, "reason": reason})

    def keep_only(self, tasks: set[str]) -> None:
        """Forget the tasks the manifest no longer declares: the reports describe the current manifest."""
        for name in [name for name in self.entries if name not in tasks]:
            del self.entries[name]

    def write(self) -> bool:
        """Write the report; False when it already said exactly this (the pages made from it are current)."""
        text = _layout({name: self.entry_text(name) for name in self.entries})
        if text == self.text:
            if not self.vouched:  # the text read, written by an epbuild that kept no digest
                self._vouch(text)
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, text)
        self._vouch(text)
        self.text = text
        return True

    def _vouch(self, text: str) -> None:
        """Leave the digest of `text`, which `_layout` made (so a text it vouches for needs no layout check)."""
        if self.digest_path is not None:
            vouch(self.digest_path, text)
            self.vouched = True

    def summary(self, seen: set[str], ran: set[str], stages: AbstractSet[str] = frozenset()) -> str | None:
        """Counts by status over the tasks this run saw (a stage that ran counts as "staged", so "compiled" counts
        compiles), and the three slowest it ran; None when it saw none."""
        counts = Counter("staged" if name in stages and status == "compiled" else status
                         for name in self.entries if name in seen and (status := self.entries.status(name)))
        if not counts:
            return None
        slowest = sorted((e["seconds"], n) for n in ran if n in self.entries and (e := self.entries[n]).get("seconds")
                         and e["status"] != TaskStatus.SKIPPED)[::-1][:3]
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
