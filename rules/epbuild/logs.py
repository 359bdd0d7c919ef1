"""epbuild's diagnostics: `logging` under the `epbuild` logger, silent unless EPBUILD_LOG names a level (debug,
info, warning, error); then to stderr, in the build process and in every job process (whose stderr is the job's
log file under artifacts/.logs/). The console lines a user reads are not logging: they are the doit layer's."""

from __future__ import annotations

import logging
import os
import sys

LEVELS = ("debug", "info", "warning", "error")
VARIABLE = "EPBUILD_LOG"


def configure() -> None:
    """Send the `epbuild` logger to stderr at EPBUILD_LOG's level; nothing when unset (idempotent)."""
    level = os.environ.get(VARIABLE, "").strip().lower()
    logger = logging.getLogger("epbuild")
    if level not in LEVELS or any(getattr(h, "epbuild", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("epbuild %(levelname)s %(name)s: %(message)s"))
    handler.epbuild = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level.upper())
