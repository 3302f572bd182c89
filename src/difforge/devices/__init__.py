"""Device backends behind one protocol, and the parser for ``--device``.

``auto`` picks npu > cuda > xpu > mps > cpu; ``cuda:1`` / ``npu:1`` select an index.
"""

from __future__ import annotations

from .base import DTYPES, PHILOX_STREAM, RANDOM_STREAMS, REFERENCE_STREAM, Backend, EnvPreset, dtype_name
from .compile import CompilePolicy
from .cpu import CPUBackend
from .cuda import CUDABackend
from .mps import MPSBackend
from .npu import NPUBackend
from .xpu import XPUBackend

BACKENDS: dict[str, type[Backend]] = {
    "cpu": CPUBackend,
    "cuda": CUDABackend,
    "npu": NPUBackend,
    "mps": MPSBackend,
    "xpu": XPUBackend,
}
AUTO_ORDER = ("npu", "cuda", "xpu", "mps", "cpu")


def available_backends() -> list[str]:
    """Names of the backends present on this machine, in auto-selection order."""
    return [name for name in AUTO_ORDER if BACKENDS[name].is_available()]


def get_backend(spec: str | None = "auto") -> Backend:
    """Parse a device spec (``auto``, ``cpu``, ``cuda``, ``npu:1`` ...) into a ready backend.

    ``None`` means ``auto``; an empty or blank string is refused, because it is what an unset shell
    variable (``--device "$DEV"``) produces and silently running on another device hides that.  The
    index must be ASCII digits (``str.isdigit`` also accepts ``²``, which ``int`` then rejects) and
    must name an existing device -- the CPU and MPS backends have exactly one, ``cpu:0`` / ``mps:0``.
    """
    from ..errors import DeviceError

    known = ", ".join(["auto", *AUTO_ORDER])
    if spec is not None and not spec.strip():
        raise DeviceError(f"The device is empty; use one of {known} (optionally with an index, e.g. cuda:1).")
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return BACKENDS[available_backends()[0]]()
    name, sep, idx_text = spec.partition(":")
    if name not in BACKENDS:
        raise DeviceError(f"Unknown device '{spec}'; use one of {known} (optionally with an index, e.g. cuda:1).")
    index: int | None = None
    if sep:
        if not (idx_text.isascii() and idx_text.isdigit()):
            raise DeviceError(f"Device index in '{spec}' must be a non-negative integer, e.g. {name}:0.")
        digits = idx_text.lstrip("0") or "0"
        index = int(digits) if len(digits) <= 18 else 2**63  # no device has that many; int() caps long digit strings
    cls = BACKENDS[name]
    if not cls.is_available():
        raise DeviceError(
            f"Device '{name}' is not present on this machine; available: {', '.join(available_backends())}."
        )
    if index is not None:
        count = cls.device_count()
        if index >= count:
            raise DeviceError(f"Device '{spec}' does not exist: this machine has {count} {name} device(s).")
    return cls(index=None if name in ("cpu", "mps") else index)


__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "DTYPES",
    "Backend",
    "CPUBackend",
    "CUDABackend",
    "CompilePolicy",
    "EnvPreset",
    "MPSBackend",
    "NPUBackend",
    "PHILOX_STREAM",
    "RANDOM_STREAMS",
    "REFERENCE_STREAM",
    "XPUBackend",
    "available_backends",
    "dtype_name",
    "get_backend",
]
