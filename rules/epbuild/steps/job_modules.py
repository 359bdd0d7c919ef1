"""The job modules a fork server imports ahead of this build's jobs (`execute.links.JobModules`), and the roots of the
code digest that names what the jobs run: named here, by the layer whose jobs they are, and handed down to the
servers a build starts (`tasks.loading`, a Dask worker's job), to a first build's candidate (`execute.warm_start`,
before the no-op shortcut: this module imports nothing heavy) and to the build's `Provenance`."""

from __future__ import annotations

from ..execute.links import SHAPE_STAGE, JobModules

# The code whose work ends in outputs (compiles, stages, validations, on this host or a Dask worker): these files and
# every module of the package they import (`execute.provenance.digested_files`); the C source is compiled into the
# OpenVINO vendor shim. What runs around the jobs (doit's tasks, reports, the worker's resources) is not named: a
# change there rebuilds nothing.
CODE_ROOTS = ("steps/compile.py", "steps/preprocess.py", "steps/validate.py", "steps/remote_job.py",
              "steps/validation/sample_worker.py", "execute/fork_server.py", "execute/server_process.py",
              "steps/shims/*.c")

JOB_MODULES = JobModules(
    idle=("epbuild.steps.compile", "epbuild.steps.validate", "epbuild.steps.preprocess",
          "epbuild.steps.stages.runners"),
    calls=((SHAPE_STAGE, "epbuild.steps.stages.shape", "shape_tools"),),
    code=CODE_ROOTS)
