"""Stand-in for ``torch_npu.npu.utils`` (NOT the real one).

Real signatures, torch_npu 2.13.0 ``torch_npu/npu/utils.py``: ``get_cann_version(module="CANN")`` (line 39),
``synchronize(device=None)`` (65), ``set_device(device)`` (91), ``current_device()`` (97).
"""

from __future__ import annotations

import os
from typing import Any

_current = 0


def get_cann_version(module: str = "CANN") -> str:
    """The real one asks the CANN runtime; the stand-in answers ``DIFFORGE_STANDIN_CANN_VERSION``."""
    return os.environ.get("DIFFORGE_STANDIN_CANN_VERSION", "8.3.RC1-standin")


def synchronize(device: Any = None) -> None:
    from . import _checked_index, _standin_calls

    _standin_calls.append(("synchronize", _checked_index(device)))


def set_device(device: Any) -> None:
    from . import _get_device_index

    global _current
    idx = _get_device_index(device, optional=True)
    if idx >= 0:
        _current = idx


def current_device() -> int:
    return _current
