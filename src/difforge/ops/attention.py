"""Attention through ``torch.nn.functional.scaled_dot_product_attention``.

Inputs are ``[B, L, heads, d]`` ("BSND"); key/value may have fewer heads (grouped-query attention,
query head h reads kv head ``h // (heads / kv_heads)``).  No mask: URSA attends bidirectionally.
SDPA itself dispatches to flash / memory-efficient / math kernels per device, which is why the same
function serves CPU, CUDA, XPU and MPS.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..devices.cpu import fused_sdpa_low_precision_ok


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Bidirectional softmax(q k^T / sqrt(d)) v; returns ``[B, L, heads, d]`` (a transposed view).

    ``enable_gqa`` (torch >= 2.5, difforge's minimum) has SDPA pair each query head with its kv head
    itself, so no per-group copy of k and v is made here.
    """
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and not fused_sdpa_low_precision_ok():
        with sdpa_kernel(SDPBackend.MATH):  # see devices.cpu.fused_sdpa_low_precision_ok
            out = F.scaled_dot_product_attention(q, k, v, None, is_causal=False, enable_gqa=True)
        return out.transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, None, is_causal=False, enable_gqa=True)
    return out.transpose(1, 2)
