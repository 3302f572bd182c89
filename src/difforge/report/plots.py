"""Matplotlib figures of the report (PNG bytes; the Agg backend needs no display)."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def step_error_plot(step_data: dict[str, Any] | None, traj_data: dict[str, Any] | None) -> bytes | None:
    """Left: teacher-forced error per step (1 - cosine, rel-L2). Right: free-running divergence, device
    and floor, per step."""
    seeds = (step_data or {}).get("seeds") or []
    tseeds = (traj_data or {}).get("seeds") or []
    if not seeds and not tseeds:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for s in seeds:
        pts = s["steps"]
        xs = [p["step"] for p in pts]
        ax1.semilogy(xs, [max(1 - p["cosine"], 1e-12) for p in pts], "o-", label=f"1-cos seed {s['seed']}")
        ax1.semilogy(xs, [max(p["rel_l2"], 1e-12) for p in pts], "s--", label=f"rel-L2 seed {s['seed']}")
    ax1.axhline(1 - 0.999, color="green", lw=0.8, ls=":", label="1-cos PASS limit")
    ax1.axhline(1 - 0.99, color="red", lw=0.8, ls=":", label="1-cos FAIL limit")
    ax1.set_xlabel("denoising step")
    ax1.set_title("teacher-forced: device vs reference")
    ax1.legend(fontsize=7)
    for s in tseeds:
        for key, style, who in (("per_step", "o-", "device"), ("per_step_floor", "x--", "floor")):
            pts = s.get(key) or []
            if not pts:
                continue
            xs = [p["step"] for p in pts]
            if "rel_l2" in pts[0]:
                ys = [max(p["rel_l2"], 1e-12) for p in pts]
                ax2.set_ylabel("latent rel-L2")
            else:
                ys = [max(1 - p["token_agreement"], 1e-12) for p in pts]
                ax2.set_ylabel("token disagreement")
            ax2.semilogy(xs, ys, style, label=f"{who} seed {s['seed']}")
    ax2.set_xlabel("denoising step")
    ax2.set_title("free-running trajectory vs reference")
    if ax2.has_data():
        ax2.legend(fontsize=7)
    return _png(fig)


def step_time_plot(bench_data: dict[str, Any] | None) -> bytes | None:
    """Per-step wall time of every timed round (ms)."""
    rounds = (bench_data or {}).get("step_times_s") or []
    if not rounds or not any(rounds):
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for k, times in enumerate(rounds):
        ax.plot(range(len(times)), [t * 1e3 for t in times], "o-", label=f"round {k + 1}")
    ax.set_xlabel("denoising step")
    ax.set_ylabel("ms")
    ax.set_title("per-step time (timed rounds)")
    ax.legend(fontsize=7)
    return _png(fig)


def block_plot(localisation: dict[str, Any] | None) -> bytes | None:
    """Every transformer block's output at the localised step, by the rule that judged it: its rel-L2 over
    the floor's at that block (with a floor, the line at the ratio threshold), else 1 - cosine."""
    blocks = (localisation or {}).get("blocks") or []
    if not blocks:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ratio_rule = localisation.get("ratio_threshold") is not None and all(b.get("ratio") is not None for b in blocks)
    if ratio_rule:
        ys = [b["ratio"] if b["ratio"] == b["ratio"] else 1e3 for b in blocks]
        line, label = localisation["ratio_threshold"], "rel-L2 / floor's"
    else:
        ys = [max(1 - b["cosine"], 1e-12) if b["cosine"] == b["cosine"] else 1.0 for b in blocks]
        line, label = 1 - localisation["threshold"], "1 - cosine"
    colours = ["red" if b["divergent"] else "steelblue" for b in blocks]
    ax.bar(range(len(blocks)), ys, color=colours)
    ax.set_yscale("log")
    ax.axhline(line, color="red", lw=0.8, ls=":")
    ax.set_xticks(range(len(blocks)))
    ax.set_xticklabels([b["block"].split(".")[-1] for b in blocks], fontsize=7)
    ax.set_xlabel("block")
    ax.set_ylabel(label)
    ax.set_title(f"block outputs at step {localisation['step']}")
    return _png(fig)
