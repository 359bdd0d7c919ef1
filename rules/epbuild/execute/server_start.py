"""What a build and the fork servers it starts agree on: the switch, the imports every server makes before it
serves, the argument that makes a Python a candidate, and what a server is started through. Apart from both sides
(`execute.warm_start`, `execute.fork_server`, `execute.server_process`) so that none imports another's module to
learn them."""

from __future__ import annotations

from typing import Protocol

SWITCH = "EPBUILD_FORK_SERVER"  # "0": a plain child for every job (`fork_server.enabled`); no candidate either
CANDIDATE = "--candidate"  # `python -m epbuild.execute.server_candidate --candidate`: preload, wait to be adopted
# what every fork server imports before it serves, whatever its EP. numpy.random: numpy imports it lazily, and every
# validation child needs it. Not onnxruntime.quantization: only quantize stages use it (~50 ms of a stage that
# calibrates for seconds), and it made every server start ~30 ms later and every forked child's inherited heap larger.
PRELOAD = ("numpy", "numpy.random", "onnx", "onnx.shape_inference", "onnxruntime")
IDLE_S = 30.0  # a server without jobs for this long exits (a client waits at least this long for one starting)
MODULES = "--modules"  # the server's command line: [--detach] [--modules JSON] PATH ALIAS


class Starter(Protocol):
    """The process a build starts a fork server through (it exits once it has forked the server off)."""

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class Detached:
    """The starter of a server forked off by another (a first build's candidate forks the build's other first
    servers): nothing of this process's to wait for."""

    def poll(self) -> int | None:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0
