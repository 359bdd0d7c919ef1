"""epbuild's diagnostics: `logging` under the `epbuild` logger, silent unless EPBUILD_LOG names a level (debug,
info, warning, error); then to stderr, in the build process and in every job process (whose stderr is the job's
log file under artifacts/.logs/). Unset, nothing imports `logging` on its behalf: the build process, the fork
servers and their jobs stay as they were (no at-fork hooks, no import cost). The console lines a user reads are
not logging: they are the doit layer's, and the warnings below it go through `warn`, the one place where a part
below the doit layer writes to the console."""

from __future__ import annotations

import os
import sys
from typing import Any

LEVELS = ("debug", "info", "warning", "error")
VARIABLE = "EPBUILD_LOG"


def _level() -> str | None:
    level = os.environ.get(VARIABLE, "").strip().lower()
    return level if level in LEVELS else None


def configure() -> None:
    """Send the `epbuild` logger to stderr at EPBUILD_LOG's level; nothing when unset (idempotent)."""
    level = _level()
    if level is None:
        return
    import logging
    import sys

    logger = logging.getLogger("epbuild")
    if any(getattr(h, "epbuild", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("epbuild %(levelname)s %(name)s: %(message)s"))
    handler.epbuild = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level.upper())


def log(name: str, level: str, message: str, *args: Any) -> None:
    """`logging.getLogger(name).<level>(message, *args)`, without importing logging when EPBUILD_LOG is unset."""
    if _level() is None:
        return
    import logging

    getattr(logging.getLogger(name), level)(message, *args)


def warn(text: str) -> None:
    """A warning the user must see whatever EPBUILD_LOG says (a cache entry refused, the remote cache down): one
    `warning: ...` line on stderr (the debug log notes it too, in order with the rest)."""
    sys.stderr.write(f"warning: {text}\n")
    sys.stderr.flush()
    log("epbuild", "debug", "warned: %s", text)
