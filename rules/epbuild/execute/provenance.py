"""What a job's process must have loaded: the package versions and the epbuild code its fingerprint names.

A fingerprint names the toolchain versions the build process read from the environment and a digest of the epbuild
code that shapes outputs (`code_digest`). A fork server, its warm workers and a fresh child each record what they
loaded (`record_loaded`, when they import); every job request carries the build's view (`expected`) and the job
refuses to run in a process that disagrees (`check`), so an environment changed under a running fork server, or
during a build, never gives an artifact under another toolchain's fingerprint.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any

from .host import package_version, use_saved_versions

PACKAGE = Path(__file__).resolve().parents[1]
# The modules whose code runs in the jobs that write outputs (compiles, stages, validations, on this host or a Dask
# worker); what they import from the package is followed from here.
JOB_MODULES = ("steps/compile.py", "steps/preprocess.py", "steps/validate.py", "execute/fork_server.py",
               "worker.py")
DATA_FILES = ("steps/shims/*.c",)  # compiled into the OpenVINO vendor shim
# Every distribution a job may load; a version that differs from the build's is refused.
DISTRIBUTIONS = ("onnxruntime", "onnx", "numpy", "sympy", "onnxruntime-qnn", "onnxruntime-ep-openvino")

_LOADED: dict[str, Any] | None = None  # what this process loaded, recorded when it imported the toolchain


# `from ..store.cache import X`, `from . import (a, b)`, `from epbuild.x import y`, `import epbuild.x`: a text scan,
# five times cheaper than parsing every module (a mention in a docstring only adds a file to the digest)
IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)"
                    r"|^[ \t]*import[ \t]+(epbuild[\w.]*)", re.M)


def _imported(path: Path) -> set[Path]:
    """The package's modules `path` imports (any depth of `from .. import`, also inside functions)."""
    found = set()
    for dots, module, names, plain in IMPORT.findall(path.read_text(encoding="utf-8")):
        if plain or (not dots and (module == "epbuild" or module.startswith("epbuild."))):
            base, module = PACKAGE.parent, plain or module
        elif dots:
            base = path.parent
            for _ in range(len(dots) - 1):
                base = base.parent
        else:
            continue
        target = base.joinpath(*module.split(".")) if module else base
        words = [name.split()[0] for name in re.sub(r"#[^\n]*", "", names).strip("()").split(",") if name.split()]
        candidates = [target.with_suffix(".py"), target / "__init__.py", *(target / f"{w}.py" for w in words)]
        found.update(c for c in candidates if c.is_file())
    return found


def digested_files() -> list[Path]:
    """The job modules, everything of the package they import, and the shim's C source: the epbuild code that can
    change what an artifact, stage output or validation report contains."""
    todo = [PACKAGE / name for name in JOB_MODULES]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        init = path.parent / "__init__.py"  # importing a module runs its package's __init__
        todo.extend([*_imported(path), *([init] if init.is_file() and path.parent != PACKAGE.parent else [])])
    return sorted(seen | {p for pattern in DATA_FILES for p in PACKAGE.glob(pattern)})


_SAVED_DIGEST: str | None = None  # what a saved plan holds for this run's project key (`use_saved`)


@functools.cache
def code_digest() -> str:
    """sha256 over `digested_files()`."""
    if _SAVED_DIGEST is not None:
        return _SAVED_DIGEST
    digest = hashlib.sha256()
    for path in digested_files():
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def use_saved(digest: str | None, saved_versions: dict[str, str | None]) -> None:
    """Take the code digest and distributions' versions the saved plan of this run's project key holds instead of
    reading the files and asking importlib.metadata again (~7 ms of every run that compiles): that key hashes the
    bytes of every file the digest reads (`fast_path.SOURCES`) and holds the identity of every import folder, which
    installing, upgrading or removing a distribution changes. A job still checks what its own process loaded.
    (None, {}): read them again."""
    global _SAVED_DIGEST
    _SAVED_DIGEST = digest
    code_digest.cache_clear()
    use_saved_versions(saved_versions)


def versions() -> dict[str, str | None]:
    """The version of each distribution a job may load (None: absent)."""
    return {name: package_version(name) for name in DISTRIBUTIONS}


def expected() -> dict[str, Any]:
    """The build process's view: the versions its fingerprints name and its code digest."""
    return {"versions": versions(), "code": code_digest()}


def record_loaded() -> None:
    """Called by a process once it has imported the toolchain (a fork server after its preloads; a fresh child
    at its start): its forked children inherit the record."""
    global _LOADED
    use_saved(None, {})  # what this process loaded is read from the files and distributions
    _LOADED = expected()


def check(wanted: dict[str, Any] | None) -> str | None:
    """Why this process must not run a job that expects `wanted`, or None."""
    if wanted is None:
        return None
    if _LOADED is None:
        record_loaded()
    loaded = _LOADED or {}
    differ = [f"{name} {have or 'absent'} (the build expects {wanted['versions'].get(name) or 'it absent'})"
              for name, have in loaded["versions"].items() if have != wanted["versions"].get(name)]
    if loaded["code"] != wanted["code"]:
        differ.append("other epbuild code than the build's")
    if not differ:
        return None
    return (f"this job's process has {', '.join(differ)} loaded: the Python environment or epbuild changed during "
            "the build; run it again")
