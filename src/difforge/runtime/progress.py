"""Progress bars and spinners for long work (rich), silenced by ``--quiet``.

The bar shows the rate the way the seed reports' logs do: ``s/it`` for slow steps (a 20B model on a
CPU), ``it/s`` for fast ones, whichever reads as a number above 1.  Work without steps (import, load,
decode) gets a spinner, so a user never stares at a silent terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

T = TypeVar("T")


def rate_text(speed: float | None) -> str:
    """``"2.31 s/it"`` below one step a second, ``"4.50 it/s"`` above; ``"-- s/it"`` before the first step."""
    if not speed or speed != speed or speed <= 0:
        return "-- s/it"
    return f"{speed:.2f} it/s" if speed >= 1 else f"{1 / speed:.2f} s/it"


class RateColumn(ProgressColumn):
    """The step rate (:func:`rate_text`)."""

    def render(self, task: Any) -> Text:
        return Text(rate_text(task.finished_speed or task.speed), style="progress.data.speed")


@contextmanager
def spinner(what: str, quiet: bool = False) -> Iterator[None]:
    """A spinner on stderr while ``what`` runs (nothing when quiet or when stderr is not a terminal)."""
    console = Console(file=sys.stderr)
    if quiet or not console.is_terminal:
        yield
        return
    with console.status(what, spinner="dots"):
        yield


def track(items: Iterable[T], total: int | None = None, description: str = "", quiet: bool = False) -> Iterator[T]:
    """Iterate ``items`` with a progress bar on stderr unless ``quiet``."""
    if quiet:
        yield from items
        return
    console = Console(file=sys.stderr)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        for item in items:
            yield item
            progress.advance(task)
