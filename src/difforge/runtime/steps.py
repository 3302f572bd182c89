"""Per-step timing without a host sync inside the denoising loop.

On accelerators each step boundary records a device event; the events are read once after the
loop, so the loop stays free of synchronisation (and capturable by CUDA graphs later).  On the
CPU, work is synchronous and ``perf_counter`` is exact.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..devices import Backend


class StepTimer:
    """Call :meth:`start` before the loop, :meth:`mark` after each step, :meth:`durations` after."""

    def __init__(self, backend: Backend | None = None) -> None:
        self._device = backend.device if backend is not None else torch.device("cpu")
        # device events time asynchronous work without a host sync; the host itself needs none
        self._use_events = backend is not None and not backend.is_host and hasattr(torch, "Event")
        self._marks: list[Any] = []

    def _now(self) -> Any:
        if self._use_events:
            try:
                ev = torch.Event(device=self._device, enable_timing=True)
                ev.record()
                return ev
            except (RuntimeError, TypeError):  # backend without timing events: fall back, sync once
                self._use_events = False
        return time.perf_counter()

    def start(self) -> None:
        self._marks = [self._now()]

    def mark(self) -> None:
        self._marks.append(self._now())

    def durations(self) -> list[float]:
        """Seconds per step (synchronises once when events were used)."""
        if len(self._marks) < 2:
            return []
        first = self._marks[0]
        if isinstance(first, float) and all(isinstance(m, float) for m in self._marks):
            return [b - a for a, b in zip(self._marks, self._marks[1:], strict=False)]
        self._marks[-1].synchronize()
        return [a.elapsed_time(b) / 1000.0 for a, b in zip(self._marks, self._marks[1:], strict=False)]
