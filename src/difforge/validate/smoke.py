"""Smoke rung: did every phase of one cold run complete, and is the output a real picture?"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from ..runtime.record import RunRecord
from .metrics import image_health, nonfinite
from .thresholds import BLANK_STD_LEVELS, SATURATED_SHARE
from .verdict import Row, RungResult, Verdict

#: The phases a run goes through, in order; pipelines may record more (e.g. per-component encodes).
EXPECTED_PHASES = ("load", "encode", "denoise", "decode", "save")


def _phase_row(name: str, record: RunRecord) -> Row:
    stat = record.phases[name]
    row = Row(name)
    row.add("status", "PASS", verdict=Verdict.PASS)
    row.add("wall_s", stat.wall_s)
    row.add("peak_device_mib", None if stat.peak_device_bytes is None else stat.peak_device_bytes / 2**20)
    row.add("peak_host_rss_mib", stat.peak_host_rss_bytes / 2**20)
    return row


def smoke_rung(record: RunRecord, images: list[Image.Image], step_outputs: dict[str, torch.Tensor] | None,
               error: str | None = None) -> RungResult:
    """Judge the cold run: phases from its RunRecord, then NaN/Inf and blank/saturated checks."""
    rows: list[Row] = []
    recorded = list(record.phases)
    ordered = [p for p in EXPECTED_PHASES if p in recorded] + [p for p in recorded if p not in EXPECTED_PHASES]
    rows.extend(_phase_row(p, record) for p in ordered)
    if error is not None:
        missing = next((p for p in EXPECTED_PHASES if p not in recorded), "run")
        row = Row(missing, note=error)
        row.add("status", "FAIL", verdict=Verdict.FAIL)
        rows.append(row)
    for name, tensor in (step_outputs or {}).items():
        bad = nonfinite(tensor)
        row = Row(f"final {name}: NaN/Inf")
        row.add("nonfinite", bad, "= 0", Verdict.PASS if bad == 0 else Verdict.FAIL, "msprobe-nan")
        rows.append(row)
    for i, img in enumerate(images):
        h = image_health(img)
        row = Row(f"image {i}: {img.size[0]}x{img.size[1]}")
        row.add("std_levels", h["std_levels"], f">= {BLANK_STD_LEVELS:g}",
                Verdict.PASS if h["std_levels"] >= BLANK_STD_LEVELS else Verdict.FAIL, "difforge-image")
        row.add("saturated_share", h["saturated_share"], f"<= {SATURATED_SHARE:g}",
                Verdict.PASS if h["saturated_share"] <= SATURATED_SHARE else Verdict.FAIL, "difforge-image")
        rows.append(row)
    if error is None and not images:
        row = Row("output", note="the run returned no image")
        row.add("images", 0, ">= 1", Verdict.FAIL)
        rows.append(row)
    failed = [r.subject for r in rows if r.settle() is Verdict.FAIL]
    summary = "all phases completed; output finite and not blank" if not failed else "failed: " + ", ".join(failed)
    data: dict[str, Any] = {"phases": {k: vars(v) for k, v in record.phases.items()}, "error": error}
    return RungResult.from_rows("smoke", rows, summary, data)
