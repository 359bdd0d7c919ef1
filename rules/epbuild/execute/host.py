"""What this host can build: installed EP packages, registered EP devices, and why a target is unavailable.

Probing needs onnxruntime and the plugin libraries, which cost a second; it runs once in a child process and is
cached in `artifacts/.state/host.json`, keyed by package versions and the machine, so task creation reads a
small JSON file instead. The in-child helpers (`register_plugin`, `select_ep_device`) are shared by the compile
and validation children.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..manifest.eps import REGISTRY, EpInfo, platform_reason
from ..state.folder import StateFolder
from ..state.registry import HOST
from .python_path import child_import_path

SHIM_LIBRARY = "EPBUILD_OPENVINO_SHIM"  # the built vendor-id shim (epbuild.steps.vendor_shim), for children
SHIM_PLUGIN = "EPBUILD_OPENVINO_PLUGIN"  # the real plugin library the shim loads
PROBE_TIMEOUT_S = 300.0


@functools.cache
def package_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpuinfo(keys: tuple[str, ...]) -> str | None:
    """The first /proc/cpuinfo line starting with one of `keys`, its value; None where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(keys):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@functools.cache
def cpu_model() -> str:
    return _cpuinfo(("model name",)) or platform.processor()


@functools.cache
def cpu_vendor() -> str:
    return _cpuinfo(("vendor_id",)) or ""


@functools.cache
def cpu_flags() -> str:
    """The CPU's instruction-set features as one digest: artifacts tied to this host's ISA are keyed by it."""
    flags = _cpuinfo(("flags", "Features"))
    return hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest() if flags else platform.processor()


def probe_key(version: Callable[[str], str | None] = package_version) -> dict[str, Any]:
    """What the probe's answer depends on; a change re-probes."""
    packages = sorted({info.package for info in REGISTRY.values() if info.package})
    return {"python": [sys.prefix, sys.version], "platform": sys.platform, "machine": platform.machine(),
            "node": platform.node(), "cpu": cpu_model(), "packages": {p: version(p) for p in packages},
            "vendor_shim": Path(os.environ[SHIM_LIBRARY]).parent.name if os.environ.get(SHIM_LIBRARY) else None}



class ForkedProbe(Protocol):
    """The probe forked by a fork server (`fork_server.ForkedJob`): onnxruntime already imported there."""

    def wait(self, timeout: float) -> tuple[int, int] | None: ...

    def kill(self) -> None: ...


# Forks `python -m epbuild.execute.host RESULT` (arguments, output file, working folder) from a fork server this
# build runs anyway, or None where none serves
Fork = Callable[[list[str], Path, Path], "ForkedProbe | None"]


class HostProbe:
    """The probe's answer: the cached one, or a child started now and waited for in `result()`, so that a first
    build reads its models while the child registers the plugins: forked by a fork server the build starts anyway
    (`fork`, which has imported onnxruntime), else a fresh Python. `stop()` ends a child whose answer is no longer
    wanted (the build stopped first)."""

    def __init__(self, state_dir: Path, version: Callable[[str], str | None] = package_version,
                 fork: Fork | None = None):
        self.state = StateFolder(state_dir)
        self.key = probe_key(version)
        self.cached = self.state.read_document(HOST, self.key)
        self.child: subprocess.Popen | None = None
        self.forked: ForkedProbe | None = None
        self.folder: Path | None = None
        if self.cached is None and fork is not None:
            self.folder = Path(tempfile.mkdtemp(prefix="epbuild-probe-"))
            self.forked = fork([str(self.folder / "result.json")], self.folder / "output.txt", self.folder)
            if self.forked is None:
                shutil.rmtree(self.folder, ignore_errors=True)
        if self.cached is None and self.forked is None:
            self.child = subprocess.Popen(
                [sys.executable, "-m", "epbuild.execute.host"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env={**os.environ, "PYTHONPATH": child_import_path()})

    def result(self) -> dict[str, Any]:
        if self.cached is not None:
            return self.cached
        code, stdout, stderr = self._forked_answer() if self.forked is not None else self._child_answer()
        if code != 0:
            result = {"error": f"host probe failed ({code}): {stderr.strip()[-500:]}", "eps": {}}
        else:
            result = json.loads(stdout)
        result["key"] = self.key
        with contextlib.suppress(OSError):  # a read-only artifacts folder (`doit list` there): probed again next time
            self.state.write_document(HOST, result, indent=1)
        self.cached = result
        return result

    def _child_answer(self) -> tuple[int | None, str, str]:
        assert self.child is not None
        try:
            stdout, stderr = self.child.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            stdout, stderr = "", f"timed out after {PROBE_TIMEOUT_S:.0f} s"
        return self.child.returncode, stdout, stderr

    def _forked_answer(self) -> tuple[int | None, str, str]:
        assert self.forked is not None and self.folder is not None
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        ended = None
        while ended is None and time.monotonic() < deadline:
            ended = self.forked.wait(0.01)
        try:
            if ended is None:
                self.forked.kill()
                return None, "", f"timed out after {PROBE_TIMEOUT_S:.0f} s"
            result = self.folder / "result.json"
            output = (self.folder / "output.txt").read_text(encoding="utf-8", errors="replace")
            if ended[0] != 0 or not result.is_file():
                return ended[0] or 1, "", output
            return 0, result.read_text(encoding="utf-8"), output
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def stop(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.communicate()
        if self.forked is not None and self.cached is None:
            self.forked.kill()
            self.forked.wait(1.0)  # its server reports the end: the connection closes
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)


def capabilities(state_dir: Path, version: Callable[[str], str | None] = package_version) -> dict[str, Any]:
    """The cached probe result, probing in a child process when the key changed; `version`: the distributions'
    versions as this run names them (`Provenance.version`)."""
    return HostProbe(state_dir, version).result()


def package_reason(info: EpInfo, source: str) -> str | None:
    """Why this host cannot even name the EP's toolchain (platform, delivery, package), or None. A Dask
    coordinator needs only this: the package's version enters the fingerprint, the device is the workers' concern."""
    reason = platform_reason(info)
    if reason:
        return reason
    if source in ("nuget", "catalog"):
        return f"{info.name} from '{source}' is delivered only through Windows ML on Windows"
    if info.package and package_version(info.package) is None:
        return f"{info.name} needs the '{info.package}' package: pip install {info.package}"
    return None


def unavailable_reason(info: EpInfo, source: str, device: str, caps: dict[str, Any]) -> str | None:
    """Why this host cannot build for (EP, source, device), with how to fix it; None when it can."""
    reason = package_reason(info, source)
    if reason:
        return reason
    found = caps.get("eps", {}).get(info.name)
    if found is None:
        return f"{info.name} is not offered by this onnxruntime build ({caps.get('error', 'not registered')})"
    if found.get("error"):
        return f"{info.name} failed to register: {found['error']}"
    shim = caps.get("vendor_shim", {})
    if info.vendor_shim and shim.get("reason") and not found["devices"]:
        return (f"{info.name} offers no device on this {caps['key']['cpu']} CPU without its vendor-id shim: "
                f"{shim['reason']}")
    if not found["devices"]:
        return (f"{info.name} registered but offers no device on this host (CPU: {caps['key']['cpu']})"
                f"{info.no_device_hint}")
    key = info.device_metadata
    if key and not any(d.get(key, "").upper().startswith(device.upper()) for d in found["devices"]):
        offered = ", ".join(d.get(key, "?") for d in found["devices"])
        return f"{info.name} offers {offered} on this host, not {device}"
    return None


# ---- in the child process only: these import onnxruntime ----

def plugin_library(info: EpInfo) -> str:
    """The library to register for a PyPI plugin EP: the plugin's, or on a host that needs it the vendor-id shim,
    which then loads the plugin from SHIM_PLUGIN."""
    assert info.module is not None, f"{info.name} is built into onnxruntime: no plugin library"
    library: str = __import__(info.module).get_library_path()
    if info.vendor_shim and os.environ.get(SHIM_LIBRARY):
        os.environ[SHIM_PLUGIN] = library
        library = os.environ[SHIM_LIBRARY]
    return library


def load_backend(info: EpInfo) -> None:
    """Load the libraries of the plugin's folder its sessions load on first use (`EpInfo.backend_libraries`), in a
    fork server before it forks jobs: the EP's own load of each then finds it loaded (the dynamic loader matches
    the file), so no forked job pays it. Where one cannot be loaded here, the EP's own load says why in the job."""
    import ctypes

    if info.module is None:
        return
    folder = os.path.dirname(__import__(info.module).get_library_path())
    for name in info.backend_libraries:
        with contextlib.suppress(OSError):
            ctypes.CDLL(os.path.join(folder, name))


def register_plugin(ort: Any, info: EpInfo) -> None:
    """Register a PyPI plugin EP library with this process's onnxruntime, once per process (no-op for built-in
    EPs): a process that runs several jobs (a Dask worker, a warm worker) asks again for each, and a library
    registered before offers no device to find where its devices did not come up (or were not asked for yet),
    so ONNX Runtime's own refusal of a second registration is that answer too."""
    if info.module is None or any(d.ep_name == info.name for d in ort.get_ep_devices()):
        return
    try:
        ort.register_execution_provider_library(info.name, plugin_library(info))
    except Exception as exc:  # onnxruntime's Fail: only "already registered" is ours to take
        if "already registered" not in str(exc):
            raise


def select_ep_device(ort: Any, info: EpInfo, device: str) -> Any:
    """The OrtEpDevice for an EP and device, matched by EP name: a build host without an NPU registers QNN on
    the CPU device type, so the hardware type alone cannot pick it. Some EPs say the device in metadata
    (OpenVINO: ov_device)."""
    candidates = [d for d in ort.get_ep_devices() if d.ep_name == info.name]
    if not candidates:
        raise RuntimeError(f"{info.name} offers no device on this host")
    key = info.device_metadata
    if key:
        matching = [d for d in candidates if d.ep_metadata.get(key, "").upper().startswith(device.upper())]
        if not matching:
            raise RuntimeError(f"{info.name} offers no {device} device on this host")
        return matching[0]
    typed = [d for d in candidates if d.device.type.name.lower() == device]
    return (typed or candidates)[0]


def _probe() -> dict[str, Any]:
    import onnxruntime as ort

    eps: dict[str, dict[str, Any]] = {}
    for info in REGISTRY.values():
        if info.module and package_version(info.package or "") and not platform_reason(info):
            try:
                register_plugin(ort, info)
            except Exception as exc:  # noqa: BLE001 - any registration failure is a reason to report
                eps[info.name] = {"devices": [], "error": str(exc).strip()}
    for ep_device in ort.get_ep_devices():
        entry = eps.setdefault(ep_device.ep_name, {"devices": [], "error": None})
        entry["devices"].append({"type": ep_device.device.type.name.lower(), "vendor": ep_device.device.vendor,
                                 "version": ep_device.ep_metadata.get("version"),
                                 "ov_device": ep_device.ep_metadata.get("ov_device", "")})
    for name in ort.get_available_providers():
        eps.setdefault(name, {"devices": [{"type": "cpu", "vendor": "", "version": ort.__version__}],
                              "error": None})
    for info in REGISTRY.values():
        if info.module and info.name not in eps and package_version(info.package or ""):
            eps[info.name] = {"devices": [], "error": None}
    return {"onnxruntime": ort.__version__, "eps": eps}


def main() -> None:
    """`python -m epbuild.execute.host [RESULT]`: the probe's answer on stdout, or into RESULT (a forked probe's
    stdout is its log, which the EP libraries also write to)."""
    answer = json.dumps(_probe())
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(answer, encoding="utf-8")
    else:
        sys.stdout.write(answer)
    sys.stdout.flush()
    os._exit(0)  # a forked probe must not return into its fork server's code; no EP library teardown either


if __name__ == "__main__":
    main()
