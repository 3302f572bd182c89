"""The trajectory rung's token rule (issue 25): a discrete model's path judged step by step.

On a shared stream the reference and the floor replay every step of the device's own run on the device's
recorded tokens; the device's recorded outputs may differ from the reference's step at most 2x (PASS) /
3x (WARN) as often as the floor's do, plus a near-boundary allowance.  Free-running final tokens are only
reported (one early flip changes every later step).  These tests drive the rule with hand-made traces and
probes (identical images, so only the tokens decide); the real models are in test_sampler_step.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from PIL import Image

from difforge.config import RunConfig
from difforge.validate.steps import StepTrace
from difforge.validate.trajectory import StepReplay, TrajectoryRun, shared_stream, trajectory_rung
from difforge.validate.verdict import Row, RungResult, Verdict

N, STEPS = 64, 4
IMAGE = Image.new("RGB", (16, 16), (90, 140, 30))
CFG = RunConfig(model="x", seed=0)
START = (torch.arange(N).view(1, N) * 7) % 97


def step(x: torch.Tensor, i: int) -> torch.Tensor:
    """The reference's step: a fixed function of the state and the step."""
    return (x * 3 + i + 1) % 97


def flipped(x: torch.Tensor, k: int) -> torch.Tensor:
    out = x.clone()
    out[0, :k] = (out[0, :k] + 50) % 97
    return out


class Side:
    """A probe whose step is the reference's with ``k`` tokens flipped; counts its replays."""

    def __init__(self, k: int = 0) -> None:
        self.k = k
        self.calls = 0

    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"tokens": flipped(step(inputs["tokens"], i), self.k)}


def run_of(side: Side) -> TrajectoryRun:
    """A free run: every step of ``side`` from START, recorded as the pipelines' step hook records it."""
    trace, x = StepTrace(), START
    for i in range(STEPS):
        y = side.forward_step(CFG, i, {"tokens": x})["tokens"]
        trace.hook(i, {"tokens": x}, {"tokens": y})
        x = y
    side.calls = 0
    return TrajectoryRun([IMAGE], trace)


def judge(dut_k: int, floor_k: int | None, shared: bool = True) -> tuple[RungResult, Side, Side | None]:
    ref, floor = Side(0), Side(floor_k) if floor_k is not None else None
    runs = [(0, run_of(Side(dut_k)), run_of(ref), run_of(floor) if floor is not None else None)]
    result = trajectory_rung(runs, "test floor", shared, StepReplay(ref, floor, {0: CFG}))
    return result, ref, floor


def row_named(result: RungResult, end: str) -> Row:
    return next(r for r in result.rows if r.subject.endswith(end))


@pytest.mark.parametrize(("dut_k", "floor_k", "verdict"), [
    (0, 0, Verdict.PASS),
    (1, 1, Verdict.PASS),  # a clean port: as many near-boundary flips as the floor
    (1, 0, Verdict.PASS),  # 4 of 256 token-steps on a zero floor: 4 / 3 = 1.33x (allowance: 3 tokens)
    (4, 1, Verdict.WARN),  # 16 over (4 + 3): 2.29x
    (12, 1, Verdict.FAIL),  # a broken step: far more flips than the floor on the same states (48 / 7 = 6.9x)
])
def test_the_path_is_judged_step_by_step(dut_k: int, floor_k: int, verdict: Verdict) -> None:
    result, _, _ = judge(dut_k, floor_k)
    row = row_named(result, "tokens step by step")
    n = STEPS * N
    dis, f_dis = dut_k * STEPS / n, floor_k * STEPS / n
    assert row.get("one-step disagreement") == pytest.approx(dis)
    assert row.get("floor one-step disagreement") == pytest.approx(f_dis)
    assert row.get("tokens / (floor + allowance)") == pytest.approx(dis / (f_dis + 3 / n))
    assert row.verdict is verdict and result.verdict is verdict


def test_a_state_the_reference_visited_is_not_recomputed() -> None:
    """The device that never left the reference's path costs no replay (its states are the reference run's)."""
    result, ref, floor = judge(0, 0)
    assert ref.calls == 0 and floor is not None and floor.calls == 0
    result, ref, _ = judge(3, 0)  # off the path after step 0: steps 1.. are replayed
    assert ref.calls == STEPS - 1


def test_final_tokens_are_reported_not_judged() -> None:
    result, _, _ = judge(12, 1)
    final = row_named(result, "final tokens")
    assert all(m.verdict is None for m in final.measurements) and "informative" in final.note


def test_on_the_reference_stream_tokens_are_only_reported() -> None:
    """The reference's CPU stream falls out of step between the sides: the tokens prove nothing there."""
    result, ref, _ = judge(40, 0, shared=False)
    assert not [r for r in result.rows if r.subject.endswith("tokens step by step")]
    assert "not judged" in row_named(result, "final tokens").note and ref.calls == 0
    assert result.verdict is Verdict.PASS  # the image rule alone (identical images)


def test_no_floor_leaves_the_tokens_unjudged() -> None:
    result, _, _ = judge(40, None)
    row = row_named(result, "tokens step by step")
    assert "no noise floor" in row.note and all(m.verdict is None for m in row.measurements)
    assert result.verdict is Verdict.WARN  # the image without a floor: at best WARN, as before


def test_shared_stream_asks_the_probe() -> None:
    class Portable:
        def portable_stream(self, cfg: Any) -> bool:
            return True

    assert shared_stream(Portable(), CFG) is True
    assert shared_stream(object(), CFG) is False


# ---- the pixels from the device's own tokens ----------------------------------------------------------
def picture(tokens: torch.Tensor, shift: int = 0) -> Image.Image:
    """A 'decode': one 2x2 patch per token, its grey level from the code (plus ``shift`` levels)."""
    grid = (tokens.reshape(8, 8).to(torch.int64) * 2 + shift).clamp(0, 255).to(torch.uint8)
    return Image.fromarray(grid.repeat_interleave(2, 0).repeat_interleave(2, 1).numpy()).convert("RGB")


class Decoding(Side):
    def __init__(self, k: int = 0, shift: int = 0) -> None:
        super().__init__(k)
        self.shift = shift

    def decode_tokens(self, cfg: RunConfig, tokens: torch.Tensor) -> list[Image.Image]:
        return [picture(tokens, self.shift)]


def decoded_run(side: Side, shift: int) -> TrajectoryRun:
    run = run_of(side)
    return TrajectoryRun([picture(run.trace.final()["tokens"], shift)], run.trace)


@pytest.mark.parametrize(("dut_shift", "verdict"), [(1, Verdict.PASS), (12, Verdict.FAIL)])
def test_the_pixels_are_judged_from_the_devices_own_tokens(dut_shift: int, verdict: Verdict) -> None:
    """The device's picture against the reference's decode of the device's final tokens: which tokens were
    drawn does not enter (the device flipped 1 token a step, the floor none); the decode path does."""
    ref, floor = Decoding(0), Decoding(0, shift=1)
    dut_run = decoded_run(Side(1), dut_shift)
    runs = [(0, dut_run, decoded_run(ref, 0), decoded_run(floor, 1))]
    result = trajectory_rung(runs, "test floor", True, StepReplay(ref, floor, {0: CFG}))
    row = row_named(result, "image 0 from the device's tokens")
    assert row.get("rmse_levels") == pytest.approx(dut_shift, rel=0.02)
    assert row.verdict is verdict and result.verdict is verdict
    end_to_end = row_named(result, "image 0")
    assert all(m.verdict is None for m in end_to_end.measurements if "rmse" in m.name)
    assert "informative" in end_to_end.note


def test_on_the_reference_stream_the_end_to_end_picture_stays_judged() -> None:
    ref, floor = Decoding(0), Decoding(0, shift=1)
    runs = [(0, decoded_run(Side(0), 1), decoded_run(ref, 0), decoded_run(floor, 1))]
    result = trajectory_rung(runs, "test floor", False, StepReplay(ref, floor, {0: CFG}))
    assert row_named(result, "image 0").get("rmse / floor") == pytest.approx(1.0)
    assert row_named(result, "image 0 from the device's tokens").verdict is Verdict.PASS
