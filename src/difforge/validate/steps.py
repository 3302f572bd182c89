"""Teacher-forced per-step rung and first-divergent-layer localisation.

Free-running trajectories of a diffusion model drift apart chaotically, so a small per-step error
and a real bug can look alike at the end.  Here every step is isolated: the reference run's inputs
at step ``i`` (latents and timestep, or URSA's token grid) are replayed on both pipelines through
``forward_step`` and the outputs compared.  When a step fails, forward hooks on the transformer
blocks name the first block whose output leaves the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import RunConfig
from ..models.registry import primary_outputs
from .components import floor_ratio, judge_floor
from .metrics import cosine, tensor_compare
from .thresholds import (
    ABS_COS_FAIL,
    BLOCK_COS_DIVERGE,
    RATIO_FAIL,
    RATIO_PASS,
    token_allowance,
)
from .verdict import Row, RungResult, Verdict


@dataclass
class StepTrace:
    """Inputs and outputs of every denoising step of one run, as CPU copies (filled by ``hook``)."""

    inputs: list[dict[str, torch.Tensor]] = field(default_factory=list)
    outputs: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def hook(self, i: int, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]) -> None:
        while len(self.inputs) <= i:
            self.inputs.append({})
            self.outputs.append({})
        self.inputs[i] = {k: _cpu(v) for k, v in inputs.items()}
        self.outputs[i] = {k: _cpu(v) for k, v in outputs.items()}

    def final(self) -> dict[str, torch.Tensor]:
        return self.outputs[-1] if self.outputs else {}


def _cpu(v: Any) -> Any:
    return v.detach().to("cpu").clone() if isinstance(v, torch.Tensor) else v


def primary_key(outputs: dict[str, torch.Tensor]) -> str:
    """The output compared per step: the first registered family's primary output (its record's
    ``primary_output``: Qwen's velocity, URSA's logits) present, else the first floating one."""
    for key in primary_outputs():
        if key in outputs:
            return key
    for key, value in outputs.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return key
    raise KeyError(f"no floating-point output among {sorted(outputs)}")


# ---- block capture ------------------------------------------------------------------------------
def _flat(output: Any) -> torch.Tensor | None:
    """All floating tensors of a block's output, flattened into one CPU float32 vector."""
    found: list[torch.Tensor] = []

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            if x.is_floating_point():
                found.append(x.detach().reshape(-1).to("cpu", torch.float32))
        elif isinstance(x, list | tuple):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    walk(output)
    return torch.cat(found) if found else None


@contextmanager
def capture_blocks(pipeline: Any, reference: dict[str, list[torch.Tensor]] | None = None,
                   reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   ) -> Iterator[tuple[list[str], dict[str, list[Any]]]]:
    """Hook every transformer block.  Without ``reference`` the outputs are stored; with it, each
    call is compared on the fly (so the device side never holds all block outputs at once).
    ``reduce`` maps each flattened output to what is kept or compared (a golden bundle keeps a fixed
    sample of the elements of a large block output; see :mod:`.bundle`)."""
    blocks = list(pipeline.transformer_blocks())
    names = [name for name, _ in blocks]
    store: dict[str, list[Any]] = {name: [] for name in names}
    handles = []
    for name, module in blocks:
        def hook(_mod: Any, _args: Any, output: Any, name: str = name) -> None:
            flat = _flat(output)
            if flat is None:
                return
            if reduce is not None:
                flat = reduce(flat)
            if reference is None:
                store[name].append(flat)
                return
            k = len(store[name])
            ref_list = reference.get(name, [])
            store[name].append(_compare_block(flat, ref_list[k] if k < len(ref_list) else None))

        handles.append(module.register_forward_hook(hook))
    try:
        yield names, store
    finally:
        for h in handles:
            h.remove()


def _compare_block(flat: torch.Tensor, ref: torch.Tensor | None) -> dict[str, Any]:
    if ref is not None and ref.shape == flat.shape:
        return tensor_compare(flat, ref)
    return {"cosine": float("nan"), "rel_l2": float("nan"), "max_abs": float("nan"), "nonfinite_dut": 0,
            "mismatch": True}


def block_outputs(probe: Any, cfg: RunConfig, step: int, inputs: dict[str, torch.Tensor],
                  reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, list[torch.Tensor]]:
    """Every transformer block's (flattened) outputs while ``probe`` replays ``step``, block order kept.

    A golden bundle's probe returns what it recorded (``recorded_blocks``) instead of computing.
    """
    recorded = getattr(probe, "recorded_blocks", None)
    if recorded is not None:
        return recorded(cfg, step)
    with capture_blocks(probe, reduce=reduce) as (_names, store):
        probe.forward_step(cfg, step, inputs)
    return store


def _nan_worst(values: list[float], pick: Any) -> float:
    """min/max of per-call metrics where NaN wins (a NaN call is divergent, whatever its position)."""
    return float("nan") if any(v != v for v in values) else pick(values)


def localise(dut: Any, ref: Any, cfg: RunConfig, step: int, inputs: dict[str, torch.Tensor],
             floor: Any | None = None) -> dict[str, Any]:
    """Replay ``step`` with block hooks on the reference, the device and (if any) the floor; the first
    divergent block is the first the floor rule (:func:`~.components.judge_floor`) does not PASS: its
    rel-L2 over the floor's at that block above ``RATIO_PASS``, or its cosine below the absolute bound
    (so precision drift alone never names a block).  Without a floor, the first whose cosine falls
    below ``BLOCK_COS_DIVERGE``.  Each block reports its ``ratio`` and floor-rule ``verdict``."""
    reduce = getattr(dut, "reduce_block", None)  # set when the reference is a golden bundle's sample
    ref_store = block_outputs(ref, cfg, step, inputs)
    names = list(ref_store)
    with capture_blocks(dut, reference=ref_store, reduce=reduce) as (_, cmp_store):
        dut.forward_step(cfg, step, inputs)
    floor_store: dict[str, list[Any]] = {}
    if floor is dut:
        floor_store = cmp_store
    elif getattr(floor, "recorded_blocks", None) is not None:
        floor_store = {name: [_compare_block(f, r[k] if k < len(r) else None) for k, f in enumerate(fl)]
                       for name, fl in block_outputs(floor, cfg, step, inputs).items()
                       for r in [ref_store.get(name, [])]}
    elif floor is not None:
        with capture_blocks(floor, reference=ref_store) as (_, floor_store):
            floor.forward_step(cfg, step, inputs)
    blocks: list[dict[str, Any]] = []
    first: str | None = None
    for name in names:
        calls = cmp_store.get(name) or []
        if not calls:
            continue
        cos = _nan_worst([c["cosine"] for c in calls], min)
        rel = _nan_worst([c["rel_l2"] for c in calls], max)
        mx = _nan_worst([c["max_abs"] for c in calls], max)
        fcalls = floor_store.get(name) or []
        frel = _nan_worst([c["rel_l2"] for c in fcalls], max) if fcalls else None
        # The floor rule of the rungs (judge_floor): with a floor, a block diverges when its rel-L2 is more
        # than RATIO_PASS x the floor's at that block (or its cosine fails the absolute bound, or NaN), so a
        # fault that scales or shifts a block's output without turning it (cosine ~1) is named where it
        # enters; without a floor, the cosine gate alone (NaN counts as divergent).
        verdict, _how = judge_floor(cos, rel, frel)
        ratio = floor_ratio(rel, frel) if frel is not None else None
        diverged = (verdict is not Verdict.PASS) if frel is not None else (not cos >= BLOCK_COS_DIVERGE)
        blocks.append({"block": name, "calls": len(calls), "cosine": cos, "rel_l2": rel, "max_abs": mx,
                       "floor_rel_l2": frel, "ratio": ratio, "verdict": str(verdict), "divergent": diverged})
        if diverged and first is None:
            first = name
    return {"step": step, "blocks": blocks, "first_divergent": first, "threshold": BLOCK_COS_DIVERGE,
            "ratio_threshold": RATIO_PASS if floor_store else None, "after_blocks": first is None}


# ---- the rung -----------------------------------------------------------------------------------
def _token_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.reshape(-1) == b.reshape(-1)).double().mean())


def judge_step(cos: float, rel: float, floor_cos: float | None, floor_rel: float | None) -> Verdict:
    """The floor rule (:func:`~.components.judge_floor`): the step's rel-L2 against the floor's."""
    return judge_floor(cos, rel, floor_rel)[0]


# ---- URSA's sampler step, teacher-forced on the reference's logits ----------------------------------
def token_disagreement_ratio(dut: float, floor: float, n: int) -> float:
    """A side's share of tokens that differ from the reference's, over the floor's share plus the
    near-boundary allowance (:func:`~.thresholds.token_allowance` of ``n`` tokens): judged like every
    floor ratio (:data:`RATIO_PASS` / :data:`RATIO_FAIL`), never infinite, NaN only for NaN input."""
    if dut != dut or floor != floor:
        return float("nan")
    return dut / (floor + token_allowance(n))


def _ratio_verdict(ratio: float) -> Verdict:
    if ratio != ratio:
        return Verdict.FAIL
    if ratio <= RATIO_PASS:
        return Verdict.PASS
    return Verdict.WARN if ratio <= RATIO_FAIL else Verdict.FAIL


def _sampler_sides(dut: Any, ref: Any, floor: Any | None) -> bool:
    """Every side can run its sampler step alone (a golden bundle's reference cannot: it stores no sampler)."""
    return all(hasattr(p, "sampler_step") for p in (dut, ref) + ((floor,) if floor is not None else ()))


def sampler_outputs(dut: Any, ref: Any, floor: Any | None, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor],
                    logits: torch.Tensor) -> tuple[dict, dict, dict | None]:
    """Each side's sampler step ``i`` on the same ``logits`` (the reference's float32 guided logits), the same
    Philox draws and the reference's drawn targets ``x1``: the device natively in its dtype; the reference in float32 with any low-precision work on
    float32 kernels; the floor - when it is an emulated one (a float32 pipeline standing for a low-precision
    device) - in the device's dtype on float32 kernels, else natively (a second real device)."""
    r = ref.sampler_step(cfg, i, inputs, logits, emulate=ref.dtype)
    x1 = r["x1"]  # every side's rates are computed for the reference's targets (see the probe's sampler_step)
    d = dut.sampler_step(cfg, i, inputs, logits, x1=x1)
    if floor is None:
        return d, r, None
    if floor is ref:
        return d, r, r
    if floor is dut:
        return d, r, d
    emulated_floor = floor.dtype not in (torch.bfloat16, torch.float16) and dut.dtype in (torch.bfloat16, torch.float16)
    f = floor.sampler_step(cfg, i, inputs, logits, emulate=dut.dtype if emulated_floor else None, x1=x1)
    return d, r, f


def sampler_measurements(row: Row, point: dict[str, Any], dut: Any, ref: Any, floor: Any | None, cfg: RunConfig,
                         i: int, inputs: dict[str, torch.Tensor], logits: torch.Tensor) -> None:
    """Judge the sampler/scheduler step ``i`` (URSA's jump probabilities, jump rates and drawn tokens) on
    the reference's logits, adding its measurements to the step's ``row``: the continuous internals by
    the floor rule (rel-L2 over the floor's, the floor raised to its absolute allowance), the tokens by
    :func:`token_disagreement_ratio`.  The transformer's logits are judged by the row's other
    measurements; these catch what the network output cannot show (a broken softmax, exp, normalise or
    codebook matmul in the sampler's low-precision math)."""
    if not _sampler_sides(dut, ref, floor) or "tokens" not in inputs:
        return
    d, r, f = sampler_outputs(dut, ref, floor, cfg, i, inputs, logits)
    info: dict[str, Any] = {}
    for name in ("jump_prob", "rate"):
        if name not in r or name not in d:
            continue
        m = tensor_compare(d[name], r[name])
        fm = tensor_compare(f[name], r[name]) if f is not None and name in f else None
        verdict, how = judge_floor(m["cosine"], m["rel_l2"], fm["rel_l2"] if fm is not None else None)
        ratio = floor_ratio(m["rel_l2"], fm["rel_l2"]) if fm is not None else None
        row.add(f"sampler {name} cosine", m["cosine"])
        row.add(f"sampler {name} rel_l2 / floor", ratio if ratio is not None else m["rel_l2"],
                f"<= {RATIO_PASS:g} PASS, <= {RATIO_FAIL:g} WARN; cosine >= {ABS_COS_FAIL}", verdict, "difforge-ratio")
        bad = m["nonfinite_dut"] - m["nonfinite_ref"]
        if bad > 0:
            row.add(f"sampler {name} nonfinite_only_device", bad, "= 0", Verdict.FAIL, "msprobe-nan")
        info[name] = {"cosine": m["cosine"], "rel_l2": m["rel_l2"], "floor_rel_l2": fm["rel_l2"] if fm else None,
                      "ratio": ratio, "decision": how}
    n = int(r["tokens"].numel())
    dis = 1.0 - _token_agreement(d["tokens"], r["tokens"])
    row.add("sampler x1 agreement", _token_agreement(d["x1"], r["x1"]))
    if f is not None:
        f_dis = 1.0 - _token_agreement(f["tokens"], r["tokens"])
        ratio = token_disagreement_ratio(dis, f_dis, n)
        row.add("sampler token disagreement", dis)
        row.add("sampler floor token disagreement", f_dis)
        row.add("sampler tokens / (floor + allowance)", ratio,
                f"<= {RATIO_PASS:g} PASS, <= {RATIO_FAIL:g} WARN (allowance {token_allowance(n):.3g})",
                _ratio_verdict(ratio), "difforge-tokens")
        info["tokens"] = {"disagreement": dis, "floor_disagreement": f_dis, "ratio": ratio, "n": n}
    else:
        row.add("sampler token disagreement", dis)  # no floor: nothing to hold it against
        info["tokens"] = {"disagreement": dis, "n": n}
    point["sampler"] = info


# ---- every other step output, and Qwen-Image-Edit's work after the network ----------------------------
def _floor_measure(row: Row, name: str, dut: torch.Tensor, ref: torch.Tensor, floor: torch.Tensor | None,
                   judged: bool = True) -> dict[str, Any]:
    """One tensor judged by the floor rule (:func:`~.components.judge_floor`: rel-L2 over the floor's, the
    floor raised to its absolute allowance :data:`~.thresholds.MIN_FLOOR_REL`, so a zero floor - the
    device bit-equal to its emulation - gives a finite ratio), as measurements ``name ...`` of ``row``;
    ``judged`` False: the same numbers, informative (no verdict)."""
    m = tensor_compare(dut, ref)
    fm = tensor_compare(floor, ref) if floor is not None else None
    verdict, how = judge_floor(m["cosine"], m["rel_l2"], fm["rel_l2"] if fm is not None else None)
    ratio = floor_ratio(m["rel_l2"], fm["rel_l2"]) if fm is not None else None
    row.add(f"{name} cosine", m["cosine"])
    rule = f"<= {RATIO_PASS:g} PASS, <= {RATIO_FAIL:g} WARN; cosine >= {ABS_COS_FAIL}"
    if ratio is not None:
        row.add(f"{name} rel_l2 / floor", ratio, rule if judged else "", verdict if judged else None,
                "difforge-ratio")
    else:  # no floor: the cosine gate alone (at best WARN)
        row.add(f"{name} rel_l2", m["rel_l2"], f"cosine >= {ABS_COS_FAIL}; no floor" if judged else "",
                verdict if judged else None, "difforge-ratio")
    bad = m["nonfinite_dut"] - m["nonfinite_ref"]
    if bad > 0 and judged:
        row.add(f"{name} nonfinite_only_device", bad, "= 0", Verdict.FAIL, "msprobe-nan")
    return {"cosine": m["cosine"], "rel_l2": m["rel_l2"], "floor_rel_l2": fm["rel_l2"] if fm else None,
            "ratio": ratio, "verdict": str(verdict) if judged else None, "decision": how if judged else "informative"}


def _floats(out: dict[str, Any]) -> list[str]:
    return [k for k, v in out.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]


def output_measurements(row: Row, point: dict[str, Any], primary: str, dut_out: dict[str, torch.Tensor],
                        ref_out: dict[str, torch.Tensor], flo_out: dict[str, torch.Tensor] | None,
                        informative: tuple[str, ...] = ()) -> None:
    """Every floating-point output of ``forward_step`` besides the primary one, by the floor rule; judged
    unless the probe names it ``informative`` (its ``informative_outputs``); only keys every side returned
    (a golden bundle keeps the primary output alone).  The results go to ``point["outputs"]``."""
    keys = [k for k in _floats(ref_out) if k != primary and k in dut_out and (flo_out is None or k in flo_out)]
    info = {k: _floor_measure(row, k, dut_out[k], ref_out[k], flo_out[k] if flo_out is not None else None,
                              judged=k not in informative)
            for k in keys if dut_out[k].shape == ref_out[k].shape}
    if info:
        point["outputs"] = info


def post_network_stage(row: Row) -> str | None:
    """The first post-network stage (``post <stage>``) that gives ``row`` its verdict, if one does."""
    for m in row.measurements:
        if m.name.startswith("post ") and m.verdict is row.verdict and m.verdict is not Verdict.PASS:
            return m.name.split()[1]  # "post <stage> <measurement>": stages are one word
    return None


def _post_network_sides(dut: Any, ref: Any, floor: Any | None) -> bool:
    """Every side can run its post-network step alone (a golden bundle's reference cannot: it stores none)."""
    return all(hasattr(p, "post_network_step") for p in (dut, ref) + ((floor,) if floor is not None else ()))


def post_network_outputs(dut: Any, ref: Any, floor: Any | None, cfg: RunConfig, i: int,
                         inputs: dict[str, torch.Tensor], teacher: dict[str, torch.Tensor],
                         ) -> tuple[dict, dict, dict | None]:
    """Each side's work after the network at step ``i`` (the probe's ``post_network_step``: Qwen's true-CFG
    combine and norm rescale, the scheduler's Euler step, the latents as the VAE receives them), every side
    fed the reference's ``teacher`` outputs, rounded first to the device's dtype on every side (``hold``: the
    same input values bit for bit, as the device holds them): the device natively in its dtype, the reference
    natively (float32), the floor in the device's dtype on float32 kernels when it is emulated (a float32
    pipeline standing for a low-precision device), else natively (a second real device)."""
    low = (torch.bfloat16, torch.float16)
    hold = dut.dtype if dut.dtype in low else None
    r = ref.post_network_step(cfg, i, inputs, teacher, hold=hold)
    d = dut.post_network_step(cfg, i, inputs, teacher, hold=hold)
    if floor is None:
        return d, r, None
    if floor is ref:
        return d, r, r
    if floor is dut:
        return d, r, d
    emulated_floor = floor.dtype not in low and dut.dtype in low
    return d, r, floor.post_network_step(cfg, i, inputs, teacher, emulate=dut.dtype if emulated_floor else None,
                                         hold=hold)


def post_network_measurements(row: Row, point: dict[str, Any], dut: Any, ref: Any, floor: Any | None,
                              cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor],
                              teacher: dict[str, torch.Tensor]) -> None:
    """Judge every stage after the network output at step ``i``, teacher-forced on the reference's outputs
    (see :func:`post_network_outputs`), each by the floor rule, as measurements ``post <stage> ...`` of the
    step's ``row``: a fault in the CFG rescale, the scheduler update or the unpacking shows here even when
    the network's outputs are clean.  Nothing for a family without ``post_network_step`` (URSA's sampler
    is judged by :func:`sampler_measurements`)."""
    if not _post_network_sides(dut, ref, floor):
        return
    d, r, f = post_network_outputs(dut, ref, floor, cfg, i, inputs, teacher)
    info = {k: _floor_measure(row, f"post {k}", d[k], r[k], f[k] if f is not None else None)
            for k in _floats(r) if k in d and (f is None or k in f) and d[k].shape == r[k].shape}
    if info:
        point["post_network"] = info


def step_rows(dut: Any, ref: Any, cfg: RunConfig, trace: StepTrace, label: str = "", floor: Any | None = None,
              ) -> tuple[list[Row], list[dict]]:
    """Replay every recorded step on the pipelines; one row (and one JSON dict) per step."""
    rows: list[Row] = []
    series: list[dict[str, Any]] = []
    for i, inputs in enumerate(trace.inputs):
        ref_out = ref.forward_step(cfg, i, inputs)
        dut_out = dut.forward_step(cfg, i, inputs)
        flo_out = dut_out if floor is dut else (floor.forward_step(cfg, i, inputs) if floor is not None else None)
        key = primary_key(ref_out)
        m = tensor_compare(dut_out[key], ref_out[key])
        f = tensor_compare(flo_out[key], ref_out[key]) if flo_out is not None else None
        row = Row(f"{label}step {i}")
        verdict = judge_step(m["cosine"], m["rel_l2"], f["cosine"] if f else None, f["rel_l2"] if f else None)
        row.add(f"{key} cosine", m["cosine"], f">= {ABS_COS_FAIL} absolute; then rel-L2 / floor",
                verdict, "difforge-ratio")
        row.add(f"{key} rel_l2", m["rel_l2"])
        if f is not None:
            row.add("floor cosine", f["cosine"])
            row.add("rel_l2 / floor", m["rel_l2"] / f["rel_l2"] if f["rel_l2"] > 0 else float("inf"),
                    f"<= {RATIO_PASS:g} PASS, <= {RATIO_FAIL:g} WARN", None, "difforge-ratio")
        row.add(f"{key} max_abs", m["max_abs"])
        bad = m["nonfinite_dut"] - m["nonfinite_ref"]
        row.add("nonfinite_only_device", max(0, bad), "= 0", Verdict.PASS if bad <= 0 else Verdict.FAIL,
                "msprobe-nan")
        point: dict[str, Any] = {"step": i, "key": key, **{k: m[k] for k in ("cosine", "rel_l2", "max_abs")}}
        if f is not None:  # what the report's per-step plot draws against the rule's lines
            point["floor_rel_l2"] = f["rel_l2"]
            point["ratio"] = m["rel_l2"] / f["rel_l2"] if f["rel_l2"] > 0 else float("inf")
        if key == "logits":
            argmax = _token_agreement(dut_out[key].argmax(-1), ref_out[key].argmax(-1))
            f_arg = _token_agreement(flo_out[key].argmax(-1), ref_out[key].argmax(-1)) if flo_out else None
            row.add("argmax agreement", argmax)  # informative: the logits themselves are judged by rel-L2
            if f_arg is not None:
                row.add("floor argmax agreement", f_arg)
            point["argmax_agreement"] = argmax
        if "tokens" in dut_out and "tokens" in ref_out:
            sampled = _token_agreement(dut_out["tokens"], ref_out["tokens"])
            f_s = (_token_agreement(flo_out["tokens"], ref_out["tokens"])
                   if flo_out is not None and "tokens" in flo_out else None)
            # informative: one sampling draw amplifies near-ties chaotically (a clean bf16 step flipped 25 %
            # of 64 sampled tokens where the floor flipped 2 %); the logits it samples from are judged above
            row.add("sampled-token agreement", sampled)
            if f_s is not None:
                row.add("floor sampled agreement", f_s)
            point["sampled_agreement"] = sampled
        if key == "logits":
            sampler_measurements(row, point, dut, ref, floor, cfg, i, inputs, ref_out[key])
        output_measurements(row, point, key, dut_out, ref_out, flo_out, tuple(getattr(dut, "informative_outputs", ())))
        post_network_measurements(row, point, dut, ref, floor, cfg, i, inputs, ref_out)
        recorded = trace.outputs[i].get(key)
        if isinstance(recorded, torch.Tensor) and recorded.shape == ref_out[key].shape:
            # Harness self-check: the reference's replay must reproduce its own run.
            point["replay_self_cosine"] = cosine(ref_out[key], recorded)
            row.add("replay self-check cosine", point["replay_self_cosine"])
        row.settle()
        point["verdict"] = str(row.verdict)
        rows.append(row)
        series.append(point)
    return rows, series


def _summary(rows: list[Row]) -> str:
    """The sentence the rule that decided produces (not a fixed text): the worst ratio, or the cosine."""
    ratios = [m.value for r in rows for m in r.measurements if m.name == "rel_l2 / floor"]
    ratios = [x for x in ratios if isinstance(x, float)]
    if ratios:
        worst = max(ratios)
        return (f"{len(rows)} teacher-forced steps: worst rel-L2 {worst:.2f}x the floor's (PASS <= {RATIO_PASS:g}, "
                f"FAIL > {RATIO_FAIL:g})")
    cos = [m.value for r in rows for m in r.measurements if m.name.endswith(" cosine")]
    worst_cos = min((c for c in cos if isinstance(c, float)), default=float("nan"))
    return f"{len(rows)} teacher-forced steps without a floor: worst cosine {worst_cos:.5f} (at best WARN)"


def step_rung(dut: Any, ref: Any, runs: list[tuple[RunConfig, StepTrace]], floor: Any | None = None) -> RungResult:
    """Teacher-forced comparison on every (seed) run; localise the first failing (else warning) step."""
    rows: list[Row] = []
    per_seed: list[dict[str, Any]] = []
    target: tuple[RunConfig, int, dict[str, torch.Tensor], Verdict] | None = None
    worst: tuple[float, RunConfig, int, dict[str, torch.Tensor]] | None = None
    for cfg, trace in runs:
        label = f"seed {cfg.seed} " if len(runs) > 1 else ""
        seed_rows, series = step_rows(dut, ref, cfg, trace, label, floor)
        rows.extend(seed_rows)
        per_seed.append({"seed": cfg.seed, "steps": series})
        for i, row in enumerate(seed_rows):
            if row.verdict is Verdict.FAIL and (target is None or target[3] is not Verdict.FAIL):
                target = (cfg, i, trace.inputs[i], Verdict.FAIL)
            elif row.verdict is Verdict.WARN and target is None:
                target = (cfg, i, trace.inputs[i], Verdict.WARN)
            ratio = next((m.value for m in row.measurements if m.name == "rel_l2 / floor"), None)
            if isinstance(ratio, float) and ratio == ratio and (worst is None or ratio > worst[0]):
                worst = (ratio, cfg, i, trace.inputs[i])
    data: dict[str, Any] = {"seeds": per_seed, "localisation": None}
    result = RungResult.from_rows("step", rows, data=data)
    def locate(cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor], informative: bool) -> dict[str, Any]:
        loc = localise(dut, ref, cfg, i, inputs, floor)
        loc.update(seed=cfg.seed, informative=informative)
        data["localisation"] = loc
        return loc

    if target is not None:
        cfg, i, inputs, _ = target
        loc = locate(cfg, i, inputs, informative=False)
        where = loc["first_divergent"] or "after the last block (final norm / head)"
        bad_row = next(r for r in rows if r.verdict is result.verdict)
        result.summary = f"first {result.verdict} at {bad_row.subject}; first divergent block: {where}"
        stage = post_network_stage(bad_row)
        if stage:
            result.summary += f"; after the network: {stage}"
    else:
        result.summary = _summary(rows)
        if worst is not None:
            # Every step passed: the worst one is still replayed block by block (one more forward), so a
            # fault the other rungs catch is located here too; informative only, it never changes the verdict.
            _, cfg, i, inputs = worst
            loc = locate(cfg, i, inputs, informative=True)
            if loc["first_divergent"]:
                result.summary += f"; at the worst step ({i}) block {loc['first_divergent']} exceeds its floor"
    result.data = data
    return result
