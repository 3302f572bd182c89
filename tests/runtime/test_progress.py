"""The progress bar's rate reads like the seed logs' (s/it when slow, it/s when fast); spinners stay
silent when quiet or when stderr is not a terminal (logs and CI get no control characters)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.progress import Progress

from difforge.runtime import progress
from difforge.runtime.progress import RateColumn, rate_text, spinner, track


@pytest.mark.parametrize(("speed", "text"), [(None, "-- s/it"), (0.0, "-- s/it"), (float("nan"), "-- s/it"),
                                             (0.25, "4.00 s/it"), (1.0, "1.00 it/s"), (12.345, "12.35 it/s")])
def test_rate_text(speed: float | None, text: str) -> None:
    assert rate_text(speed) == text


def test_the_bar_shows_the_rate_column() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with Progress(RateColumn(), console=console) as bar:
        task = bar.add_task("denoise", total=2)
        bar.advance(task)
    assert "s/it" in buf.getvalue() or "it/s" in buf.getvalue()


def test_track_yields_everything_quiet_or_not(capsys: pytest.CaptureFixture[str]) -> None:
    assert list(track(range(3), total=3, quiet=True)) == [0, 1, 2]
    assert list(track(range(3), total=3, description="denoise")) == [0, 1, 2]


def test_spinner_is_silent_when_quiet_or_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", buf)
    with spinner("loading", quiet=False):  # a StringIO is not a terminal
        pass
    with spinner("loading", quiet=True):
        pass
    assert buf.getvalue() == ""
