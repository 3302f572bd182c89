"""CPU backend: always present; the float32 reference device."""

from __future__ import annotations

from typing import ClassVar

import psutil
import torch

from .base import Backend


class CPUBackend(Backend):
    name: ClassVar[str] = "cpu"
    # float16 is refused on the CPU: many CPU kernels lack half support or emulate it very slowly;
    # bfloat16 is the reduced-precision dtype to test a port's numerics on a CPU-only machine.
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16)

    @classmethod
    def is_available(cls) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def device_name(self) -> str:
        import platform

        return platform.processor() or platform.machine() or "cpu"

    def total_memory_bytes(self) -> int | None:
        return int(psutil.virtual_memory().total)

    def synchronize(self) -> None:
        return None

    def reset_peak_memory(self) -> None:
        return None

    def peak_memory_bytes(self) -> int | None:
        # Host memory is tracked separately (peak RSS) by the phase timer.
        return None

    def memory_allocated_bytes(self) -> int | None:
        return None

    def empty_cache(self) -> None:
        return None

    def preferred_dtype(self) -> torch.dtype:
        # bf16/fp16 matmuls on CPU are slow and lossy; float32 is the reference dtype.
        return torch.float32
