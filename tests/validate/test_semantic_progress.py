"""Issue 28.9: the semantic stage says what it costs before it starts (it keeps the model's default steps
under --quick, so it is the longest stage of a quick validation) and shows a progress bar while it runs."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from difforge.validate import runner
from difforge.validate.runner import _Climb
from difforge.validate.verdict import RungResult, Verdict


def _climb(quick: bool, steps: int | None, floor: object | None) -> SimpleNamespace:
    lad = SimpleNamespace(o=SimpleNamespace(steps=steps), quick=quick, probe_type=SimpleNamespace(default_steps=50))
    bench = RungResult("benchmark", Verdict.PASS, "", data={"step": {"median": 0.5}})
    ref = SimpleNamespace(pipe=object())
    return SimpleNamespace(lad=lad, floor=floor, ref=ref, cfg0=SimpleNamespace(steps=4 if quick else None),
                           rungs={"benchmark": bench})


def test_the_semantic_stage_states_its_runs_steps_and_time_before_it_starts() -> None:
    line = _Climb._semantic_cost(_climb(quick=True, steps=None, floor=object()), 4)  # type: ignore[arg-type]
    # --quick ran 4 steps elsewhere; meaning is judged at the model's 50: 4 prompts x 3 sides, 4 x 50 x 0.5 s
    assert line == ("semantic rung (4 prompts x 3 sides = 12 runs at 50 steps; the device's share about 100 s "
                    "at its benchmark step time)"), line
    no_floor = _Climb._semantic_cost(_climb(quick=False, steps=None, floor=None), 16)  # type: ignore[arg-type]
    assert no_floor == "semantic rung (16 prompts x 2 sides = 32 runs at the model's default steps)", no_floor
    given = _Climb._semantic_cost(_climb(quick=True, steps=8, floor=None), 4)  # type: ignore[arg-type]
    assert "at 8 steps" in given and "about 16 s" in given


def test_the_semantic_prompts_run_under_the_progress_bar() -> None:
    source = inspect.getsource(_Climb.semantic)
    assert "track(items" in source and runner.track.__module__ == "difforge.runtime.progress"
