"""Component rung: each component (text encoder, one transformer forward, VAE encode/decode) run on
identical inputs on the device, the reference and the floor, judged by the floor rule
(:func:`judge_floor`, used by the step rung too)."""

from __future__ import annotations

from typing import Any

from ..config import RunConfig
from .metrics import tensor_compare
from .thresholds import (
    ABS_COS_FAIL,
    COMPONENT_COS_PASS,
    MIN_FLOOR_REL,
    RATIO_FAIL,
    RATIO_PASS,
)
from .verdict import Row, RungResult, Verdict


def floor_ratio(rel: float, floor_rel: float) -> float:
    """The device's relative error over the floor's (the floor raised to :data:`MIN_FLOOR_REL`)."""
    if rel != rel or floor_rel != floor_rel:
        return float("nan")
    return rel / max(floor_rel, MIN_FLOOR_REL)


def judge_floor(cos: float, rel: float, floor_rel: float | None) -> tuple[Verdict, str]:
    """The one rule for a tensor judged against a noise floor, and the words saying what decided.

    NaN or cosine below the absolute bound fails whatever the floor says; without a floor the cosine
    gate alone can only WARN (nothing proves the precision); with one, the error ratio decides.
    """
    if cos != cos or rel != rel:
        return Verdict.FAIL, "NaN in the comparison"
    if cos < ABS_COS_FAIL:
        return Verdict.FAIL, f"cosine {cos:.5f} < {ABS_COS_FAIL}"
    if floor_rel is None:
        verdict = Verdict.WARN if cos >= COMPONENT_COS_PASS else Verdict.FAIL
        return verdict, f"no floor: cosine {cos:.5f} {'>=' if verdict is Verdict.WARN else '<'} {COMPONENT_COS_PASS}"
    ratio = floor_ratio(rel, floor_rel)
    if ratio <= RATIO_PASS:
        return Verdict.PASS, f"rel-L2 {ratio:.2f}x the floor's <= {RATIO_PASS:g}"
    if ratio <= RATIO_FAIL:
        return Verdict.WARN, f"rel-L2 {ratio:.2f}x the floor's, in ({RATIO_PASS:g}, {RATIO_FAIL:g}]"
    return Verdict.FAIL, f"rel-L2 {ratio:.2f}x the floor's > {RATIO_FAIL:g}"


def floor_row(subject: str, dut: Any, ref: Any, floor: Any | None) -> Row:
    """One row judged by :func:`judge_floor`: the device's and the floor's error on the same inputs."""
    m = tensor_compare(dut, ref)
    f = tensor_compare(floor, ref) if floor is not None else None
    verdict, how = judge_floor(m["cosine"], m["rel_l2"], f["rel_l2"] if f is not None else None)
    row = Row(subject)
    row.add("cosine", m["cosine"], f">= {ABS_COS_FAIL} (absolute)", None, "msprobe-precheck")
    row.add("rel_l2", m["rel_l2"])
    if f is not None:
        row.add("floor rel_l2", f["rel_l2"])
        row.add("rel_l2 / floor", floor_ratio(m["rel_l2"], f["rel_l2"]),
                f"<= {RATIO_PASS:g} PASS, <= {RATIO_FAIL:g} WARN", None, "difforge-ratio")
    row.add("max_abs", m["max_abs"])
    bad = m["nonfinite_dut"] - m["nonfinite_ref"]
    row.add("nonfinite_only_device", max(0, bad), "= 0", Verdict.PASS if bad <= 0 else Verdict.FAIL, "msprobe-nan")
    row.add("shape", "x".join(str(s) for s in ref.shape))
    row.add("decision", how, "floor rule", verdict, "difforge-ratio")
    return row


def component_rung(dut: Any, ref: Any, cfg: RunConfig, floor: Any | None = None) -> RungResult:
    """Feed the reference pipeline's component inputs to the device, the reference and the floor."""
    inputs = ref.component_inputs(cfg)
    rows: list[Row] = []
    for name, kwargs in inputs.items():
        ref_out = ref.run_component(name, kwargs)
        dut_out = dut.run_component(name, kwargs)
        floor_out = floor.run_component(name, kwargs) if floor is not None else None
        rows.append(floor_row(name, dut_out, ref_out, floor_out))
    for row in rows:
        row.settle()
    result = RungResult.from_rows("component", rows)
    decided = [(r.subject, r.get("decision")) for r in rows if r.verdict is result.verdict]
    result.summary = (f"{len(rows)} components PASS ({'; '.join(f'{s}: {h}' for s, h in decided[:3])})"
                      if result.verdict is Verdict.PASS
                      else f"{result.verdict}: " + "; ".join(f"{s}: {h}" for s, h in decided))
    return result
