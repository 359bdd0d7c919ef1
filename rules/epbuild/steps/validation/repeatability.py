"""Whether an artifact computes the same outputs twice on the same inputs: a verdict of one run of an artifact
whose outputs vary from run to run (a random op, an EP's race) is luck. The validation runs the artifact a second
time on the same session and inputs (one run more, no session), and outputs that differ between the two beyond
what the target's precision explains fail it, named. What it does not see: outputs that depend on what ran before
in the process (QNN's HTP leaves part of a ConvTranspose output unwritten, so it holds an earlier graph's leftovers:
13.1, 18.6, -17 dB after other graphs, 141.3 dB alone; a second run repeats the same values; docs/targets/qnn.md).
Where one run is long (the simulator on a large model), `validation.repeat_within_s` bounds it: a first run slower
than that is not repeated, and validation.json says so (`repeatability.checked`)."""

from __future__ import annotations

from typing import Any

from .comparison import allowed_relative

REPEAT_WITHIN_S = 30.0  # the default: a first run at most this long is repeated


def repeatability(session: Any, feeds: dict[str, Any], first: list[Any], seconds: float, thresholds: dict[str, float],
                  precision: str, within_s: float) -> tuple[dict[str, Any], str | None]:
    """(validation.json's `repeatability`, the failure when the two runs differ). `first`: the outputs of the run
    that took `seconds`."""
    import numpy as np

    if within_s <= 0:
        return {"checked": False, "why": "validation.repeat_within_s = 0"}, None
    if seconds > within_s:
        return {"checked": False, "why": f"one run took {seconds:.1f} s, above validation.repeat_within_s = "
                                         f"{within_s:g}"}, None
    second = session.run(None, feeds)
    relative, floor = allowed_relative(thresholds, precision)
    for output, one, two in zip(session.get_outputs(), first, second, strict=True):
        one, two = np.asarray(one), np.asarray(two)
        if one.shape != two.shape:
            return ({"checked": True, "runs": 2}, f"the artifact's output varies from run to run: '{output.name}' has "
                    f"shape {list(one.shape)} in one run and {list(two.shape)} in the next, on the same inputs")
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
            return ({"checked": True, "runs": 2}, f"the artifact's output varies from run to run: "
                    f"{int(differ.sum())} of {differ.size} values of '{output.name}' differ{by} between two runs on "
                    f"the same inputs, beyond what {precision} explains: a single run's verdict would be luck")
    return {"checked": True, "runs": 2}, None
