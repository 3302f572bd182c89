"""CUDA (and ROCm) backend."""

from __future__ import annotations

from typing import ClassVar

import torch

from .base import Backend, EnvPreset


class CUDABackend(Backend):
    name: ClassVar[str] = "cuda"
    pinned_host_copies: ClassVar[bool] = True
    fused_ops: ClassVar[frozenset[str]] = frozenset({"attention"})  # SDPA flash / cuDNN / efficient

    @classmethod
    def is_available(cls) -> bool:
        return torch.cuda.is_available()

    @classmethod
    def device_count(cls) -> int:
        return torch.cuda.device_count() if cls.is_available() else 0

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
