"""A build's links to the helpers its jobs run through: which fork servers refused it, which it started, the warm
worker each of its threads leases, its Dask clients and its remote-cache connections. One object, made where the
build starts (`tasks.loading`, a Dask worker's job), carried on the `Workspace` and handed to every job
(`execute.child.run_child(links=...)`): nothing of it lives in a module, so two builds in one process (tests, an
embedding program) never share a lease or a refusal, and a job run without a build's links leases nothing that
outlives it.

A process forked from the one that made the links (doit's `-n` workers) keeps the refusals and the started
servers (facts about the host) but not the leases: those are the parent's connections, and their copies would keep
its warm workers leased after the parent let them go."""

from __future__ import annotations

import json
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .warm_start import Candidate

# The shape stage's fork server: it also loads onnxruntime's shape tools with sympy (in every other server that
# larger heap made each forked job ~15 ms slower: the child's allocations copy more of the inherited pages).
SHAPE_STAGE = "shape-stage"


class JobModules(NamedTuple):
    """What a fork server imports ahead of the jobs it will run, named by the layer whose jobs they are
    (`steps.job_modules`: nothing here imports above itself): `idle`, imported once the server serves and no job
    runs; `calls`, (server alias, module, function) called before that server listens (the shape stage's tools);
    `code`, the roots of the code digest the build's jobs expect (`execute.provenance.code_digest`), read by the
    server once it has imported them, so a job it forks is judged by the code it loaded, not by files changed since.
    Handed to a server on its command line (`argument`, `of`); none named, a server imports what each job needs.
    A named tuple, not a record: `epbuild.dodo` imports it before the no-op shortcut, which must stay cheap."""

    idle: tuple[str, ...] = ()
    calls: tuple[tuple[str, str, str], ...] = ()
    code: tuple[str, ...] = ()

    def argument(self) -> str:
        return json.dumps([list(self.idle), [list(call) for call in self.calls], list(self.code)])

    @classmethod
    def of(cls, text: str) -> JobModules:
        """What `argument` wrote; ValueError for anything else."""
        found = json.loads(text)
        if not (isinstance(found, list) and len(found) == 3 and all(isinstance(m, str) for m in found[0])
                and all(isinstance(c, list) and len(c) == 3 and all(isinstance(p, str) for p in c) for c in found[1])
                and all(isinstance(r, str) for r in found[2])):
            raise ValueError(f"not a list of job modules: {text[:80]}")
        return cls(tuple(found[0]), tuple((alias, module, function) for alias, module, function in found[1]),
                   tuple(found[2]))

    def calls_for(self, alias: str) -> list[tuple[str, str]]:
        return [(module, function) for server, module, function in self.calls if server == alias]


NO_MODULES = JobModules()


class Links:
    """Mutable by design: connections are made on first use and dropped when they fail. Compared by identity.
    `modules`: what the fork servers this build starts import ahead of its jobs."""

    def __init__(self, modules: JobModules = NO_MODULES) -> None:
        self.modules = modules
        self.lock = threading.Lock()  # doit's `-P thread` workers share one build's links
        self.refused: dict[str, str] = {}  # fork server key -> why it cannot serve (jobs use plain children)
        self.prestarted: dict[str, tuple[Any, float]] = {}  # fork server key -> its starter (Popen), when run
        self.leases: dict[tuple[str, int, int], Any] = {}  # (server socket, process, thread) -> its warm worker
        self.dask: dict[str, Any] = {}  # scheduler address -> client (made on first job, never before doit forks)
        self.remote: dict[str, Any] = {}  # remote cache URL -> its `RemoteCache` (one warning and budget per build)
        # a first build's server imports, begun with the build (`execute.warm_start`): the first server it starts
        # adopts them; let go (`Candidate.discard`) once the project is loaded, before doit forks any worker
        self.early: Candidate | None = None
        forget = weakref.WeakMethod(self._forget_inherited)
        os.register_at_fork(after_in_child=lambda: (method := forget()) is not None and method())

    def _forget_inherited(self) -> None:
        leases, self.leases = list(self.leases.values()), {}
        for lease in leases:
            lease.connection.close()
        self.dask = {}  # a client's threads do not survive a fork
        self.lock = threading.Lock()

    def close(self) -> None:
        """Let go of the warm workers and the Dask clients (a Dask worker's job, at its end)."""
        clients = list(self.dask.values())
        self._forget_inherited()
        for client in clients:
            client.close()
