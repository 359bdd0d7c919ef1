"""A content-addressed artifact cache that many builders and machines can share.

An entry is a folder of output files named by the fingerprint of everything that shapes them, with a record
(`.epbuild-entry.json`) of every file's sha256 beside them. Entries are written under a temporary name and renamed
into place, and a lock per fingerprint (`epbuild.files.locks`) makes concurrent builders (doit -n, several CI jobs)
wait for each other instead of compiling the same fingerprint twice. A restore verifies every file; a corrupted
or tampered entry is evicted with a warning and the caller rebuilds. With a size cap, least-recently-used entries
are evicted. (Entries of the layout before `entries-v2/`, under `entries/`, are no longer read.)

With a remote (`[cache] remote`, `epbuild.store.remote_cache`) the local cache is the first level: a local miss looks
there, a remote hit is downloaded into the local cache, verified, and restored from it; what is produced is
stored locally and uploaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..contracts.task_result import recorded_peaks
from ..errors import BuildError, UserError, json_value
from ..execute.executor import JobContext
from ..execute.links import Links
from ..execute.provenance import Provenance
from ..files.hashing import changed_inputs
from ..files.layout import RECORD, Layout, size_of
from ..files.locks import fingerprint_lock, fingerprint_lock_if_free
from ..files.owners import owner_tag
from ..files.publish import copy_file, discard, publish, scratch_dir
from ..logs import log, warn, warn_once
from ..manifest.parse import CacheSpec
from ..manifest.schema import s3_url
from ..records import record
from ..state.hash_memory import FileHashes

if TYPE_CHECKING:
    from ..execute.executor import ExecutorSettings
    from .remote_cache import RemoteCache

ENTRIES = "entries-v2"  # <cache>/entries-v2/<fingerprint>/: the output files and RECORD beside them
R = TypeVar("R")  # what a step's job gives (`through_cache`)
T = TypeVar("T")  # what the step makes of the output, restored or produced


def default_dir() -> Path:
    """The per-user default: $XDG_CACHE_HOME/epbuild or ~/.cache/epbuild."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "epbuild"


def cache_location(spec: CacheSpec) -> tuple[Path, int | None]:
    """(folder, size cap in bytes): EPBUILD_CACHE_DIR, else `[cache] dir`, else the per-user default."""
    folder = os.environ.get("EPBUILD_CACHE_DIR") or spec.dir or default_dir()
    cap = int(spec.max_size_mb * 1024 * 1024) if spec.max_size_mb else None
    return Path(folder).absolute(), cap


def remote_location(spec: CacheSpec) -> str | None:
    """EPBUILD_CACHE_REMOTE when set (empty: no remote), else `[cache] remote`."""
    url = os.environ.get("EPBUILD_CACHE_REMOTE")
    if url is None:
        return spec.remote
    problem = s3_url(url) if url else None
    if problem:
        raise UserError("EPBUILD_CACHE_REMOTE", None, problem)
    return url or None


class ArtifactCache:
    """The local cache. It is never a point of failure: a folder that cannot be written (read-only, full) costs one
    warning, and the build goes on restoring what it can and storing nothing."""

    def __init__(self, folder: Path, hashes: FileHashes, max_bytes: int | None = None, hard_links: bool = False,
                 said: Path | None = None):
        self.folder, self.hashes, self.max_bytes = folder, hashes, max_bytes
        self.said = said  # the marker of its one warning per build (`logs.warn_once`)
        self.hard_links = hard_links  # `[cache] hard_links`: entries and artifacts share their files
        self.unusable: str | None = None  # why this process stopped writing to it

    def give_up(self, exc: OSError, action: str) -> None:
        """The one warning of this build about the local cache (each of its processes skips later stores once it
        meets the fault itself)."""
        if self.unusable is None:
            self.unusable = f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}"
            warn_once(self.said, f"local cache {self.folder} unusable while {action} ({self.unusable}); building "
                                 "without storing in it for the rest of this build")

    def entry_folder(self, fingerprint: str) -> Path:
        return self.folder / ENTRIES / fingerprint

    @contextmanager
    def lock(self, fingerprint: str) -> Iterator[None]:
        """Held while looking up, building and storing one fingerprint (not held where the cache's folder takes no
        lock file: then concurrent builders may both produce it)."""
        with contextlib.ExitStack() as held:
            if self.unusable is None:
                try:
                    held.enter_context(fingerprint_lock(self.folder / "locks", fingerprint))
                except OSError as exc:
                    self.give_up(exc, "locking")
            yield

    def restore(self, fingerprint: str, destination: Path) -> list[str] | None:
        """Put copies of the entry's files into `destination`; None on a miss, which leaves `destination`
        untouched.

        Every file is checked against the sha256 recorded when it was stored; any mismatch evicts the entry."""
        entry = self.entry_folder(fingerprint)
        try:
            recorded = json_value((entry / RECORD).read_text())["files"]
        except (OSError, ValueError, KeyError):
            if entry.exists():
                self._evict(entry, f"its {RECORD} is unreadable")
            return None
        for name, digest in recorded.items():
            try:
                actual = self.hashes.sha256(entry / name)
            except OSError:
                actual = "missing"
            if actual != digest:
                self._evict(entry, f"{name} does not match its recorded sha256")
                return None
        destination.mkdir(parents=True, exist_ok=True)
        copied: list[Path] = []
        try:
            for name in recorded:
                target = destination / name
                if "/" in name:
                    target.parent.mkdir(parents=True, exist_ok=True)
                copy_file(entry / name, target, self.hard_links)
                copied.append(target)
                self.hashes.copied(target, recorded[name])
        except FileNotFoundError:
            # evicted meanwhile: a restore that holds no lock (a small CPU reference, which two targets may compute
            # at once) can meet another builder's store under the cap. A miss, like any other: nothing restored
            for target in copied:
                target.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):  # a read-only cache restores all the same
            os.utime(entry)  # recency for least-recently-used eviction
        return sorted(recorded)

    def staging(self, fingerprint: str) -> Path:
        """A private folder inside the cache (so entries are renamed into place, never copied across disks)."""
        if self.unusable is not None:
            raise OSError(self.unusable)
        staging_root = self.folder / "tmp"
        staging_root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{fingerprint[:16]}.{owner_tag()}.", dir=staging_root))

    def store(self, fingerprint: str, source: Path, names: list[str], adopt: bool = False,
              digests: dict[str, str] | None = None) -> dict[str, str]:
        """Put `names` from `source` into a new entry, atomically, and return their sha256s; an existing entry is
        kept. The files are linked (or copied) into a staging folder, unless `adopt`: then `source` is a staging
        folder of this cache (`staging()`) that becomes the entry itself, anything else in it removed. `digests`:
        their sha256s where already known (checked while downloading)."""
        if RECORD in names:
            raise BuildError(f"an output is named {RECORD}, a name the artifact cache reserves for its own record")
        if self.unusable is not None:
            return {}
        try:
            return self._store(fingerprint, source, names, adopt, digests)
        except OSError as exc:
            self.give_up(exc, "storing")
            return {}

    def _store(self, fingerprint: str, source: Path, names: list[str], adopt: bool,
               digests: dict[str, str] | None) -> dict[str, str]:
        entry = self.entry_folder(fingerprint)
        if entry.exists():
            try:
                return json_value((entry / RECORD).read_text())["files"]
            except (OSError, ValueError, KeyError):
                if not adopt:
                    return {name: self.hashes.sha256(source / name) for name in names}
                shutil.rmtree(entry, ignore_errors=True)  # incomplete: replaced by the adopted folder
        staging = source if adopt else self.staging(fingerprint)
        try:
            if adopt:  # what a child left beside the outputs (its working folder) is not part of the entry
                for leftover in set(os.listdir(staging)) - {name.split("/")[0] for name in names}:
                    if (staging / leftover).is_dir():
                        discard(staging / leftover)
                    else:
                        (staging / leftover).unlink()
            else:
                for name in names:
                    if "/" in name:
                        (staging / name).parent.mkdir(parents=True, exist_ok=True)
                    copy_file(source / name, staging / name, self.hard_links)
            # hashed from `source` (the copy has the same bytes): the published folder keeps those files, whose
            # digests this process then knows
            files = dict(digests) if digests else {name: self.hashes.sha256(source / name) for name in names}
            (staging / RECORD).write_text(json.dumps({"files": files, "stored": time.time()}, indent=1))
            entry.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, entry)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not entry.exists():
                raise
        self._enforce_cap(keep=entry)
        return files

    def _entries(self) -> list[Path]:
        return list((self.folder / ENTRIES).glob("*"))

    def usage(self) -> tuple[int, int]:
        """(entries, bytes) held now."""
        entries = self._entries()
        return len(entries), sum(size_of(entry) for entry in entries)

    def evict(self, fingerprint: str, why: str | None) -> None:
        """Remove the entry of `fingerprint` (found wrong by its user), with a warning saying `why` (None: the
        caller has said it)."""
        self._evict(self.entry_folder(fingerprint), why)

    def _evict(self, entry: Path, why: str | None) -> None:
        if why is not None:
            warn(f"cache entry {entry.name[:16]} evicted: {why}; rebuilding")
        doomed = self.folder / "tmp" / f"evicted.{entry.name}.{owner_tag()}"
        doomed.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(entry, doomed)
        except OSError:
            return
        shutil.rmtree(doomed, ignore_errors=True)

    def _enforce_cap(self, keep: Path) -> None:
        """Evict least-recently-used entries until the cap holds, never `keep`, the entry just stored: the caller
        restores or uploads from it next (a cap below one entry's size then holds that one entry until the next
        store); nor an entry whose fingerprint's lock another builder holds (`doit -n`: it is being restored or
        uploaded from, and would be pulled from under it)."""
        if self.max_bytes is None:
            return
        entries = []
        for entry in self._entries():
            with contextlib.suppress(OSError):  # another builder evicting it at the same time
                entries.append((entry.stat().st_mtime, size_of(entry), entry))
        total = sum(size for _, size, _ in entries)
        for _, size, entry in sorted(entries):
            if total <= self.max_bytes:
                break
            if entry == keep:
                continue
            named = len(entry.name) == 64 and all(c in "0123456789abcdef" for c in entry.name)
            with fingerprint_lock_if_free(self.folder / "locks", entry.name) if named else \
                    contextlib.nullcontext(True) as free:
                if free:
                    shutil.rmtree(entry, ignore_errors=True)
                    total -= size


@record
class Workspace:
    """Where tasks write: the artifacts folder and the cache. Plain data, so it travels to doit's workers;
    the hash memory and the cache are opened once per process on first use."""

    artifacts: Path
    cache_dir: Path
    cache_max_bytes: int | None
    remote_url: str | None = None
    executor: ExecutorSettings | None = None  # a Dask cluster that produces what the caches miss
    hard_links: bool = False  # `[cache] hard_links`
    remote_budget_s: float = 60.0  # `[cache] remote_budget_s`
    remote_timeout_s: float = 10.0  # `[cache] remote_timeout_s`
    memory_gb: float | None = None  # `[build] memory_gb`: the budget memory admission holds jobs to
    # what this run's fingerprints and job requests name (the saved plan's, or read when the run starts), given by
    # whoever makes the workspace (its roots are the steps'): never a reading of this layer's own
    provenance: Provenance = dataclasses.field(kw_only=True)
    # the build's process (this one's mark, taken where the build starts; doit's workers get a copy): what its
    # processes said once is marked under it, in a folder swept when that process is gone
    run: str = dataclasses.field(default_factory=owner_tag)
    # the build's fork-server leases, Dask clients and remote connections (`execute.links`), made with it
    links: Links = dataclasses.field(default_factory=Links)

    def said(self, what: str) -> Path:
        """The marker of a warning this build says once (`logs.warn_once`), whichever of its processes meets it."""
        return self.layout.scratch_root / f"said.{self.run}" / what

    @property
    def project_root(self) -> Path:
        return self.artifacts.parent

    @property
    def layout(self) -> Layout:
        return Layout(self.artifacts)

    @functools.cached_property
    def hashes(self) -> FileHashes:
        return FileHashes(self.layout.state)

    @functools.cached_property
    def last_peaks(self) -> dict[str, float]:
        """What each task's job held at its peak in the runs so far (the build report's), read when a job first
        asks in this process: the expectation memory admission holds for it (`steps.expected_peak`)."""
        return recorded_peaks(self.layout.build_report)

    @functools.cached_property
    def cache(self) -> ArtifactCache:
        return ArtifactCache(self.cache_dir, self.hashes, self.cache_max_bytes, self.hard_links,
                             self.said("local-cache"))

    @property
    def remote(self) -> RemoteCache | None:
        """The process's connection to the remote, if one is configured (boto3 is imported on first request)."""
        if self.remote_url is None:
            return None
        from .remote_cache import connect

        return connect(self.links, self.remote_url, self.remote_budget_s, self.remote_timeout_s,
                       self.said("remote-cache"))

    def job_context(self) -> JobContext:
        """What a job on the cluster needs of this build (`execute.executor`): no more than that."""
        assert self.executor is not None, "only a build with an executor sends jobs to a cluster"
        return JobContext(self.executor, self.layout, self.links, self.provenance.code, self.remote_url)

    def fetch_into(self, fingerprint: str, scratch: Path, task: str) -> int | None:
        """`execute.executor.OutputCache`: a worker's upload through the remote and the local cache into
        `scratch`, verified on the way; the bytes downloaded, None when it could not be fetched."""
        remote = self.remote
        downloaded = remote.fetch(fingerprint, self.cache, task) if remote else None
        if downloaded is None or self.cache.restore(fingerprint, scratch) is None:
            return None
        return downloaded


@record
class Outcome:
    """Where an output came from, for the printed line and the build report."""

    origin: str | None  # "local" or "remote" when restored, None when produced
    downloaded: int = 0  # bytes from the remote
    uploaded: int = 0  # bytes to the remote

    @property
    def restored(self) -> bool:
        return self.origin is not None

    def report(self) -> dict[str, Any]:
        """The build report's fields: `from` when restored, `remote_bytes` when anything moved."""
        moved = {"remote_bytes": {"down": self.downloaded, "up": self.uploaded}} if (
            self.downloaded or self.uploaded) else {}
        return {**({"from": self.origin} if self.origin else {}), **moved}


def produced_files(folder: Path) -> list[str]:
    """Every file under `folder`, as sorted relative paths."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def with_download(outcome: Outcome, ran: dict[str, Any]) -> Outcome:
    """`outcome` plus the bytes a Dask job's outputs took through the remote (`ran["downloaded"]`)."""
    moved = ran.get("downloaded", 0)
    return dataclasses.replace(outcome, downloaded=outcome.downloaded + moved) if moved else outcome


def restore(label: str, fingerprint: str, workspace: Workspace, scratch: Path) -> tuple[list[str] | None, Outcome]:
    """The entry's files into `scratch` from the local cache, else from the remote through the local cache."""
    found = workspace.cache.restore(fingerprint, scratch)
    if found is not None:
        return found, Outcome("local")
    remote = workspace.remote
    downloaded = None
    if remote and workspace.cache.unusable is None:  # a download lands in the local cache first
        try:
            downloaded = remote.fetch(fingerprint, workspace.cache, label)
        except OSError as exc:
            workspace.cache.give_up(exc, "downloading")
    if downloaded is None:
        return None, Outcome(None)
    found = workspace.cache.restore(fingerprint, scratch)
    return found, Outcome("remote" if found is not None else None, downloaded)


def store(label: str, fingerprint: str, workspace: Workspace, folder: Path, names: list[str],
          identity: dict[str, Any], adopt: bool = False) -> int:
    """Keep what was produced in the local cache (with `adopt`, `folder` is a staging folder of the cache and
    becomes the entry) and upload it to the remote; bytes uploaded."""
    digests = workspace.cache.store(fingerprint, folder, names, adopt)
    remote = workspace.remote
    if remote is None or sorted(digests) != sorted(names):  # an older local entry holds other files: keep it local
        return 0
    return remote.upload(fingerprint, workspace.cache.entry_folder(fingerprint) if adopt else folder, digests,
                         identity, label)


def _refuse_entry(label: str, fingerprint: str, workspace: Workspace, outcome: Outcome, why: str) -> None:
    """An entry restored whole but not what its task writes: evicted here, and refused on the remote it came
    from, so that what this build produces replaces it in both (never kept, never restored again)."""
    remote = workspace.remote if outcome.origin == "remote" else None
    if remote is not None:
        remote.refuse(fingerprint, label, why)
    workspace.cache.evict(fingerprint, None if remote is not None else why)


def _holds(final: Path, scratch: Path, names: list[str], workspace: Workspace) -> bool:
    """Whether `final` holds the files `names` of `scratch`, byte for byte (what was added beside them after
    they were published, such as their validation report, belongs to these very bytes)."""
    try:
        return all((final / name).is_file() and
                   workspace.hashes.sha256(final / name) == workspace.hashes.sha256(scratch / name) for name in names)
    except OSError:
        return False


def check_inputs(label: str, inputs: dict[Path, list[int] | None]) -> None:
    """Refuse to store or publish when an input changed after it was hashed: the job may have read other bytes
    than its fingerprint names."""
    moved = changed_inputs(inputs)
    if moved:
        raise BuildError(f"{label}: {moved[0].name} changed while {label} ran; run again")


@record
class Cached:
    """An output kept in the caches under its fingerprint, as a step hands it to the one protocol (`through_cache`)."""

    label: str  # the task, for lines and the remote's manifest
    fingerprint: str
    inputs: dict[Path, list[int] | None]  # the inputs' identities before they were hashed (`hashing.snapshot`)
    identity: dict[str, Any]  # tool versions, host: into the remote's manifest, for people reading it
    expected: list[str] | None = None  # the files an entry holds; None: whatever the tool writes


def through_cache(step: Cached, workspace: Workspace, folder: Path, produce: Callable[[Path], R],
                  keep: Callable[[R], list[str] | None], use: Callable[[Path, list[str] | None, R | None], T],
                  abandon: Callable[[], None] | None = None, *, locked: bool = True) -> tuple[T, Outcome]:
    """The cache protocol every cached output goes through (a stage, a compile or group, a validation's verdict),
    under the fingerprint's lock so that two builders never produce it twice: restore the entry into `folder`
    (local cache, else the remote through it); when it holds what the step expects, check the inputs and hand it to
    `use(folder, found, None)`. Else `produce(folder)`, check the inputs (one changed while the job ran: the job may
    have read other bytes than the fingerprint names), store the files `keep(result)` names (None: nothing, a
    failure is worth checking again) and hand the result to `use(folder, None, result)`. An entry holding other
    files than expected is refused (evicted, and refused on the remote it came from) and produced again.
    `abandon()` runs under the lock when anything fails, so that what it removes is never a concurrent builder's.
    `locked=False`: without the lock, for a by-product cheaper to compute twice than to wait for (a small model's
    CPU reference, computed by the validation that needs it)."""
    with workspace.cache.lock(step.fingerprint) if locked else contextlib.nullcontext():
        try:
            found, outcome = restore(step.label, step.fingerprint, workspace, folder)
            log(__name__, "debug", "%s: %s for %s", step.label, f"restored from the {outcome.origin} cache"
                if found is not None else "not in the caches: producing", step.fingerprint[:16])
            if found is not None and (step.expected is None or found == step.expected):
                check_inputs(step.label, step.inputs)
                return use(folder, found, None), outcome
            if found is not None:  # a miss leaves the folder empty
                discard(folder)
                _refuse_entry(step.label, step.fingerprint, workspace, outcome,
                              f"it holds {found}, not {step.expected}")
            folder.mkdir(parents=True, exist_ok=True)
            result = produce(folder)
            check_inputs(step.label, step.inputs)
            names = keep(result)
            uploaded = (store(step.label, step.fingerprint, workspace, folder, names, step.identity)
                        if names is not None else 0)
            return use(folder, None, result), Outcome(None, outcome.downloaded, uploaded)
        except BaseException:
            if abandon is not None:
                abandon()
            raise


def cached_folder(label: str, fingerprint: str, workspace: Workspace, final: Path, expected: list[str] | None,
                  produce: Callable[[Path], None], identity: dict[str, Any],
                  inputs: dict[Path, list[int] | None], publishing: Callable[[Path], None] | None = None) -> Outcome:
    """A folder output through the cache protocol (`through_cache`): restored, or `produce(scratch)` with what it
    wrote stored (exactly `expected`, or whatever the tool decides when None); then published atomically.
    `publishing(scratch)` adds what is not cached (names outside the fingerprint) and may refuse. A failure leaves
    neither the scratch folder nor an older `final` behind."""
    label_text = label.replace(":", ".").replace("@", ".").replace("[", ".")
    scratch = scratch_dir(workspace.layout.scratch_root, label_text)

    def kept(_: None) -> list[str]:
        produced = produced_files(scratch)
        if expected is not None and produced != expected:
            raise BuildError(f"{label}: wrote {produced}, expected {expected}")
        return produced

    def published(folder: Path, found: list[str] | None, _: None) -> None:
        if publishing is not None:
            publishing(folder)
        if found is not None and _holds(final, folder, found, workspace):
            # another builder has just published these very bytes: replacing the folder would pull it from under
            # a compile of that builder that reads from it (a stage's output)
            discard(folder)
            return
        publish(folder, final)

    return through_cache(Cached(label, fingerprint, inputs, identity, expected), workspace, scratch, produce, kept,
                         published, lambda: discard(scratch, final))[1]
