"""RMSNorm, plain PyTorch.

The reference (diffnext's pure-torch fallback, used whenever flash-attn's Triton kernel is absent)
computes the reciprocal root mean square in float32, casts that *factor* to the activation dtype
and only then multiplies; reproducing that order is what makes bf16/fp16 runs match bit for bit.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x_f32^2) + eps).to(x.dtype) * weight`` over the last dim."""
    factor = x.float().square().mean(-1, True).add_(eps).rsqrt().to(x.dtype)
    return x.mul(factor) * weight
