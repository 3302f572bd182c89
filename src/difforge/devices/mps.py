"""Apple MPS backend.

Synchronize, empty_cache and the device count go through the base backend (``torch.accelerator``,
which drives MPS on macOS builds, else ``torch.mps``).  Memory stays on ``torch.mps``'s own counters:
Metal memory is unified with the host, MPS keeps no peak counter, and the figures that mean something
here - the working-set budget (``recommended_max_memory``) and what the Metal driver holds
(``driver_allocated_memory``) - have no ``torch.accelerator`` equivalent.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from .base import Backend, EnvPreset


class MPSBackend(Backend):
    name: ClassVar[str] = "mps"
    # SDPA on MPS falls back to the math kernel for most shapes/dtypes (full score matrix).
    attention_materialises_scores: ClassVar[bool] = True

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

    def available_memory_bytes(self) -> int | None:
        """The Metal working-set budget minus what the driver already holds (memory is unified)."""
        mod = getattr(torch, "mps", None)
        if mod is None or not all(hasattr(mod, f) for f in ("recommended_max_memory", "driver_allocated_memory")):
            return None
        try:
            return max(0, int(mod.recommended_max_memory()) - int(mod.driver_allocated_memory()))
        except Exception:
            return None

    def synchronize(self) -> None:
        self._device_call("synchronize", with_device=False)  # torch.mps.synchronize() takes no device

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
