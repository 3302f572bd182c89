"""RunRecord.phase: wall time, device syncs at both ends, peak memory, accumulation, and JSON round trip."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from difforge.runtime.record import RunRecord


@dataclass
class RecordingBackend:
    """Just the backend calls ``phase`` makes, logged, with a settable peak."""

    peak: int | None = 0
    calls: list[str] = field(default_factory=list)

    def synchronize(self) -> None:
        self.calls.append("sync")

    def reset_peak_memory(self) -> None:
        self.calls.append("reset")

    def peak_memory_bytes(self) -> int | None:
        self.calls.append("peak")
        return self.peak


def test_phase_times_the_block() -> None:
    record = RunRecord(kind="generate")
    with record.phase("load"):
        time.sleep(0.05)
    stat = record.phases["load"]
    assert stat.name == "load"
    assert 0.04 <= stat.wall_s < 2.0
    assert stat.peak_device_bytes is None  # no backend, no device memory
    assert stat.peak_host_rss_bytes > 0
    assert record.total_wall_s == pytest.approx(stat.wall_s)


def test_phase_syncs_before_and_after_then_reads_peak() -> None:
    backend = RecordingBackend(peak=123)
    record = RunRecord(kind="generate")
    with record.phase("denoise", backend):  # type: ignore[arg-type]
        backend.calls.append("work")
    assert backend.calls == ["sync", "reset", "work", "sync", "peak"]
    assert record.phases["denoise"].peak_device_bytes == 123


def test_phase_entered_twice_accumulates_time_and_keeps_max_peak() -> None:
    backend = RecordingBackend(peak=500)
    record = RunRecord(kind="edit")
    with record.phase("encode", backend):  # type: ignore[arg-type]
        time.sleep(0.02)
    first = record.phases["encode"].wall_s
    backend.peak = 200
    with record.phase("encode", backend):  # type: ignore[arg-type]
        time.sleep(0.02)
    stat = record.phases["encode"]
    assert stat.wall_s > first + 0.015
    assert stat.peak_device_bytes == 500


def test_phase_keeps_peak_when_one_entry_has_none() -> None:
    backend = RecordingBackend(peak=None)
    record = RunRecord(kind="generate")
    with record.phase("decode", backend):  # type: ignore[arg-type]
        pass
    backend.peak = 42
    with record.phase("decode", backend):  # type: ignore[arg-type]
        pass
    assert record.phases["decode"].peak_device_bytes == 42


def test_phase_syncs_even_when_block_raises() -> None:
    backend = RecordingBackend(peak=7)
    record = RunRecord(kind="generate")
    with pytest.raises(RuntimeError), record.phase("denoise", backend):  # type: ignore[arg-type]
        raise RuntimeError("boom")
    # the closing sync still ran, so the device was drained before the error propagated
    assert backend.calls == ["sync", "reset", "sync"]


def test_record_round_trips_through_json(tmp_path: Path) -> None:
    record = RunRecord(kind="generate", config={"steps": 2})
    with record.phase("load"):
        pass
    record.adapt("rms_norm", "torch_npu.npu_rms_norm")
    record.adapt("rms_norm", "torch")  # re-logging replaces
    path = record.save(tmp_path / "run.json")
    loaded = RunRecord.load(path)
    assert loaded.phases["load"].wall_s == record.phases["load"].wall_s
    assert [(a.what, a.choice) for a in loaded.adaptations] == [("rms_norm", "torch")]
    assert loaded.config == {"steps": 2}
