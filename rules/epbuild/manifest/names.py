"""What a model, target, group or package may be named: its name becomes path parts and task names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import UserError


def shown(value: Any, limit: int = 80) -> str:
    """A value as an error message quotes it: repr (newlines escaped), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 5]}… ({len(text)} characters)"


NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
NAME_LIMIT = 64  # model, target and group names become parts of file names (<model>.<target>.compile.log ...)
REPORT_NAMES = ("report.html", "build-report.json", "junit.xml", "graph.dot", "graph.svg")  # beside the folders


def check_name(file: Path, path: str, name: str) -> None:
    """Names become path parts and task names: letters, digits, '-', '_', '.'; no leading '.'; short enough
    for every path built from them; not the name of a report beside the artifact folders."""
    if not NAME_PATTERN.match(name):
        raise UserError(file.name, path, f"invalid name {shown(name)}: use letters, digits, '-', '_' and '.' only, "
                        "not starting with '.'")
    if len(name) > NAME_LIMIT:
        raise UserError(file.name, path, f"name of {len(name)} characters: at most {NAME_LIMIT} (it becomes part of "
                        "file and folder names)")
    if name in REPORT_NAMES or (name.startswith("graph-") and name.endswith((".dot", ".svg"))):
        raise UserError(file.name, path, f"'{name}' is the name of a report in artifacts/; choose another name")
