"""The `qaic = {...}` table of a qaic-compile target, checked as declared: plain data for the plan and the adapter
(`steps.toolchain.toolchains`)."""

from __future__ import annotations

from ..records import record
from .parse import TableReader

STATS_LEVEL_DEFAULT = 40  # 50: I/O doorbell waits, 70: per-operator cycles (needed by qaic-opstats), 100: extended PMU


@record
class QaicOptions:
    """The `qaic = {...}` table of a target, checked against the seed's rules (keys: `epbuild.manifest.schema`)."""

    num_cores: int | None = None
    convert_to_fp16: bool = False
    stats_level: int | None = None
    stats_batchsize: int | None = None
    ddr_stats: bool = False
    pmu_recipe: str | None = None
    pmu_events: tuple[str, ...] = ()
    perf_warnings: bool = False
    perf_metrics: bool = False
    aic_hw: bool = True
    extra_args: tuple[str, ...] = ()


def check_qaic(table: TableReader) -> QaicOptions:
    """The `qaic` table of a target: each key as `manifest.schema` declares it, then the rules between keys (as the
    seed documents them); raises UserError naming `targets.NAME.qaic.KEY`."""
    values = table.read("qaic")
    level = values["stats_level"] or STATS_LEVEL_DEFAULT
    if values["ddr_stats"] and level < 40:
        table.fail(f"needs stats_level >= 40, found {level}", "ddr_stats")
    if values["pmu_recipe"] is not None and values["pmu_events"]:
        table.fail("pmu_recipe and pmu_events are mutually exclusive: give one", "pmu_events")
    return QaicOptions(**{**values, "pmu_events": tuple(e.removeprefix("0x") for e in values["pmu_events"]),
                          "extra_args": tuple(values["extra_args"])})
