"""A first build's candidate (`execute.warm_start`) on its side: the toolchain imported while the build starts,
then adopted as a fork server (`server_process.serve`), forking off the build's other first servers with the imports
made; or, never adopted, gone.

    python -P -m epbuild.execute.server_candidate --candidate [JOB_MODULES_JSON]   (started by `warm_start.begin`)
"""

from __future__ import annotations

import json
import os
import select
import sys
from pathlib import Path

from .links import JobModules
from .server_process import IDLE_PRELOAD_S, serve
from .server_start import CANDIDATE, PRELOAD


def _serve_here(path: Path, alias: str, modules: JobModules) -> None:
    """Become the server for `alias` at `path`: output to its log, nothing on stdin, in the sockets' folder."""
    log = os.open(path.with_suffix(".log"), os.O_WRONLY | os.O_APPEND)
    for stream in (1, 2):
        os.dup2(log, stream)
    os.close(log)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.close(nothing)
    os.chdir(path.parent)
    serve(path, alias, modules, preloaded=True)


def _sibling(path: Path, alias: str, modules: JobModules) -> None:
    """In an adopted candidate: fork off the server for `alias` at `path`, detached, its output to its log, as a
    server started by the build would be (`--detach`), without importing the toolchain again."""
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)  # the first child exits once it has forked the server
        return
    try:
        if os.fork():
            os._exit(0)
        os.setsid()
        _serve_here(path, alias, modules)
    except BaseException:  # noqa: BLE001 - never back into the candidate's code: said into its log
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        os._exit(0)


def candidate(modules: JobModules, detached: bool = False) -> None:
    """`execute.warm_start`'s candidate: detached (here, unless forked from the build, `detached`), the preloads
    imported, then adopted (a socket and an EP on its stdin, its output to the server's log, its folder the
    sockets') or, at the end of its stdin, gone."""
    import importlib

    if not detached:
        if os.fork():
            os._exit(0)
        os.setsid()
    for module in PRELOAD:
        importlib.import_module(module)
    if not select.select([sys.stdin], [], [], IDLE_PRELOAD_S)[0]:  # not adopted yet: the job modules meanwhile
        for module in modules.idle:
            importlib.import_module(module)
    line = sys.stdin.readline()
    if not line.strip():
        os._exit(0)
    path, alias, others = json.loads(line)
    for other, other_alias in others:  # the build's other first servers: forked off with the imports made
        _sibling(Path(other), other_alias, modules)
    _serve_here(Path(path), alias, modules)


def main(argv: list[str]) -> None:
    """`--candidate [JSON]`: what `warm_start.begin` starts where it cannot fork the build."""
    if argv[:1] != [CANDIDATE]:
        raise SystemExit(f"usage: python -m epbuild.execute.server_candidate {CANDIDATE} [JOB_MODULES_JSON]")
    candidate(JobModules.of(argv[1]) if len(argv) > 1 else JobModules())


if __name__ == "__main__":
    main(sys.argv[1:])
