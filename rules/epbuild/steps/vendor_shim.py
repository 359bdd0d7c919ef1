"""OpenVINO on non-Intel x86-64 hosts: the vendor-id shim (`rules/epbuild/steps/shims/openvino_vendor.c`).

Every onnxruntime-ep-openvino release offers its CPU device only when the CPU's vendor id is Intel's, though
OpenVINO's CPU plugin runs on AMD x86-64 too. The shim, compiled here with the system C compiler on first need into
the cache folder, stands in for the plugin library and answers Intel's vendor id for CPU devices only. It is used
for the CPU device on non-Intel x86-64 hosts, never on Intel ones; `EPBUILD_OPENVINO_VENDOR_SHIM=0` turns it off.
Children find it through `EPBUILD_OPENVINO_SHIM` (set by `prepare`); `execute.host.register_plugin` registers it in
place of the plugin and names the real plugin in `EPBUILD_OPENVINO_PLUGIN`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..execute.host import SHIM_LIBRARY, cpu_vendor

SOURCE = Path(__file__).resolve().parent / "shims" / "openvino_vendor.c"
SWITCH = "EPBUILD_OPENVINO_VENDOR_SHIM"
NAME = "libepbuild_openvino_vendor.so"


def needed() -> bool:
    """A non-Intel x86-64 Linux host, and not switched off."""
    return (os.environ.get(SWITCH) != "0" and platform.system() == "Linux"
            and platform.machine().lower() in ("x86_64", "amd64") and cpu_vendor() != "GenuineIntel")


@functools.cache
def identity() -> dict[str, str]:
    """What enters fingerprints and artifact.json: the shim's source (its bytes decide what it does)."""
    return {"name": "openvino-vendor-id", "source_sha256": hashlib.sha256(SOURCE.read_bytes()).hexdigest()}


def _compiler() -> tuple[str, str] | None:
    """The C compiler ($CC, else cc) and its identity (path, size, mtime: cheap, changes with an upgrade)."""
    found = shutil.which(os.environ.get("CC", "cc"))
    if found is None:
        return None
    stat = os.stat(os.path.realpath(found))
    return found, f"{os.path.realpath(found)}:{stat.st_size}:{stat.st_mtime_ns}"


def build(cache_dir: Path) -> Path:
    """The compiled shim, built once per (source, compiler) into the cache folder; raises OSError with the
    compiler's words when it cannot be built."""
    compiler = _compiler()
    if compiler is None:
        raise OSError(f"no C compiler ({os.environ.get('CC', 'cc')}) to build the OpenVINO vendor-id shim for this "
                      f"{cpu_vendor() or 'non-Intel'} CPU: install one (Debian: apt install gcc), or set {SWITCH}=0")
    key = hashlib.sha256(SOURCE.read_bytes() + compiler[1].encode()).hexdigest()[:16]
    library = cache_dir / "shims" / key / NAME
    if library.is_file():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as work:
        output = Path(work) / NAME
        done = subprocess.run([compiler[0], "-shared", "-fPIC", "-O2", "-o", str(output), str(SOURCE), "-ldl"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{compiler[0]} could not build the OpenVINO vendor-id shim: "
                          f"{(done.stdout + done.stderr).strip()[-500:]}")
        os.replace(output, library)
    return library


def prepare(*folders: Path) -> dict[str, str]:
    """On hosts that need it, build the shim (in the first of `folders` that takes it: the cache, else the
    project's state) and point children at it. Returns {"library": path} when OpenVINO runs through the shim,
    {"reason": why not} when it is needed and cannot be built, {} when not needed."""
    if not needed():
        os.environ.pop(SHIM_LIBRARY, None)
        return {}
    reason = ""
    for folder in folders:
        try:
            library = build(folder)
            break
        except (OSError, subprocess.SubprocessError) as exc:
            reason = str(exc)
    else:
        os.environ.pop(SHIM_LIBRARY, None)
        return {"reason": reason}
    os.environ[SHIM_LIBRARY] = str(library)
    return {"library": str(library)}


def active() -> bool:
    """Whether OpenVINO is loaded through the shim in this process and its children."""
    return bool(os.environ.get(SHIM_LIBRARY))
