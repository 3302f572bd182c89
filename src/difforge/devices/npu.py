"""Huawei Ascend NPU backend: every NPU specific in difforge lives here.

``torch_npu`` is imported lazily (it needs CANN, and importing it on a machine without one fails),
and only through :func:`torch_npu_module`.  Tests install a stand-in module under the same name
(``tests/standin/torch_npu``) whose functions follow the real signatures; no NPU code path in this
repository has been run on real Ascend hardware from CI.

Device-module calls pass the device *index* (an int), not a ``torch.device``: every torch_npu
function used here resolves ints itself (``_get_device_index(..., optional=True)``), and an int does
not depend on ``torch.device("npu")`` being parseable -- which it only is after the real torch_npu
has renamed torch's PrivateUse1 backend.

Environment presets and their sources are documented in docs/npu.md.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
from types import ModuleType
from typing import Any, ClassVar

import torch

from ..errors import DeviceError
from .base import Backend, EnvPreset

#: The torch_npu function behind each fused op (names as in :data:`difforge.ops.OP_NAMES`).
FUSED_KERNELS = {
    "rms_norm": "npu_rms_norm",
    "swiglu": "npu_swiglu",
    "rotary": "npu_rotary_mul",
    "attention": "npu_fusion_attention",
}

#: The option torch_npu sets through ``torch_npu.npu.set_option`` (npu/npu_config.py), not the env.
PRECISION_OPTION = "ACL_PRECISION_MODE"


def torch_npu_module() -> ModuleType | None:
    """Import ``torch_npu`` (cached by Python after the first success), or None when it or CANN is missing."""
    return _import_torch_npu()[0]


def torch_npu_import_error() -> str | None:
    """Why ``torch_npu`` cannot be used, as one phrase for ``difforge doctor``; None when it imports."""
    return _import_torch_npu()[1]


def _import_torch_npu() -> tuple[ModuleType | None, str | None]:
    try:
        return importlib.import_module("torch_npu"), None
    except ModuleNotFoundError as exc:
        if exc.name == "torch_npu" or importlib.util.find_spec("torch_npu") is None:
            return None, "not installed"
        return None, f"import failed: {type(exc).__name__}: {exc}"
    except Exception as exc:  # OSError/RuntimeError/ImportError from a broken CANN install
        return None, f"import failed: {type(exc).__name__}: {exc}"


def cann_version() -> str | None:
    """CANN version: asked from torch_npu when it imports, else read from the toolkit set_env.sh exports.

    torch_npu's own ``collect_env`` reads ``ascend_*_install.info`` under ``ASCEND_HOME_PATH``; the
    same files are read here, so doctor works even when torch_npu itself fails to import.
    """
    mod = torch_npu_module()
    if mod is not None:
        try:
            version = mod.npu.utils.get_cann_version()
            if version:
                return str(version)
        except Exception:  # older torch_npu without it, or CANN runtime not initialisable
            pass
    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    if not home or not os.path.isdir(home):
        return None
    candidates = [
        *sorted(glob.glob(os.path.join(home, "ascend_*_install.info"))),
        *sorted(glob.glob(os.path.join(home, "*", "ascend_*_install.info"))),
        os.path.join(home, "version.cfg"),
    ]
    for path in candidates:
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition("=")
                if sep and "version" in key.lower() and value.strip():
                    return value.strip().strip("[]")
    return os.path.basename(os.path.realpath(home))


class NPUBackend(Backend):
    name: ClassVar[str] = "npu"
    fused_ops: ClassVar[frozenset[str]] = frozenset({"rms_norm", "swiglu", "attention", "rotary"})
    pinned_host_copies: ClassVar[bool] = True

    # ---- kernels ------------------------------------------------------------------------------------
    def fused_kernel(self, op: str) -> Any | None:
        """``torch_npu``'s kernel for ``op`` when this backend fuses it and the installed torch_npu has it."""
        if op not in self.fused_ops:
            return None
        mod = torch_npu_module()
        return getattr(mod, FUSED_KERNELS[op], None) if mod is not None else None

    def sdpa_note(self) -> str:
        return ""

    def diffusers_attention(self, dtype: torch.dtype, allow_fused: bool = True) -> tuple[str, str]:
        """diffusers' ``_native_npu`` backend (``npu_fusion_attention``) for bf16/fp16, else SDPA with the reason."""
        if not allow_fused:
            return "native", "_native_npu switched off with 'npu-attention'"
        if not self.has_fused("attention"):
            return "native", ""
        if dtype not in (torch.bfloat16, torch.float16):
            return "native", "the NPU fused kernel needs bf16/fp16"
        return "_native_npu", ""

    # ---- presence ---------------------------------------------------------------------------------
    @classmethod
    def is_available(cls) -> bool:
        mod = torch_npu_module()
        if mod is None:
            return False
        npu = getattr(torch, "npu", None) or getattr(mod, "npu", None)
        try:
            return bool(npu is not None and npu.is_available())
        except Exception:
            return False

    @classmethod
    def device_count(cls) -> int:
        if not cls.is_available():
            return 0
        return int(cls._npu().device_count())

    @staticmethod
    def _npu() -> Any:
        """``torch.npu`` once the real torch_npu registered it, else ``torch_npu.npu`` (the stand-in)."""
        mod = torch_npu_module()
        return getattr(torch, "npu", None) or mod.npu  # type: ignore[union-attr]

    def _module(self) -> Any | None:
        return self._npu() if torch_npu_module() is not None else None

    @property
    def _idx(self) -> int:
        """The device index every device-module call gets (0 when the user wrote plain ``npu``)."""
        return 0 if self.index is None else int(self.index)

    @property
    def device(self) -> torch.device:
        try:
            return torch.device("npu", self._idx)
        except RuntimeError as exc:  # "npu" unknown: torch_npu has not renamed PrivateUse1 (stand-in)
            raise DeviceError(
                "torch does not know the 'npu' device type; import the real torch_npu (with CANN's "
                "set_env.sh sourced) before creating tensors on the NPU."
            ) from exc

    def __str__(self) -> str:
        return f"npu:{self._idx}"

    # ---- device module calls, by index ------------------------------------------------------------
    def device_name(self) -> str:
        return str(self._npu().get_device_name(self._idx))

    def total_memory_bytes(self) -> int | None:
        return int(self._npu().get_device_properties(self._idx).total_memory)

    def _memory_index(self) -> Any:
        return self._idx  # torch_npu's mem_get_info resolves an int itself (see the module docstring)

    def synchronize(self) -> None:
        self._npu().synchronize(self._idx)

    def reset_peak_memory(self) -> None:
        self._npu().reset_peak_memory_stats(self._idx)

    def peak_memory_bytes(self) -> int | None:
        return int(self._npu().max_memory_allocated(self._idx))

    def memory_allocated_bytes(self) -> int | None:
        return int(self._npu().memory_allocated(self._idx))

    def empty_cache(self) -> None:
        self._npu().empty_cache()

    # ---- dtypes -------------------------------------------------------------------------------------
    def preferred_dtype(self) -> torch.dtype:
        # Both seed reports ran on Ascend 910 in bf16/fp16; bf16 keeps fp32's range (no overflow in
        # the 20B MMDiT) and is native on 910B and later.
        return torch.bfloat16

    # ---- environment presets ------------------------------------------------------------------------
    def env_presets(self) -> list[EnvPreset]:
        """Recommended settings; sources in docs/npu.md.  Read by torch_npu at device init, so apply early."""
        return [
            EnvPreset(
                "PYTORCH_NPU_ALLOC_CONF",
                "expandable_segments:True",
                "the caching allocator grows segments instead of fragmenting (both seed reports: fewer OOMs)",
            ),
            EnvPreset(
                "TASK_QUEUE_ENABLE",
                "2",
                "level-2 operator dispatch pipeline (1 is torch_npu's default); set 1 if peak memory is tight",
            ),
            EnvPreset(
                "CPU_AFFINITY_CONF",
                "1",
                "coarse core binding: torch_npu pins each NPU's host threads to its own slice of CPU cores",
            ),
            EnvPreset(
                PRECISION_OPTION,
                "allow_fp32_to_fp16",
                "CANN may run fp32 matrix ops in fp16 (torch_npu.npu.set_option); reduces precision, so opt-in",
                opt_in=True,
            ),
        ]

    def apply_env_presets(self, opt_in: bool = False) -> dict[str, str]:
        """Set the presets the user has not set; the precision mode also goes through ``set_option``.

        torch_npu takes ACL_PRECISION_MODE as a compile option (``torch_npu.npu.set_option``,
        npu/npu_config.py) rather than documenting it as an environment variable, so exporting it
        alone -- as the URSA seed report did -- may not change anything.
        """
        applied = super().apply_env_presets(opt_in=opt_in)
        value = self.applied_presets.get(PRECISION_OPTION)
        if value is not None:
            mod = torch_npu_module()
            npu = getattr(mod, "npu", None) if mod is not None else None
            if npu is not None and hasattr(npu, "set_option"):
                npu.set_option({PRECISION_OPTION: value})
                self.precision_option_set = True
        return applied

    # ---- introspection ------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        mod = torch_npu_module()
        return {
            "backend": self.name,
            "device": str(self),
            "device_name": self.device_name(),
            "device_count": self.device_count(),
            "total_memory_bytes": self.total_memory_bytes(),
            "fused_ops": sorted(self.fused_ops),
            "env_presets_applied": dict(self.applied_presets),
            "precision_mode_via_set_option": bool(getattr(self, "precision_option_set", False)),
            "torch_npu": getattr(mod, "__version__", None) if mod is not None else None,
            "cann": cann_version(),
        }
