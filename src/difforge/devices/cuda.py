"""CUDA (and ROCm) backend."""

from __future__ import annotations

from typing import ClassVar

import torch

from .base import Backend, EnvPreset


class CUDABackend(Backend):
    name: ClassVar[str] = "cuda"
    pinned_host_copies: ClassVar[bool] = True
    fused_ops: ClassVar[frozenset[str]] = frozenset({"attention"})  # SDPA flash / cuDNN / efficient
    visible_devices_env: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    dist_backend: ClassVar[str] = "nccl"

    @classmethod
    def is_available(cls) -> bool:
        return torch.cuda.is_available()

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
