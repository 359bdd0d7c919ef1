"""Where the files a manifest names may be: inside the project (the manifest's folder), or under a folder the user
names in `EPBUILD_ROOTS`. Every file epbuild reads for a build can end up in an artifact folder, a package or a
cache entry (and from there in a shared remote): a manifest that names `/home/me/.aws/credentials` as an option
file must stop before anything is built, not publish it. Symbolic links are judged by where they point.

The extra roots come from the environment, not from the manifest: a pull request that names a file outside the
project could as easily name its folder as a root in the same manifest. Toolchain roots and the cache folder are
not data the build publishes, and stay where the user puts them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UserError

if TYPE_CHECKING:
    from .parse import Manifest

ROOTS = "EPBUILD_ROOTS"  # os.pathsep-separated absolute folders, beside the project, that manifests may name


def extra_roots() -> tuple[Path, ...]:
    """The folders `EPBUILD_ROOTS` names, resolved; one line naming the variable for an entry that is not an
    absolute path to a folder."""
    found = []
    for entry in os.environ.get(ROOTS, "").split(os.pathsep):
        if not entry:
            continue
        path = Path(entry)
        if not path.is_absolute() or not path.is_dir():
            raise UserError(ROOTS, None, f"{entry!r} is not an absolute path to a folder; give folders that hold "
                            f"files the manifest names, separated by '{os.pathsep}'")
        found.append(path.resolve())
    return tuple(found)


class Roots:
    """The project's folder and the extra roots, resolved once per reading of a manifest."""

    __slots__ = ("file", "folders", "project", "roots")

    def __init__(self, manifest: Path):
        self.file = manifest
        self.project = manifest.parent.resolve()
        self.roots = (self.project, *extra_roots())
        self.folders: dict[str, str] = {}  # a folder -> where it resolves: 10,000 models in one folder, one answer

    def resolved(self, path: Path) -> Path:
        """`path.resolve()`, its folder resolved once per reading: a file that is not a link resolves to its name
        in its folder's resolution; a link, or a path through `..`, is resolved whole."""
        if ".." in path.parts:  # abspath would drop `link/..` before the link is followed
            return path.resolve()
        absolute = os.path.abspath(path)
        folder, name = os.path.split(absolute)
        if not name or os.path.islink(absolute):
            return path.resolve()
        found = self.folders.get(folder)
        if found is None:
            found = self.folders[folder] = os.path.realpath(folder)
        return Path(found, name)

    def check(self, key_path: str, path: Path) -> Path:
        """`path` when it (or what it links to) lies inside a root; else one line naming the key and the fix."""
        resolved = self.resolved(path)
        if any(resolved.is_relative_to(root) for root in self.roots):
            return path
        target = f" (a link to {resolved})" if str(resolved) != os.path.normpath(path.absolute()) else ""
        roots = f" or {os.pathsep.join(str(r) for r in self.roots[1:])}" if len(self.roots) > 1 else ""
        raise UserError(self.file.name, key_path, f"{path}{target} is outside the project ({self.project}{roots}): "
                        f"files a manifest names are built, published and cached, so they must lie inside it; move "
                        f"it into the project, or name a folder that holds it in {ROOTS}")


def check_named_files(manifest: Manifest) -> None:
    """Every file the manifest itself names (models, calibration samples, validation inputs and references) inside
    a root; option files are checked where targets resolve them (`plan.targets`), a WinML config where it is read."""
    roots = Roots(manifest.path)
    for name, model in manifest.models.items():
        where = f"models.{name.split('.', 1)[0]}"  # a variant's files are its model's
        roots.check(f"{where}.path", model.path)
        for sample in (model.quantize.calibration or ()) if model.quantize else ():
            roots.check(f"{where}.quantize.calibration", sample)
        _validation_files(roots, f"{where}.validation", model.validation)
    for name, target in manifest.targets.items():
        _validation_files(roots, f"targets.{name}.validation", target.validation)


def _validation_files(roots: Roots, where: str, settings: dict[str, Any]) -> None:
    for key in ("inputs", "reference", "metric_file"):
        if key in settings:
            roots.check(f"{where}.{key.removesuffix('_file')}", settings[key])
    for path in settings.get("dataset", ()):
        roots.check(f"{where}.dataset", path)
