"""Huawei Ascend NPU backend: every NPU specific in difforge lives here.

``torch_npu`` is imported lazily (it needs CANN, and importing it on a machine without one fails),
and only through :func:`torch_npu_module`.  Tests install a stand-in module under the same name
(``tests/standin/torch_npu``) whose functions follow the real signatures; no NPU code path in this
repository has been run on real Ascend hardware from CI.

Device calls pass the device *index* (an int), not a ``torch.device``: every torch_npu function used
here resolves ints itself (``_get_device_index(..., optional=True)``), so does ``torch.accelerator``
(an int skips its device-type check), and an int does not depend on ``torch.device("npu")`` being
parseable -- which it only is after the real torch_npu has renamed torch's PrivateUse1 backend.
The sync and memory calls themselves are the base backend's: ``torch.accelerator`` once the real
torch_npu has made ``npu`` the current accelerator, ``torch.npu`` / ``torch_npu.npu`` otherwise
(always, under the test stand-in) -- see :mod:`difforge.devices.base`.

Environment presets and their sources are documented in docs/npu.md.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
from collections.abc import Mapping
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

#: Where CANN's ``set_env.sh`` puts the toolkit, in the order :func:`cann_version` reads them.
CANN_HOME_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
#: The script that exports them (the default toolkit install path).
CANN_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"


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
    home = next((os.environ[v] for v in CANN_HOME_VARS if os.environ.get(v)), None)
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
    visible_devices_env: ClassVar[str | None] = "ASCEND_RT_VISIBLE_DEVICES"
    #: HCCL's collective expansion: only multi-NPU collectives read it, recorded in case a user set it.
    extra_env_vars: ClassVar[tuple[str, ...]] = ("HCCL_OP_EXPANSION_MODE",)
    dist_backend: ClassVar[str] = "hccl"

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
        if torch_npu_module() is None:
            return False
        try:
            return bool(cls._npu().is_available())
        except Exception:  # a torch_npu that imports but cannot reach the driver
            return False

    @staticmethod
    def _npu() -> Any:
        """``torch.npu`` once the real torch_npu registered it, else ``torch_npu.npu`` (the stand-in)."""
        mod = torch_npu_module()
        return getattr(torch, "npu", None) or mod.npu  # type: ignore[union-attr]

    @classmethod
    def _module(cls) -> Any | None:
        return cls._npu() if torch_npu_module() is not None else None

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

    # ---- device calls, by index ----------------------------------------------------------------------
    def _device_arg(self) -> Any:
        return self._idx  # see the module docstring: an int, never torch.device("npu")

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

    def apply_env_presets(self, opt_in: bool = False, asked: Mapping[str, str] | None = None) -> dict[str, str]:
        """Set the presets the user has not set; the precision mode also goes through ``set_option``.

        torch_npu takes ACL_PRECISION_MODE as a compile option (``torch_npu.npu.set_option``,
        npu/npu_config.py) rather than documenting it as an environment variable, so exporting it
        alone -- as the URSA seed report did -- may not change anything.
        """
        applied = super().apply_env_presets(opt_in=opt_in, asked=asked)
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
            **super().describe(),
            "precision_mode_via_set_option": bool(getattr(self, "precision_option_set", False)),
            "torch_npu": getattr(mod, "__version__", None) if mod is not None else None,
            "cann": cann_version(),
        }
