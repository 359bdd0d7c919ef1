"""The job modules a fork server imports ahead of this build's jobs (`execute.links.JobModules`): named here, by the
layer whose jobs they are, and handed down to the servers a build starts (`tasks.loading`, a Dask worker's job) and
to a first build's candidate (`execute.warm_start`, before the no-op shortcut: this module imports nothing heavy)."""

from __future__ import annotations

from ..execute.links import SHAPE_STAGE, JobModules

JOB_MODULES = JobModules(
    idle=("epbuild.steps.compile", "epbuild.steps.validate", "epbuild.steps.preprocess",
          "epbuild.steps.stages.runners"),
    calls=((SHAPE_STAGE, "epbuild.steps.stages.shape", "shape_tools"),))
