"""doit's own database (`.doit.db.epbuild`, sqlite3), checked before doit opens it: one that sqlite cannot read
(overwritten, torn by a full disk, truncated) is set aside as `.doit.db.epbuild.corrupt` with one warning, as epbuild's
other state files are when unreadable, instead of doit's sqlite traceback on every run until someone deletes it. doit
then starts a new database and checks every task afresh: what the caches hold is restored, not rebuilt.

Only the header and the schema page are read (a few hundred bytes): a whole-file integrity check would cost
every run time that grows with the number of tasks.
"""

from __future__ import annotations

import os
from pathlib import Path

HEADER = b"SQLite format 3\x00"


def _unreadable(path: Path) -> str | None:
    """Why sqlite cannot use the database at `path`, or None (absent or empty files are new databases)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(HEADER))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    if not head:
        return None
    if head != HEADER:
        return "it is not an sqlite database"
    import sqlite3

    connection = None
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    finally:
        if connection is not None:
            connection.close()
    return None


def migrate(path: Path, legacy: Path) -> bool:
    """Move the database epbuild kept under doit's default name (`legacy`, sqlite) to `path`, with its sqlite
    journals, when `path` has none yet: its results carry over, and doit's default dbm backend (a dodo.py without
    epbuild's settings) no longer trips on it. Whether it moved."""
    try:
        with open(legacy, "rb") as handle:
            if handle.read(len(HEADER)) != HEADER or path.exists():
                return False
    except OSError:
        return False
    for suffix in ("-wal", "-shm", "-journal", ""):  # the main file last: it is what says a database is there
        try:
            os.replace(f"{legacy}{suffix}", f"{path}{suffix}")
        except FileNotFoundError:
            continue
    return True


def recover(path: Path) -> str | None:
    """Set an unreadable database aside (replacing an older one set aside); the warning to print, or None."""
    why = _unreadable(path)
    if why is None:
        return None
    aside = path.with_name(f"{path.name}.corrupt")
    try:
        os.replace(path, aside)
    except OSError as exc:
        return f"doit's database {path} is unreadable ({why}) and cannot be set aside ({exc.strerror}): delete it"
    return (f"doit's database {path.name} was unreadable ({why}): set aside as {aside.name}; every task is checked "
            "afresh (cached outputs are restored, not rebuilt)")
