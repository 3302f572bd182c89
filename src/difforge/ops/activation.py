"""SwiGLU activation, plain PyTorch.

The reference's CUDA kernel evaluates ``g * u / (1 + exp(-g))`` in float32 and casts back; doing
``silu(g) * u`` in the model dtype instead differs by a rounding step in bf16/fp16, so the plain
path spells out the float32 expression in the same operation order.
"""

from __future__ import annotations

import torch


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` computed in float32 as ``g*u / (1 + exp(-g))``, returned in gate's dtype."""
    g, u = gate.float(), up.float()
    return (g * u / (1 + torch.exp(-g))).to(gate.dtype)


def swiglu_packed(gate_up: torch.Tensor) -> torch.Tensor:
    """Same maths for a concatenated ``[gate, up]`` last dim (the layout fused kernels take)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return swiglu(gate, up)
