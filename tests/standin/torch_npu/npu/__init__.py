"""Stand-in for ``torch_npu.npu``, the device module (NOT the real one; see ``torch_npu/__init__.py``).

Signatures follow torch_npu 2.13.0:
``is_available()`` / ``device_count()`` / ``get_device_name(device_name=None)`` /
``get_device_properties(device_name=None)`` / ``mem_get_info(device=None)``  -- torch_npu/npu/__init__.py:410-558;
``synchronize(device=None)`` / ``set_device(device)`` / ``current_device()`` -- torch_npu/npu/utils.py:65-99;
``empty_cache()`` / ``reset_peak_memory_stats(device=None)`` / ``memory_allocated(device=None)`` /
``max_memory_allocated(device=None)`` / ``memory_reserved(device=None)`` / ``max_memory_reserved(device=None)``
-- torch_npu/npu/memory.py:168-509; ``set_option(option)`` -- torch_npu/npu/npu_config.py:20,52.

The memory counters are simulated: tests move them with :func:`_standin_allocate` / :func:`_standin_free`
and read every call difforge made from :data:`_standin_calls`, which is how they prove difforge
routes synchronize / peak-memory / empty_cache through this module.  State is per import: the
``npu_standin`` fixture re-imports the package for each test.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from . import utils
from .utils import current_device, set_device, synchronize

_DEFAULT_NAME = "Ascend910B-standin"
_DEFAULT_MEMORY = 64 * 1024**3

#: Every device-module call, in order, as ``(function name, resolved device index or None)``.
_standin_calls: list[tuple[str, int | None]] = []
_allocated: dict[int, int] = {}
_peak: dict[int, int] = {}
_options: dict[str, str] = {}

# torch_npu/npu/npu_config.py:20 -- the values set_option accepts for ACL_PRECISION_MODE.
_PRECISION_MODES = ("allow_fp32_to_fp16", "must_keep_origin_dtype")


@dataclass(frozen=True)
class _NPUDeviceProperties:
    """The fields of the real ``NPUDeviceProp`` that difforge reads."""

    name: str
    total_memory: int


def _count() -> int:
    return max(0, int(os.environ.get("DIFFORGE_STANDIN_NPU_COUNT", "1")))


def _get_device_index(device: Any, optional: bool = True) -> int:
    """Resolve ``None`` / int / ``"npu:1"`` / a ``torch.device`` to an index, like torch_npu does."""
    if device is None:
        if not optional:
            raise ValueError("Expected a device, got None.")
        return current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, idx = device.partition(":")
        if kind != "npu":
            raise ValueError(f"Expected an npu device, got {device!r}.")
        return int(idx) if idx else current_device()
    if isinstance(device, torch.device):
        if device.type not in ("npu", "privateuseone"):
            raise ValueError(f"Expected an npu device, got {device}.")
        return current_device() if device.index is None else int(device.index)
    raise ValueError(f"Cannot interpret {device!r} as an npu device.")


def _checked_index(device: Any) -> int:
    idx = _get_device_index(device, optional=True)
    if idx < 0 or idx >= device_count():
        # the real functions raise AssertionError("Invalid device id") here (npu/__init__.py:537)
        raise AssertionError("Invalid device id")
    return idx


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return _count()


def get_device_name(device_name: Any = None) -> str:
    _standin_calls.append(("get_device_name", _checked_index(device_name)))
    return os.environ.get("DIFFORGE_STANDIN_NPU_NAME", _DEFAULT_NAME)


def get_device_properties(device_name: Any = None) -> _NPUDeviceProperties:
    _standin_calls.append(("get_device_properties", _checked_index(device_name)))
    total = int(os.environ.get("DIFFORGE_STANDIN_NPU_MEMORY", str(_DEFAULT_MEMORY)))
    return _NPUDeviceProperties(
        name=os.environ.get("DIFFORGE_STANDIN_NPU_NAME", _DEFAULT_NAME), total_memory=total
    )


def mem_get_info(device: Any = None) -> tuple[int, int]:
    idx = _checked_index(device)
    total = get_device_properties(idx).total_memory
    return total - _allocated.get(idx, 0), total


def is_bf16_supported(including_emulation: bool = False) -> bool:
    return True


# ---- memory (torch_npu/npu/memory.py) --------------------------------------------------------------
def empty_cache() -> None:
    _standin_calls.append(("empty_cache", None))


def reset_peak_memory_stats(device: Any = None) -> None:
    idx = _checked_index(device)
    _standin_calls.append(("reset_peak_memory_stats", idx))
    _peak[idx] = _allocated.get(idx, 0)


def memory_allocated(device: Any = None) -> int:
    idx = _checked_index(device)
    _standin_calls.append(("memory_allocated", idx))
    return _allocated.get(idx, 0)


def max_memory_allocated(device: Any = None) -> int:
    idx = _checked_index(device)
    _standin_calls.append(("max_memory_allocated", idx))
    return _peak.get(idx, 0)


def memory_reserved(device: Any = None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device: Any = None) -> int:
    return max_memory_allocated(device)


# ---- options (torch_npu/npu/npu_config.py) ----------------------------------------------------------
def set_option(option: dict[str, Any]) -> None:
    """Accepts the ACL_PRECISION_MODE values the real ``_option_map`` allows; remembers the rest verbatim."""
    if not isinstance(option, dict):
        raise TypeError("npu option must be a dict.")
    for name, value in option.items():
        if name == "ACL_PRECISION_MODE" and str(value) not in _PRECISION_MODES:
            raise ValueError(f"value of {name} should be in {list(_PRECISION_MODES)} but got {value}")
        _options[name] = str(value)
    _standin_calls.append(("set_option", None))


# ---- test hooks (not part of the real API) ----------------------------------------------------------
def _standin_allocate(nbytes: int, device: Any = None) -> None:
    """Pretend ``nbytes`` were allocated on ``device``: moves current and peak like the caching allocator."""
    idx = _checked_index(device)
    _allocated[idx] = _allocated.get(idx, 0) + int(nbytes)
    _peak[idx] = max(_peak.get(idx, 0), _allocated[idx])


def _standin_free(nbytes: int, device: Any = None) -> None:
    idx = _checked_index(device)
    _allocated[idx] = max(0, _allocated.get(idx, 0) - int(nbytes))


__all__ = [
    "current_device",
    "device_count",
    "empty_cache",
    "get_device_name",
    "get_device_properties",
    "is_available",
    "is_bf16_supported",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "reset_peak_memory_stats",
    "set_device",
    "set_option",
    "synchronize",
    "utils",
]
