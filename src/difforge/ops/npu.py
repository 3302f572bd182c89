"""Ascend fused kernels (``torch_npu``) wrapped to difforge's op signatures.

Each factory takes the kernel the backend found (:meth:`difforge.devices.NPUBackend.fused_kernel`: the
real library on Ascend, the CPU stand-in in tests), so wrappers bind once at load time, never per call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from .rotary import RopeTable


def make_rms_norm(fused: Callable[..., Any]) -> Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]:
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return fused(x, weight, epsilon=eps)[0]  # (y, rstd)

    return rms_norm


def make_swiglu_packed(fused: Callable[..., Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    def swiglu_packed(gate_up: torch.Tensor) -> torch.Tensor:
        return fused(gate_up, dim=-1)

    return swiglu_packed


def make_swiglu(fused: Callable[..., Any]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Unpacked form (used when a model has no packed gate/up weight): concatenates per call."""
    packed = make_swiglu_packed(fused)

    def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return packed(torch.cat((gate, up), dim=-1))

    return swiglu


def rope_table(cos: torch.Tensor, sin: torch.Tensor) -> RopeTable:
    """``npu_rotary_mul`` wants full-width r1/r2 of shape [1, L, 1, d] (rotate-half pairing)."""
    return torch.cat((cos, cos), -1)[None, :, None, :], torch.cat((sin, sin), -1)[None, :, None, :]


def make_rotary(fused: Callable[..., Any]) -> Callable[[torch.Tensor, RopeTable], torch.Tensor]:
    def rotary(x: torch.Tensor, table: RopeTable) -> torch.Tensor:
        r1, r2 = table
        return fused(x, r1, r2)

    return rotary


def make_attention(fused: Callable[..., Any]) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        heads, dim = q.shape[2], q.shape[3]
        return fused(q, k, v, heads, "BSND", scale=1.0 / math.sqrt(dim))[0]

    return attention
