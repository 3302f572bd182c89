"""The stage-timing hook (difforge.runtime.stages): what a benchmark measures through, free when unused."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
import torch

from difforge.runtime.stages import CFG, DRAWS, SAMPLER, stage_timing, timed_stage


class Recorder:
    """A StageTimer that notes each stage as it is entered and left."""

    def __init__(self) -> None:
        self.events: list[str] = []

    @contextlib.contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        self.events.append(f"+{stage}")
        yield
        self.events.append(f"-{stage}")


@timed_stage(DRAWS)
def draw(x: int) -> int:
    return x + 1


@timed_stage(SAMPLER)
def step(x: int) -> int:
    return draw(x) * 2


def test_without_a_timer_a_marked_function_runs_as_it_is() -> None:
    recorder = Recorder()
    assert step(1) == 4 and recorder.events == []
    assert step.__name__ == "step" and step.__wrapped__(1) == 4  # type: ignore[attr-defined]


def test_an_installed_timer_brackets_each_call_and_nested_stages() -> None:
    recorder = Recorder()
    with stage_timing(recorder):
        assert step(1) == 4
    assert recorder.events == ["+sampler", "+draws", "-draws", "-sampler"]
    assert step(2) == 6 and len(recorder.events) == 4  # uninstalled on leaving the block


def test_the_timer_is_uninstalled_when_the_run_raises() -> None:
    recorder = Recorder()
    with pytest.raises(RuntimeError), stage_timing(recorder):
        raise RuntimeError("boom")
    draw(0)
    assert recorder.events == []


def test_a_timer_times_its_own_thread_only() -> None:
    recorder = Recorder()
    with stage_timing(recorder):
        thread = threading.Thread(target=draw, args=(0,))
        thread.start()
        thread.join()
    assert recorder.events == []


def test_an_unknown_stage_is_refused_when_marked() -> None:
    with pytest.raises(ValueError, match="Unknown stage"):
        timed_stage("draw")


def test_ursa_marks_its_draws_sampler_and_cfg_combine() -> None:
    """The functions the URSA benchmark times are the ones marked: a guided step reports every stage."""
    from difforge.models.ursa import DFMScheduler, SchedulerConfig, URSAPipeline
    from difforge.models.ursa.sampling import Draws, PhiloxDraws

    recorder = Recorder()
    scheduler = DFMScheduler(SchedulerConfig(alpha=0.9, c=3.0, shift=1.0, eps=1e-5),
                             torch.randn(16, 4, generator=torch.Generator().manual_seed(0)))
    logits = torch.randn(2, 1, 6, 16, generator=torch.Generator().manual_seed(1))
    with stage_timing(recorder):
        z = URSAPipeline.guide(logits.flatten(0, 1), 3.0)
        ph = PhiloxDraws(0, torch.device("cpu"))
        x = ph.codes((1, 6), 16)
        scheduler.step(z, 1, 4, x, Draws(philox=ph))
        scheduler.step(z.clone(), 1, 4, x, torch.Generator().manual_seed(0))
    stages = [e[1:] for e in recorder.events if e.startswith("+")]
    # the combine, the initial codes, then each stream's step with its three draws: x1, uniforms, the jump
    assert stages == [CFG, DRAWS, SAMPLER, DRAWS, DRAWS, DRAWS, SAMPLER, DRAWS, DRAWS, DRAWS]


def test_the_qwen_edit_combine_is_the_cfg_stage() -> None:
    from difforge.models.qwen_edit.loop import combine_cfg

    recorder = Recorder()
    cond, uncond = torch.ones(1, 2, 4), torch.zeros(1, 2, 4)
    with stage_timing(recorder):
        out = combine_cfg(cond, uncond, 4.0)
    assert recorder.events == ["+cfg", "-cfg"] and torch.allclose(out, cond)
