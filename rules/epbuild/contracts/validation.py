"""`validation.json`, the verdict beside every validated artifact: what was judged (`status`, a `Verdict`), why it
did not pass, the thresholds, and the figures (each output's metrics, a group's members, a pipeline's steps, each
SoC of a fleet). Written only through `ValidationRecord.to_json` and read only through `read_validation` (or
`from_json`): a file whose status is not one of the five verdicts, or of another format, is refused
(`ValidationFormatError`), never taken for a pass.

The envelope a reader decides on is typed; the figures, which only reports show, are kept as they were written
(`figures`), so a report of this version's shape round-trips exactly."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import json_value
from ..version import RULES_FORMAT
from .statuses import Verdict

NAME = "validation.json"
# the keys read into typed fields; every other key is a figure
ENVELOPE = ("status", "format", "reason", "target", "thresholds", "structural", "summary")


class ValidationFormatError(ValueError):
    """A validation.json this version of epbuild does not read: another format, or no verdict it knows."""


@dataclasses.dataclass(frozen=True)
class ValidationRecord:
    status: Verdict
    format: int = RULES_FORMAT
    reason: str | None = None  # why it did not pass (a failure, a skip, an inconclusive output)
    target: str | None = None  # added where it is published (the target's name is not in the fingerprint)
    thresholds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    structural: Verdict | None = None  # a group this host cannot load: its structural checks' verdict
    summary: str | None = None  # a passed pipeline's figures in one line
    figures: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # every other key, as written
    keys: tuple[str, ...] = ()  # the envelope's keys the file holds (read); empty: those set (made here)

    @property
    def passed(self) -> bool:
        """Only a run whose thresholds were met: structural, skipped and inconclusive are never passed."""
        return self.status is Verdict.PASSED

    def to_json(self) -> dict[str, Any]:
        """The JSON object (written with sorted keys by `files.layout.write_json`): a record read writes back the
        very keys it was read from."""
        values = {"status": self.status.value, "format": self.format, "reason": self.reason, "target": self.target,
                  "thresholds": dict(self.thresholds), "structural": self.structural.value if self.structural else None,
                  "summary": self.summary}
        keys = self.keys or tuple(key for key in ENVELOPE if key in ("status", "format") or values[key])
        return {**self.figures, **{key: values[key] for key in keys}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ValidationRecord:
        if not isinstance(data, Mapping):
            raise ValidationFormatError(f"not a JSON object: {type(data).__name__}")
        found = data.get("format", RULES_FORMAT)
        if found != RULES_FORMAT:
            raise ValidationFormatError(f"format {found!r}, this epbuild reads format {RULES_FORMAT}: validate again")
        return cls(status=_verdict(data.get("status"), "status"), format=found, reason=_text(data, "reason"),
                   target=_text(data, "target"), thresholds=dict(data.get("thresholds") or {}),
                   structural=_verdict(data["structural"], "structural") if data.get("structural") else None,
                   summary=_text(data, "summary"),
                   figures={key: value for key, value in data.items() if key not in ENVELOPE},
                   keys=tuple(key for key in ENVELOPE if key in data))

    def replace(self, **changes: Any) -> ValidationRecord:
        """With `changes`; an envelope key set here is written (`to_json`)."""
        keys = tuple(dict.fromkeys([*self.keys, *(k for k in ENVELOPE if k in changes)])) if self.keys else ()
        return dataclasses.replace(self, **changes, keys=keys)


def _verdict(word: Any, key: str) -> Verdict:
    try:
        return Verdict(word)
    except ValueError:
        raise ValidationFormatError(f"{key} {word!r} is none of {', '.join(v.value for v in Verdict)}") from None


def _text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return None if value is None else str(value)


def read_validation(folder: Path) -> ValidationRecord:
    """The verdict beside a validated artifact; OSError when absent, ValueError when unreadable or not this
    format (`ValidationFormatError`)."""
    return load_validation(folder / NAME)


def load_validation(path: Path) -> ValidationRecord:
    """A verdict from the file at `path` (as `read_validation`)."""
    return ValidationRecord.from_json(json_value(path.read_text(encoding="utf-8")))
