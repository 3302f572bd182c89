"""Matplotlib figures of the report (PNG bytes; the Agg backend needs no display).

Each quantity gets its own axes (a ratio and a cosine never share a y scale), steps are integer ticks,
and the horizontal lines are the limits the rules really apply (:mod:`difforge.validate.thresholds`),
so a reader can see where a step crossed one.  Labels follow the report's language; the zh plots use
the report's embedded Chinese font (:mod:`difforge.report.fonts`), so they render on a machine without
one.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..validate.thresholds import ABS_COS_FAIL, RATIO_FAIL, RATIO_PASS  # noqa: E402

#: The figures' labels, one JSON object per language; the limit lines name the thresholds they draw
#: (``{RATIO_PASS:g}`` ...), filled in here, so a changed threshold relabels its line.
LABELS_FILE = Path(__file__).parent / "templates" / "plot_labels.json"
LIMITS = {"RATIO_PASS": RATIO_PASS, "RATIO_FAIL": RATIO_FAIL, "ABS_COS_FAIL": ABS_COS_FAIL}
LABELS: dict[str, dict[str, str]] = {
    lang: {key: text.format(**LIMITS) for key, text in labels.items()}
    for lang, labels in json.loads(LABELS_FILE.read_text(encoding="utf-8")).items()
}
#: The Chinese labels (the embedded font's subset must hold their characters).
ZH_LABELS = LABELS["zh"]
TINY = 1e-12


def _labels(lang: str) -> dict[str, str]:
    if lang == "zh":
        from .fonts import register_matplotlib

        family = register_matplotlib()
        plt.rcParams["font.family"] = ["DejaVu Sans", family]  # Latin first, the CJK subset for the rest
    else:
        plt.rcParams["font.family"] = ["DejaVu Sans"]
    return LABELS.get(lang, LABELS["en"])


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _steps_axis(ax: Any, label: str) -> None:
    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _finite(y: float, cap: float = 1e3) -> float:
    return cap if not math.isfinite(y) else max(y, TINY)


def step_error_plot(step_data: dict[str, Any] | None, traj_data: dict[str, Any] | None,
                    lang: str = "en") -> bytes | None:
    """The teacher-forced step rule on its own axes - rel-L2 over the floor's with the PASS/FAIL ratio lines
    (rel-L2 alone when there is no floor), and 1 - cosine with the absolute cosine limit - then the
    free-running trajectory's per-step divergence, device and floor (informative: the trajectory rung
    judges the final image)."""
    seeds = (step_data or {}).get("seeds") or []
    tseeds = (traj_data or {}).get("seeds") or []
    if not seeds and not tseeds:
        return None
    t = _labels(lang)
    panels = (2 if seeds else 0) + (1 if tseeds else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4), squeeze=False)
    axes = list(axes[0])
    if seeds:
        ax_r, ax_c = axes.pop(0), axes.pop(0)
        has_floor = all("ratio" in p for s in seeds for p in s["steps"])
        for s in seeds:
            xs = [p["step"] for p in s["steps"]]
            label = f"{t['seed']} {s['seed']}"
            if has_floor:
                ax_r.plot(xs, [_finite(p["ratio"]) for p in s["steps"]], "o-", label=label)
            else:
                ax_r.semilogy(xs, [_finite(p["rel_l2"]) for p in s["steps"]], "o-", label=label)
            ax_c.semilogy(xs, [_finite(1 - p["cosine"]) for p in s["steps"]], "o-", label=label)
        if has_floor:
            ax_r.axhline(RATIO_PASS, color="green", lw=1, ls="--", label=t["pass_line"])
            ax_r.axhline(RATIO_FAIL, color="red", lw=1, ls="--", label=t["fail_line"])
            worst = max(_finite(p["ratio"]) for s in seeds for p in s["steps"])
            if worst > 10:  # a blown-up step: a log scale keeps the clean ones readable
                ax_r.set_yscale("log")
            else:
                ax_r.set_ylim(0, max(RATIO_FAIL * 1.25, worst * 1.1))
            ax_r.set_ylabel(t["ratio"])
            ax_r.set_title(t["ratio_title"], fontsize=9)
        else:
            ax_r.set_ylabel(t["rel"])
            ax_r.set_title(t["rel_title"], fontsize=9)
        ax_c.axhline(1 - ABS_COS_FAIL, color="red", lw=1, ls="--", label=t["cos_line"])
        ax_c.set_ylabel(t["cos"])
        ax_c.set_title(t["cos_title"], fontsize=9)
        for ax in (ax_r, ax_c):
            _steps_axis(ax, t["step"])
            ax.legend(fontsize=7)
    if tseeds:
        ax = axes.pop(0)
        for s in tseeds:
            for key, style, who in (("per_step", "o-", t["device"]), ("per_step_floor", "x--", t["floor"])):
                pts = s.get(key) or []
                if not pts:
                    continue
                xs = [p["step"] for p in pts]
                if "rel_l2" in pts[0]:
                    ys = [_finite(p["rel_l2"]) for p in pts]
                    ax.set_ylabel(t["traj_latent"])
                    ax.set_yscale("log")
                else:  # a share from 0 to 1: a linear axis (a log one would stretch the exact 0 of step 0)
                    ys = [1 - p["token_agreement"] for p in pts]
                    ax.set_ylabel(t["traj_tokens"])
                    ax.set_ylim(0, 1.05)
                ax.plot(xs, ys, style, label=f"{who}, {t['seed']} {s['seed']}")
        _steps_axis(ax, t["step"])
        ax.set_title(t["traj_title"], fontsize=9)
        if ax.has_data():
            ax.legend(fontsize=7)
    return _png(fig)


def step_time_plot(bench_data: dict[str, Any] | None, lang: str = "en") -> bytes | None:
    """Per-step wall time of every timed round (ms)."""
    rounds = (bench_data or {}).get("step_times_s") or []
    if not rounds or not any(rounds):
        return None
    t = _labels(lang)
    fig, ax = plt.subplots(figsize=(7, 3.0))
    for k, times in enumerate(rounds):
        ax.plot(range(len(times)), [x * 1e3 for x in times], "o-", label=f"{t['round']} {k + 1}")
    _steps_axis(ax, t["step"])
    ax.set_ylabel(t["ms"])
    ax.set_ylim(bottom=0)
    ax.set_title(t["time_title"], fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


def block_plot(localisation: dict[str, Any] | None, lang: str = "en") -> bytes | None:
    """Every transformer block's output at the localised step, by the rule that judged it: its rel-L2 over
    the floor's at that block (with a floor, the line at the ratio threshold), else 1 - cosine."""
    blocks = (localisation or {}).get("blocks") or []
    if not blocks:
        return None
    t = _labels(lang)
    fig, ax = plt.subplots(figsize=(7, 3.0))
    ratio_rule = localisation.get("ratio_threshold") is not None and all(b.get("ratio") is not None for b in blocks)
    if ratio_rule:
        ys = [_finite(b["ratio"]) for b in blocks]
        line, label = localisation["ratio_threshold"], t["block_ratio"]
    else:
        ys = [_finite(1 - b["cosine"]) if b["cosine"] == b["cosine"] else 1.0 for b in blocks]
        line, label = 1 - localisation["threshold"], t["block_cos"]
    colours = ["red" if b["divergent"] else "steelblue" for b in blocks]
    ax.bar(range(len(blocks)), ys, color=colours)
    if not ratio_rule or max(ys) > 10:  # a cosine gap, or a blown-up block: a log scale
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, max(line * 1.25, max(ys) * 1.1))
    ax.axhline(line, color="red", lw=1, ls="--")
    ax.set_xticks(range(len(blocks)))
    ax.set_xticklabels([b["block"].split(".")[-1] for b in blocks], fontsize=7)
    ax.set_xlabel(t["block"])
    ax.set_ylabel(label)
    ax.set_title(t["block_title"].format(step=localisation["step"]), fontsize=9)
    return _png(fig)
