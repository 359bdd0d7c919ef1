"""doit's file checker on epbuild's hash memory (`state.hash_memory`) and published-file record."""

from __future__ import annotations

import os

from doit.dependency import FileChangedChecker

from ..files.layout import settled, stat_key
from ..state.hash_memory import FileHashes

SEEN_CHANGING = [-1]  # no file has this identity


def saw(checked: dict[str, list[int]], path: str, key: list[int]) -> None:
    """Remember the identity a check saw; a file seen with two identities in one run (changed between two tasks'
    checks, or since the last run's record vouched for it) is remembered as neither, so that no record claims
    either task saw it unchanged."""
    if checked.setdefault(path, key) != key:
        checked[path] = SEEN_CHANGING


class HashChecker(FileChangedChecker):
    """doit's file checker on the shared hash memory: state is [size, mtime_ns, ctime_ns, inode, sha256], and a file
    whose identity changed but whose bytes did not (a fresh clone, a touch) is hashed once, not on every run. It
    keeps the identity of every file it judged unchanged or found present (`checked`): a full no-op's stamp.
    doit makes it by calling what `check_file_uptodate` names with no arguments: hand it
    `functools.partial(HashChecker, hashes, published)` and read `checked` / `edited` from the dicts passed in."""

    def __init__(self, hashes: FileHashes, published: dict[str, list], checked: dict[str, list[int]] | None = None,
                 edited: set[str] | None = None):
        self.hashes = hashes
        self.published = published  # target -> [*identity, sha256] its task recorded when it published it
        self.checked = {} if checked is None else checked
        self.edited = set() if edited is None else edited  # published targets found changed since: they run again

    def check_modified(self, file_path, file_stat, state):
        if state is None or len(state) != 5:
            return True
        key = stat_key(file_stat)
        try:
            if key != state[:4] and self.hashes.sha256(file_path, file_stat) != state[4]:
                return True
        except OSError:  # unreadable now (a permission, a file going away): its task runs and says so in a line
            return True
        saw(self.checked, file_path, key)
        return False

    def exists(self, file_path):
        """Present, and as its task published it: a published file changed since counts as missing, so that its
        task restores or rebuilds it (a touched one is hashed once and found unchanged)."""
        try:
            stat = os.stat(file_path)
        except OSError:
            return False
        key = stat_key(stat)
        saw(self.checked, file_path, key)
        recorded = self.published.get(file_path)
        try:
            changed = recorded is not None and bool(recorded) and key != recorded[:4] and \
                self.hashes.sha256(file_path, stat) != recorded[4]
        except OSError:  # unreadable: its task restores or rebuilds it, or says why it cannot
            changed = True
        if changed:
            self.edited.add(file_path)
            return False
        return True

    def get_state(self, dep, current_state):
        stat = os.stat(dep)
        key = stat_key(stat)
        if current_state and current_state[:4] == key:
            return None
        if not settled(stat):  # it may change again under this identity: compared by content next time
            key = [*key[:2], -1, key[3]]
        return [*key, self.hashes.sha256(dep, stat)]


