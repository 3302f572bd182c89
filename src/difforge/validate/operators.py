"""Operator rung: every op the port runs, on the real inputs it sees, against float32 on the CPU.

The inputs are captured from one teacher-forced step of the device under test (so shapes and value
ranges are the model's own, not synthetic), upcast to float32 and replayed through the portable
reference implementation on the CPU.  Each op is judged by msprobe's pre-check decision tree.  In
bf16/fp16 the dual-N shares fail on output rounding alone, so a dual-N miss is settled by msprobe's
new-standard ratios (RMSE <= 2x, max relative error <= 10x, small-value errors <= 2x) against the
same reference implementation run at the device's dtype on the reference device (what the dtype
alone costs); NaN/Inf on the device only and cosine <= 0.99 always fail.

Capturing is the family probe's job (:meth:`difforge.models.probing.Probe.operator_cases`: URSA wraps
its transformer's :class:`~difforge.ops.OpSet`, Qwen-Image-Edit hooks diffusers modules); this module
only judges the cases it returns, the same way for every family.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..config import RunConfig
from ..devices import dtype_name
from ..models.probing import OpCase
from .metrics import op_compare
from .thresholds import OP_COSINE, OP_MAX_ABS, dual_rule
from .verdict import Row, RungResult, Verdict

RMSE_RATIO = 2.0
MAX_REL_RATIO = 10.0


# ---- judging -----------------------------------------------------------------------------------------
def judge(case: OpCase, dtype: torch.dtype) -> Row:
    """msprobe pre-check decision tree; a dual-N error or warning is settled by msprobe's
    new-standard ratios against the floor (the reference implementation at the device's dtype)."""
    rule = dual_rule(dtype)
    m = op_compare(case.dut, case.ref, rule)
    fl = op_compare(case.floor, case.ref, rule) if case.floor is not None else None
    row = Row(f"{case.op}", note=case.note)
    row.add("impl", f"{case.impl} ({'exact' if case.exact else 'approximate'})")
    row.add("shape", case.shape)
    bad_nan = m["nonfinite_dut"] > m["nonfinite_ref"]
    row.add("NaN/Inf only on device", bool(bad_nan), "= False", Verdict.FAIL if bad_nan else Verdict.PASS,
            "msprobe-nan")
    cos_ok = m["cosine"] > OP_COSINE
    row.add("cosine", m["cosine"], f"> {OP_COSINE}", Verdict.PASS if cos_ok else Verdict.FAIL, "msprobe-precheck")
    row.add("max_abs_err", m["max_abs"], f"< {OP_MAX_ABS:g} (else dual-N)", None, "msprobe-precheck")
    row.add("max_rel_err", m["max_rel"])
    err_key = "rel_gt_1%" if rule.error_n == 100 else "rel_gt_0.1%"
    warn_key = "rel_gt_0.1%" if rule.warn_n == 1000 else "rel_gt_0.01%"
    row.add("share rel err > 0.1%", m["rel_gt_0.1%"])
    row.add("share rel err > 1%", m["rel_gt_1%"])
    exp = int(round(math.log2(rule.small_below)))
    row.add("small-value errors", m["small_value_errors"], f"|ref| < 2^{exp}: abs err <= {rule.small_abs:.1e}")
    if bad_nan or not cos_ok:
        verdict, how = Verdict.FAIL, "NaN/Inf or cosine"
    elif m["max_abs"] < OP_MAX_ABS:
        verdict, how = Verdict.PASS, f"max abs < {OP_MAX_ABS:g}"
    else:
        if m[err_key] >= 1.0 / rule.error_n:
            verdict, how = Verdict.FAIL, f"dual-{rule.error_n} ({err_key} >= {1 / rule.error_n:g})"
        elif m[warn_key] >= 1.0 / rule.warn_n:
            verdict, how = Verdict.WARN, f"dual-{rule.warn_n} ({warn_key} >= {1 / rule.warn_n:g})"
        else:
            verdict, how = Verdict.PASS, f"dual-{rule.error_n} and dual-{rule.warn_n}"
        if verdict is not Verdict.PASS and fl is not None:
            rmse_ratio = _ratio(m["rel_l2"], fl["rel_l2"])
            rel_ratio = _ratio(m["max_rel"], fl["max_rel"])
            small_ratio = _ratio(m["small_value_errors"], fl["small_value_errors"])
            row.add("rmse / floor", rmse_ratio, f"<= {RMSE_RATIO:g}", None, "msprobe-ratio")
            row.add("max_rel / floor", rel_ratio, f"<= {MAX_REL_RATIO:g}", None, "msprobe-ratio")
            row.add("small errors / floor", small_ratio, f"<= {RMSE_RATIO:g}", None, "msprobe-ratio")
            if rmse_ratio <= RMSE_RATIO and rel_ratio <= MAX_REL_RATIO and small_ratio <= RMSE_RATIO:
                verdict, how = Verdict.PASS, f"{how}, explained by {dtype_name(dtype)} (within the ratio rule)"
    row.add("decision", how, "msprobe pre-check tree, then ratio rule", verdict, "msprobe-precheck")
    return row


def _ratio(a: float, b: float) -> float:
    if b <= 0:
        return 1.0 if a <= 0 else float("inf")
    return a / b


@torch.inference_mode()
def operator_rung(dut: Any, ref_device: torch.device, cfg: RunConfig, inputs: dict[str, torch.Tensor],
                  adaptations: list[Any] | None = None) -> RungResult:
    """Capture the device's ops on step 0 of the reference trajectory (``dut`` is the device's probe)
    and judge each one."""
    cases = dut.operator_cases(ref_device, cfg, inputs, list(adaptations or []))
    if not cases:
        return RungResult("operator", Verdict.SKIP, "no op calls captured")
    rows = [judge(c, dut.dtype) for c in cases]
    result = RungResult.from_rows("operator", rows)
    bad = [r.subject for r in rows if r.verdict is not Verdict.PASS]
    result.summary = (f"{len(rows)} ops within msprobe thresholds" if not bad
                      else f"{result.verdict}: " + ", ".join(bad))
    result.data = {"ops": [{"op": c.op, "impl": c.impl, "exact": c.exact, "shape": c.shape} for c in cases]}
    return result
