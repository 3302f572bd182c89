"""Determinism rung: the same seed, run again on the device under test, must give the same pixels.

MindIE-SD's L1 gate is a bitwise-identical rerun.  Some kernels reduce with atomics, so a rerun may
differ by rounding; difforge's rule: bitwise identical -> PASS; differences no larger than what the
dtype alone costs (the noise floor's image RMSE against the reference, at least 1 grey level) -> WARN;
larger -> FAIL (a rerun that moves the picture more than precision can is a race, not rounding).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .thresholds import FLOOR_MIN_RMSE_LEVELS
from .verdict import Row, RungResult, Verdict


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))


def determinism_rung(runs: list[list[Image.Image]], floor_rmse: float | None = None, floor_label: str = "") -> RungResult:
    """``runs[0]`` is the first run; every later run (same config and seed) is compared with it.

    ``floor_rmse``: the floor's image RMSE against the reference (0-255 levels), None without a floor.
    """
    if len(runs) < 2:
        return RungResult("determinism", Verdict.SKIP, "only one run with this seed")
    bound = max(floor_rmse if floor_rmse is not None else 0.0, FLOOR_MIN_RMSE_LEVELS)
    where = f"the floor's RMSE ({floor_label})" if floor_rmse is not None else "1 grey level (no floor)"
    first = runs[0]
    rows: list[Row] = []
    for k, run in enumerate(runs[1:], start=1):
        for i, (a, b) in enumerate(zip(first, run, strict=False)):
            x = np.asarray(a.convert("RGB"), dtype=np.int16)
            y = np.asarray(b.convert("RGB"), dtype=np.int16)
            row = Row(f"run {k + 1} vs run 1, image {i}")
            if x.shape != y.shape:
                row.add("same size", False, "= True", Verdict.FAIL, "mindie-gate")
                rows.append(row)
                continue
            diff = np.abs(x - y)
            identical = not diff.any()
            rmse = _rmse(x, y)
            verdict = Verdict.PASS if identical else (Verdict.WARN if rmse <= bound else Verdict.FAIL)
            row.add("bitwise_identical", identical, "= True PASS", None, "mindie-gate")
            row.add("rmse_levels", rmse, f"<= {bound:.2f} ({where}) WARN, else FAIL", verdict, "mindie-gate")
            row.add("max_abs_levels", int(diff.max()))
            row.add("pixels_differing", float((diff > 0).mean()))
            rows.append(row)
    result = RungResult.from_rows("determinism", rows)
    same = all(r.verdict is Verdict.PASS for r in rows)
    if same:
        result.summary = f"{len(runs)} runs with the same seed are bitwise identical"
    else:
        worst = max((r.get("rmse_levels") for r in rows if any(m.name == "rmse_levels" for m in r.measurements)),
                    default=float("nan"))
        rel = "within" if result.verdict is Verdict.WARN else "beyond"
        result.summary = (f"{len(runs)} runs with the same seed differ: RMSE up to {worst:.2f} levels, {rel} "
                          f"{where} = {bound:.2f}")
    result.data = {"runs": len(runs), "identical": same, "bound_levels": bound}
    return result
