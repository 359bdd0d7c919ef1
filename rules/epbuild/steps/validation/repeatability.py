"""Whether an artifact computes the same outputs twice on the same inputs: a verdict of one run of an artifact
whose outputs vary from run to run (a random op, an EP's race) is luck. The validation runs the artifact a second
time on the same session and inputs (one run more, no session), and outputs that differ between the two beyond
what the target's precision explains fail it, named. Outputs that depend on what ran before in the process
(QNN's HTP leaves part of a ConvTranspose output unwritten, so it holds an earlier graph's leftovers: 13.1, 18.6,
-17 dB after other graphs, 141.3 dB alone; a second run of the same session repeats them) are seen where the EP's
entry asks (`history`): the second run is then a new session's, after another graph ran on the EP.
Where one run is long (the simulator on a large model), `validation.repeat_within_s` bounds it: a first run slower
than that is not repeated, and validation.json says so (`repeatability.checked`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .comparison import allowed_relative
from .history import leftovers_line

REPEAT_WITHIN_S = 30.0  # the default: a first run at most this long is repeated


def repeatability(session: Any, feeds: dict[str, Any], first: list[Any], seconds: float, thresholds: dict[str, float],
                  precision: str, within_s: float, ep: str = "",
                  reopen: Callable[[], tuple[Any, str | None]] | None = None) -> tuple[dict[str, Any], str | None]:
    """(validation.json's `repeatability`, the failure when the runs differ). `first`: the outputs of the run that
    took `seconds`. `reopen`: for an EP whose outputs may hold what ran before (`steps.validation.history`), the
    artifact's new session opened after another graph ran on the EP, or why there is none; the second run is then
    that session's, and a third on it tells leftovers (the same again: `leftovers`, how many values) from run-to-run
    variation."""
    if within_s <= 0:
        return {"checked": False, "why": "validation.repeat_within_s = 0"}, None
    if seconds > within_s:
        return {"checked": False, "why": f"one run took {seconds:.1f} s, above validation.repeat_within_s = "
                                         f"{within_s:g}"}, None
    tolerance = allowed_relative(thresholds, precision)
    names = [output.name for output in session.get_outputs()]
    fresh, unchecked = reopen() if reopen else (None, None)
    if fresh is None:
        second = session.run(None, feeds)
        found = _differing(names, first, second, tolerance)
        report = {"checked": True, "runs": 2, **({"after_other_graph": False, "why": unchecked} if reopen else {})}
        return report, _varies(found, precision) if found else None
    second = fresh.run(None, feeds)
    found = _differing(names, first, second, tolerance)
    if not found:
        return {"checked": True, "runs": 2, "after_other_graph": True}, None
    third = fresh.run(None, feeds)
    again = _differing(names, second, third, tolerance)
    report = {"checked": True, "runs": 3, "after_other_graph": True}
    if again or isinstance(found, str):
        return report, _varies(again or found, precision)
    return {**report, "leftovers": found[1]}, leftovers_line(*found, ep)


def _differing(names: list[str], one_run: list[Any], other: list[Any],
               tolerance: tuple[float, float]) -> tuple[str, int, int, str] | str | None:
    """The first output that differs between two runs: (name, how many values, of how many, " by up to ..."), a
    shape change's words, or None."""
    import numpy as np

    relative, floor = tolerance
    for name, one, two in zip(names, one_run, other, strict=True):
        one, two = np.asarray(one), np.asarray(two)
        if one.shape != two.shape:
            return f"'{name}' has shape {list(one.shape)} in one run and {list(two.shape)} in the next"
        if one.dtype.kind in "fc":
            a, b = one.astype(np.float64).ravel(), two.astype(np.float64).ravel()
            finite = np.isfinite(a) & np.isfinite(b)
            differ = ~finite & ((np.isnan(a) != np.isnan(b)) | (np.isposinf(a) != np.isposinf(b))
                                | (np.isneginf(a) != np.isneginf(b)))
            gap = np.where(finite, np.abs(a - b), 0.0)
            differ |= finite & (gap > relative * np.abs(a) + floor)
            by = f" by up to {float(gap.max()):.3g}" if differ.any() and gap.size else ""
        else:
            differ, by = (one != two).ravel(), ""
        if differ.any():
            return name, int(differ.sum()), int(differ.size), by
    return None


def _varies(found: tuple[str, int, int, str] | str, precision: str) -> str:
    if isinstance(found, str):
        return f"the artifact's output varies from run to run: {found}, on the same inputs"
    name, differ, size, by = found
    return (f"the artifact's output varies from run to run: {differ} of {size} values of '{name}' differ{by} between "
            f"two runs on the same inputs, beyond what {precision} explains: a single run's verdict would be luck")
