"""Apple MPS backend."""

from __future__ import annotations

from typing import ClassVar

import torch

from .base import Backend, EnvPreset


class MPSBackend(Backend):
    name: ClassVar[str] = "mps"

    @classmethod
    def is_available(cls) -> bool:
        mps = getattr(torch.backends, "mps", None)
        return bool(mps is not None and mps.is_available())

    @property
    def device(self) -> torch.device:
        return torch.device("mps")

    def device_name(self) -> str:
        return "Apple MPS"

    def total_memory_bytes(self) -> int | None:
        mod = getattr(torch, "mps", None)
        if mod is not None and hasattr(mod, "recommended_max_memory"):
            return int(mod.recommended_max_memory())
        return None

    def synchronize(self) -> None:
        torch.mps.synchronize()

    def reset_peak_memory(self) -> None:
        return None  # MPS has no peak counter; the phase timer samples current allocation instead

    def peak_memory_bytes(self) -> int | None:
        return int(torch.mps.driver_allocated_memory()) if self.is_available() else None

    def memory_allocated_bytes(self) -> int | None:
        return int(torch.mps.current_allocated_memory()) if self.is_available() else None

    def env_presets(self) -> list[EnvPreset]:
        return [
            EnvPreset("PYTORCH_ENABLE_MPS_FALLBACK", "1", "run ops MPS lacks on the CPU instead of failing")
        ]

    def preferred_dtype(self) -> torch.dtype:
        # MPS bf16 support depends on the macOS version; fp16 is the safe half precision there.
        return torch.float16
