"""The one exception type for mistakes a user can fix, and how it reads."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MESSAGE_LIMIT = 500  # a user error is one line: whatever value it quotes, it stays readable
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # terminal colour and cursor codes some EP libraries log with


# every control character but newline and tab (C0, DEL, C1), and the bidirectional overrides that reorder a line
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
LINE_BREAKS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def plain(text: str) -> str:
    """Text without terminal control codes: what messages, logs and reports keep."""
    return ANSI.sub("", text)


def printable(text: str, one_line: bool = False) -> str:
    """Text that came from a file (an artifact.json, a model's names, an EP's output), as the console may show it:
    each control character escaped as Python writes it (`\\x1b`), never sent to the terminal, where it could clear
    the screen or forge a line; newlines and tabs kept, unless the text is `one_line` (a line whose words came from a
    file: a newline there would start a line of the file's own)."""
    pattern = LINE_BREAKS if one_line else CONTROL
    return pattern.sub(lambda found: repr(found.group())[1:-1], text) if pattern.search(text) else text


def json_value(text: str | bytes) -> Any:
    """`json.loads` for text read from a file (a record, a report, an artifact.json): a nesting too deep for the
    decoder (its RecursionError) is malformed JSON like any other, a ValueError that readers already take as a miss
    or one line, never a traceback that ends every later run."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deep to be a record") from None


class UserError(Exception):
    """A problem in the manifest, a model or an input file, named by file and key path.

    Printed as one line without a traceback: `models.toml: targets.qnn-htp.options.soc_modle: unknown option ...`.
    """

    def __init__(self, file: str | Path | None, key_path: str | None, message: str):
        self.file = str(file) if file is not None else None
        self.key_path = key_path
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = [part for part in (self.file, self.key_path) if part]
        text = printable(": ".join([*where, self.message]).replace("\r", "\\r").replace("\n", "\\n"))
        return text if len(text) <= MESSAGE_LIMIT else f"{text[:MESSAGE_LIMIT - 1]}…"


class BuildError(Exception):
    """A compile or validation that ran and failed (EP error, crash, timeout); the message says why."""


class ModelCausedError(BuildError):
    """A job that failed for a cause the model's file or its settings show (its opset below what the EP takes, a
    zero-size input, a manifest key): no EP bug, so no reduction to a repro is suggested."""


def closest(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean X?)' hint, or '' when nothing is close."""
    import difflib  # only for a user's mistake: not loaded by every run

    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


class ModelError(Exception):
    """Raised inside a child when the model or its settings cannot be processed; the message is already a
    sentence for the user (what is wrong and what to do), reported without an "internal error" label.

    `key` is the manifest key the problem is about, relative to the model's entry (`inputs.x`); `located` puts
    the file and the entry in front, so the user reads `models.toml: models.m.inputs.x: ...`."""

    def __init__(self, message: str, key: str | None = None, file: str | None = None, in_model: bool = False):
        self.message, self.key, self.file = message, key, file
        self.in_model = in_model or key is not None  # the model's file or its settings are the cause, not an EP bug
        super().__init__(": ".join(part for part in (file, key, message) if part))


@contextmanager
def located(file: str | None, entry: str | None) -> Iterator[None]:
    """Re-raise a ModelError about a manifest key with the manifest file and the model's entry in its key path."""
    try:
        yield
    except ModelError as exc:
        if exc.key and exc.file is None and file and entry:
            raise ModelError(exc.message, f"{entry}.{exc.key}", file, exc.in_model) from None
        raise
