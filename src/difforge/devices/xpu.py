"""Intel XPU backend."""

from __future__ import annotations

from typing import ClassVar

import torch

from .base import Backend


class XPUBackend(Backend):
    name: ClassVar[str] = "xpu"
    pinned_host_copies: ClassVar[bool] = True
    fused_ops: ClassVar[frozenset[str]] = frozenset({"attention"})

    @classmethod
    def is_available(cls) -> bool:
        xpu = getattr(torch, "xpu", None)
        return bool(xpu is not None and xpu.is_available())
