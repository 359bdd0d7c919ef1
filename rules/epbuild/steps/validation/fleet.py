"""A multi-SoC QNN target's verdict (`soc_model = ["SM8650", "SC8380XP", 57]`): one binary for several SoCs, which
the HTP simulator cannot run (onnxruntime-qnn 2.7.0 refuses it at session creation, "Compatible cache not found",
whatever soc_model or htp_arch the session names). So each SoC is compiled alone and run (its own build,
`TARGET~57`, `plan.targets.each_soc`), and the multi-SoC binary itself is checked structurally: its files, its
EPContext attributes, and that its compatibility string lists exactly the SoCs declared. The target passes only if
every SoC passed; a SoC that did not pass is never counted as passed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...contracts.statuses import Verdict
from ...contracts.validation import ValidationRecord, load_validation
from ...manifest.builds import Build
from ...manifest.eps import QNN_KNOWN_VALUES

MULTI_SOC_NOT_RUN = ("the multi-SoC binary was checked structurally (its files, EPContext attributes, the SoCs its "
                     "compatibility string lists): the HTP simulator cannot run a multi-SoC binary, so each SoC was "
                     "compiled alone and run")


def chip(soc: str) -> str:
    """`57 (SM8650)`."""
    name = QNN_KNOWN_VALUES["soc_model"].get(soc)
    return f"{soc} ({name})" if name else soc


def listed_socs(compatibility: str | None) -> list[str] | None:
    """The SoCs a QNN compatibility string lists (`v2:6:2.51.0:5.51.0:0,0,0:60,69,57:0,0,0:0`: its sixth field)."""
    fields = (compatibility or "").split(":")
    return [soc for soc in fields[5].split(",") if soc] if len(fields) > 5 and fields[0] == "v2" else None


def fleet_verdict(build: Build, structural: dict[str, Any], compatibility: str | None,
                  pruning: dict[str, Any] | None = None) -> dict[str, Any]:
    """The multi-SoC build's report from its structural check and each SoC's own validation.json. `pruning`: what
    `ship_socs` did (artifact.json's `soc_pruning`): the binary must hold the SoCs kept, else every SoC declared."""
    socs: dict[str, dict[str, Any]] = {}
    for soc, path in build.soc_reports:
        try:
            own = load_validation(Path(path))
        except (OSError, ValueError):
            own = ValidationRecord(Verdict.FAILED, reason=f"its validation report ({path.name}) is missing or "
                                   "unreadable")
        socs[soc] = _per_soc(own)
    problems = [structural["reason"]] if structural.get("status") == Verdict.FAILED else []
    listed = listed_socs(compatibility)
    declared = list(pruning["kept"]) if pruning and "kept" in pruning else list(build.target.socs)
    notes = []
    if listed is not None and listed != declared:
        problems.append(f"the binary's compatibility string lists SoCs {', '.join(listed)}, the target declares "
                        f"{', '.join(declared)}")
    elif listed is None:
        problems.append("the compiled model carries no QNN compatibility string naming its SoCs")
    elif pruning and "skipped" in pruning:
        unshipped = [chip(soc) for soc in declared if soc not in socs]
        notes.append(f"not pruned to ship_socs ({pruning['skipped']}): the binary also holds SoC "
                     f"{', '.join(unshipped)}, not shipped and not run")
    statuses = {entry["status"] for entry in socs.values()}
    status = Verdict.FAILED if problems or Verdict.FAILED in statuses else next(
        (s for s in (Verdict.INCONCLUSIVE, Verdict.SKIPPED, Verdict.STRUCTURAL) if s in statuses), Verdict.PASSED)
    report: dict[str, Any] = {"status": status, "socs": socs, "multi_soc": MULTI_SOC_NOT_RUN,
                              "structural": structural.get("status"), **({"notes": notes} if notes else {})}
    if status != Verdict.PASSED:
        reasons = problems + [f"SoC {chip(soc)}: {entry['status']}" + (f" ({entry['reason']})" if "reason" in entry
                                                                        else "")
                              for soc, entry in socs.items() if entry["status"] != Verdict.PASSED]
        report["reason"] = "; ".join(reasons)
    return report


def _per_soc(report: ValidationRecord) -> dict[str, Any]:
    """What a SoC's own report says, in short: its verdict, its worst SNR, why it did not pass."""
    entry: dict[str, Any] = {"status": report.status}
    outputs = [o for o in report.figures.get("outputs", {}).values() if "snr_db" in o]
    if outputs:
        entry["min_snr_db"] = round(min(o["snr_db"] for o in outputs), 1)
        entry["max_abs_error"] = max(o["max_abs_error"] for o in outputs)
    if report.reason is not None:
        entry["reason"] = report.reason
    return entry


def summary(report: dict[str, Any]) -> str:
    """Each SoC's verdict and SNR, and how the multi-SoC binary was checked."""
    parts = [f"SoC {chip(soc)} {entry['status']}" + (f" SNR {entry['min_snr_db']:.1f} dB" if "min_snr_db" in entry
                                                       else "")
             for soc, entry in report["socs"].items()]
    return f"{', '.join(parts)}; {MULTI_SOC_NOT_RUN}" + "".join(f"; {note}" for note in report.get("notes", []))


def soc_strings(compatibility: str) -> dict[str, str]:
    """A multi-SoC QNN compatibility string (`v2:6:sdk:api:73,75:60,57:4,4:0`: HTP architectures, SoCs and VTCM
    sizes as parallel lists) as one string per SoC; {} for any other string."""
    fields = compatibility.split(":")
    if len(fields) != 8 or fields[0] != "v2" or "," not in fields[5]:
        return {}
    lists = [fields[index].split(",") for index in (4, 5, 6)]
    if len({len(values) for values in lists}) != 1:
        return {}
    return {soc: ":".join([*fields[:4], arch, soc, vtcm, fields[7]]) for arch, soc, vtcm in zip(*lists, strict=True)}


def soc_answers(ort: Any, ep_name: str, compatibility: str) -> dict[str, Any]:
    """ONNX Runtime's answer for a multi-SoC binary here: for its whole string and for each SoC's part (in the
    validating child, which has the EP registered); host-dependent, so never cached or published."""
    from .compatibility import answer

    found, text = answer(ort, ep_name, [compatibility])
    parts = {soc: answer(ort, ep_name, [part])[1].split(" (string")[0]
             for soc, part in soc_strings(compatibility).items()}
    if len(set(parts.values())) == 1 and text.startswith(next(iter(parts.values()), "\0")):
        text += f"; each SoC's part ({', '.join(chip(soc) for soc in parts)}): the same"
    else:
        text += "".join(f"; SoC {chip(soc)}: {said}" for soc, said in parts.items())
    return {"answer": found, "text": text}
