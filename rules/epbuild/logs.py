"""epbuild's diagnostics: `logging` under the `epbuild` logger, silent unless EPBUILD_LOG names a level (debug,
info, warning, error); then to stderr, in the build process and in every job process (whose stderr is the job's
log file under artifacts/.logs/). Unset, nothing imports `logging` on its behalf: the build process, the fork
servers and their jobs stay as they were (no at-fork hooks, no import cost). The console lines a user reads are
not logging: they are the doit layer's, and the warnings below it go through `warn`, the one place where a part
below the doit layer writes to the console."""

from __future__ import annotations

import os
import sys
from pathlib import Path
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


def warn_once(marker: Path | None, text: str) -> bool:
    """`warn`, once per build: the first of its processes (doit's `-n` workers) to create `marker` says it, the
    others only log it; True where this one said it. None: said here, no marker."""
    if marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            log("epbuild", "debug", "said by another process of this build: %s", text)
            return False
        except OSError:  # nowhere to mark it: said here
            pass
    warn(text)
    return True


def say(text: str) -> None:
    """One console line for the user, written whole in one call: doit's `-n` workers share this stdout (a pipe in
    CI), and `print` writes the text and its newline apart, so another worker's line could land between them."""
    from .errors import printable

    sys.stdout.write(f"{printable(text)}\n")
    sys.stdout.flush()


def warn(text: str) -> None:
    """A warning the user must see whatever EPBUILD_LOG says (a cache entry refused, the remote cache down): one
    `warning: ...` line on stderr (the debug log notes it too, in order with the rest)."""
    from .errors import printable

    sys.stderr.write(f"warning: {printable(text)}\n")
    sys.stderr.flush()
    log("epbuild", "debug", "warned: %s", text)
