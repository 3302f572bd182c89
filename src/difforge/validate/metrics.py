"""Numerical comparisons of a device's tensors and images against a reference.

Everything is computed in float64 on the CPU so the metric itself adds no error; inputs may come
from any device and dtype.  Image metrics (PSNR, SSIM) use torchmetrics rather than local code.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..models.probing import cosine
from .thresholds import DualRule


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64).reshape(-1)


def nonfinite(t: torch.Tensor) -> int:
    """Number of NaN/Inf elements."""
    return int((~torch.isfinite(t.detach().float())).sum()) if t.is_floating_point() else 0


def tensor_compare(dut: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    """Cosine, relative L2, max/mean abs error of ``dut`` against ``ref`` (same shape)."""
    if tuple(dut.shape) != tuple(ref.shape):
        raise ValueError(f"shape mismatch: device {tuple(dut.shape)} vs reference {tuple(ref.shape)}")
    x, y = _f64(dut), _f64(ref)
    diff = (x - y).abs()
    ref_norm = float(y.norm())
    finite = bool(torch.isfinite(x).all())
    return {
        "cosine": cosine(x, y),
        "rel_l2": float((x - y).norm() / ref_norm) if ref_norm > 0 else float((x - y).norm()),
        "max_abs": float(diff.max()) if diff.numel() else 0.0,
        "mean_abs": float(diff.mean()) if diff.numel() else 0.0,
        "nonfinite_dut": nonfinite(dut),
        "nonfinite_ref": nonfinite(ref),
        "finite": finite,
    }


def op_compare(dut: torch.Tensor, ref: torch.Tensor, rule: DualRule) -> dict[str, Any]:
    """msprobe-style operator metrics, with its small-value regime.

    Elements whose reference magnitude is below ``rule.small_below`` are judged by absolute error
    (``rule.small_abs``) instead of relative error, as msprobe does, because a relative error of a
    near-zero value says nothing about the op.  Such an element counts as "over" every rel-error
    share exactly when its absolute error exceeds ``small_abs``.  ``max_rel`` is taken over the
    normal-value domain only (msprobe's benchmark standard masks the small values out of it);
    ``elements`` is the number compared, so every share can be turned back into a count.
    """
    out = tensor_compare(dut, ref)
    x, y = _f64(dut), _f64(ref)
    abs_err = (x - y).abs()
    small = y.abs() < rule.small_below
    rel = abs_err / y.abs().clamp_min(1e-300)
    small_bad = small & (abs_err > rule.small_abs)
    n = max(1, y.numel())
    big = ~small
    out["max_rel"] = float(rel[big].max()) if bool(big.any()) else 0.0
    for label, tol in (("rel_gt_0.1%", 1e-3), ("rel_gt_1%", 1e-2), ("rel_gt_0.01%", 1e-4)):
        over = (big & (rel > tol)) | small_bad
        out[label] = float(over.sum()) / n
    out["small_values"] = float(small.sum()) / n
    out["small_value_errors"] = int(small_bad.sum())
    # msprobe's benchmark standard divides by the small values only; a share of every compared element
    # is what the dual-N allowance is written in, and it stays defined when no value is small.
    out["small_error_share"] = float(small_bad.sum()) / n
    out["elements"] = int(y.numel())
    return out


# ---- images -------------------------------------------------------------------------------------------
def image_tensor(img: Image.Image) -> torch.Tensor:
    """PIL image -> float tensor (1, C, H, W) in 0..1."""
    arr = np.asarray(img.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(arr).permute(2, 0, 1).unsqueeze(0)


def image_compare(dut: Image.Image, ref: Image.Image) -> dict[str, Any]:
    """MSE/MAE/RMSE (0-255 levels), PSNR, SSIM and the share of pixels within ±1/±4/±16 levels."""
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    if dut.size != ref.size:
        raise ValueError(f"image size mismatch: device {dut.size} vs reference {ref.size}")
    a = np.asarray(dut.convert("RGB"), dtype=np.float64)
    b = np.asarray(ref.convert("RGB"), dtype=np.float64)
    diff = np.abs(a - b)
    mse = float(np.mean(diff**2))
    ta, tb = image_tensor(dut), image_tensor(ref)
    psnr = float("inf") if mse == 0 else float(peak_signal_noise_ratio(ta, tb, data_range=1.0))
    kernel = max(3, min(11, (min(ta.shape[-2:]) // 2) * 2 - 1))  # tiny images need a smaller window
    ssim = float(structural_similarity_index_measure(ta, tb, data_range=1.0, kernel_size=kernel))
    return {
        "mse": mse,
        "mae": float(np.mean(diff)),
        "rmse": math.sqrt(mse),
        "psnr_db": psnr,
        "ssim": ssim,
        "within_1": float(np.mean(diff <= 1)),
        "within_4": float(np.mean(diff <= 4)),
        "within_16": float(np.mean(diff <= 16)),
    }


def image_health(img: Image.Image) -> dict[str, Any]:
    """Statistics that reveal a collapsed output: level spread and the share of clipped pixels."""
    a = np.asarray(img.convert("RGB"), dtype=np.float64)
    return {
        "std_levels": float(a.std()),
        "mean_levels": float(a.mean()),
        "saturated_share": float(np.mean((a <= 0) | (a >= 255))),
    }


def latent_compare(dut: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    """MSE/MAE of two latents (float) or the token agreement of two token grids (integer)."""
    if not dut.is_floating_point():
        return {"token_agreement": float((dut.reshape(-1) == ref.reshape(-1)).double().mean())}
    x, y = _f64(dut), _f64(ref)
    out = tensor_compare(dut, ref)
    out["mse"] = float(((x - y) ** 2).mean())
    out["mae"] = float((x - y).abs().mean())
    return out


def summarize(values: list[float]) -> dict[str, float]:
    """Median/min/max/mean of a list (empty -> NaNs) for timing tables."""
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "mean": float("nan"), "n": 0}
    arr = np.asarray(values, dtype=np.float64)
    return {
        "median": float(np.median(arr)),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "mean": float(arr.mean()),
        "n": len(values),
    }
