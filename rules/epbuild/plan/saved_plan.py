"""`artifacts/.state/plan.record`: the last run's plan (the manifest read and checked, its targets resolved, the
builds and stages planned from it and the models' facts), taken instead of reading and planning again while
nothing it was made from changed. At 10,000 targets that work is most of task creation's own time.

What a plan is made from, all compared before it is taken: everything the no-op shortcut's project key holds (the
manifest's bytes, epbuild's sources, the host probe, the Python environment, the variables epbuild reads;
`fast_path.project_key`), this host's memory (the default memory limit), the identity of every file and folder
reading the manifest looked at and of every option file, and the models' facts as the external-data index has them
now (`tasks.project`). Of a model file itself reading the manifest only checks that it is a file (it reads no
byte: its facts are compared instead), so an edited model keeps the plan when its facts stay: such a model needs to
be a regular file still, and each folder above it the same folder, not a symbolic link (a resolved path, such as a
validation reference's, would change). A file changed after this run began reading is not vouched for: the plan
is then not saved.

The plan is typed JSON (`state.codec`), never a pickle: a checkout can bring this file, and reading it makes only
the manifest's, the builds' and the stages' own classes (`PLAN_CLASSES`), after its key and files checked out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from ..files.layout import file_identity
from ..logs import log
from ..manifest.builds import Build, Limits, Member, ResolvedTarget, ValidationSettings
from ..manifest.eps import QAIC, REGISTRY, EpInfo
from ..manifest.packages import PackageSpec
from ..manifest.parse import (
    BuildSpec,
    CacheSpec,
    ExecutorSpec,
    GroupSpec,
    Manifest,
    ModelSpec,
    QuantizeSpec,
    TargetSpec,
)
from ..manifest.qaic import QaicOptions
from ..manifest.stage import Stage, StageKind
from ..records import record
from ..state import codec
from ..state.folder import StateFolder
from ..state.records import VOUCHES, vouch
from .declared_inputs import Blocked


def _is_plain_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _folder(path: str) -> list[int] | None:
    """A folder's inode and kind (not its times: a model written beside the others changes those)."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return [found.st_ino, stat.S_IFMT(found.st_mode)]


def _folders_above(paths: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for path in paths:
        for parent in Path(path).parents:
            if str(parent) in seen:
                break
            seen[str(parent)] = None
    return list(seen)


@record
class Plan:
    """A manifest as read (`read`, typed JSON text, with its resolved targets) and as planned (`manifest`, with
    the models' facts and dims applied), the builds (before an executor's toolchains) and stages, and the facts
    planned from. The manifest as read is needed only to plan again when the facts changed: kept as text, a taken
    plan does not decode it (its size grows with the manifest)."""

    read: str | None  # None: not made yet (a fresh plan: `SavedPlan.save` makes it), or JSON cannot hold it
    resolved: dict[str, ResolvedTarget]
    facts: str  # the digest of what it was planned from (`digest`): external data, inputs and graph facts by model
    manifest: Manifest
    builds: list[Build]
    stages: dict[str, Stage]
    code: str  # the jobs' code digest (`execute.provenance.code_digest`), a function of the key's sources
    versions: dict[str, str | None]  # the distributions a job may load (`execute.provenance.versions`), likewise
    blocked: dict[str, Blocked]  # model -> why its NPU builds wait (`plan.declared_inputs.check_declared_inputs`)

    def as_read(self) -> Manifest:
        assert self.read is not None, "a plan whose manifest JSON cannot hold is never saved (`Plan.text`)"
        return codec.loads(self.read, PLAN_CLASSES)

    @staticmethod
    def digest(facts: Any) -> str:
        """The models' facts as a plan compares them, for equality only: the digest of their JSON with sorted keys
        (a model read just now lists its graph facts in another order than the index keeps them, and a dict's order
        means nothing here). Kept as a digest: decoding 3,000 small containers per 1,000 targets cost more than
        reading the models' facts themselves."""
        import hashlib
        import json

        external, *rest = facts
        text = json.dumps([{str(path): [str(file) for file in files] for path, files in external.items()}, *rest],
                          sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    @staticmethod
    def text(read: Manifest) -> str | None:
        """`read` as the plan keeps it; None when it holds a value typed JSON cannot (a TOML date in a model's
        settings): such a plan is not saved."""
        try:
            return codec.dumps(read, PLAN_CLASSES)
        except TypeError as exc:
            log(__name__, "debug", "plan not saved: %s", exc)
            return None


def _shaped(plan: Plan) -> bool:
    """Whether each field of a decoded plan holds what a plan holds (typed JSON checks the classes it makes, not
    what a field of one holds: a record whose `builds` was a string or `[1, 2, 3]` ended every run in an
    AttributeError)."""
    def mapping(value: Any, kind: type) -> bool:
        return type(value) is dict and all(type(k) is str and type(v) is kind for k, v in value.items())

    return (type(plan.builds) is list and all(type(build) is Build for build in plan.builds)
            and mapping(plan.stages, Stage) and mapping(plan.resolved, ResolvedTarget)
            and mapping(plan.blocked, Blocked) and type(plan.manifest) is Manifest
            and type(plan.code) is str and (plan.facts is None or type(plan.facts) is str)
            and type(plan.versions) is dict
            and (plan.read is None or type(plan.read) is str))


PLAN = "plan.record"
# Every class a plan holds: reading one makes these and nothing else (the EPs by their name in the code's table)
PLAN_CLASSES = codec.Classes(
    Plan, Manifest, ModelSpec, QuantizeSpec, TargetSpec, GroupSpec, BuildSpec, CacheSpec, ExecutorSpec, PackageSpec,
    ResolvedTarget, QaicOptions, ValidationSettings, Member, Build, Limits, Stage, StageKind, Blocked,
    constants={EpInfo: {**REGISTRY, "qaic-compile": QAIC}}, values=(ValidationSettings, Limits),
)


class SavedPlan:
    """Load the plan that still holds under `key`, or save a new one."""

    def __init__(self, state: Path, key: str):
        self.state = StateFolder(state)
        self.key = key
        self.unreadable = False

    def load(self) -> Plan | None:
        """The saved plan when its key and every file's identity match, else None (absent, unreadable, torn)."""
        written = self.state.read_key(PLAN)  # [this key, what the plan holds]: any holding under this key
        if type(written) is not list or len(written) != 2 or written[0] != self.key:
            return None
        saved = self.state.read_record(PLAN, written, PLAN_CLASSES)
        if saved is None or type(saved.get("plan")) is not Plan or not _shaped(saved["plan"]) \
                or type(saved.get("models")) is not list or type(saved.get("folders")) is not dict \
                or not all(type(p) is str for p in saved["models"]):
            self.unreadable = True  # under this key, yet no plan (a checkout's): written again, whatever it says
            return None
        if not all(_is_plain_file(path) for path in saved["models"]):
            return None
        if any(_folder(path) != identity for path, identity in saved["folders"].items()):
            return None
        return saved["plan"]

    def save(self, plan: Plan, started_ns: int, read: Manifest | None = None) -> None:
        """Save the plan, unless a file it was made from changed at or after `started_ns` (`now_ns` when this run
        began reading): its bytes then may not be those read. `read`: the manifest as read, for a fresh plan whose
        `read` is not made yet (it is made only when the record is written)."""
        if plan.read is None and read is None:
            return
        # the planned manifest has the models and files of the one read (planning sets only the models' facts)
        models = [path for path in dict.fromkeys(str(m.path) for m in plan.manifest.models.values())
                  if _is_plain_file(path)]
        plain = set(models)
        files: dict[str, list[int] | None] = {}
        looked_at = [*plan.manifest.reads, *(p for t in plan.resolved.values() for p in t.option_files.values())]
        for path in dict.fromkeys(str(p) for p in looked_at if str(p) not in plain):
            identity = file_identity(path)
            if identity is not None and identity[2] >= started_ns:
                return
            files[path] = identity
        folders = {path: _folder(path) for path in _folders_above(models)}
        # what the plan was made from besides its key (which names the manifest's bytes and epbuild's code): a
        # record written under both holds this very plan, and is not encoded again (a full-path run at 10,000
        # targets would spend longer on that than on the rest of its planning)
        holds = hashlib.sha256(json.dumps([plan.facts, files, models, folders]).encode()).hexdigest()
        key = [self.key, holds]
        if not self.unreadable and self.state.read_key(PLAN) == key:
            return
        if plan.read is None:
            assert read is not None, "checked on entry"
            plan = dataclasses.replace(plan, read=Plan.text(read))
            if plan.read is None:
                return
        try:
            self.state.write_record(PLAN, {"key": key, VOUCHES: vouch(files), "models": models, "folders": folders,
                                           "plan": plan}, PLAN_CLASSES)
        except TypeError as exc:  # a value typed JSON cannot hold (a TOML date in a model's settings): no shortcut
            log(__name__, "debug", "plan not saved: %s", exc)
