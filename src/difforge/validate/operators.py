"""Operator rung: every op the port runs, on the real inputs it sees, against float32 on the CPU.

The inputs are captured from one teacher-forced step of the device under test (so shapes and value
ranges are the model's own, not synthetic), upcast to float32 and replayed through the portable
reference implementation on the CPU.  Each op is judged by msprobe's pre-check decision tree.  In
bf16/fp16 the dual-N shares fail on output rounding alone, so a dual-N miss is settled by msprobe's
new-standard ratios (RMSE <= 2x, max relative error <= 10x, small-value errors <= 2x) against the
same reference implementation run at the device's dtype on the reference device (what the dtype
alone costs); NaN/Inf on the device only and cosine <= 0.99 always fail.

URSA ops are captured by wrapping the transformer's :class:`~difforge.ops.OpSet`; Qwen-Image-Edit
ops (diffusers modules) by forward hooks on the first RMSNorm and the first joint attention.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..config import RunConfig
from .metrics import op_compare
from .thresholds import OP_COSINE, OP_MAX_ABS, dual_rule
from .verdict import Row, RungResult, Verdict

RMSE_RATIO = 2.0
MAX_REL_RATIO = 10.0


@dataclass
class OpCase:
    """One op as it ran on the device, with the reference (fp32 CPU) and floor outputs for it."""

    op: str
    impl: str
    exact: bool
    shape: str
    dut: torch.Tensor
    ref: torch.Tensor
    floor: torch.Tensor | None
    note: str = ""


def _detach(t: Any) -> Any:
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def _up(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float32)


def _to(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return t.detach().to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)


def _shape(*ts: torch.Tensor) -> str:
    return ", ".join("x".join(str(s) for s in t.shape) for t in ts)


def _rotate_half_layout(t: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs (a0, b0, a1, b1 ...) -> rotate-half layout (a0, a1 ..., b0, b1 ...)."""
    return torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)


def _match_layout(dut: torch.Tensor, ref: torch.Tensor, floor: torch.Tensor) -> tuple[str, torch.Tensor, torch.Tensor]:
    """Fused rotary kernels may return the rotate-half layout (same attention, permuted head dim).
    Compare in whichever of the two layouts the device output is closer to; a wrong pairing is far
    from both."""
    from .metrics import cosine

    half = _rotate_half_layout(ref)
    if cosine(dut, half) > cosine(dut, ref):
        return "rotate-half", half, _rotate_half_layout(floor)
    return "interleaved", ref, floor


# ---- URSA: wrap the OpSet ---------------------------------------------------------------------------
class _Recorder:
    """Wraps OpSet callables to keep the first call(s) of each op: inputs and output."""

    def __init__(self, ops: Any, head_dim: int) -> None:
        self.ops = ops
        self.head_dim = head_dim
        self.calls: dict[str, list[tuple[tuple, Any]]] = {}

    def _keep(self, key: str, args: tuple, out: Any, limit: int = 1) -> None:
        lst = self.calls.setdefault(key, [])
        if len(lst) < limit:
            lst.append((tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args),
                        out.detach().clone() if isinstance(out, torch.Tensor) else out))

    def wrapped(self) -> Any:
        ops = self.ops

        def rms_norm(x, w, eps):  # type: ignore[no-untyped-def]
            out = ops.rms_norm(x, w, eps)
            self._keep("rms_norm/head" if x.shape[-1] == self.head_dim else "rms_norm/hidden", (x, w, eps), out)
            return out

        def swiglu(g, u):  # type: ignore[no-untyped-def]
            out = ops.swiglu(g, u)
            self._keep("swiglu", (g, u), out)
            return out

        def rope_table(cos, sin):  # type: ignore[no-untyped-def]
            self._keep("rope_table", (cos, sin), None)
            return ops.rope_table(cos, sin)

        def rotary(x, table):  # type: ignore[no-untyped-def]
            out = ops.rotary(x, table)
            self._keep("rotary", (x,), out, limit=2)  # q then k of the first layer
            return out

        def attention(q, k, v):  # type: ignore[no-untyped-def]
            out = ops.attention(q, k, v)
            self._keep("attention", (q, k, v), out)
            return out

        changes: dict[str, Any] = {"rms_norm": rms_norm, "swiglu": swiglu, "rope_table": rope_table,
                                   "rotary": rotary, "attention": attention}
        if ops.swiglu_packed is not None:
            def swiglu_packed(gu):  # type: ignore[no-untyped-def]
                out = ops.swiglu_packed(gu)
                self._keep("swiglu", tuple(gu.chunk(2, dim=-1)), out)
                return out

            changes["swiglu_packed"] = swiglu_packed
        return dataclasses.replace(ops, **changes)


def ursa_cases(dut: Any, ref_device: torch.device, cfg: RunConfig, inputs: dict[str, torch.Tensor]) -> list[OpCase]:
    from ..ops import plain_ops

    transformer = dut.transformer
    original = transformer.ops
    recorder = _Recorder(original, transformer.config.head_dim)
    transformer.set_ops(recorder.wrapped())
    try:
        dut.forward_step(cfg, 0, inputs)
    finally:
        transformer.set_ops(original)
    plain = plain_ops()
    choices = dict(original.choices)
    calls = recorder.calls
    dt = dut.dtype

    def floor_of(fn: Any, *args: Any) -> torch.Tensor:
        return fn(*(_to(a, ref_device, dt) if isinstance(a, torch.Tensor) else a for a in args))

    def up_args(args: tuple) -> tuple:
        return tuple(_up(a) if isinstance(a, torch.Tensor) else a for a in args)

    cases: list[OpCase] = []
    for key in ("rms_norm/hidden", "rms_norm/head"):
        if key in calls:
            (x, w, eps), out = calls[key][0]
            ch = choices.get("rms_norm")
            cases.append(OpCase(key, ch.name if ch else "?", ch.exact if ch else True, _shape(x, w), _up(out),
                                plain.rms_norm(*up_args((x, w, eps))), floor_of(plain.rms_norm, x, w, eps)))
    if "swiglu" in calls:
        (g, u), out = calls["swiglu"][0]
        ch = choices.get("swiglu")
        cases.append(OpCase("swiglu", ch.name if ch else "?", ch.exact if ch else True, _shape(g, u), _up(out),
                            plain.swiglu(_up(g), _up(u)), floor_of(plain.swiglu, g, u)))
    if "rotary" in calls and "rope_table" in calls:
        (q,), q_rot = calls["rotary"][0]
        (cos, sin), _ = calls["rope_table"][0]
        ref = plain.rotary(_up(q), plain.rope_table(_up(cos), _up(sin)))
        flo = plain.rotary(_to(q, ref_device, dt), plain.rope_table(_to(cos, ref_device, dt), _to(sin, ref_device, dt)))
        layout, ref, flo = _match_layout(_up(q_rot), ref, flo)
        ch = choices.get("rotary")
        cases.append(OpCase("rotary", ch.name if ch else "?", ch.exact if ch else True, _shape(q), _up(q_rot), ref, flo,
                            note=f"output layout {layout} (the reference is compared in the same layout)"))
    if "attention" in calls:
        (q, k, v), out = calls["attention"][0]
        ch = choices.get("attention")
        cases.append(OpCase("attention", ch.name if ch else "?", ch.exact if ch else True, _shape(q, k, v),
                            _up(out), plain.attention(_up(q), _up(k), _up(v)),
                            floor_of(plain.attention, q, k, v)))
    return cases


# ---- Qwen-Image-Edit: hook diffusers modules -------------------------------------------------------
def qwen_cases(dut: Any, ref_device: torch.device, cfg: RunConfig, inputs: dict[str, torch.Tensor],
               adaptations: list[Any]) -> list[OpCase]:
    from ..models.qwen_edit.attention import QwenJointAttnProcessor
    from ..models.qwen_edit.overrides import reference_attention, reference_rms_norm

    blocks = list(dut.transformer_blocks())
    if not blocks:
        return []
    first = blocks[0][1]
    norm = next((m for m in first.modules() if type(m).__name__ == "RMSNorm"), None)
    attn = getattr(first, "attn", None)
    seen: dict[str, tuple[tuple, dict, Any]] = {}

    def keeper(key: str) -> Any:
        def hook(_m: Any, args: tuple, kwargs: dict, out: Any) -> None:
            if key not in seen:
                out_c = tuple(_detach(o) for o in out) if isinstance(out, tuple) else _detach(out)
                seen[key] = (tuple(_detach(a) for a in args), {k: _detach(v) for k, v in kwargs.items()}, out_c)
        return hook

    handles = []
    if norm is not None:
        handles.append(norm.register_forward_hook(keeper("rms_norm"), with_kwargs=True))
    if attn is not None:
        handles.append(attn.register_forward_hook(keeper("attention"), with_kwargs=True))
    try:
        dut.forward_step(cfg, 0, inputs)
    finally:
        for h in handles:
            h.remove()
    adapt = {a.what: a for a in adaptations}
    dt = dut.dtype
    cases: list[OpCase] = []
    if "rms_norm" in seen and norm is not None:
        (x, *_), _, out = seen["rms_norm"]
        w = norm.weight
        bias = getattr(norm, "bias", None)

        def run(xx: torch.Tensor, ww: torch.Tensor | None, bb: torch.Tensor | None) -> torch.Tensor:
            y = reference_rms_norm(xx, ww, norm.eps)
            return y + bb if bb is not None else y

        ref = run(_up(x), None if w is None else _up(w), None if bias is None else _up(bias))
        flo = run(_to(x, ref_device, dt), None if w is None else _to(w, ref_device, dt),
                  None if bias is None else _to(bias, ref_device, dt))
        a = adapt.get("rms_norm")
        cases.append(OpCase("rms_norm", a.choice if a else "diffusers RMSNorm", a.exact if a else True,
                            _shape(x), _up(out), ref, flo))
    if "attention" in seen and attn is not None:
        args, kwargs, out = seen["attention"]

        def run_copy(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
            mod = copy.deepcopy(attn).to(device=device, dtype=dtype)
            for sub in mod.modules():  # drop instance-level op overrides: the reference runs plain ops
                sub.__dict__.pop("forward", None)
            # Same processor as the port (it understands the port's RoPE tables and ragged CFG batch),
            # but with the plain SDPA kernel.
            mod.set_processor(QwenJointAttnProcessor(attention=reference_attention))

            def mv(t: Any) -> Any:
                return _to(t, device, dtype) if isinstance(t, torch.Tensor) else t

            res = mod(*(mv(a) for a in args), **{k: (tuple(mv(x) for x in v) if isinstance(v, tuple) else mv(v))
                                                 for k, v in kwargs.items()})
            return torch.cat([_up(r).reshape(-1) for r in res])

        dut_out = torch.cat([_up(r).reshape(-1) for r in out])
        a = adapt.get("attention")
        hs = args[0] if args else kwargs.get("hidden_states")
        cases.append(OpCase("joint attention (block 0)", a.choice if a else "diffusers processor",
                            a.exact if a else True, _shape(hs) if isinstance(hs, torch.Tensor) else "?",
                            dut_out, run_copy(torch.device("cpu"), torch.float32), run_copy(ref_device, dt),
                            note="whole attention sub-module (projections, q/k norm, RoPE, kernel)"))
    return cases


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
                verdict, how = Verdict.PASS, f"{how}, explained by {_dn(dtype)} (within the ratio rule)"
    row.add("decision", how, "msprobe pre-check tree, then ratio rule", verdict, "msprobe-precheck")
    return row


def _ratio(a: float, b: float) -> float:
    if b <= 0:
        return 1.0 if a <= 0 else float("inf")
    return a / b


def _dn(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@torch.inference_mode()
def operator_rung(dut: Any, ref_device: torch.device, cfg: RunConfig, inputs: dict[str, torch.Tensor],
                  adaptations: list[Any] | None = None) -> RungResult:
    """Capture the device's ops on step 0 of the reference trajectory and judge each one."""
    if getattr(dut, "family", "") == "ursa":
        cases = ursa_cases(dut, ref_device, cfg, inputs)
    else:
        cases = qwen_cases(dut, ref_device, cfg, inputs, list(adaptations or []))
    if not cases:
        return RungResult("operator", Verdict.SKIP, "no op calls captured")
    rows = [judge(c, dut.dtype) for c in cases]
    result = RungResult.from_rows("operator", rows)
    bad = [r.subject for r in rows if r.verdict is not Verdict.PASS]
    result.summary = (f"{len(rows)} ops within msprobe thresholds" if not bad
                      else f"{result.verdict}: " + ", ".join(bad))
    result.data = {"ops": [{"op": c.op, "impl": c.impl, "exact": c.exact, "shape": c.shape} for c in cases]}
    return result
