"""The fork servers' folder and sockets against another local user: a folder another user pre-created (open to
all, or a file in its place) is passed over, this user's own with a wider mode is narrowed and cleared, a server
running as another user is never sent a request, and a job's request carries no secret of the build's.

The other-user cases act as `nobody` through `setpriv` with the system's Python, so they need root; they are
skipped with that reason elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from epbuild.execute import fork_server, private_folder
from epbuild.execute.child import run_child
from epbuild.execute.fork_server import SWITCH
from epbuild.execute.job_environment import EXTRA, job_environment
from epbuild.manifest.builds import Limits

OTHER_UID = 65534  # nobody
SYSTEM_PYTHON = "/usr/bin/python3"
as_other_user = pytest.mark.skipif(
    os.getuid() != 0 or not shutil.which("setpriv") or not Path(SYSTEM_PYTHON).exists(),
    reason="acting as another user needs root, setpriv and /usr/bin/python3")

# What the other user runs: its folder where the build's would be, open to all, with listening sockets at the
# names given; it records every byte any connection sends, until it is stopped.
ATTACKER = r"""
import json, os, socket, sys, time
folder, names, record = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
os.mkdir(folder)
os.chmod(folder, 0o777)
listeners = []
for name in filter(None, names):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, name))
    os.chmod(os.path.join(folder, name), 0o777)
    listener.listen(16)
    listener.setblocking(False)
    listeners.append(listener)
received = []
open(record, "w").write("[]")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    for listener in listeners:
        try:
            connection, _ = listener.accept()
        except BlockingIOError:
            continue
        connection.settimeout(2)
        try:
            received.append(connection.recv(1 << 20).decode(errors="replace"))
        except OSError:
            pass
        connection.close()
        open(record, "w").write(json.dumps(received))
    time.sleep(0.02)
"""


@pytest.fixture
def shared_tmp(monkeypatch):
    """A sticky, world-writable temporary folder of this test's own, as /tmp is (short: socket paths)."""
    root = Path(tempfile.mkdtemp(prefix="epb", dir="/tmp"))
    root.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    yield root
    shutil.rmtree(root)  # the servers' sockets gone, they leave


def _as_other_user(*command: str) -> subprocess.Popen:
    return subprocess.Popen(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
                             *command], stdin=subprocess.DEVNULL)


@pytest.fixture
def crash_child(monkeypatch):
    from conftest import REPO, SOURCE

    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'tests'}{os.pathsep}{SOURCE}")


@as_other_user
def test_another_users_open_folder_with_sockets_gets_no_request(shared_tmp, monkeypatch, crash_child):
    """The other user's folder holds a listening socket at the very name the build's server would have: the build
    passes the folder over for a private one of its own, and no byte reaches the other user."""
    monkeypatch.setenv(SWITCH, "1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-others")
    taken = shared_tmp / f"epbuild-fork-{os.getuid()}"
    script, record = shared_tmp / "attacker.py", shared_tmp / "received.json"
    script.write_text(ATTACKER)
    names = ",".join(f"{fork_server._server_key(alias)}.sock" for alias in ("", "qnn"))
    attacker = _as_other_user(SYSTEM_PYTHON, str(script), str(taken), names, str(record))
    try:
        deadline = time.monotonic() + 30
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert record.exists(), "the other user's listener never started"
        answer = run_child("crash_child", {"action": "env", "name": "AWS_SECRET_ACCESS_KEY"}, shared_tmp / "job",
                           Limits(60), "compile m@t", reuse=True)
        time.sleep(0.5)
    finally:
        attacker.kill()  # our own child
        attacker.wait()
    assert json.loads(record.read_text()) == []
    assert answer["value"] is None  # nor did the job itself get the secret
    mine = shared_tmp / f"epbuild-fork-{os.getuid()}-1"
    assert fork_server._folder() == mine
    status = mine.lstat()
    assert status.st_uid == os.getuid() and stat.S_IMODE(status.st_mode) == 0o700
    assert list(mine.glob("*.sock"))  # the build's server serves from the private folder


@as_other_user
def test_a_file_another_user_left_at_the_folders_path_does_not_stop_the_build(shared_tmp, monkeypatch, crash_child):
    """`touch /tmp/epbuild-fork-$UID` by anyone: the build still runs its jobs on fork servers."""
    monkeypatch.setenv(SWITCH, "1")
    taken = shared_tmp / f"epbuild-fork-{os.getuid()}"
    subprocess.run(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "touch",
                    str(taken)], check=True)
    answer = run_child("crash_child", {"action": "sleep"}, shared_tmp / "job", Limits(60), "compile m@t", reuse=True)
    assert answer["pid"] > 0 and taken.is_file() and fork_server._folder() == taken.with_name(f"{taken.name}-1")


@as_other_user
def test_a_server_running_as_another_user_is_never_connected_to(shared_tmp):
    """Whatever the folder: the kernel's account of the peer decides (`SO_PEERCRED`)."""
    script, record = shared_tmp / "attacker.py", shared_tmp / "received.json"
    script.write_text(ATTACKER)
    attacker = _as_other_user(SYSTEM_PYTHON, str(script), str(shared_tmp / "open"), "x.sock", str(record))
    try:
        deadline = time.monotonic() + 30
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fork_server._connect(shared_tmp / "open" / "x.sock") is None
    finally:
        attacker.kill()
        attacker.wait()


def test_every_name_held_by_another_turns_fork_servers_off_with_one_warning(tmp_path, monkeypatch, capsys):
    """Simulated without root: every candidate is a file of this user's that cannot be removed (a read-only
    parent), so none can be made private."""
    monkeypatch.setattr(private_folder, "make_private", lambda path: False)
    fork_server._found_folder.cache_clear()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(SWITCH, raising=False)
    assert not fork_server.enabled() and not fork_server.enabled()
    assert capsys.readouterr().err.count("warning: fork servers are off for this build") == 1
    fork_server._found_folder.cache_clear()


def test_this_users_own_folder_left_open_is_narrowed_and_cleared(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    folder.chmod(0o777)
    (folder / "mine.sock").write_text("")
    assert private_folder.make_private(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and (folder / "mine.sock").exists()
    (folder / "f2").write_text("")
    folder.chmod(0o755)
    if os.getuid() == 0:  # an entry of another user's, left while the folder was open: removed
        os.chown(folder / "f2", OTHER_UID, OTHER_UID)
        assert private_folder.make_private(folder) and not (folder / "f2").exists()


def test_this_users_own_file_or_link_in_the_folders_place_is_replaced(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "target").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "target")
    for name in ("file", "link"):
        assert private_folder.make_private(tmp_path / name)
        assert (tmp_path / name).is_dir() and not (tmp_path / name).is_symlink()


def test_a_jobs_environment_keeps_what_jobs_read_and_no_secret(monkeypatch):
    for name, value in {"AWS_SECRET_ACCESS_KEY": "s", "AWS_ACCESS_KEY_ID": "a", "EPBUILD_CACHE_SIGNING_KEY": "k",
                        "GITHUB_TOKEN": "t", "OMP_NUM_THREADS": "2", "EPBUILD_OPENVINO_SHIM": "/x.so",
                        "QNN_SDK_ROOT": "/q", "LC_ALL": "C", "UNRELATED": "u", "MY_LICENSE": "l"}.items():
        monkeypatch.setenv(name, value)
    env = job_environment()
    assert {"OMP_NUM_THREADS", "EPBUILD_OPENVINO_SHIM", "QNN_SDK_ROOT", "LC_ALL", "PYTHONPATH"} <= set(env)
    assert not {"AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "EPBUILD_CACHE_SIGNING_KEY", "GITHUB_TOKEN",
                "UNRELATED", "MY_LICENSE"} & set(env)
    monkeypatch.setenv(EXTRA, "MY_LICENSE, UNRELATED")  # a toolchain's own variables, named by the user
    assert {"MY_LICENSE", "UNRELATED"} <= set(job_environment())


@pytest.mark.parametrize("mode", ["1", "fork", "0"])
def test_no_job_process_gets_the_builds_secrets(tmp_path, monkeypatch, crash_child, mode):
    """A warm worker, a forked child and a fresh child alike."""
    monkeypatch.setenv(SWITCH, mode)
    monkeypatch.setenv("EPBUILD_CACHE_SIGNING_KEY", "not-for-jobs")
    answer = run_child("crash_child", {"action": "env", "name": "EPBUILD_CACHE_SIGNING_KEY"}, tmp_path / "a",
                       Limits(60), "compile m@t", reuse=True)
    assert answer["value"] is None
