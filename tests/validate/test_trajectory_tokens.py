"""The trajectory rung's final-token rule (issue 25): judged on a shared stream against the floor.

A clean bf16 tiny-ursa image sits at PSNR ~14 dB from float32, so the image rule cannot tell a diverged
sample; on the shared Philox stream the device's tokens may differ from the reference's at most 2x (PASS)
/ 3x (WARN) as often as the floor's do, plus a near-boundary allowance.  These tests build the runs by
hand (identical images, so only the token rule decides).
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from difforge.validate.steps import StepTrace
from difforge.validate.trajectory import TrajectoryRun, shared_stream, trajectory_rung
from difforge.validate.verdict import Verdict

N = 256
IMAGE = Image.new("RGB", (16, 16), (90, 140, 30))


def _run(tokens: torch.Tensor) -> TrajectoryRun:
    trace = StepTrace()
    trace.hook(0, {"tokens": tokens}, {"tokens": tokens})
    return TrajectoryRun([IMAGE], trace)


def _flip(tokens: torch.Tensor, k: int) -> torch.Tensor:
    out = tokens.clone()
    out[0, :k] += 1
    return out


REF = torch.arange(N).view(1, N) % 97


def _tokens_row(result: object) -> object:
    return next(r for r in result.rows if r.subject.endswith("final tokens"))  # type: ignore[attr-defined]


@pytest.mark.parametrize(("dut_flips", "floor_flips", "verdict"), [
    (0, 0, Verdict.PASS),
    (20, 16, Verdict.PASS),  # a clean port: about as many differ as on the floor
    (5, 0, Verdict.PASS),  # within the allowance on a floor that matched exactly
    (60, 16, Verdict.WARN),  # 60/256 over (16/256 + 0.02): 2.84x
    (200, 16, Verdict.FAIL),  # a diverged sample
])
def test_final_tokens_are_judged_against_the_floor(dut_flips: int, floor_flips: int, verdict: Verdict) -> None:
    result = trajectory_rung([(0, _run(_flip(REF, dut_flips)), _run(REF), _run(_flip(REF, floor_flips)))],
                             "test floor", shared=True)
    row = _tokens_row(result)
    assert row.verdict is verdict  # type: ignore[attr-defined]
    assert result.verdict is verdict
    assert "final tokens" in result.summary


def test_on_the_reference_stream_tokens_are_only_reported() -> None:
    """The reference's CPU stream falls out of step between the sides: the tokens prove nothing there."""
    result = trajectory_rung([(0, _run(_flip(REF, 200)), _run(REF), _run(REF))], "test floor", shared=False)
    row = _tokens_row(result)
    assert row.verdict is Verdict.PASS and "not judged" in row.note  # type: ignore[attr-defined]
    assert all(m.verdict is None for m in row.measurements)  # type: ignore[attr-defined]


def test_no_floor_leaves_the_tokens_unjudged() -> None:
    result = trajectory_rung([(0, _run(_flip(REF, 200)), _run(REF), None)], "none", shared=True)
    row = _tokens_row(result)
    assert "no noise floor" in row.note  # type: ignore[attr-defined]
    assert result.verdict is Verdict.WARN  # the image without a floor: at best WARN, as before


def test_shared_stream_asks_the_probe() -> None:
    class Portable:
        def portable_stream(self, cfg: object) -> bool:
            return True

    assert shared_stream(Portable(), object()) is True  # type: ignore[arg-type]
    assert shared_stream(object(), object()) is False  # type: ignore[arg-type]
