"""Optional timing of named stages inside a run: the public seam a benchmark measures through.

A denoising step is a transformer forward plus smaller stages - the random draws, the sampler's step,
the classifier-free-guidance combine.  How much of a step each takes is a benchmark's question (issue
12's "time on random draws"), and answering it needs a synchronised clock around each call.  Rather
than have a benchmark reach into a family's private functions and swap them for timed copies, the
family marks those functions with :func:`timed_stage` and a caller that wants the figures installs
a :class:`StageTimer` for the span of a run with :func:`stage_timing`.

With no timer installed - every ``generate``/``edit``/``validate`` run - a marked function costs one
context-variable read a call and runs as it is: nothing syncs, nothing is recorded.  The timer is
held in a :class:`contextvars.ContextVar`, so a timer installed in one thread or task times only
that one.  Stages may nest (the sampler's step calls draws): each stage's timer call brackets its
own function, so a nested draw is counted in both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

#: The stage names the families mark: random draws, the sampler's (scheduler's) step, the CFG combine.
DRAWS, SAMPLER, CFG = "draws", "sampler", "cfg"
STAGES = (DRAWS, SAMPLER, CFG)

F = TypeVar("F", bound=Callable[..., Any])


class StageTimer(Protocol):
    """What :func:`stage_timing` installs: ``measure(stage)`` is entered around every call of a marked
    function of that stage (one of :data:`STAGES`), so it may synchronise the device and read a clock."""

    def measure(self, stage: str) -> AbstractContextManager[object]: ...


_ACTIVE: ContextVar[StageTimer | None] = ContextVar("difforge_stage_timer", default=None)


@contextmanager
def stage_timing(timer: StageTimer) -> Iterator[StageTimer]:
    """Install ``timer`` for the marked stages run inside the ``with`` block (this context only)."""
    token = _ACTIVE.set(timer)
    try:
        yield timer
    finally:
        _ACTIVE.reset(token)


def timed_stage(stage: str) -> Callable[[F], F]:
    """Mark a function as one call of ``stage``: timed by the installed :class:`StageTimer`, if any."""
    if stage not in STAGES:
        raise ValueError(f"Unknown stage {stage!r}; expected one of {', '.join(STAGES)}.")

    def mark(fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            timer = _ACTIVE.get()
            if timer is None:
                return fn(*args, **kwargs)
            with timer.measure(stage):
                return fn(*args, **kwargs)

        return timed  # type: ignore[return-value]

    return mark
