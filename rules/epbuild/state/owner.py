"""Whose `.state/` this is: a folder a checkout brings (a pull request that commits `artifacts/` with its records and
doit's database) holds records written elsewhere, and records that say which bytes were published would vouch for
whatever bytes the checkout put beside them (a swapped artifact with its hashes rewritten stayed "up to date").

The folder carries a stamp (`owner`, read and written by `state.registry`): an HMAC of its layout under a key
this user keeps outside every project and cache (`$XDG_STATE_HOME/epbuild/owner.key`, else
`~/.local/state/epbuild/`; a private file of the temporary folder where no home is writable). A checkout cannot
bring the key, so it cannot bring a stamp that holds: a folder whose stamp does not hold is another's, and a full
load empties it (and sets doit's database aside), so the first build of a clone checks every artifact afresh,
restoring or rebuilding it. The no-op shortcut never
needs this: its records vouch by file identities (ctime, inode), which no checkout can reproduce.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path

KEY_BYTES = 32


def _key_paths() -> list[Path]:
    import tempfile  # only where a full load settles the folder, never on a no-op

    home = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return [Path(home) / "epbuild" / "owner.key",
            Path(tempfile.gettempdir()) / f"epbuild-owner-{os.getuid() if hasattr(os, 'getuid') else 0}.key"]


def _read_key(path: Path) -> bytes | None:
    """The key at `path` when it is this user's private regular file of the right size (never through a link)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        found = os.fstat(descriptor)
        if not stat.S_ISREG(found.st_mode) or (hasattr(os, "getuid") and found.st_uid != os.getuid()) \
                or found.st_mode & 0o077:
            return None
        data = os.read(descriptor, KEY_BYTES + 1)
    finally:
        os.close(descriptor)
    return data if len(data) == KEY_BYTES else None


def owner_key() -> bytes | None:
    """This user's key, made on first need; None where no private file can hold one (then no folder is ever taken
    as this user's: every full load checks everything)."""
    for path in _key_paths():
        key = _read_key(path)
        if key is not None:
            return key
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:
            continue  # another's, a link, unwritable: the next place
        try:
            os.write(descriptor, os.urandom(KEY_BYTES))
        finally:
            os.close(descriptor)
        key = _read_key(path)
        if key is not None:
            return key
    return None


def stamp(state: Path, layout: int) -> str | None:
    """The stamp this user writes into `state` for `layout`: None without a key. Not bound to the folder's path: a
    project this user moves or copies keeps its state (the key, not the place, is what a checkout cannot bring)."""
    key = owner_key()
    if key is None:
        return None
    return hmac.new(key, f"epbuild state layout {layout}".encode(), hashlib.sha256).hexdigest()
