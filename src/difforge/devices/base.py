"""The one small protocol every device backend implements.

A backend answers the questions the rest of difforge asks about an accelerator: is it here, which
``torch.device`` is it, how do I wait for it, how much memory did the last phase peak at, which
dtype should I default to and which fused kernels may I use.  Everything device-specific lives in
one backend file; the rest of the code only talks to this protocol.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..errors import DtypeError
from .compile import CompilePolicy, compile_policy

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the spelling used in configs and records."""
    return str(dtype).removeprefix("torch.")


@dataclass
class EnvPreset:
    """An environment variable a backend recommends, and whether difforge applied it."""

    name: str
    value: str
    why: str
    opt_in: bool = False  # precision-reducing presets are only applied when asked for


@dataclass
class Backend(ABC):
    """Base backend: the device-agnostic behaviour, built on ``torch.accelerator`` where possible."""

    index: int | None = None
    applied_presets: dict[str, str] = field(default_factory=dict)
    _compile_policy: CompilePolicy | None = field(default=None, init=False, repr=False, compare=False)

    name: ClassVar[str] = "base"
    #: Fused ops this backend provides (names used by :mod:`difforge.ops`).
    fused_ops: ClassVar[frozenset[str]] = frozenset()
    #: dtypes the backend can compute in; ``auto`` picks :meth:`preferred_dtype`.
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16, torch.float16)
    #: Whether this backend's attention kernel writes the full ``L x L`` score matrix (a math-path
    #: SDPA).  Memory estimates add it only here: flash / memory-efficient kernels (CPU, CUDA, NPU's
    #: fusion attention) never hold it, and counting it there would refuse sizes that run fine.
    attention_materialises_scores: ClassVar[bool] = False
    #: Whether a host-to-device copy from page-locked memory overlaps the host on this device
    #: (cuda, npu, xpu).  URSA's per-step host random draws use it; on the CPU there is no copy.
    pinned_host_copies: ClassVar[bool] = False

    # ---- presence -------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def is_available(cls) -> bool:
        """Whether this kind of device is usable in this process (each backend answers for itself)."""

    @classmethod
    def device_count(cls) -> int:
        return 1 if cls.is_available() else 0

    @property
    def device(self) -> torch.device:
        return torch.device(self.name) if self.index is None else torch.device(self.name, self.index)

    def __str__(self) -> str:
        return str(self.device)

    # ---- the device module (torch.cuda, torch.npu, torch.xpu, torch.mps) ------------------
    def _module(self) -> Any | None:
        return getattr(torch, self.name, None)

    def device_name(self) -> str:
        mod = self._module()
        if mod is not None and hasattr(mod, "get_device_name"):
            return str(mod.get_device_name(self.device))
        return self.name

    def total_memory_bytes(self) -> int | None:
        mod = self._module()
        if mod is not None and hasattr(mod, "get_device_properties"):
            return int(mod.get_device_properties(self.device).total_memory)
        return None

    def available_memory_bytes(self) -> int | None:
        """Bytes a new allocation can still get on this device now, or None when the backend cannot say.

        Pipelines compare their memory estimate with this *before* allocating, so a size that cannot
        fit is refused with one sentence instead of an out-of-memory crash (or, on the host, the OOM
        killer).  Accelerator modules that follow ``torch.cuda`` report ``mem_get_info() -> (free,
        total)``; a module without it answers None and the caller skips the check, recording why.
        """
        mod = self._module()
        if mod is None or not hasattr(mod, "mem_get_info"):
            return None
        idx = self._memory_index()
        try:
            free = int(mod.mem_get_info(idx)[0])
        except Exception:  # a driver that cannot answer is "unknown", never a crash
            return None
        # Blocks torch's caching allocator holds but no tensor uses: taken for the driver, free for torch.
        with contextlib.suppress(Exception):
            free += max(0, int(mod.memory_reserved(idx)) - int(mod.memory_allocated(idx)))
        return free

    def _memory_index(self) -> Any:
        """What the device module's memory queries take for this device (``torch.device`` by default)."""
        return self.device

    def synchronize(self) -> None:
        mod = self._module()
        if mod is not None and hasattr(mod, "synchronize"):
            mod.synchronize(self.device)

    def reset_peak_memory(self) -> None:
        mod = self._module()
        if mod is not None and hasattr(mod, "reset_peak_memory_stats"):
            mod.reset_peak_memory_stats(self.device)

    def peak_memory_bytes(self) -> int | None:
        mod = self._module()
        if mod is not None and hasattr(mod, "max_memory_allocated"):
            return int(mod.max_memory_allocated(self.device))
        return None

    def memory_allocated_bytes(self) -> int | None:
        mod = self._module()
        if mod is not None and hasattr(mod, "memory_allocated"):
            return int(mod.memory_allocated(self.device))
        return None

    def empty_cache(self) -> None:
        mod = self._module()
        if mod is not None and hasattr(mod, "empty_cache"):
            mod.empty_cache()

    # ---- randomness -------------------------------------------------------------------------
    def generator(self, seed: int) -> torch.Generator:
        """A CPU generator: the same seed gives the same noise on every backend (see DESIGN)."""
        return torch.Generator("cpu").manual_seed(int(seed))

    # ---- dtypes -----------------------------------------------------------------------------
    def preferred_dtype(self) -> torch.dtype:
        return torch.bfloat16

    def resolve_dtype(self, spec: str | torch.dtype | None) -> torch.dtype:
        """Map ``auto``/a name/a dtype to a dtype this backend computes in, or raise DtypeError."""
        if spec is None or spec == "auto":
            return self.preferred_dtype()
        if isinstance(spec, torch.dtype):
            dtype = spec
        else:
            key = str(spec).lower().removeprefix("torch.")
            if key not in DTYPES:
                raise DtypeError(
                    f"Unknown dtype '{spec}'; use one of auto, float32, bfloat16, float16."
                )
            dtype = DTYPES[key]
        if dtype not in self.supported_dtypes:
            names = ", ".join(dtype_name(d) for d in self.supported_dtypes)
            raise DtypeError(f"dtype {dtype_name(dtype)} is not supported on {self.name}; use one of {names}.")
        return dtype

    # ---- environment presets ------------------------------------------------------------------
    def env_presets(self) -> list[EnvPreset]:
        return []

    def apply_env_presets(self, opt_in: bool = False) -> dict[str, str]:
        """Set recommended env vars the user has not set; returns (and remembers) what was applied."""
        for preset in self.env_presets():
            if preset.opt_in and not opt_in:
                continue
            if preset.name in os.environ:
                continue
            os.environ[preset.name] = preset.value
            self.applied_presets[preset.name] = preset.value
        return dict(self.applied_presets)

    # ---- kernels and compilers: chosen here, once, for every model --------------------------------
    def has_fused(self, op: str) -> bool:
        return op in self.fused_ops

    def fused_kernel(self, op: str) -> Any | None:
        """The vendor kernel implementing ``op`` (a name in :data:`difforge.ops.OP_NAMES`) on this device,
        or None when the portable PyTorch path is used.  Only the NPU backend has any."""
        return None

    def sdpa_note(self) -> str:
        """Why plain SDPA is still the fast attention here ("" when nothing needs saying)."""
        return "SDPA picks flash/efficient kernels itself" if self.has_fused("attention") else ""

    def diffusers_attention(self, dtype: torch.dtype, allow_fused: bool = True) -> tuple[str, str]:
        """The diffusers attention backend for ``dtype`` and a note on why: ``("native", "")`` = SDPA.

        Overridden by a backend whose vendor kernel diffusers can dispatch to (the NPU's).
        """
        return "native", ""

    def compile_policy(self) -> CompilePolicy:
        """How ``--compile`` compiles on this device, decided on first use and kept for the backend's life."""
        if self._compile_policy is None:
            self._compile_policy = compile_policy(self.name)
        return self._compile_policy

    # ---- introspection --------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What the RunRecord and `difforge doctor` show about this backend."""
        return {
            "backend": self.name,
            "device": str(self.device),
            "device_name": self.device_name(),
            "device_count": self.device_count(),
            "total_memory_bytes": self.total_memory_bytes(),
            "fused_ops": sorted(self.fused_ops),
            "env_presets_applied": dict(self.applied_presets),
        }
