"""Operator rung: every op type the port runs, on the real inputs it sees, against float32 on the CPU.

Two sources of cases, judged the same way:

* **traced** (:mod:`.tracing`): every call of a fixed table of torch functions (linear, matmul,
  convolutions, layer/group/RMS norm, normalize, the activations, softmax, attention, embedding,
  interpolation) made while the device under test runs step 0 teacher-forced on the reference's
  recorded inputs, then each component the probe runs alone (text encoder, transformer, VAE ...).
  A bounded sample of calls per op type and component is replayed from CPU copies of its inputs:
  the reference is the same function in float32 on the CPU, the floor an emulated low-precision run
  (float32 CPU kernel, inputs and output rounded to the dtype the op ran at, and the intermediates a
  real kernel rounds too: :data:`~.tracing.FLOOR_RUNS`), so the floor never uses the device's
  low-precision kernels.  One row per op type: its worst call, with where it ran.
* **the probe's own cases** (:meth:`difforge.models.probing.Probe.operator_cases`): fused kernels a
  torch-function trace cannot see (a ``torch_npu`` RMSNorm, a fused rotary, a whole attention block),
  with the probe's reference and floor.

Each case is judged by msprobe's pre-check decision tree.  In bf16/fp16 the dual-N shares fail on
output rounding alone, so a dual-N miss is settled by msprobe's benchmark ratios (RMSE <= 2x, max
relative error over the normal-value domain <= 10x, small-value errors <= 2x) against the floor (what
the dtype alone costs), each floor error raised to an absolute allowance so a zero floor never makes
a ratio infinite; NaN/Inf on the device only and cosine <= 0.99 always fail.  :func:`decide` is the
rule as a pure function of the measured values, so a report can be judged again from its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..config import RunConfig
from ..devices import dtype_name
from ..models.probing import OpCase
from .metrics import op_compare, tensor_compare
from .thresholds import OP_COSINE, OP_MAX_ABS, dual_rule, op_allowance
from .tracing import CAPS, Call, Caps, Capture, probe_captures, replay
from .verdict import Row, RungResult, Verdict

RMSE_RATIO = 2.0
MAX_REL_RATIO = 10.0
SMALL_RATIO = 2.0

#: What :func:`decide` reads of the device's comparison (``metrics.op_compare``) and of the floor's.
DEVICE_KEYS = ("nonfinite_dut", "nonfinite_ref", "cosine", "max_abs", "rel_gt_0.01%", "rel_gt_0.1%", "rel_gt_1%",
               "max_rel", "rel_l2", "small_value_errors", "elements")
FLOOR_KEYS = ("rel_l2", "max_rel", "small_value_errors", "elements")


@dataclass(frozen=True)
class Decision:
    """The operator rule's outcome on measured values: the verdict, what decided it, the ratios it formed."""

    verdict: Verdict
    how: str
    ratios: dict[str, float]


def _raised(value: float, floor: float, allowance: float) -> float:
    """``value`` over the floor's error raised to its absolute allowance (finite for a zero floor)."""
    if value != value or floor != floor:
        return float("nan")
    return value / max(floor, allowance)


def decide(m: Mapping[str, Any], fl: Mapping[str, Any] | None, dtype: torch.dtype) -> Decision:
    """The operator rule as a pure function of measured values (``DEVICE_KEYS`` of ``m``, ``FLOOR_KEYS``
    of ``fl``), so a report's numbers can be judged again without the tensors.

    msprobe's pre-check tree (NaN/Inf only on the device and cosine <= 0.99 fail; max abs < 1e-3 passes;
    else dual-N).  A dual-N miss is settled by msprobe's benchmark ratios against the floor (what the
    dtype alone costs): RMSE <= 2x, max relative error over the normal-value domain <= 10x, small-value
    errors <= 2x - each floor error raised to the absolute allowance a correct low-precision kernel
    earns (:func:`~.thresholds.op_allowance`), so a floor whose own error is 0 never makes a ratio
    infinite.  Without a floor the dual-N verdict stands.
    """
    rule = dual_rule(dtype)
    bad_nan = m["nonfinite_dut"] > m["nonfinite_ref"]
    if bad_nan or not m["cosine"] > OP_COSINE:
        return Decision(Verdict.FAIL, "NaN/Inf or cosine", {})
    if m["max_abs"] < OP_MAX_ABS:
        return Decision(Verdict.PASS, f"max abs < {OP_MAX_ABS:g}", {})
    err_key = "rel_gt_1%" if rule.error_n == 100 else "rel_gt_0.1%"
    warn_key = "rel_gt_0.1%" if rule.warn_n == 1000 else "rel_gt_0.01%"
    if m[err_key] >= 1.0 / rule.error_n:
        verdict, how = Verdict.FAIL, f"dual-{rule.error_n} ({err_key} >= {1 / rule.error_n:g})"
    elif m[warn_key] >= 1.0 / rule.warn_n:
        verdict, how = Verdict.WARN, f"dual-{rule.warn_n} ({warn_key} >= {1 / rule.warn_n:g})"
    else:
        return Decision(Verdict.PASS, f"dual-{rule.error_n} and dual-{rule.warn_n}", {})
    if fl is None:
        return Decision(verdict, f"{how}; no floor to settle it", {})
    allow = op_allowance(dtype)
    n, fn = max(1, int(m["elements"])), max(1, int(fl["elements"]))
    ratios = {
        "rmse / floor": _raised(m["rel_l2"], fl["rel_l2"], allow.rmse),
        "max_rel / floor": _raised(m["max_rel"], fl["max_rel"], allow.max_rel),
        # small-value errors as a share of the compared elements; the floor's share raised to half the
        # dual-N share, so the rule reads "at most max(2x the floor's, the dual-N share)"
        "small errors / floor": _raised(m["small_value_errors"] / n, fl["small_value_errors"] / fn,
                                        allow.small_share / SMALL_RATIO),
    }
    within = (ratios["rmse / floor"] <= RMSE_RATIO and ratios["max_rel / floor"] <= MAX_REL_RATIO
              and ratios["small errors / floor"] <= SMALL_RATIO)
    if within:
        return Decision(Verdict.PASS, f"{how}, explained by {dtype_name(dtype)} (within the ratio rule)", ratios)
    over = [k for k, lim in (("rmse / floor", RMSE_RATIO), ("max_rel / floor", MAX_REL_RATIO),
                             ("small errors / floor", SMALL_RATIO)) if not ratios[k] <= lim]
    return Decision(verdict, f"{how}; ratio rule exceeded: {', '.join(over)}", ratios)


def judge(case: OpCase, dtype: torch.dtype) -> Row:
    """The operator rule (:func:`decide`) on one case, as a report row holding every value it read."""
    rule = dual_rule(dtype)
    m = op_compare(case.dut, case.ref, rule)
    fl = op_compare(case.floor, case.ref, rule) if case.floor is not None else None
    d = decide(m, fl, dtype)
    allow = op_allowance(dtype)
    row = Row(f"{case.op}", note=case.note)
    row.add("impl", f"{case.impl} ({'exact' if case.exact else 'approximate'})")
    row.add("shape", case.shape)
    bad_nan = m["nonfinite_dut"] > m["nonfinite_ref"]
    row.add("NaN/Inf only on device", bool(bad_nan), "= False", Verdict.FAIL if bad_nan else Verdict.PASS,
            "msprobe-nan")
    cos_ok = m["cosine"] > OP_COSINE
    row.add("cosine", m["cosine"], f"> {OP_COSINE}", Verdict.PASS if cos_ok else Verdict.FAIL, "msprobe-precheck")
    row.add("max_abs_err", m["max_abs"], f"< {OP_MAX_ABS:g} (else dual-N)", None, "msprobe-precheck")
    row.add("max_rel_err", m["max_rel"], f"|ref| >= 2^{int(round(math.log2(rule.small_below)))}", None,
            "msprobe-benchmark")
    row.add("rel_l2", m["rel_l2"])
    row.add("share rel err > 0.01%", m["rel_gt_0.01%"])
    row.add("share rel err > 0.1%", m["rel_gt_0.1%"])
    row.add("share rel err > 1%", m["rel_gt_1%"])
    exp = int(round(math.log2(rule.small_below)))
    row.add("small-value errors", m["small_value_errors"], f"|ref| < 2^{exp}: abs err <= {rule.small_abs:.1e}")
    row.add("elements compared", m["elements"])
    if fl is not None:
        row.add("floor rel_l2", fl["rel_l2"])
        row.add("floor max_rel_err", fl["max_rel"])
        row.add("floor small-value errors", fl["small_value_errors"])
    if d.ratios:
        row.add("rmse / floor", d.ratios["rmse / floor"], f"<= {RMSE_RATIO:g} (floor >= {allow.rmse:.2g})", None,
                "msprobe-ratio")
        row.add("max_rel / floor", d.ratios["max_rel / floor"],
                f"<= {MAX_REL_RATIO:g} (floor >= {allow.max_rel:.2g})", None, "msprobe-benchmark")
        row.add("small errors / floor", d.ratios["small errors / floor"],
                f"<= {SMALL_RATIO:g} (share; floor >= {allow.small_share / SMALL_RATIO:.2g})", None, "msprobe-dual-n")
    row.add("decision", d.how, "msprobe pre-check tree, then ratio rule (floors raised to allowances)", d.verdict,
            "msprobe-precheck")
    return row


def measured(row: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(device, floor) values :func:`decide` reads, from a judged row's measurements by name (a
    report.json row's ``{name: value}``); the floor is None when the row has none."""
    names = {"nonfinite_dut": None, "cosine": "cosine", "max_abs": "max_abs_err", "rel_gt_0.01%": "share rel err > 0.01%",
             "rel_gt_0.1%": "share rel err > 0.1%", "rel_gt_1%": "share rel err > 1%", "max_rel": "max_rel_err",
             "rel_l2": "rel_l2", "small_value_errors": "small-value errors", "elements": "elements compared"}
    m: dict[str, Any] = {k: row[v] for k, v in names.items() if v is not None}
    m["nonfinite_dut"], m["nonfinite_ref"] = (1 if row["NaN/Inf only on device"] else 0), 0
    if "floor rel_l2" not in row:
        return m, None
    fl = {"rel_l2": row["floor rel_l2"], "max_rel": row["floor max_rel_err"],
          "small_value_errors": row["floor small-value errors"], "elements": row["elements compared"]}
    return m, fl


# ---- traced op types --------------------------------------------------------------------------------
_SEVERITY = {Verdict.SKIP: -1, Verdict.PASS: 0, Verdict.WARN: 1, Verdict.FAIL: 2}


@dataclass
class _Judged:
    """One replayed call, judged (its inputs already freed: only where it ran is kept)."""

    component: str
    op: str
    index: int
    where: str
    how: str
    dtype: torch.dtype
    row: Row
    ratio: float  # rel-L2 error over the floor's (how many times what the dtype explains)

    def key(self) -> tuple[int, float]:
        return _SEVERITY[self.row.verdict], self.ratio


def _judge_call(component: str, call: Call) -> _Judged:
    ref, floor = replay(call)
    dut = call.out.float().reshape(ref.shape)
    case = OpCase(call.op, f"{call.func} (traced)", True, call.shape, dut, ref, floor)
    row = judge(case, call.dtype)
    row.settle()
    ratio = _raised(tensor_compare(dut, ref)["rel_l2"], tensor_compare(floor, ref)["rel_l2"],
                    op_allowance(call.dtype).rmse)
    return _Judged(component, call.op, call.index, call.where, call.how, call.dtype, row, ratio)


def _op_row(judged: list[_Judged], ran: int, subject: str) -> Row:
    """The op type's worst judged call as its row, saying which call it was and where it ran."""
    w = max(judged, key=_Judged.key)
    row = w.row
    row.subject = subject
    row.note = (f"worst of {len(judged)} judged calls ({ran} ran): {w.component}, call #{w.index} of {w.op}"
                f"{f' in {w.where}' if w.where else ''}; kept {w.how}")
    row.add("where", f"{w.component}: {w.where or '-'} (call #{w.index})")
    row.add("dtype", dtype_name(w.dtype))
    row.add("rel-L2 / floor", w.ratio)
    row.add("calls judged", len(judged))
    return row


def _unjudged_row(ran: int, why: list[str], subject: str) -> Row:
    """An op type that ran but none of whose calls could be kept: a coverage gap, not a pass."""
    row = Row(subject, note="; ".join(why[:3]))
    row.add("calls judged", 0, "> 0", Verdict.WARN)
    row.add("calls", ran)
    return row


def traced_rows(dut: Any, cfg: RunConfig, inputs: dict[str, torch.Tensor], taken: set[str] | None = None,
                caps: Caps = CAPS) -> tuple[list[Row], dict[str, Any]]:
    """One row per traced op type (its worst call over every component) and what each component ran.

    ``taken`` are subjects already used (the probe's cases): a traced op type of the same name is
    reported as ``"<op> (traced)"``.  Captures are replayed and freed one component at a time.
    """
    judged: dict[str, list[_Judged]] = {}
    ran: dict[str, int] = {}
    why: dict[str, list[str]] = {}
    components: dict[str, Any] = {}
    recorded = getattr(dut, "recorded_captures", None)  # a capture's device: the calls it kept there
    for cap in recorded(cfg, inputs) if recorded is not None else probe_captures(dut, cfg, inputs, caps):
        components[cap.component] = _component_data(cap)
        for op, n in cap.seen.items():
            ran[op] = ran.get(op, 0) + n
        for op, reasons in cap.skipped.items():
            why.setdefault(op, []).extend(f"{cap.component} {r}" for r in reasons)
        for op, calls in cap.calls.items():
            judged.setdefault(op, []).extend(_judge_call(cap.component, c) for c in calls)
        del cap
    rows = []
    for op in ran:
        subject = f"{op} (traced)" if op in (taken or set()) else op
        rows.append(_op_row(judged[op], ran[op], subject) if judged.get(op)
                    else _unjudged_row(ran[op], why.get(op, []), subject))
    data = {
        "op_types": list(ran),
        "components": components,
        "caps": {"calls_per_op_and_component": caps.calls, "first": caps.first, "spread": caps.spread,
                 "bytes_per_call": caps.call_bytes, "bytes_per_op_and_component": caps.op_bytes,
                 "output_elements_per_call": caps.outputs},
        "worst": {op: {"component": w.component, "call": w.index, "where": w.where, "verdict": str(w.row.verdict)}
                  for op, js in judged.items() if js for w in [max(js, key=_Judged.key)]},
    }
    return rows, data


def _component_data(cap: Capture) -> dict[str, Any]:
    kept = cap.kept_bytes()
    return {op: {"calls": n, "judged": len(cap.calls.get(op, [])), "kept_bytes": kept.get(op, 0),
                 "skipped": len(cap.skipped.get(op, []))} for op, n in cap.seen.items()}


@torch.inference_mode()
def operator_rung(dut: Any, ref_device: torch.device, cfg: RunConfig, inputs: dict[str, torch.Tensor],
                  adaptations: list[Any] | None = None) -> RungResult:
    """Judge every op type the device runs (traced on step 0 and each component) and the probe's own
    operator cases (``dut`` is the device's probe; ``inputs`` step 0's recorded inputs)."""
    cases = dut.operator_cases(ref_device, cfg, inputs, list(adaptations or []))
    rows = [judge(c, dut.dtype) for c in cases]
    traced, traced_data = traced_rows(dut, cfg, inputs, {r.subject for r in rows})
    rows += traced
    if not rows:
        return RungResult("operator", Verdict.SKIP, "no op calls captured")
    result = RungResult.from_rows("operator", rows)
    bad = [r.subject for r in rows if r.verdict is not Verdict.PASS]
    result.summary = (f"{len(cases)} probe ops and {len(traced)} traced op types within msprobe thresholds" if not bad
                      else f"{result.verdict}: " + ", ".join(bad))
    result.data = {"ops": [{"op": c.op, "impl": c.impl, "exact": c.exact, "shape": c.shape} for c in cases],
                   "traced": traced_data}
    return result
