"""Verdicts and the small records every rung of the acceptance ladder returns.

A rung is a list of rows (one per operator, component, step, image ...); a row is a list of
measurements; a measurement carries its value, the threshold it was judged against and the
source of that threshold, so the report can print all three side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Verdict(str, Enum):
    """Ordered outcome: PASS < WARN < FAIL; SKIP (not applicable) never changes a combined verdict."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"

    def __str__(self) -> str:
        return self.value


_RANK = {Verdict.SKIP: -1, Verdict.PASS: 0, Verdict.WARN: 1, Verdict.FAIL: 2}


def worst(verdicts: list[Verdict] | tuple[Verdict, ...]) -> Verdict:
    """The combined verdict: the worst non-SKIP one, SKIP when every part was skipped."""
    real = [v for v in verdicts if v is not Verdict.SKIP]
    if not real:
        return Verdict.SKIP
    return max(real, key=lambda v: _RANK[v])


#: The accuracy rungs that prove a port; one skipped leaves the port unproven (overall at least WARN).
REQUIRED_ACCURACY = ("operator", "component", "step", "trajectory")
#: The rungs that judge against a noise floor: a WARN of theirs from a floor ratio between PASS and FAIL
#: fails the sign-off unless the user accepts it (``--accept-warn RUNG=REASON``).
RATIO_RUNGS = ("operator", "component", "step", "trajectory", "semantic")


def _is_floor_ratio(name: str) -> bool:
    return "/ floor" in name or "/ (floor" in name


def _free_run_picture(row: Row) -> bool:
    """A trajectory row of a free run's end-to-end picture (not a picture decoded from the device's own
    tokens, not a token row): its only floor ratio is the image's ``rmse / floor``."""
    return "image" in row.subject and "from the device's tokens" not in row.subject and any(
        m.name == "rmse / floor" for m in row.measurements)


def free_run_explanation(rungs: Mapping[str, RungResult]) -> str | None:
    """Why a WARN of a free run's picture is explained, or None when it is not.

    A free run's end-to-end picture is one sample of a chaotic map: an in-floor error at every step can grow
    differently from the floor's own one.  Measured on a clean bf16 port of shapes-qwen-edit (CPU, --quick,
    seeds 0-4) the picture sat at 2.08, 1.25, 1.04, 0.79 and 1.48x the floor while every teacher-forced step
    stayed at <= 1.51x.  So the picture's WARN band is explained when every teacher-forced step (the network
    and, since issue 25, each stage after it) and every component PASS: what the port computes per step is
    within the floor.  A picture beyond the FAIL line still fails, and a WARN with any step or component above
    PASS is not explained.
    """
    steps, components = rungs.get("step"), rungs.get("component")
    if steps is None or components is None:
        return None
    if steps.verdict is Verdict.PASS and components.verdict is Verdict.PASS:
        return ("explained: every teacher-forced step and every component PASS, so the free run's picture "
                "is the chaotic growth of in-floor per-step errors")
    return None


def warn_band(rung: RungResult, explained_free_run: bool = False) -> list[str]:
    """Where ``rung`` WARNs because a floor ratio sits in the band between PASS and FAIL, as
    ``"subject: ratio name value"``; empty when its WARN is explained by its rule instead (a coverage
    gap, no floor to judge against, a prompt set the reference cannot draw) or it does not WARN.

    A row is in the band when it WARNs and formed a floor ratio (a measurement named ``... / floor``):
    the rules that WARN without a floor, or on coverage, form none.  The semantic rung says so itself
    (``data["warn_band"]``): its rows are prompts, its ratio is a count.
    """
    if rung.key not in RATIO_RUNGS or rung.verdict is not Verdict.WARN:
        return []
    if rung.key == "semantic":
        band = rung.data.get("warn_band")
        return [str(band)] if band else []
    found = []
    for row in rung.rows:
        if row.verdict is not Verdict.WARN or (explained_free_run and _free_run_picture(row)):
            continue
        ratios = [(m.name, m.value) for m in row.measurements
                  if _is_floor_ratio(m.name) and isinstance(m.value, int | float) and not isinstance(m.value, bool)]
        if ratios:
            name, value = max(ratios, key=lambda nv: nv[1] if nv[1] == nv[1] else float("inf"))
            found.append(f"{row.subject}: {name} {value:.3g}")
    return found


def overall(rungs: dict[str, RungResult], caveats: list[str] | tuple[str, ...] = (),
            accepted: Mapping[str, str] | None = None) -> tuple[Verdict, list[str]]:
    """The verdict of a whole validation and the reasons it is not a plain PASS.

    The worst rung verdict, except that SKIP never hides a gap: a required accuracy rung that was
    skipped (or never ran) makes the result at least WARN, as does any ``caveat`` (a stage that
    failed outside the rungs, e.g. the gallery); everything skipped is a FAIL.  A WARN from a floor
    ratio between PASS and FAIL (:func:`warn_band`) is a FAIL of the sign-off - real breakages sat at
    2.55-2.94x the floor while clean runs reached 1.77x (issue 25) - unless ``accepted`` names its
    rung with the user's reason, which the reasons then carry.  A free run's picture in the band is
    explained, not failed, when every step and component PASS (:func:`free_run_explanation`).
    """
    verdict = worst([r.verdict for r in rungs.values()])
    reasons: list[str] = []
    if verdict is Verdict.SKIP:
        verdict = Verdict.FAIL
        reasons.append("every rung was skipped, so nothing was judged")
    for key in REQUIRED_ACCURACY:
        rung = rungs.get(key)
        if rung is None:
            reasons.append(f"the {key} rung did not run")
        elif rung.verdict is Verdict.SKIP:
            reasons.append(f"the {key} rung was skipped ({rung.summary or 'no reason given'})")
    reasons.extend(caveats)
    accepted = dict(accepted or {})
    unexplained = False
    free_run = free_run_explanation(rungs)
    for key, rung in rungs.items():
        band = warn_band(rung, explained_free_run=key == "trajectory" and free_run is not None)
        if key == "trajectory" and free_run is not None and warn_band(rung) != band:
            reasons.append(f"the trajectory rung WARNs on a free run's picture between PASS and FAIL "
                           f"({'; '.join(b for b in warn_band(rung) if b not in band)}), {free_run}")
        if not band:
            continue
        where = "; ".join(band)
        if key in accepted:
            reasons.append(f"the {key} rung WARNs on a floor ratio between PASS and FAIL ({where}), accepted by "
                           f"the user: {accepted[key]}")
        else:
            unexplained = True
            reasons.append(f"the {key} rung WARNs on a floor ratio between PASS and FAIL ({where}): a sign-off "
                           f"fails on it unless accepted with --accept-warn {key}=REASON")
    if unexplained:
        verdict = Verdict.FAIL
    if reasons and verdict is Verdict.PASS:
        verdict = Verdict.WARN
    return verdict, reasons


def parse_accept_warn(values: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``--accept-warn RUNG=REASON`` values as {rung: reason}; ValueError naming the bad one (an unknown
    rung, no reason) so the caller can say it in one line."""
    out: dict[str, str] = {}
    for value in values:
        rung, sep, reason = value.partition("=")
        rung, reason = rung.strip(), reason.strip()
        if not sep or not reason:
            raise ValueError(f"--accept-warn takes RUNG=REASON (a rung and why its WARN is acceptable), not '{value}'.")
        if rung not in RATIO_RUNGS:
            raise ValueError(f"--accept-warn names an unknown rung '{rung}' (a rung judged against the floor: "
                             f"{', '.join(RATIO_RUNGS)}).")
        out[rung] = reason
    return out


@dataclass
class Measurement:
    """One number judged against a threshold; ``verdict`` is None for informative values."""

    name: str
    value: Any
    threshold: str = ""
    verdict: Verdict | None = None
    source: str = ""  # key into thresholds.SOURCES


@dataclass
class Row:
    """One subject of a rung (an operator, a component, a denoising step, a phase ...)."""

    subject: str
    measurements: list[Measurement] = field(default_factory=list)
    verdict: Verdict = Verdict.PASS
    note: str = ""

    def add(self, name: str, value: Any, threshold: str = "", verdict: Verdict | None = None,
            source: str = "") -> Measurement:
        m = Measurement(name, value, threshold, verdict, source)
        self.measurements.append(m)
        return m

    def settle(self) -> Verdict:
        """Row verdict = worst judged measurement (informative ones do not count)."""
        judged = [m.verdict for m in self.measurements if m.verdict is not None]
        self.verdict = worst(judged) if judged else Verdict.PASS
        return self.verdict

    def get(self, name: str) -> Any:
        for m in self.measurements:
            if m.name == name:
                return m.value
        raise KeyError(name)


@dataclass
class RungResult:
    """The outcome of one rung: verdict, a one-line finding, its rows and raw data for report.json."""

    key: str
    verdict: Verdict
    summary: str = ""
    rows: list[Row] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @classmethod
    def from_rows(cls, key: str, rows: list[Row], summary: str = "", data: dict[str, Any] | None = None,
                  ) -> RungResult:
        verdict = worst([r.settle() for r in rows]) if rows else Verdict.SKIP
        return cls(key, verdict, summary, rows, dict(data or {}))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
