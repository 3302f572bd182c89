"""Progress bars for long work (rich), silenced by ``--quiet``."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")


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
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        for item in items:
            yield item
            progress.advance(task)
