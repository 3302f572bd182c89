"""The performance table's rows: medians per row, memory, and the speed-up over the baseline row."""

from __future__ import annotations

import pytest

from difforge.runtime.record import PhaseStat, RunRecord
from difforge.validate.bench import speed_row, speed_table


def _record(step_s: float, steps: int = 4, load_s: float = 5.0, peak: int | None = None) -> RunRecord:
    rec = RunRecord(kind="generate")
    rec.step_times_s = [step_s] * steps
    rec.phases = {"load": PhaseStat("load", load_s, peak, 2**30),
                  "denoise": PhaseStat("denoise", step_s * steps, peak, 3 * 2**30)}
    return rec


def test_speed_rows_take_medians_and_the_speedup_is_against_the_baseline() -> None:
    base = speed_row("baseline", "--disable a,b", [_record(0.4), _record(0.5), _record(0.6)], 2**30, False)
    fast = speed_row("exact", "defaults", [_record(0.2), _record(0.25)], 2**30, True)
    broken = {"kind": "approximate", "name": "--fast x", "validated": False, "error": "out of memory"}
    rows = speed_table([base, fast, broken])
    assert rows[0]["s_per_it"] == pytest.approx(0.5) and rows[0]["it_per_s"] == pytest.approx(2.0)
    assert rows[0]["speedup_step"] == pytest.approx(1.0)
    assert rows[1]["s_per_it"] == pytest.approx(0.225) and rows[1]["speedup_step"] == pytest.approx(0.5 / 0.225)
    # end to end leaves the load out: 4 steps of the median round, over the baseline's
    assert rows[1]["speedup_end_to_end"] == pytest.approx(rows[0]["end_to_end_s"] / rows[1]["end_to_end_s"])
    assert rows[2] == broken  # a row that did not run keeps its reason and gets no speed-up
    # on the CPU (no device allocator) memory is the host's resident set, and said so
    assert rows[0]["memory_kind"] == "host RSS" and rows[0]["peak_bytes"] == 3 * 2**30


def test_device_memory_is_preferred_when_the_device_reports_it() -> None:
    row = speed_row("exact", "defaults", [_record(0.1, peak=7 * 2**30)], 5 * 2**30, True)
    assert row["memory_kind"] == "device" and row["peak_bytes"] == 7 * 2**30
    assert row["memory_after_load_bytes"] == 5 * 2**30


def test_no_baseline_no_speedup() -> None:
    rows = speed_table([speed_row("exact", "defaults", [_record(0.1)], None, True)])
    assert "speedup_step" not in rows[0]
