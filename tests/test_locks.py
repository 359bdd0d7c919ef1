"""The per-fingerprint lock: threads and processes exclude each other on one fingerprint and not across
fingerprints; a killed holder releases it; on Linux nothing is created per fingerprint."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import SOURCE
from epbuild.files import locks
from epbuild.files.locks import SHARED_FILE, fingerprint_lock

REPO = Path(__file__).resolve().parent.parent
HOLDER = """
import sys
from pathlib import Path
from epbuild.files.locks import fingerprint_lock
with fingerprint_lock(Path(sys.argv[1]), sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


def fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(params=["ofd", "flock", "filelock"])
def mode(request, monkeypatch):
    """Every implementation: Linux's one-file byte locks, the lock file per fingerprint used elsewhere (flock), and
    its Windows form (filelock)."""
    if request.param == "ofd" and not locks._OFD:
        pytest.skip("open-file-description locks are Linux-only")
    monkeypatch.setattr(locks, "_OFD", request.param == "ofd")
    if request.param == "filelock":
        monkeypatch.setattr(locks, "fcntl", None)
    return request.param


def test_threads_wait_for_the_same_fingerprint_and_not_for_another(tmp_path, mode):
    held, release, events = threading.Event(), threading.Event(), []

    def holder() -> None:
        with fingerprint_lock(tmp_path, fingerprint("a")):
            held.set()
            release.wait(10)
            events.append("holder released")

    def waiter(name: str, key: str) -> None:
        with fingerprint_lock(tmp_path, fingerprint(key)):
            events.append(f"{name} acquired")

    first = threading.Thread(target=holder)
    first.start()
    assert held.wait(10)
    same, other = threading.Thread(target=waiter, args=("same", "a")), threading.Thread(target=waiter,
                                                                                        args=("other", "b"))
    same.start()
    other.start()
    other.join(10)
    time.sleep(0.2)  # time enough for `same` to get the lock, were it not excluded
    assert events == ["other acquired"]
    release.set()
    first.join(10)
    same.join(10)
    assert events == ["other acquired", "holder released", "same acquired"]


def test_another_process_holding_the_lock_excludes_this_one_until_it_is_killed(tmp_path, mode):
    key = fingerprint("shared")
    env = {**os.environ, "PYTHONPATH": str(SOURCE)}
    switch = {"ofd": "", "flock": "l._OFD = False\n", "filelock": "l._OFD = False\nl.fcntl = None\n"}[mode]
    script = "import epbuild.files.locks as l\n" + switch + HOLDER
    holder = subprocess.Popen([sys.executable, "-c", script, str(tmp_path), key], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        acquired = threading.Event()

        def take() -> None:
            with fingerprint_lock(tmp_path, key):
                acquired.set()

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        assert not acquired.wait(0.5)
        holder.kill()  # our own child: the kernel drops its lock with it
        assert acquired.wait(10)
    finally:
        holder.kill()
        holder.wait(10)


def test_one_file_holds_every_fingerprint_lock_on_linux(tmp_path, mode):
    if mode != "ofd":
        pytest.skip("a lock file per fingerprint elsewhere")
    for index in range(50):
        with fingerprint_lock(tmp_path, fingerprint(str(index))):
            pass
    assert [p.name for p in tmp_path.iterdir()] == [SHARED_FILE]
