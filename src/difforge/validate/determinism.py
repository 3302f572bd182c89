"""Determinism rung: the same seed, run again on the device under test, must give the same pixels.

MindIE-SD's L1 gate is a bitwise-identical rerun; a difference is reported with its size, as a
warning (some kernels reduce with atomics), since the accuracy rungs judge whether it matters.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .verdict import Row, RungResult, Verdict


def determinism_rung(runs: list[list[Image.Image]]) -> RungResult:
    """``runs[0]`` is the first run; every later run (same config and seed) is compared with it."""
    if len(runs) < 2:
        return RungResult("determinism", Verdict.SKIP, "only one run with this seed")
    first = runs[0]
    rows: list[Row] = []
    for k, run in enumerate(runs[1:], start=1):
        for i, (a, b) in enumerate(zip(first, run, strict=False)):
            x = np.asarray(a.convert("RGB"), dtype=np.int16)
            y = np.asarray(b.convert("RGB"), dtype=np.int16)
            same_size = x.shape == y.shape
            diff = np.abs(x - y) if same_size else None
            identical = bool(same_size and not diff.any())  # type: ignore[union-attr]
            row = Row(f"run {k + 1} vs run 1, image {i}")
            row.add("bitwise_identical", identical, "= True", Verdict.PASS if identical else Verdict.WARN,
                    "mindie-gate")
            row.add("max_abs_levels", int(diff.max()) if diff is not None else None)
            row.add("mean_abs_levels", float(diff.mean()) if diff is not None else None)
            row.add("pixels_differing", float((diff > 0).mean()) if diff is not None else None)
            rows.append(row)
    same = all(r.get("bitwise_identical") for r in rows)
    summary = (f"{len(runs)} runs with the same seed are bitwise identical" if same
               else f"{len(runs)} runs with the same seed differ (max {max(r.get('max_abs_levels') or 0 for r in rows)}"
                    " levels)")
    return RungResult.from_rows("determinism", rows, summary, {"runs": len(runs), "identical": same})
