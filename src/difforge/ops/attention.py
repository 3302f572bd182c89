"""Attention through ``torch.nn.functional.scaled_dot_product_attention``.

Inputs are ``[B, L, heads, d]`` ("BSND"); key/value may have fewer heads (grouped-query attention,
query head h reads kv head ``h // (heads / kv_heads)``).  No mask: URSA attends bidirectionally.
SDPA itself dispatches to flash / memory-efficient / math kernels per device, which is why the same
function serves CPU, CUDA, XPU and MPS.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Bidirectional softmax(q k^T / sqrt(d)) v; returns ``[B, L, heads, d]`` (a transposed view)."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if _HAS_GQA:
        out = F.scaled_dot_product_attention(q, k, v, None, is_causal=False, enable_gqa=True)
    else:  # torch < 2.5: repeat each kv head for its group of query heads
        groups = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, None, is_causal=False)
    return out.transpose(1, 2)
