"""StepTimer: per-step durations with perf_counter on the CPU and a fallback when events fail."""

from __future__ import annotations

import time

import pytest
import torch

from difforge.devices.cpu import CPUBackend
from difforge.runtime import steps
from difforge.runtime.steps import StepTimer


def test_cpu_durations_match_sleeps() -> None:
    timer = StepTimer(CPUBackend())
    timer.start()
    for pause in (0.01, 0.03, 0.02):
        time.sleep(pause)
        timer.mark()
    durations = timer.durations()
    assert len(durations) == 3
    for got, pause in zip(durations, (0.01, 0.03, 0.02), strict=True):
        assert pause * 0.9 <= got < pause + 0.5
    assert durations[1] > durations[0]


def test_no_backend_means_cpu() -> None:
    timer = StepTimer()
    timer.start()
    timer.mark()
    assert len(timer.durations()) == 1


def test_fewer_than_two_marks_gives_nothing() -> None:
    timer = StepTimer()
    assert timer.durations() == []
    timer.start()
    assert timer.durations() == []


def test_start_resets_previous_marks() -> None:
    timer = StepTimer()
    timer.start()
    timer.mark()
    timer.mark()
    timer.start()
    timer.mark()
    assert len(timer.durations()) == 1


class _FakeBackend:
    device = torch.device("meta")
    is_host = False


def test_falls_back_to_perf_counter_when_events_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_event(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no timing events on this backend")

    monkeypatch.setattr(steps.torch, "Event", broken_event)
    timer = StepTimer(_FakeBackend())  # type: ignore[arg-type]
    timer.start()
    time.sleep(0.01)
    timer.mark()
    (duration,) = timer.durations()
    assert 0.009 <= duration < 1.0


def test_event_path_reads_elapsed_time_after_one_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 10.0, 35.0])
    synced: list[float] = []

    class FakeEvent:
        def __init__(self, device: torch.device, enable_timing: bool) -> None:
            assert enable_timing
            self.t = 0.0

        def record(self) -> None:
            self.t = next(clock)

        def synchronize(self) -> None:
            synced.append(self.t)

        def elapsed_time(self, other: FakeEvent) -> float:  # milliseconds, like torch.Event
            return other.t - self.t

    monkeypatch.setattr(steps.torch, "Event", FakeEvent)
    timer = StepTimer(_FakeBackend())  # type: ignore[arg-type]
    timer.start()
    timer.mark()
    timer.mark()
    assert timer.durations() == pytest.approx([0.010, 0.025])
    assert synced == [35.0]  # only the last event was waited on
