"""Huawei Ascend NPU backend: every NPU specific in difforge lives here.

``torch_npu`` is imported lazily (it needs CANN, and importing it on a machine without one fails),
and only through :func:`torch_npu_module`.  Tests install a stand-in module under the same name
(``tests/standin/torch_npu``) whose functions follow the real signatures; no NPU code path in this
repository has been run on real Ascend hardware from CI.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, ClassVar

import torch

from .base import Backend, EnvPreset


def torch_npu_module() -> ModuleType | None:
    """Import ``torch_npu`` once, or return None when it (or CANN) is missing."""
    try:
        return importlib.import_module("torch_npu")
    except Exception:  # ImportError, or OSError/RuntimeError from a broken CANN install
        return None


def cann_version() -> str | None:
    """CANN toolkit version from the environment Ascend's set_env.sh exports, if any."""
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    if not home:
        return None
    for name in ("version.cfg", "ascend_toolkit_install.info"):
        path = os.path.join(home, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if "version" in line.lower() and "=" in line:
                        return line.split("=", 1)[1].strip()
    return os.path.basename(os.path.realpath(home))


class NPUBackend(Backend):
    name: ClassVar[str] = "npu"
    fused_ops: ClassVar[frozenset[str]] = frozenset({"rms_norm", "swiglu", "attention", "rotary"})

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
        mod = torch_npu_module()
        return getattr(torch, "npu", None) or mod.npu  # type: ignore[union-attr]

    def _module(self) -> Any | None:
        return self._npu() if torch_npu_module() is not None else None

    def env_presets(self) -> list[EnvPreset]:
        return [
            EnvPreset(
                "PYTORCH_NPU_ALLOC_CONF",
                "expandable_segments:True",
                "the caching allocator grows segments instead of fragmenting (fewer OOMs at 1024²)",
            ),
            EnvPreset("TASK_QUEUE_ENABLE", "1", "asynchronous operator dispatch (level 1 task queue)"),
            EnvPreset("CPU_AFFINITY_CONF", "1", "bind host threads to the NPU's NUMA node"),
            EnvPreset("HCCL_OP_EXPANSION_MODE", "AIV", "faster collectives when several NPUs are used"),
            EnvPreset(
                "ACL_PRECISION_MODE",
                "allow_fp32_to_fp16",
                "lets CANN run fp32 ops in fp16; reduces precision, so opt-in only",
                opt_in=True,
            ),
        ]

    def preferred_dtype(self) -> torch.dtype:
        return torch.bfloat16

    def peak_memory_bytes(self) -> int | None:
        return int(self._npu().max_memory_allocated(self.device))

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        mod = torch_npu_module()
        out["torch_npu"] = getattr(mod, "__version__", None) if mod is not None else None
        out["cann"] = cann_version()
        return out
