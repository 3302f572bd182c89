"""Trajectory rung: the full run from identical CPU-generated noise, judged against a noise floor.

The floor's distance from the float32 reference is what the device's dtype alone costs on a trusted
implementation that shares none of the device's kernels (:mod:`.floor`: emulated on the reference's
float32 kernels, or a second device given with ``--floor``).  A port is accepted when its own
distance stays within the floor rule (ratio 2 PASS, 3 WARN, beyond FAIL; the rule msprobe applies to
NPU-vs-GPU comparisons).  When no floor exists nothing can be proven about precision: each image is
then held to diffusers' absolute fp16-vs-fp32 bound (cosine distance < 0.05), which fails a broken
image but passes a good one only as a WARN, never a PASS.

A discrete model's trajectory (URSA's tokens) is judged step by step along the path the device took,
when every side draws from a stream that gives the same numbers on every device (URSA's Philox stream,
the default on accelerators, ``--fast philox-rng`` elsewhere): at each step the reference - and the floor
- run that step on the device's own recorded tokens with the same draws, and the device's recorded
output must agree with the reference's as well as the floor's does (the share of differing tokens over
all steps at most 2x (PASS) / 3x (WARN) the floor's plus a near-boundary allowance).  A clean bf16 image
of tiny-ursa already sits at PSNR 14 dB from float32, so the pixels cannot tell a diverged sample from a
clean one; and the final tokens cannot either: one near-boundary draw early in a free run changes every
later step's logits, so on tiny-ursa a clean device's final tokens differed from the reference's in 19-38 %
of positions against the floor's 0-44 % (5 seeds, Philox), while three of four planted sampler faults
stayed inside that spread.  Conditioned on the same state, a step has no history to amplify: a clean
device flips only near-boundary draws, a broken one flips what it computes wrongly.  The final tokens'
agreement is reported.  On the reference's CPU stream the draw count depends on how many tokens jump,
so the sides' streams fall out of step and nothing is judged on tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..config import RunConfig
from .metrics import cosine, image_compare, latent_compare
from .steps import StepTrace, token_disagreement_ratio
from .thresholds import FLOOR_MIN_RMSE_LEVELS, NO_FLOOR_COS_DIST, RATIO_FAIL, RATIO_PASS, token_allowance
from .verdict import Row, RungResult, Verdict

LATENT_KEYS = ("latents", "tokens")


@dataclass
class TrajectoryRun:
    """One full run's images and per-step outputs."""

    images: list[Image.Image]
    trace: StepTrace


@dataclass
class StepReplay:
    """Live reference and floor probes that can run one step on any recorded tokens (not a golden bundle's,
    which holds only its own trajectory), and the device's run config of each seed."""

    ref: Any
    floor: Any | None
    configs: dict[int, RunConfig]


def latent_key(trace: StepTrace) -> str | None:
    final = trace.final()
    return next((k for k in LATENT_KEYS if k in final), None)


def per_step_divergence(dut: StepTrace, ref: StepTrace) -> list[dict[str, Any]]:
    """Free-running distance per step (latent rel-L2, or token agreement for discrete models)."""
    key = latent_key(ref)
    if key is None:
        return []
    out = []
    for i, (a, b) in enumerate(zip(dut.outputs, ref.outputs, strict=False)):
        if key in a and key in b and a[key].shape == b[key].shape:
            out.append({"step": i, **latent_compare(a[key], b[key])})
    return out


def _nan_high(x: float) -> float:
    return float("inf") if x != x else x


def judge_ratio(ratio: float) -> Verdict:
    if ratio != ratio:
        return Verdict.FAIL
    if ratio <= RATIO_PASS:
        return Verdict.PASS
    return Verdict.WARN if ratio <= RATIO_FAIL else Verdict.FAIL


def image_cos_distance(a: Image.Image, b: Image.Image) -> float:
    """diffusers' ``numpy_cosine_similarity_distance`` of two images (1 - cosine of the flattened pixels)."""
    x = torch.from_numpy(np.asarray(a.convert("RGB"), dtype=np.float64) / 255.0)
    y = torch.from_numpy(np.asarray(b.convert("RGB"), dtype=np.float64) / 255.0)
    if x.shape != y.shape:
        return float("nan")
    return 1.0 - cosine(x, y)


def shared_stream(probe: Any, cfg: RunConfig) -> bool:
    """Whether a run of ``cfg`` on ``probe``'s pipeline draws from a stream that gives every device the same
    numbers (the probe's optional ``portable_stream``; a family without one draws no discrete tokens)."""
    fn = getattr(probe, "portable_stream", None)
    return bool(fn(cfg)) if fn is not None else False


def judge_without_floor(dist: float) -> Verdict:
    """No floor: beyond the absolute bound (or NaN) fails; within it is only a WARN, never a PASS."""
    return Verdict.WARN if dist < NO_FLOOR_COS_DIST else Verdict.FAIL


def _replayed(probe: Any, trace: StepTrace | None, cfg: RunConfig, i: int, tokens: torch.Tensor) -> torch.Tensor:
    """``probe``'s tokens after step ``i`` from ``tokens``: its own run's, when that run was in this state (on a
    shared stream a step replayed on its own run's state is that run's step, so nothing is recomputed), else
    one teacher-forced step."""
    if trace is not None and i < len(trace.inputs):
        seen = trace.inputs[i].get("tokens")
        if isinstance(seen, torch.Tensor) and seen.shape == tokens.shape and torch.equal(seen, tokens):
            return trace.outputs[i]["tokens"]
    return probe.forward_step(cfg, i, {"tokens": tokens})["tokens"]


def step_agreement(dut: TrajectoryRun, ref: TrajectoryRun, floor: TrajectoryRun | None, replay: StepReplay,
                   seed: int) -> dict[str, Any] | None:
    """Token flips along the device's own path: per recorded step, the device's output against the reference's
    step on the same input tokens (and the floor's against the reference's); None when the run has no tokens."""
    cfg = replay.configs.get(seed)
    if cfg is None or not dut.trace.inputs:
        return None
    flips, floor_flips, total, steps = 0, 0, 0, []
    for i, (inp, out) in enumerate(zip(dut.trace.inputs, dut.trace.outputs, strict=False)):
        x, y = inp.get("tokens"), out.get("tokens")
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            return None
        r = _replayed(replay.ref, ref.trace, cfg, i, x)
        d = int((y.reshape(-1) != r.reshape(-1)).sum())
        step: dict[str, Any] = {"step": i, "device_flips": d}
        if replay.floor is not None and floor is not None:
            f = _replayed(replay.floor, floor.trace, cfg, i, x)
            fd = int((f.reshape(-1) != r.reshape(-1)).sum())
            floor_flips += fd
            step["floor_flips"] = fd
        flips += d
        total += int(r.numel())
        steps.append(step)
    return {"flips": flips, "floor_flips": floor_flips if replay.floor is not None and floor is not None else None,
            "tokens": total, "steps": steps}


def _decoded_rows(seed: int, dut: TrajectoryRun, floor: TrajectoryRun | None, replay: StepReplay | None,
                  label: str) -> list[tuple[Row, dict[str, Any]]]:
    """The device's pictures against the reference's decode of the device's own final tokens (and the floor's
    decode of them against it): the decode path of the trajectory's actual output, free of which tokens were
    drawn - those are judged step by step.  Empty for a continuous model or without live probes (a probe
    without ``decode_tokens``)."""
    cfg = replay.configs.get(seed) if replay is not None else None
    final = dut.trace.final().get("tokens")
    if replay is None or cfg is None or not isinstance(final, torch.Tensor) or not hasattr(replay.ref, "decode_tokens"):
        return []
    ref_imgs = replay.ref.decode_tokens(cfg, final)
    has_floor = replay.floor is not None and floor is not None
    floor_imgs = replay.floor.decode_tokens(cfg, final) if has_floor else None
    out: list[tuple[Row, dict[str, Any]]] = []
    for k, (a, b) in enumerate(zip(dut.images, ref_imgs, strict=False)):
        m = image_compare(a, b)
        row = Row(f"{label}image {k} from the device's tokens")
        row.add("psnr_db", m["psnr_db"])
        row.add("rmse_levels", m["rmse"])
        f = image_compare(floor_imgs[k], b) if floor_imgs is not None and k < len(floor_imgs) else None
        if f is not None:
            ratio = m["rmse"] / max(f["rmse"], FLOOR_MIN_RMSE_LEVELS)
            row.add("floor_rmse_levels", f["rmse"])
            row.add("rmse / floor", ratio, f"<= {RATIO_PASS:g} PASS, <= {RATIO_FAIL:g} WARN",
                    judge_ratio(ratio), "difforge-floor")
        else:
            dist = image_cos_distance(a, b)
            row.add("cos distance (no floor)", dist, f"< {NO_FLOOR_COS_DIST:g} WARN (no floor: never PASS), else FAIL",
                    judge_without_floor(dist), "diffusers-fp16")
        out.append((row, {"device": m, "floor": f}))
    return out


def _step_agreement_row(label: str, agree: dict[str, Any]) -> Row:
    row = Row(f"{label}tokens step by step")
    n = agree["tokens"]
    dis = agree["flips"] / max(1, n)
    row.add("token-steps compared", n)
    row.add("device flips", agree["flips"])
    if agree["floor_flips"] is None:
        row.add("one-step disagreement (no floor)", dis)
        row.note = "tokens not judged: no noise floor"
        return row
    f_dis = agree["floor_flips"] / max(1, n)
    ratio = token_disagreement_ratio(dis, f_dis, n)
    row.add("floor flips", agree["floor_flips"])
    row.add("one-step disagreement", dis)
    row.add("floor one-step disagreement", f_dis)
    row.add("tokens / (floor + allowance)", ratio,
            f"<= {RATIO_PASS:g} PASS, <= {RATIO_FAIL:g} WARN (allowance {token_allowance(n):.3g})",
            judge_ratio(ratio), "difforge-tokens")
    return row


def trajectory_rows(seed: int, dut: TrajectoryRun, ref: TrajectoryRun, floor: TrajectoryRun | None,
                    label: str, shared: bool = False, replay: StepReplay | None = None,
                    ) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    data: dict[str, Any] = {"seed": seed, "images": [], "latent": None}
    decoded = _decoded_rows(seed, dut, floor, replay, label)
    # On a shared stream a discrete model's end-to-end picture differs wherever one token flipped (a floor whose
    # tokens happened to match the reference's has a zero image error): the tokens are judged step by step and
    # the pixels from the device's own tokens, so the end-to-end ratio is reported, not judged.
    end_to_end_judged = not (shared and decoded)
    for k, (a, b) in enumerate(zip(dut.images, ref.images, strict=False)):
        m = image_compare(a, b)
        f = image_compare(floor.images[k], b) if floor is not None and k < len(floor.images) else None
        row = Row(f"{label}image {k}")
        for key in ("mse", "mae", "psnr_db", "ssim", "within_1", "within_4", "within_16"):
            row.add(key, m[key])
        row.add("rmse_levels", m["rmse"])
        if f is not None:
            floor_rmse = max(f["rmse"], FLOOR_MIN_RMSE_LEVELS)
            ratio = m["rmse"] / floor_rmse
            row.add("floor_rmse_levels", f["rmse"])
            row.add("floor_psnr_db", f["psnr_db"])
            row.add("floor_ssim", f["ssim"])
            if end_to_end_judged:
                row.add("rmse / floor", ratio, f"<= {RATIO_PASS:g} PASS, <= {RATIO_FAIL:g} WARN",
                        judge_ratio(ratio), "difforge-floor")
            else:
                row.add("end-to-end rmse / floor", ratio)
                row.note = ("informative on a shared stream: the picture's tokens are judged step by step and its "
                            "pixels from the device's own tokens (the rows below)")
        else:
            dist = image_cos_distance(a, b)
            m["cos_distance"] = dist
            row.add("cos distance (no floor)", dist, f"< {NO_FLOOR_COS_DIST:g} WARN (no floor: never PASS), else FAIL",
                    judge_without_floor(dist), "diffusers-fp16")
            row.note = "no noise floor: precision not judged, only diffusers' absolute fp16 bound"
        rows.append(row)
        data["images"].append({"device": m, "floor": f})
    for row, entry in decoded:
        rows.append(row)
        data.setdefault("decoded", []).append(entry)
    key = latent_key(ref.trace)
    if key is not None and key in dut.trace.final():
        lat = latent_compare(dut.trace.final()[key], ref.trace.final()[key])
        flat = (latent_compare(floor.trace.final()[key], ref.trace.final()[key])
                if floor is not None and key in floor.trace.final() else None)
        row = Row(f"{label}final {key}")
        for name, value in lat.items():
            if name in ("mse", "mae", "cosine", "rel_l2", "token_agreement"):
                row.add(name, value)
        if flat is not None:
            for name, value in flat.items():
                if name in ("mse", "cosine", "token_agreement"):
                    row.add(f"floor {name}", value)
        if "token_agreement" in lat:
            row.note = ("informative: one early near-boundary draw changes every later step of a free run, so the "
                        "final tokens are judged step by step (the row 'tokens step by step')" if shared else
                        "tokens not judged: the sides drew from the reference's CPU stream, which falls out of step "
                        "between them (judged on the portable Philox stream: --fast philox-rng)")
        rows.append(row)
        data["latent"] = {"key": key, "device": lat, "floor": flat}
        if shared and replay is not None and "token_agreement" in lat:
            agree = step_agreement(dut, ref, floor, replay, seed)
            if agree is not None:
                rows.append(_step_agreement_row(label, agree))
                data["step_agreement"] = agree
    data["per_step"] = per_step_divergence(dut.trace, ref.trace)
    data["per_step_floor"] = per_step_divergence(floor.trace, ref.trace) if floor is not None else []
    return rows, data


def trajectory_rung(runs: list[tuple[int, TrajectoryRun, TrajectoryRun, TrajectoryRun | None]],
                    floor_label: str, shared: bool = False, replay: StepReplay | None = None) -> RungResult:
    """``runs``: (seed, device run, reference run, floor run) per seed; ``shared``: every side drew from a
    stream that gives every device the same numbers (:func:`shared_stream`); ``replay``: the live probes that
    replay steps on the device's tokens - with both, a discrete model's path is judged step by step."""
    rows: list[Row] = []
    seeds: list[dict[str, Any]] = []
    for seed, dut, ref, floor in runs:
        label = f"seed {seed} " if len(runs) > 1 else ""
        r, d = trajectory_rows(seed, dut, ref, floor, label, shared, replay)
        rows.extend(r)
        seeds.append(d)
    result = RungResult.from_rows("trajectory", rows, data={"seeds": seeds, "floor": floor_label,
                                                            "floor_available": all(f is not None for *_, f in runs)})
    judged = [r for r in rows if any(m.name == "rmse / floor" and m.verdict is not None for m in r.measurements)]
    unfloored = [r for r in rows if any(m.name == "cos distance (no floor)" for m in r.measurements)]
    parts: list[str] = []
    if judged:
        worst_ratio = max(r.get("rmse / floor") for r in judged)
        psnrs = [r.get("psnr_db") for r in judged]
        parts.append(f"image RMSE at most {worst_ratio:.2f}x the {floor_label} floor (PSNR {min(psnrs):.1f} dB worst)")
    if unfloored:
        dists = [r.get("cos distance (no floor)") for r in unfloored]
        worst_dist = float("nan") if any(d != d for d in dists) else max(dists)
        parts.append(f"no noise floor for {len(unfloored)} image(s), so not judged against precision: image cosine "
                     f"distance {worst_dist:.3g} (diffusers bound < {NO_FLOOR_COS_DIST:g}; at best WARN)")
    tokens = [r for r in rows if any(m.name == "tokens / (floor + allowance)" for m in r.measurements)]
    if tokens:
        worst_tok = max(tokens, key=lambda r: _nan_high(r.get("tokens / (floor + allowance)")))
        parts.append(f"tokens step by step along the device's path: worst {worst_tok.get('one-step disagreement'):.1%} "
                     f"differ from the reference's step (floor {worst_tok.get('floor one-step disagreement'):.1%}; "
                     f"{worst_tok.get('tokens / (floor + allowance)'):.2f}x floor + allowance)")
    if not judged and not unfloored:
        # informative rows alone must never read as a PASS
        result.verdict = Verdict.FAIL if not rows else Verdict.WARN
        parts.append("no image to judge: the device and the reference produced no comparable image")
    result.summary = "; ".join(parts)
    return result
