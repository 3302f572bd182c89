"""The step rung's URSA sampler check (issue 25): the scheduler's step judged on its own, teacher-forced.

Every side gets the reference's float32 logits, the same Philox draws and the reference's targets; the
device computes natively in bf16, the reference and the emulated floor on float32 kernels.  A clean bf16
port must PASS it; a fault planted in the sampler's low-precision math (bf16/fp16 only, as
``tests/validate/faults.py`` plants them) must FAIL it, and the fault must not reach the reference or the
floor.  Floats are compared with tolerances; only discrete verdicts are pinned.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from difforge import engine
from difforge.config import RunConfig
from difforge.devices import CPUBackend
from difforge.models.registry import probe_for
from difforge.validate.floor import InPrecision, emulate
from difforge.validate.steps import (
    StepTrace,
    sampler_measurements,
    sampler_outputs,
    step_rows,
    token_disagreement_ratio,
)
from difforge.validate.thresholds import RATIO_PASS, token_allowance
from difforge.validate.verdict import Row, Verdict

from . import faults

CFG = RunConfig(model="tiny-ursa", prompt="a red circle", device="cpu", dtype="bfloat16", height=64, width=64,
                steps=4, seed=3, quiet=True)


@pytest.fixture(scope="module")
def sides() -> dict[str, Any]:
    """The device (bf16), the reference (float32) and the emulated floor, as validate builds them, plus the
    reference run's trace (the recorded tokens every step is teacher-forced on)."""
    cpu = CPUBackend()
    dut = probe_for(engine.load_pipeline("tiny-ursa", cpu, torch.bfloat16))
    ref = probe_for(engine.load_pipeline("tiny-ursa", cpu, torch.float32))
    floor_raw = probe_for(engine.load_pipeline("tiny-ursa", cpu, torch.float32))
    floor = InPrecision(floor_raw, emulate(floor_raw, dut))
    trace = StepTrace()
    engine.run_pipeline(ref.pipeline, CFG, step_hook=trace.hook)
    return {"dut": dut, "ref": ref, "floor": floor, "trace": trace}


def _sampler(row: Row) -> dict[str, Any]:
    return {m.name: m for m in row.measurements if m.name.startswith("sampler")}


def _judged(rows: list[Row]) -> list[Verdict]:
    return [m.verdict for r in rows for m in _sampler(r).values() if m.verdict is not None]


def test_a_clean_bf16_sampler_passes(sides: dict[str, Any]) -> None:
    rows, series = step_rows(sides["dut"], sides["ref"], CFG, sides["trace"], floor=sides["floor"])
    assert len(rows) == CFG.steps
    verdicts = _judged(rows)
    # per middle step: jump_prob, rate and tokens judged; the last step: tokens only; step 0 moves nothing
    assert len(verdicts) >= 3 * (CFG.steps - 1)
    assert set(verdicts) == {Verdict.PASS}, [(r.subject, {k: m.value for k, m in _sampler(r).items()}) for r in rows]
    middle = [p["sampler"] for p in series[1:-1]]
    for info in middle:  # the device costs what the floor costs, not 0 and not much more
        for name in ("jump_prob", "rate"):
            assert info[name]["cosine"] > 0.999
            assert info[name]["ratio"] <= RATIO_PASS


def test_step_zero_of_the_metric_path_moves_nothing_on_any_side(sides: dict[str, Any]) -> None:
    inputs = sides["trace"].inputs[0]
    logits = sides["ref"].forward_step(CFG, 0, inputs)["logits"]
    d, r, f = sampler_outputs(sides["dut"], sides["ref"], sides["floor"], CFG, 0, inputs, logits)
    for out in (d, r, f):
        assert out is not None
        assert float(out["jump_prob"].abs().max()) == 0.0
        assert torch.equal(out["tokens"], inputs["tokens"])


@pytest.mark.parametrize("name", ["exp_base2", "softmax_dim", "matmul_half_k", "normalize_dim"])
def test_a_fault_in_the_sampler_math_fails_and_never_reaches_the_reference_or_floor(
        sides: dict[str, Any], name: str) -> None:
    dut, ref, floor, trace = sides["dut"], sides["ref"], sides["floor"], sides["trace"]
    i = 1
    inputs = trace.inputs[i]
    logits = ref.forward_step(CFG, i, inputs)["logits"]
    clean = sampler_outputs(dut, ref, floor, CFG, i, inputs, logits)
    fault = faults.get(name)
    assert fault is not None
    row = Row("step 1")
    with fault:
        broken = sampler_outputs(dut, ref, floor, CFG, i, inputs, logits)
        sampler_measurements(row, {}, dut, ref, floor, CFG, i, inputs, logits)
    assert fault.fired > 0
    for side in (1, 2):  # reference and floor: the low-precision work runs on float32 kernels, untouched
        assert torch.equal(broken[side]["jump_prob"], clean[side]["jump_prob"])  # type: ignore[index]
        assert torch.equal(broken[side]["tokens"], clean[side]["tokens"])  # type: ignore[index]
    assert not torch.equal(broken[0]["jump_prob"], clean[0]["jump_prob"])
    assert row.settle() is Verdict.FAIL
    failed = [m.name for m in row.measurements if m.verdict is Verdict.FAIL]
    assert any(n.startswith("sampler jump_prob") or n.startswith("sampler rate") for n in failed), failed


def test_a_golden_reference_without_a_sampler_adds_no_rows(sides: dict[str, Any]) -> None:
    class Recorded:  # a bundle's reference: it can replay recorded outputs, not run a sampler
        dtype = torch.float32

        def forward_step(self, cfg: RunConfig, i: int, inputs: dict) -> dict:
            return sides["ref"].forward_step(cfg, i, inputs)

    row = Row("step 1")
    inputs = sides["trace"].inputs[1]
    sampler_measurements(row, {}, sides["dut"], Recorded(), None, CFG, 1, inputs,
                         sides["ref"].forward_step(CFG, 1, inputs)["logits"])
    assert row.measurements == []


@pytest.mark.parametrize(("dut", "floor", "n", "verdict"), [
    (0.0, 0.0, 16, Verdict.PASS),
    (6 / 16, 0.0, 16, Verdict.PASS),  # six tokens of 16 on a zero floor: 2x the 3-token allowance
    (10 / 16, 0.0, 16, Verdict.FAIL),
    (0.05, 0.04, 1024, Verdict.PASS),
    (0.30, 0.04, 1024, Verdict.FAIL),
    (0.0125, 0.0, 10_000, Verdict.WARN),  # a large grid: the 0.5 % share is the allowance (2.5x)
])
def test_the_token_rule_is_finite_on_a_zero_floor(dut: float, floor: float, n: int, verdict: Verdict) -> None:
    from difforge.validate.trajectory import judge_ratio

    ratio = token_disagreement_ratio(dut, floor, n)
    assert ratio == ratio and ratio != float("inf")
    assert token_allowance(n) == max(0.005, 3 / n)
    assert judge_ratio(ratio) is verdict
    assert token_disagreement_ratio(float("nan"), 0.0, n) != token_disagreement_ratio(float("nan"), 0.0, n)


def test_a_clean_validation_on_the_shared_stream_judges_the_path_and_its_pixels(tmp_path: Any) -> None:
    """tiny-ursa bf16 on the Philox stream (the accelerators' default), seed 2: when measured, its floor drew
    exactly the reference's final tokens while the clean device differed in 4 of 16, so the end-to-end picture
    sat at 46x the floor's (zero) error.  That ratio is reported; the tokens step by step and the pixels from
    the device's own tokens are judged, and PASS."""
    from difforge.validate import ValidateOptions

    from .ladder_run import run_validation

    result = run_validation(ValidateOptions(model="tiny-ursa", device="cpu", dtype="bfloat16", quick=True, seed=2,
                                            height=64, width=64, rounds=1, warmup=0, fast=["philox-rng"],
                                            quiet=True, out=tmp_path / "out"))
    traj = result.rungs["trajectory"]
    assert traj.verdict is Verdict.PASS and result.rungs["step"].verdict is Verdict.PASS, traj.summary
    subjects = {r.subject: r for r in traj.rows}
    judged = {s for s, r in subjects.items() if any(m.verdict is not None for m in r.measurements)}
    assert {"tokens step by step", "image 0 from the device's tokens"} <= judged
    assert "image 0" not in judged
