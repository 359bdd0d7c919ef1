"""Where the files a manifest names may be: inside the project (the manifest's folder), or under a folder the user
names in `EPBUILD_ROOTS`. Every file epbuild reads for a build can end up in an artifact folder, a package or a
cache entry (and from there in a shared remote): a manifest that names `/home/me/.aws/credentials` as an option
file must stop before anything is built, not publish it. Symbolic links are judged by where they point.

The extra roots come from the environment, not from the manifest: a pull request that names a file outside the
project could as easily name its folder as a root in the same manifest. Toolchain roots and the cache folder are
not data the build publishes, and stay where the user puts them."""

from __future__ import annotations

import os
import stat
import sys
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

    __slots__ = ("file", "folders", "inside", "project", "roots")

    def __init__(self, manifest: Path):
        self.file = manifest
        self.project = manifest.parent.resolve()
        self.roots = (self.project, *extra_roots())
        self.folders: dict[str, str] = {}  # a folder -> where it resolves: 10,000 models in one folder, one answer
        self.inside: dict[str, bool] = {}  # a folder -> whether its resolution lies inside a root

    def _folder(self, folder: str) -> str:
        found = self.folders.get(folder)
        if found is None:
            found = self.folders[folder] = os.path.realpath(folder)
        return found

    def resolved(self, path: Path, link: bool | None = None) -> Path:
        """`path.resolve()`, its folder resolved once per reading: a file that is not a link resolves to its name
        in its folder's resolution; a link, or a path through `..`, is resolved whole. `link`: whether `path` is a
        symbolic link, when the caller has just found out (else looked up)."""
        if ".." in path.parts:  # abspath would drop `link/..` before the link is followed
            return path.resolve()
        absolute = os.path.abspath(path)
        folder, name = os.path.split(absolute)
        if not name or (os.path.islink(absolute) if link is None else link):
            return path.resolve()
        return Path(self._folder(folder), name)

    def check(self, key_path: str, path: Path, link: bool | None = None) -> Path:
        """`path` when it (or what it links to) lies inside a root; else one line naming the key and the fix. A
        file that is not a link lies where its folder's resolution does: answered once per folder (building and
        comparing a resolved path per file was most of reading a manifest of 10,000 models)."""
        if ".." not in path.parts:
            absolute = os.path.abspath(path)
            folder, name = os.path.split(absolute)
            if name and not (os.path.islink(absolute) if link is None else link):
                inside = self.inside.get(folder)
                if inside is None:
                    real = Path(self._folder(folder))
                    inside = self.inside[folder] = any(real.is_relative_to(root) for root in self.roots)
                if inside:
                    return path
        resolved = self.resolved(path, link)
        if any(resolved.is_relative_to(root) for root in self.roots):
            return path
        target = f" (a link to {resolved})" if str(resolved) != os.path.normpath(path.absolute()) else ""
        roots = f" or {os.pathsep.join(str(r) for r in self.roots[1:])}" if len(self.roots) > 1 else ""
        raise UserError(self.file.name, key_path, f"{path}{target} is outside the project ({self.project}{roots}): "
                        f"files a manifest names are built, published and cached, so they must lie inside it; move "
                        f"it into the project, or name a folder that holds it in {ROOTS}")

    def check_file(self, key_path: str, path: Path, what: str) -> Path:
        """`check` of a file that must be a regular file (or a link to one): one `lstat` answers both questions
        for a file that is not a link (a manifest of 10,000 models asked each twice)."""
        try:
            mode = os.lstat(path).st_mode
        except (OSError, ValueError):  # absent, unreadable, a name with NUL
            mode = 0
        link = stat.S_ISLNK(mode)
        if not (stat.S_ISREG(mode) or (link and os.path.isfile(path))):
            raise UserError(self.file.name, key_path, f"{what} {not_a_file(path)}: {path}")
        return self.check(key_path, path, link)


def not_a_file(path: Path) -> str:
    """Why `path`, which is not a regular file, cannot be read as one: a FIFO would block the reader forever; a
    name this process's locale cannot spell (an ASCII locale, a name with 'ü') is no missing file."""
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        return (f"cannot be named in this locale's file-name encoding ({sys.getfilesystemencoding()}): run with a "
                "UTF-8 locale (LANG=C.UTF-8) or PYTHONUTF8=1")
    if path.is_dir():
        return "is a folder"
    if path.exists():
        return "is not a regular file (a FIFO, socket or device)"
    return "not found"


def check_named_files(manifest: Manifest) -> None:
    """Every file the manifest itself names (models, calibration samples, validation inputs and references) inside
    a root; option files are checked where targets resolve them (`plan.targets`), a WinML config where it is read."""
    roots = Roots(manifest.path)
    checked = set()
    for name, model in manifest.models.items():
        where = f"models.{name.split('.', 1)[0]}"  # a variant's files are its model's
        if model.path not in checked:  # the variants of a model share its file
            checked.add(model.path)
            roots.check_file(f"{where}.path", model.path, "model file")
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
    for path in settings.get("metric_files", ()):
        roots.check(f"{where}.metric", path)
