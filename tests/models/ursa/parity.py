"""Parity with the reference that holds on every CPU: stored reference arrays and stated tolerances.

Why tolerances and not hashes: the same float32 program gives other last bits on other CPU kernel
families (AVX-512, AVX2, the portable ``default`` path, aarch64 NEON/SVE), because vectorised
reductions and fused multiply-adds group the sums differently.  Discrete results — token ids,
scheduler steps — survive that noise and are compared exactly.  Decoded floats and uint8 pixels do
not, so they are compared with the bounds below (docs/ursa.md §0 states them and why).  Bit-for-bit
identity is only claimed in one process on one machine (tests/models/ursa/test_reference_live.py).

The arrays in ``data/`` were made by the reference itself (``scripts/ursa_reference_arrays.py``).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import torch

DATA = Path(__file__).parent / "data"

# float32 decodes: max |got - ref| <= FP32_REL * max |ref|.  Measured across kernel families on one
# AMD EPYC (AVX2 vs the portable path): <= 2.0e-6; the old AVX-512 pins differed by <= 2.1e-6.
FP32_REL = 1e-5
# uint8 frames from float32 decodes: no pixel more than 1 level off, and at most this share of the
# pixels off at all.  Measured: <= 8.2e-5 of the pixels, never more than 1 level (one rounding flip).
PIXEL_MAX_LEVELS = 1
PIXEL_MAX_SHARE = 1e-3
# bfloat16 against the float32 reference: bf16 keeps 8 significant bits (a rounding error of up to
# 2^-9 per operation), and CPU kernels differ in where they round, so bf16 bits - and the bf16
# sampler's token ids - are not portable.  Measured, FSQ decode bf16 vs fp32: relative L2 <= 1.7 %,
# max relative <= 2.0 %; the bounds leave a ~2.5x margin.
BF16_REL_L2 = 4e-2
BF16_MAX_REL = 6e-2


@cache
def reference(name: str) -> dict[str, np.ndarray]:
    """One stored reference file (``reference_frames`` or ``reference_fsq_decode``), all arrays loaded."""
    with np.load(DATA / f"{name}.npz") as data:
        return {k: data[k] for k in data.files}


def _np(x: np.ndarray | torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def assert_frames_close(got: np.ndarray, want: np.ndarray) -> None:
    """uint8 frames: same shape, every pixel within PIXEL_MAX_LEVELS, at most PIXEL_MAX_SHARE off."""
    assert got.dtype == np.uint8 and want.dtype == np.uint8
    assert got.shape == want.shape, f"frames {got.shape} != reference {want.shape}"
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    share = float(np.mean(diff > 0))
    assert int(diff.max()) <= PIXEL_MAX_LEVELS, f"a pixel is {int(diff.max())} levels off (bound {PIXEL_MAX_LEVELS})"
    assert share <= PIXEL_MAX_SHARE, f"{share:.2e} of the pixels differ (bound {PIXEL_MAX_SHARE:.0e})"


def assert_fp32_close(got: np.ndarray | torch.Tensor, want: np.ndarray) -> None:
    """float32 decode: max abs error within FP32_REL of the reference's largest magnitude."""
    got = _np(got)
    assert got.shape == want.shape, f"{got.shape} != reference {want.shape}"
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= FP32_REL, f"max relative error {err:.2e} > {FP32_REL:.0e}"


def assert_bf16_close(got: np.ndarray | torch.Tensor, want_fp32: np.ndarray) -> None:
    """A bfloat16 result against the float32 reference: relative L2 and max relative error bounded."""
    got = _np(got)
    assert got.shape == want_fp32.shape, f"{got.shape} != reference {want_fp32.shape}"
    rel_l2 = float(np.linalg.norm(got - want_fp32) / np.linalg.norm(want_fp32))
    max_rel = float(np.abs(got - want_fp32).max() / np.abs(want_fp32).max())
    assert rel_l2 <= BF16_REL_L2, f"relative L2 {rel_l2:.2e} > {BF16_REL_L2:.0e}"
    assert max_rel <= BF16_MAX_REL, f"max relative error {max_rel:.2e} > {BF16_MAX_REL:.0e}"
