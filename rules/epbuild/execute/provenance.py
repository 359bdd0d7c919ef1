"""What a job's process must have loaded: the package versions and the epbuild code its fingerprint names.

A fingerprint names the toolchain versions the build process read from the environment and a digest of the epbuild
code that shapes outputs (`code_digest`), which starts from the roots the layer whose jobs they are names
(`steps.job_modules.CODE_ROOTS`: nothing here names a module above it). A fork server, its warm workers and a fresh
child each record what they loaded (`record_loaded`, when they import); every job request carries the build's view
(`Provenance.expected`, the roots with it) and the job refuses to run in a process that disagrees (`check`), so an
environment changed under a running fork server, or during a build, never gives an artifact under another
toolchain's fingerprint.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from ..records import record
from .host import package_version

PACKAGE = Path(__file__).resolve().parents[1]
# Every distribution a job may load; a version that differs from the build's is refused.
# onnxruntime-genai: validations of genai folders run its generator (absent: None, like any other); ml_dtypes: onnx
# loads it in every job (pinned for its import time; no artifact byte depends on it, so no fingerprint names it)
DISTRIBUTIONS = ("onnxruntime", "onnx", "numpy", "ml_dtypes", "sympy", "onnxruntime-qnn", "onnxruntime-ep-openvino",
                 "onnxruntime-genai")



# `from ..store.cache import X`, `from . import (a, b)`, `from epbuild.x import y`, `import epbuild.x`: a text scan,
# five times cheaper than parsing every module (a mention in a docstring only adds a file to the digest)
IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)"
                    r"|^[ \t]*import[ \t]+(epbuild[\w.]*)", re.M)


def _imported(path: str, files: frozenset[str]) -> set[str]:
    """The package's modules `path` imports (any depth of `from .. import`, also inside functions), among `files`
    (the package's, listed once: strings and a set, not a Path and a stat per candidate)."""
    found: set[str] = set()
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    for dots, module, names, plain in IMPORT.findall(text):
        if plain or (not dots and (module == "epbuild" or module.startswith("epbuild."))):
            base, module = str(PACKAGE.parent), plain or module
        elif dots:
            base = os.path.dirname(path)
            for _ in range(len(dots) - 1):
                base = os.path.dirname(base)
        else:
            continue
        target = os.path.join(base, *module.split(".")) if module else base
        words = [name.split()[0] for name in re.sub(r"#[^\n]*", "", names).strip("()").split(",") if name.split()]
        candidates = [f"{target}.py", os.path.join(target, "__init__.py"),
                      *(os.path.join(target, f"{word}.py") for word in words)]
        found.update(candidate for candidate in candidates if candidate in files)
    return found


def python_files(package: Path) -> list[str]:
    """Every .py file of `package`, as absolute paths (one `os.walk`: pathlib's glob took several times as long)."""
    return [os.path.join(folder, name) for folder, _, names in os.walk(package) for name in names
            if name.endswith(".py")]


def digested_files(roots: tuple[str, ...]) -> list[Path]:
    """The files `roots` (paths in the package, `*` patterns allowed) match and every module of the package the
    Python ones import: the epbuild code that can change what an artifact, stage output or validation report
    contains. A root that matches nothing is an error, not a smaller digest."""
    files = frozenset(python_files(PACKAGE))
    top = str(PACKAGE.parent)
    matched = {root: sorted(PACKAGE.glob(root)) for root in roots}
    if missing := [root for root, found in matched.items() if not found]:
        raise ValueError(f"code digest roots match no file of {PACKAGE}: {', '.join(missing)}")
    named = [str(path) for found in matched.values() for path in found]
    todo = [path for path in named if path in files]
    seen: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        init = os.path.join(os.path.dirname(path), "__init__.py")  # importing a module runs its package's __init__
        todo.extend([*_imported(path, files), *([init] if init in files and os.path.dirname(path) != top else [])])
    return sorted({Path(path) for path in (*seen, *named)})


@functools.cache
def code_digest(roots: tuple[str, ...]) -> str:
    """sha256 over `digested_files(roots)`: this process's reading (a build's is its `Provenance`); kept, so that a
    fork server's children inherit what the server read when it imported the code."""
    digest = hashlib.sha256()
    for path in digested_files(roots):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def versions() -> dict[str, str | None]:
    """The version of each distribution a job may load (None: absent), as this process finds them."""
    return {name: package_version(name) for name in DISTRIBUTIONS}


@record
class Provenance:
    """What one build's fingerprints and job requests name: the epbuild code digest and the versions of the
    distributions that shape outputs (those a job may load and every EP plugin's). Made once per run, read from the
    files (`read`) or taken from the saved plan of this run's project key (whose key hashes every file the digest
    reads and the identity of every import folder, which installing or upgrading a distribution changes), and
    handed to whatever fingerprints or asks for a job: the build says one thing throughout, and a job still checks
    what its own process loaded against it."""

    code: str
    versions: dict[str, str | None]
    roots: tuple[str, ...]  # where `code` starts (`steps.job_modules.CODE_ROOTS`)

    @classmethod
    def read(cls, roots: tuple[str, ...]) -> Provenance:
        from ..manifest.eps import REGISTRY

        names = sorted({*DISTRIBUTIONS, *(info.package for info in REGISTRY.values() if info.package)})
        return cls(code_digest(roots), {name: package_version(name) for name in names}, roots)

    def version(self, distribution: str) -> str | None:
        if distribution in self.versions:
            return self.versions[distribution]
        return package_version(distribution)

    def of(self, *distributions: str) -> dict[str, str | None]:
        return {name: self.version(name) for name in distributions}

    def for_ep(self, info: Any) -> dict[str, str | None]:
        """The versions that shape an artifact of this EP (`EpInfo`): onnx reads and checks every model and
        artifact in the jobs (placement, external data, EPContext attributes)."""
        return self.of("onnxruntime", "onnx", *([info.package] if info.package and info.package != "onnxruntime"
                                                 else []))

    def expected(self) -> dict[str, Any]:
        """What a job request carries: the job refuses a process that loaded other versions or code."""
        return {"versions": self.of(*DISTRIBUTIONS), "code": self.code, "roots": list(self.roots)}


def versions_expected() -> dict[str, Any]:
    """What a job run without a build's provenance (a test's, an embedding program's) carries: the versions this
    process reads; no code is named, so none is checked."""
    return {"versions": versions()}


@functools.cache
def loaded_versions() -> dict[str, str | None]:
    """The versions this process loaded, read once (`record_loaded`)."""
    return versions()


def record_loaded(roots: tuple[str, ...] = ()) -> None:
    """Record what this process loaded: called once it has imported the toolchain (a fork server after its
    preloads, with the roots its build named; a fresh child at its first check), and kept, so that its forked
    children inherit the record rather than read files changed since."""
    loaded_versions()
    if roots:
        code_digest(roots)


def check(wanted: dict[str, Any] | None) -> str | None:
    """Why this process must not run a job that expects `wanted`, or None."""
    if wanted is None:
        return None
    loaded = loaded_versions()
    differ = [f"{name} {have or 'absent'} (the build expects {wanted['versions'].get(name) or 'it absent'})"
              for name, have in loaded.items() if have != wanted["versions"].get(name)]
    if "code" in wanted and code_digest(tuple(wanted.get("roots", ()))) != wanted["code"]:
        differ.append("other epbuild code than the build's")
    if not differ:
        return None
    return (f"this job's process has {', '.join(differ)} loaded: the Python environment or epbuild changed during "
            "the build; run it again")
