"""Benchmark rung: warm-up rounds excluded, R timed rounds, read back from their RunRecords.

Numbers are normalised so ports of different models and devices can be compared: transformer
forwards per step, tokens per forward, FLOPs per step, achieved TFLOP/s and, where the device's
dense peak is known, model FLOPs utilisation (MFU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..devices import dtype_name
from ..runtime.record import RunRecord
from .metrics import summarize
from .verdict import Row, RungResult, Verdict


@dataclass(frozen=True)
class Peak:
    """Dense peak TFLOP/s of one accelerator by compute dtype, and where the figure comes from."""

    match: str  # lower-case substring of the device name
    label: str
    tflops: dict[str, float]
    source: str


#: Dense (no structured sparsity) tensor-core peaks.  First match wins, so specific names go first.
KNOWN_PEAKS: tuple[Peak, ...] = (
    Peak("h100 pcie", "NVIDIA H100 PCIe", {"bfloat16": 756.5, "float16": 756.5, "float32": 51.2},
         "NVIDIA H100 Tensor Core GPU datasheet (dense; sparsity doubles)"),
    Peak("h100", "NVIDIA H100 SXM", {"bfloat16": 989.4, "float16": 989.4, "float32": 66.9},
         "NVIDIA H100 Tensor Core GPU datasheet (dense; sparsity doubles)"),
    Peak("h200", "NVIDIA H200", {"bfloat16": 989.4, "float16": 989.4, "float32": 66.9},
         "NVIDIA H200 datasheet (1979 TFLOP/s is with sparsity; dense is half)"),
    Peak("a100", "NVIDIA A100", {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
         "NVIDIA A100 datasheet (dense)"),
    Peak("l40s", "NVIDIA L40S", {"bfloat16": 362.05, "float16": 362.05, "float32": 91.6},
         "NVIDIA L40S datasheet (dense)"),
    Peak("4090", "NVIDIA RTX 4090", {"bfloat16": 165.2, "float16": 165.2, "float32": 82.6},
         "NVIDIA Ada Lovelace architecture whitepaper (fp32 accumulate, dense)"),
    Peak("910b", "Ascend 910B", {"bfloat16": 313.0, "float16": 313.0},
         "[unverified] public reports give 280-376 TFLOP/s fp16 by SKU (910B4..910B1); 313 is the "
         "commonly cited 910B3 figure"),
    Peak("ascend910", "Ascend 910", {"float16": 256.0},
         "Huawei Ascend 910 launch (2019): 256 TFLOP/s fp16"),
)


def find_peak(device_name: str, dtype: torch.dtype) -> tuple[Peak, float] | None:
    """The dense peak for this device and dtype, or None when it is not in the table."""
    name = device_name.lower().replace(" ", "")
    for peak in KNOWN_PEAKS:
        if peak.match.replace(" ", "") in name:
            value = peak.tflops.get(dtype_name(dtype))
            return (peak, value) if value is not None else None
    return None


def bench_rung(records: list[RunRecord], warmup: int, flops: dict[str, Any] | None, device_name: str,
               dtype: torch.dtype, steps: int) -> RungResult:
    """Per-phase and per-step statistics over the timed rounds (``records``), plus normalised figures."""
    if not records:
        return RungResult("benchmark", Verdict.SKIP, "no timed rounds")
    rows: list[Row] = []
    phases: list[str] = []
    for rec in records:
        phases.extend(p for p in rec.phases if p not in phases)
    phase_stats: dict[str, Any] = {}
    for name in phases:
        walls = [rec.phases[name].wall_s for rec in records if name in rec.phases]
        peaks = [rec.phases[name].peak_device_bytes for rec in records if name in rec.phases]
        rss = [rec.phases[name].peak_host_rss_bytes for rec in records if name in rec.phases]
        s = summarize(walls)
        dev_peak = max((p for p in peaks if p is not None), default=None)
        phase_stats[name] = {**s, "peak_device_bytes": dev_peak, "peak_host_rss_bytes": max(rss, default=0)}
        row = Row(f"phase {name}")
        row.add("median_s", s["median"])
        row.add("min_s", s["min"])
        row.add("max_s", s["max"])
        row.add("peak_device_mib", None if dev_peak is None else dev_peak / 2**20)
        row.add("peak_host_rss_mib", max(rss, default=0) / 2**20)
        rows.append(row)
    step_times = [t for rec in records for t in rec.step_times_s]
    st = summarize(step_times)
    per_round_steps = [len(rec.step_times_s) for rec in records]
    row = Row("denoising step")
    row.add("median_s", st["median"])
    row.add("min_s", st["min"])
    row.add("max_s", st["max"])
    steps_per_s = 1.0 / st["median"] if st["n"] and st["median"] > 0 else None
    row.add("steps_per_s", steps_per_s)
    rows.append(row)
    totals = summarize([rec.total_wall_s - (rec.phases["load"].wall_s if "load" in rec.phases else 0.0)
                        for rec in records])
    row = Row("end to end (without load)")
    row.add("median_s", totals["median"])
    row.add("min_s", totals["min"])
    row.add("max_s", totals["max"])
    rows.append(row)

    norm: dict[str, Any] = {"steps": steps, "steps_per_round": per_round_steps}
    if flops:
        norm.update({k: flops.get(k) for k in ("forwards_per_step", "tokens_per_forward", "flops_per_step")})
        fps = flops.get("flops_per_step")
        if fps and st["n"] and st["median"] > 0:
            achieved = fps / st["median"] / 1e12
            norm["achieved_tflops"] = achieved
            found = find_peak(device_name, dtype)
            if found is not None:
                peak, value = found
                norm.update({"peak_tflops": value, "peak_device": peak.label, "peak_source": peak.source,
                             "mfu": achieved / value})
    nrow = Row("normalised")
    for key in ("forwards_per_step", "tokens_per_forward", "flops_per_step", "achieved_tflops", "peak_tflops",
                "mfu"):
        nrow.add(key, norm.get(key), source="peak-table" if key in ("peak_tflops", "mfu") and key in norm else "")
    rows.append(nrow)
    summary = (f"{len(records)} timed rounds after {warmup} warm-up: median step {st['median'] * 1e3:.1f} ms"
               f", end to end {totals['median']:.2f} s")
    if "mfu" in norm:
        summary += f", MFU {norm['mfu'] * 100:.1f} %"
    data = {"rounds": len(records), "warmup": warmup, "phases": phase_stats, "step": st, "end_to_end": totals,
            "normalised": norm, "step_times_s": [rec.step_times_s for rec in records]}
    return RungResult.from_rows("benchmark", rows, summary, data)


#: The performance table's row kinds, in the order the Ascend ModelZoo tables list them.
SPEED_KINDS = ("baseline", "exact", "validated", "approximate")


#: A row whose slowest timed round takes more than this many times its fastest is flagged: its median is
#: not a steady figure (a cold cache, another process on the machine), and a reader must not compare it.
SPREAD_FLAG = 2.0


def speed_row(kind: str, name: str, records: list[RunRecord], memory_after_load: int | None, validated: bool,
              warmup: int = 0) -> dict[str, Any]:
    """One row of the ModelZoo-style table: s/it and it/s (median step), end to end without load (median
    round), the memory held once the model is loaded and the peak over the timed rounds; the row states how
    it was measured (``rounds`` timed after ``warmup``) and the spread between its rounds (slowest over
    fastest end to end; ``unsteady`` above :data:`SPREAD_FLAG`).

    ``kind``: baseline (every exact optimisation off), exact (the defaults), validated (the options this
    validation judged, when they are none of the others) or approximate (one opt-in on top of the defaults).
    """
    steps = summarize([t for rec in records for t in rec.step_times_s])
    totals = summarize([rec.total_wall_s - (rec.phases["load"].wall_s if "load" in rec.phases else 0.0)
                        for rec in records])
    device_peaks = [p.peak_device_bytes for rec in records for p in rec.phases.values()
                    if p.peak_device_bytes is not None]
    host_peaks = [p.peak_host_rss_bytes for rec in records for p in rec.phases.values()]
    s_per_it = steps["median"] if steps["n"] else None
    spread = totals["max"] / totals["min"] if totals["n"] > 1 and totals["min"] > 0 else None
    return {"kind": kind, "name": name, "validated": validated, "rounds": len(records), "warmup": warmup,
            "spread": spread, "unsteady": spread is not None and spread > SPREAD_FLAG,
            "s_per_it": s_per_it, "it_per_s": 1.0 / s_per_it if s_per_it else None,
            "end_to_end_s": totals["median"] if totals["n"] else None,
            "memory_after_load_bytes": memory_after_load,
            "peak_bytes": max(device_peaks) if device_peaks else max(host_peaks, default=None),
            "memory_kind": "device" if device_peaks else "host RSS"}


def speed_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with their speed-up over the baseline row (end to end and per step)."""
    base = next((r for r in rows if r["kind"] == "baseline" and r.get("s_per_it")), None)
    out = []
    for r in rows:
        r = dict(r)
        if base is not None and r.get("s_per_it"):
            r["speedup_step"] = base["s_per_it"] / r["s_per_it"]
            if r.get("end_to_end_s") and base.get("end_to_end_s"):
                r["speedup_end_to_end"] = base["end_to_end_s"] / r["end_to_end_s"]
        out.append(r)
    return out
