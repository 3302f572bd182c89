"""Component rung: each component (text encoder, one transformer forward, VAE encode/decode) run
on identical inputs on both sides, compared by cosine, relative L2 and max abs (AWS NxDI style)."""

from __future__ import annotations

from typing import Any

from ..config import RunConfig
from .metrics import tensor_compare
from .thresholds import COMPONENT_COS_PASS, COMPONENT_COS_WARN
from .verdict import Row, RungResult, Verdict


def judge_cosine(cos: float, pass_at: float = COMPONENT_COS_PASS, warn_at: float = COMPONENT_COS_WARN) -> Verdict:
    if cos != cos:  # NaN
        return Verdict.FAIL
    if cos >= pass_at:
        return Verdict.PASS
    return Verdict.WARN if cos >= warn_at else Verdict.FAIL


def compare_row(subject: str, dut: Any, ref: Any, cos_source: str = "aws-nxdi") -> Row:
    """One row of cosine / rel-L2 / max-abs with the component thresholds."""
    m = tensor_compare(dut, ref)
    row = Row(subject)
    row.add("cosine", m["cosine"], f">= {COMPONENT_COS_PASS} PASS, >= {COMPONENT_COS_WARN} WARN",
            judge_cosine(m["cosine"]), cos_source)
    row.add("rel_l2", m["rel_l2"])
    row.add("max_abs", m["max_abs"])
    bad = m["nonfinite_dut"] - m["nonfinite_ref"]
    row.add("nonfinite_only_device", max(0, bad), "= 0", Verdict.PASS if bad <= 0 else Verdict.FAIL, "msprobe-nan")
    row.add("shape", "x".join(str(s) for s in ref.shape))
    return row


def component_rung(dut: Any, ref: Any, cfg: RunConfig) -> RungResult:
    """Feed the reference pipeline's component inputs to both pipelines' ``run_component``."""
    inputs = ref.component_inputs(cfg)
    rows: list[Row] = []
    for name, kwargs in inputs.items():
        ref_out = ref.run_component(name, kwargs)
        dut_out = dut.run_component(name, kwargs)
        rows.append(compare_row(name, dut_out, ref_out))
    bad = [r.subject for r in rows if r.settle() is not Verdict.PASS]
    summary = (f"{len(rows)} components within cosine >= {COMPONENT_COS_PASS}" if not bad
               else "below threshold: " + ", ".join(bad))
    return RungResult.from_rows("component", rows, summary)
