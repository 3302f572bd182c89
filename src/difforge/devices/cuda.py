"""CUDA (and ROCm) backend.

Fused kernels: on an NVIDIA GPU with triton installed, rms_norm, swiglu and rotary run as difforge's
own Triton kernels (:mod:`difforge.ops.triton_kernels`; their exactness is stated there and recorded
per op), and so do URSA's Philox inverse-CDF draws (``sampler``) and metric-path jump rates (``rate``),
both in :mod:`difforge.ops.triton_sampler`.  ``DIFFORGE_TRITON_KERNELS`` switches them: ``on`` (the
default), ``off``, or a comma list of the ones to keep (``rotary,swiglu``: the bitwise-exact ones only).  The variable is one of the
backend's recorded environment variables, so a run's record says when it was set, and each op's
adaptation names the implementation it got.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import InputError
from .base import Backend, EnvPreset

#: The ops a Triton kernel implements: difforge.ops.triton_kernels's three, URSA's sampler draws and metric rate.
TRITON_OPS = ("rms_norm", "swiglu", "rotary", "sampler", "rate")
#: The switch for them (see the module docstring).
TRITON_ENV = "DIFFORGE_TRITON_KERNELS"


@dataclass(frozen=True)
class TritonKernel:
    """The CUDA backend's answer to ``fused_kernel(op)``: "difforge's Triton kernel for ``op``".

    The kernels live in :mod:`difforge.ops.triton_kernels` (ops sit above devices, so the backend names
    them rather than importing them); :func:`difforge.ops.select_ops` binds them.
    """

    op: str


def triton_ops_asked(value: str | None) -> frozenset[str]:
    """The ops ``DIFFORGE_TRITON_KERNELS=value`` leaves on: all for unset/``on``/``1``, none for ``off``/``0``."""
    text = (value or "on").strip().lower()
    if text in ("on", "1", "true", "yes"):
        return frozenset(TRITON_OPS)
    if text in ("off", "0", "false", "no", ""):
        return frozenset()
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(TRITON_OPS))
    if unknown:
        raise InputError(
            f"{TRITON_ENV}={value!r}: unknown op(s) {', '.join(unknown)}; use on, off or a comma list of "
            f"{', '.join(TRITON_OPS)}."
        )
    return frozenset(names)


class CUDABackend(Backend):
    name: ClassVar[str] = "cuda"
    pinned_host_copies: ClassVar[bool] = True
    #: attention: SDPA's flash / cuDNN / efficient kernels; the rest: Triton kernels, where usable
    fused_ops: ClassVar[frozenset[str]] = frozenset({"attention", *TRITON_OPS})
    visible_devices_env: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    extra_env_vars: ClassVar[tuple[str, ...]] = (TRITON_ENV,)
    dist_backend: ClassVar[str] = "nccl"

    @classmethod
    def is_available(cls) -> bool:
        return torch.cuda.is_available()

    @staticmethod
    def triton_usable() -> bool:
        """An NVIDIA GPU (the kernels' exactness is argued for CUDA's libdevice) and triton installed."""
        return (
            torch.version.hip is None
            and torch.cuda.is_available()
            and importlib.util.find_spec("triton") is not None
        )

    def fused_kernel(self, op: str) -> TritonKernel | None:
        """A :class:`TritonKernel` for one of :data:`TRITON_OPS` when usable and not switched off, else None."""
        if op not in TRITON_OPS or not self.triton_usable():
            return None
        return TritonKernel(op) if op in triton_ops_asked(os.environ.get(TRITON_ENV)) else None

    def sdpa_kernels(self) -> list[str]:
        """The SDPA kernels torch.backends.cuda currently allows (flash, mem_efficient, cudnn, math)."""
        cuda = torch.backends.cuda
        switches = {
            "flash": cuda.flash_sdp_enabled,
            "mem_efficient": cuda.mem_efficient_sdp_enabled,
            "cudnn": getattr(cuda, "cudnn_sdp_enabled", None),  # newer than the other three
            "math": cuda.math_sdp_enabled,
        }
        return [name for name, enabled in switches.items() if enabled is not None and enabled()]

    def env_presets(self) -> list[EnvPreset]:
        return [
            EnvPreset(
                "PYTORCH_CUDA_ALLOC_CONF",
                "expandable_segments:True",
                "fewer fragmentation OOMs when activation sizes vary between phases",
            )
        ]

    def preferred_dtype(self) -> torch.dtype:
        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
            return torch.float16
        return torch.bfloat16
