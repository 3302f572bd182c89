"""Refuse a run that cannot fit *before* it allocates, with one sentence saying how much it needs.

Without a pre-check a too-large request fails late and badly: an accelerator raises out-of-memory
after minutes of loading, and the host (where Linux overcommits) lets the process grow until the
OOM killer ends it without a message -- or swaps for hours.  The families estimate what a load or a
call needs from the config alone (``models/<family>/memory.py``); this module compares that with
what the backend says is available (:meth:`~difforge.devices.Backend.available_memory_bytes`) and
records the outcome in the RunRecord, including *why* a check was skipped.

Estimates are deliberately simple sums of the large tensors a phase holds at once ("about");
they are meant to catch requests that are off by a large factor, not to predict the allocator.
``DIFFORGE_NO_MEMORY_CHECK=1`` skips the refusal (the estimate is still recorded) for anyone who
knows better, e.g. with swap or unified memory the backend does not count.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import DeviceOutOfMemoryError

if TYPE_CHECKING:
    from ..devices import Backend
    from .record import RunRecord

SKIP_ENV = "DIFFORGE_NO_MEMORY_CHECK"
GIB = 1 << 30


def format_bytes(n: int | float) -> str:
    """``12.3 GiB`` / ``340 MiB``: the unit a user compares with their device's spec sheet."""
    if n >= 100 * GIB:
        return f"{n / GIB:.0f} GiB"
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{max(n, 0) / (1 << 20):.0f} MiB"


@dataclass
class MemoryEstimate:
    """What one phase needs on one device, against what the device had when asked."""

    what: str  # e.g. "tiny-ursa at 4096x4096"
    device: str
    needed_bytes: int
    parts: dict[str, int] = field(default_factory=dict)  # the terms of the estimate, in bytes
    available_bytes: int | None = None
    checked: bool = False
    skipped_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["needed"] = format_bytes(self.needed_bytes)
        data["available"] = None if self.available_bytes is None else format_bytes(self.available_bytes)
        return data


def check_memory(
    backend: Backend,
    estimate: MemoryEstimate,
    hint: str,
    record: RunRecord | None = None,
    key: str = "call",
) -> MemoryEstimate:
    """Raise :class:`DeviceOutOfMemoryError` when ``estimate`` exceeds the backend's available memory.

    The estimate goes into ``record.extra["memory_estimate"][key]`` first, so a refused or skipped
    check is just as visible in the record as a passed one.  ``hint`` is what the user can change
    ("reduce --height/--width").
    """
    try:
        available = backend.available_memory_bytes()
    except Exception as exc:  # a backend bug must not turn a would-be run into a crash
        available, estimate.skipped_reason = None, f"reading available memory failed ({exc.__class__.__name__})"
    estimate.available_bytes = available
    if available is None:
        estimate.skipped_reason = estimate.skipped_reason or f"{backend.name} does not report available memory"
    elif os.environ.get(SKIP_ENV):
        estimate.skipped_reason = f"{SKIP_ENV} is set"
    else:
        estimate.checked = True
    if record is not None:
        record.extra.setdefault("memory_estimate", {})[key] = estimate.to_dict()
    if estimate.checked and available is not None and estimate.needed_bytes > available:
        raise DeviceOutOfMemoryError(
            f"{estimate.what} needs about {format_bytes(estimate.needed_bytes)} on {estimate.device}, which has "
            f"{format_bytes(available)} available; {hint} (or set {SKIP_ENV}=1 to try anyway)."
        )
    return estimate
