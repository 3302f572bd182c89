"""Rotary position embedding application, plain PyTorch.

Tables are ``(cos, sin)`` of shape ``[L, d/2]`` in the activation dtype; ``x`` is ``[B, L, heads, d]``.
Pairs are (i, i + d/2).  The plain path writes the rotated pair *interleaved* (a0, b0, a1, b1 ...),
exactly like the reference, so the q.k reduction inside attention runs in the reference's order;
a rotate-half layout is mathematically the same attention but can differ in the last bit.

Half-precision inputs are rotated in float32 and rounded once.  That is what the reference computes
on Linux, where its rotation runs through ``torch.compile`` (Inductor keeps bf16/fp16 intermediates
in float32); the products of two half values are exact in float32, so the result does not depend on
whether the compiler fuses multiply-adds.
"""

from __future__ import annotations

import torch

RopeTable = tuple[torch.Tensor, torch.Tensor]


def rope_table(cos: torch.Tensor, sin: torch.Tensor) -> RopeTable:
    """Plain path: keep ``(cos, sin)`` broadcastable over batch and heads: ``[L, 1, d/2]``."""
    return cos[:, None, :], sin[:, None, :]


def apply_rotary(x: torch.Tensor, table: RopeTable) -> torch.Tensor:
    """Rotate pairs (x[i], x[i+d/2]) and return them interleaved, in x's dtype."""
    cos, sin = table
    dtype = x.dtype
    if dtype in (torch.float16, torch.bfloat16):
        x, cos, sin = x.float(), cos.float(), sin.float()
    x1, x2 = x.chunk(2, dim=-1)
    a = (x1 * cos).sub_(x2 * sin)
    b = (x1 * sin).add_(x2 * cos)
    return torch.stack((a, b), dim=-1).flatten(-2).to(dtype)
