"""What a run does to the world before its tasks run, in one place and in the order it does it (`RunStart`). Loading
(`tasks.loading`) reads and plans; every write, removal and process start of that time is a step here, called at
the point where the next read needs it done or where its cost overlaps the most:

1. `folders`: artifacts/ checked writable (a build needs it; an inspecting command goes on without saving); a
   symbolic link a checkout put under it removed; `.state/` settled to this layout (emptied when it holds
   another's) before any record is read; doit's database moved from its old name and recovered when torn, before
   doit opens it (right after loading); scratch that killed builds left swept.
2. `servers`: on a first full build here, the fork servers its EPs use, started before the models are read, so
   that their imports overlap this process's; `servers_for` those of the targets of models that changed, while
   this process reads them.
3. `probe`: the host probe's child, started before the models are read (it registers the plugins meanwhile).
4. `keep`: the external-data index saved, and a fresh plan saved now, or by a build while its jobs run
   (`tasks.run_end.PlanSave`); only for a manifest that holds (a refused one writes nothing).

None of them waits for a task's first need, because none is a task's: doit opens its database before its first task,
loading reads `.state/` records, and the model reading and the availability check that decide which tasks exist run in
the servers and the probe; what can wait does (the plan saved while jobs run; an inspecting command starts and sweeps
nothing). What a run leaves at its end is `tasks.run_end`'s."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..execute.executor import ExecutorSettings
from ..execute.fork_server import fork_job, prestart, serving
from ..execute.host import HostProbe
from ..execute.links import Links
from ..execute.provenance import Provenance
from ..fast_path import DEP_FILE, LEGACY_DEP_FILE
from ..files.foreign import remove_links
from ..files.layout import Layout
from ..files.owners import sweep
from ..invocation import Invocation
from ..logs import log
from ..manifest.builds import ResolvedTarget
from ..manifest.eps import lookup
from ..manifest.parse import Manifest
from ..plan.external_data import ExternalDataIndex
from ..plan.saved_plan import Plan, SavedPlan
from ..state.folder import StateFolder
from ..state.registry import CONFIGS
from ..steps import vendor_shim
from ..steps.compilers import COMPILERS, compiler
from ..store.cache import Workspace, cache_location
from ..store.doit_database import migrate as migrate_doit_database
from ..store.doit_database import recover as recover_doit_database
from .project import Relative


class RunStart:
    """One run's start-up effects (the module's list), each a method loading calls once, in that order."""

    def __init__(self, invocation: Invocation, rel: Relative, links: Links, expect: Provenance):
        self.invocation, self.rel, self.links, self.expect = invocation, rel, links, expect

    def folders(self, manifest: Manifest) -> tuple[Layout, bool]:
        """artifacts/ checked and swept of killed builds' scratch, `.state/` and doit's database made this
        layout's; whether artifacts/ takes files."""
        layout = Layout(manifest.root / "artifacts")
        if layout.root.is_symlink():
            raise UserError(manifest.path.name, None, f"{layout.root} is a symbolic link (to "
                            f"{os.readlink(layout.root)}); outputs are written only inside the project: "
                            "make artifacts/ a plain folder")
        writable = check_writable(manifest, layout, self.invocation, self.rel)
        if not writable:
            return layout, False
        for path in remove_links(layout.root):
            print(f"warning: removed {self.rel(Path(path))}: a symbolic link under artifacts/, where epbuild makes "
                  "none (a checkout's files are data: a build never writes through one)", file=sys.stderr)
        emptied = StateFolder(layout.state).settle()
        if emptied in ("owner", "unstamped"):  # its records, and doit's beside them, vouch for nothing here
            Path(DEP_FILE).absolute().unlink(missing_ok=True)
        if emptied == "owner":
            print(f"warning: {self.rel(layout.state)} was not written by this user here (a checkout's, another "
                  "user's or machine's): emptied, with doit's database; every artifact is checked afresh",
                  file=sys.stderr)
        elif emptied:  # another layout, or an older epbuild's folder without an owner stamp: one full check
            log(__name__, "info", "%s held another layout's state: emptied (one full check)", layout.state)
        if migrate_doit_database(Path(DEP_FILE).absolute(), Path(LEGACY_DEP_FILE).absolute()):
            log(__name__, "info", "doit's database moved from %s to %s", LEGACY_DEP_FILE, DEP_FILE)
        said = recover_doit_database(Path(DEP_FILE).absolute())
        if said:
            print(f"warning: {said}", file=sys.stderr)
        if not self.invocation.inspecting:  # what killed builds left behind
            sweep([layout.scratch_root, Path(cache_location(manifest.cache)[0]) / "tmp"])
        return layout, True

    def servers(self, manifest: Manifest, layout: Layout, default_run: bool) -> set[str]:
        """On a first full build here (no settings record yet), the fork servers it will use, started now: their
        imports overlap this process's start-up."""
        if not default_run or StateFolder(layout.state).path(CONFIGS).exists():
            return set()
        servers = first_build_servers(manifest)
        prestart(self.links, servers, self.expect)
        return servers

    def servers_for(self, manifest: Manifest, changed: AbstractSet[Path]) -> None:
        """The servers of the targets of models that changed (their builds run next), started while this process
        reads them (on a CI runner after a commit none is running)."""
        prestart(self.links, first_build_servers(manifest, {name for m in manifest.models.values()
                                                             if m.path in changed for name in m.targets}), self.expect)

    def probe(self, targets: list[ResolvedTarget], layout: Layout, workspace: Workspace,
              executor: ExecutorSettings | None,
              servers: AbstractSet[str] = frozenset()) -> tuple[HostProbe | None, dict[str, Any]]:
        """The host probe, started when a target may need it (an EP inside ONNX Runtime): its child registers
        the plugins while this process waits for the model reading, forked by one of the fork servers this build
        started (`servers`), which has imported onnxruntime already (a second Python importing it beside them would
        slow both on a small runner), else a fresh Python; and the vendor-id shim it runs under (the shim's
        library is part of the probe's key)."""
        used = [t for t in targets if not t.is_cpu]
        if executor or not any(compiler(t).in_onnxruntime for t in used):
            return None, {}
        shim = vendor_shim.prepare(workspace.cache_dir, layout.state) if any(t.ep.vendor_shim for t in used) else {}
        links, expect = self.links, self.expect
        alias = next((a for a in sorted(servers) if serving(links, a, expect)), None)

        def fork(arguments: list[str], output: Path, folder: Path) -> Any:
            return fork_job(links, "epbuild.execute.host", alias or "", arguments, output, folder, expect=expect)

        return HostProbe(layout.state, expect.version, fork if alias is not None else None), shim

    def keep(self, index: ExternalDataIndex, saved_plan: SavedPlan, fresh: Plan | None, started: int,
             read: Any) -> Callable[[], None] | None:
        """Save the external-data index and a fresh plan; a build's plan is returned to be saved while its jobs
        run (encoding it at 10,000 targets takes longer than the rest of planning)."""
        index.save()
        if fresh is None:
            return None
        save_plan = functools.partial(saved_plan.save, fresh, started, read)
        if self.invocation.default_run:
            return save_plan
        save_plan()
        return None


def check_writable(manifest: Manifest, layout: Layout, invocation: Invocation, rel: Relative) -> bool:
    """Whether artifacts/ takes files: a build needs it (one line and exit 2 when not); listing and the other
    inspecting commands go on without saving their state, with one warning. Asked of the file system, not tried:
    a manifest refused later must have written nothing."""
    folder = next(p for p in (layout.state, *layout.state.parents) if p.exists())
    if os.access(folder, os.W_OK):
        return True
    why = "Read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else "Permission denied"
    where = rel(layout.root)
    if not invocation.inspecting:
        raise UserError(manifest.path.name, None, f"{where}/ is not writable: {why}; outputs are written "
                        "there (make it writable, or build in a copy)")
    print(f"warning: {where}/ is not writable ({why}): nothing is saved for the next run", file=sys.stderr)
    return False


def first_build_servers(manifest: Manifest, targets: set[str] | None = None) -> set[str]:
    """The fork servers a first full build here (`doit` with no settings record yet: a clean checkout, CI)
    certainly uses: those of its ONNX Runtime targets' EPs (of `targets` only, when given)."""
    specs = [t for name, t in manifest.targets.items() if (targets is None or name in targets)
             and t.ep and (backend := COMPILERS.get(t.compiler)) and backend.in_onnxruntime]
    return {info.fork_server_for(t.options) for t in specs if (info := lookup(t.ep or ""))}
