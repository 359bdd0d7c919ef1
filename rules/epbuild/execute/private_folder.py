"""The fork servers' private folder, and the check that a server answering in it is this user's.

A job request carries the job's environment and its result comes back over the same socket, so whoever can put a
socket where the build looks for its server receives the build's requests and can answer them. In a shared `/tmp`
any local user can pre-create `epbuild-fork-<uid>` (world-writable, or as a file, or as a link), so the folder is
never taken on trust: it must be a real folder (not a link) owned by this user with no access for group or others.
One of this user's, left with a wider mode, is narrowed and cleared of what others put there; one that another
user holds (a folder, a file, a link: in a sticky `/tmp` nobody else can remove it) is passed over for the next
name in a fixed sequence, so every build of this user still meets at the same servers. `XDG_RUNTIME_DIR` (a private
per-user folder on systemd hosts) comes first where there is one. When no name in the sequence can be made
private, fork servers are off for this process: plain children, with one warning.

The folder alone is not the whole trust: every connection is checked against the kernel's own account of its peer
(`SO_PEERCRED`), and a server that runs as another user is refused, so neither a request nor a result is ever
exchanged with another user's process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import struct
from pathlib import Path

MAX_ROOT_LENGTH = 40  # a server binds `<folder>/.<20-char key>.sock.<pid>`: a socket's path holds 107 bytes
ALTERNATES = 8  # names tried after `epbuild-fork-<uid>` is held by another user


def candidates(root: str, runtime: str) -> list[Path]:
    """Where the folder may be, in the order every build of this user tries them: under `runtime`
    (XDG_RUNTIME_DIR) where it is this user's private folder, then under `root` (the temporary folder; /tmp when
    that path is too long for a socket's)."""
    uid = os.getuid()
    found: list[Path] = []
    if runtime and os.path.isabs(runtime) and len(runtime) < MAX_ROOT_LENGTH and _private(runtime, uid):
        found.append(Path(runtime) / "epbuild-fork")
    base = Path(root if len(root) < MAX_ROOT_LENGTH else "/tmp") / f"epbuild-fork-{uid}"
    found += [base, *(base.with_name(f"{base.name}-{n}") for n in range(1, ALTERNATES + 1))]
    return found


def _private(path: str | Path, uid: int) -> bool:
    """A real folder of this user's that nobody else can enter."""
    try:
        status = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(status.st_mode) and status.st_uid == uid and not status.st_mode & 0o077


def make_private(path: Path) -> bool:
    """Make `path` this user's private folder, or say it cannot be (another user holds the name)."""
    uid = os.getuid()
    for _ in range(3):  # a race with another build of this user making or mending it: look again
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return False
        try:
            status = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError:
            return False
        if status.st_uid != uid:
            return False  # another user's folder, file or link: never used, never followed
        if not stat.S_ISDIR(status.st_mode):  # this user's own file or link in the way: removed
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            continue
        if status.st_mode & 0o777 != 0o700:
            _mend(path, uid)
        return _private(path, uid)
    return False


def _mend(path: Path, uid: int) -> None:
    """This user's folder with group or other access: closed first, then emptied of what others put in it while
    it was open (their sockets, links or files; this user's own servers keep theirs)."""
    os.chmod(path, 0o700, follow_symlinks=False)
    for entry in os.scandir(path):
        with contextlib.suppress(OSError):
            if entry.stat(follow_symlinks=False).st_uid != uid:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)


def find(root: str, runtime: str) -> tuple[Path | None, str]:
    """The first candidate that is, or can be made, private: (folder, "") or (None, why none could be)."""
    tried = candidates(root, runtime)
    for folder in tried:
        if make_private(folder):
            return folder, ""
    return None, (f"fork servers are off for this build: none of {tried[0]} ... {tried[-1]} can be made a "
                  "private folder of this user (another user holds them); jobs run in plain children")


def peer_uid(connection: socket.socket) -> int | None:
    """The user id the kernel records for the process at the other end of a Unix socket (None where it cannot
    say)."""
    try:
        credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", credentials)[1]


def trusted(connection: socket.socket) -> bool:
    """Whether the process at the other end runs as this user."""
    return peer_uid(connection) == os.getuid()
