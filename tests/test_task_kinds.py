"""The task kinds live in one registry (`tasks.kinds`): doit's generators, the cached listing and the selections
read it, and the command line's reading of a run (`invocation.INSPECTING`) agrees with it."""

from __future__ import annotations

from epbuild.invocation import INSPECTING
from epbuild.tasks.definitions import Tasks
from epbuild.tasks.entry import namespace
from epbuild.tasks.kinds import KINDS, is_subtask


def test_every_kind_has_its_module_and_every_command_builds_nothing():
    """One module per kind (`tasks.kind.*`): its generator, and for a kind that does work its single task's maker
    (a selecting run's); every module there belongs to a kind."""
    import pkgutil

    import epbuild.tasks.kind as rooms

    for kind in KINDS:
        assert callable(kind.code.tasks), kind
        assert not kind.work or callable(kind.code.make), kind
        assert kind.work or kind.name in INSPECTING, f"{kind.name}: a command that would build"
    assert len({kind.name for kind in KINDS}) == len(KINDS)
    helper = {"reduce"}  # made with the compile kind's generator, only when named: no group of its own
    assert {m.name for m in pkgutil.iter_modules(rooms.__path__)} == {kind.module for kind in KINDS} | helper
    assert Tasks.made_or and not hasattr(Tasks, "build_tasks")


def test_doit_is_handed_one_generator_per_kind_the_project_wants():
    class Source:
        def wants(self, kind: str) -> bool:
            return kind != "ops"

        def doit_config(self) -> dict:
            return {}

    made = namespace(Source())
    assert [name for name in made if name.startswith("task_")] == [f"task_{k.name}" for k in KINDS if k.name != "ops"]


def test_a_subtask_is_one_of_a_kind():
    assert is_subtask("compile:m@t") and is_subtask("shape:m") and not is_subtask("compile")
    assert not is_subtask("prune")


def test_the_listing_groups_are_the_kinds(project):
    from helpers import TWO_MODELS_CPU_QNN

    project.manifest(TWO_MODELS_CPU_QNN)
    listed = project.doit("list", "--all").stdout.split()
    groups = [word for word in listed if word in {kind.name for kind in KINDS}]
    assert {"compile", "validate", "backends", "prune"} <= set(groups)
