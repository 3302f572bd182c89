"""Swap single operators of one loaded transformer for other implementations.

Validation needs to ask "does this kernel change the result?" one operator at a time, e.g. run the
same pipeline with the NPU fused RMSNorm versus the PyTorch reference.  An override is installed on
the modules of *one* transformer instance (instance-level ``forward`` / attention processor), never
by patching diffusers or torch globally, so two pipelines in one process stay independent.

Supported names and the signatures the replacement callables must have:

* ``"rms_norm"``: ``fn(hidden_states, weight_or_None, eps) -> Tensor`` for every diffusers
  ``RMSNorm`` in the transformer (``txt_norm`` and the q/k norms); the module's bias, if any, is
  added afterwards.
* ``"attention"``: ``fn(query, key, value) -> Tensor`` with ``[batch, sequence, heads, head_dim]``
  tensors in and out, for the joint text+image attention of every block.  Every text token the
  function sees is valid, so there is no mask: with batched CFG and texts of different lengths,
  difforge's processor (:mod:`.attention`) calls it once per batch row on that row's valid keys.
  If a caller passes its own text mask, it is handed over as ``attn_mask=``
  (``[batch, 1, 1, sequence]`` bool, True = attend).

Both signatures are those of :mod:`difforge.ops` (``norm.rms_norm``, ``attention.sdpa_attention``),
so the same callables serve both model families.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

OVERRIDABLE_OPS = ("rms_norm", "attention")

RmsNormFn = Callable[[torch.Tensor, torch.Tensor | None, float], torch.Tensor]
AttentionFn = Callable[..., torch.Tensor]


def reference_rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The PyTorch RMSNorm with diffusers' dtype rules (statistics in fp32, half weights win)."""
    dtype = hidden_states.dtype
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    out = hidden_states * torch.rsqrt(variance + eps)
    if weight is None:
        return out.to(dtype)
    if weight.dtype in (torch.float16, torch.bfloat16):
        out = out.to(weight.dtype)
    return out * weight


def reference_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v on ``[B, L, heads, d]`` tensors, as diffusers' 'native' backend computes it."""
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask).transpose(1, 2)


def _install_rms_norm(model: nn.Module, fn: RmsNormFn) -> int:
    from diffusers.models.normalization import RMSNorm

    def forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        out = fn(hidden_states, self.weight, self.eps)
        return out + self.bias if self.bias is not None else out

    count = 0
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.forward = types.MethodType(forward, module)
            count += 1
    return count


def _install_attention(model: nn.Module, fn: AttentionFn) -> int:
    """Run every block's joint attention through ``fn`` (difforge's processor, see :mod:`.attention`)."""
    from .attention import install_processor

    return install_processor(model, fn)


def install_overrides(model: nn.Module, overrides: dict[str, Callable] | None) -> dict[str, int]:
    """Install each override on ``model``; returns how many modules each one replaced."""
    from ...errors import DifforgeError

    installed: dict[str, int] = {}
    for name, fn in (overrides or {}).items():
        if name not in OVERRIDABLE_OPS:
            raise DifforgeError(f"Unknown operator override '{name}'; Qwen-Image-Edit supports {', '.join(OVERRIDABLE_OPS)}.")
        if not callable(fn):
            raise DifforgeError(f"Operator override '{name}' must be a callable.")
        installed[name] = _install_rms_norm(model, fn) if name == "rms_norm" else _install_attention(model, fn)
    return installed
