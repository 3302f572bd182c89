"""The step rung's post-network rows (issue 25): Qwen-Image-Edit's work after the transformer, teacher-forced.

Each recorded step's true-CFG combine (with its norm rescale), Euler update and unpacking before the VAE
is recomputed on every side from the reference's own outputs at that step: the device natively in bf16,
the reference in float32, the emulated floor on float32 kernels rounded like bf16.  A clean bf16 port must
PASS these rows; a fault planted after the network output (bf16/fp16 only, as ``tests/validate/faults.py``
plants them) must FAIL them while the network's own output still passes, and must never reach the
reference or the floor.  Floats are compared with tolerances; only discrete verdicts are pinned.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from difforge import engine
from difforge.config import RunConfig
from difforge.devices import CPUBackend
from difforge.models.registry import probe_for
from difforge.runtime.images import test_picture as picture
from difforge.validate.floor import InPrecision, emulate
from difforge.validate.steps import StepTrace, post_network_outputs, post_network_stage, step_rows
from difforge.validate.thresholds import RATIO_FAIL, RATIO_PASS
from difforge.validate.verdict import Row, Verdict

from . import faults

STAGES = ("guided", "latents_next", "vae_input")


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The device (bf16), the reference (float32) and the emulated floor, as validate builds them, plus the
    reference run's trace (the recorded latents every step is teacher-forced on)."""
    path = tmp_path_factory.mktemp("post") / "in.png"
    picture(64, 64).save(path)
    cfg = RunConfig(model="tiny-qwen-edit", prompt="make the sky red", device="cpu", dtype="bfloat16",
                    height=64, width=64, steps=3, seed=0, quiet=True, images=[str(path)])
    cpu = CPUBackend()
    dut = probe_for(engine.load_pipeline("tiny-qwen-edit", cpu, torch.bfloat16, cfg))
    ref = probe_for(engine.load_pipeline("tiny-qwen-edit", cpu, torch.float32, cfg))
    floor_raw = probe_for(engine.load_pipeline("tiny-qwen-edit", cpu, torch.float32, cfg))
    floor = InPrecision(floor_raw, emulate(floor_raw, dut))
    trace = StepTrace()
    engine.run_pipeline(ref.pipeline, cfg, images=[picture(64, 64)], step_hook=trace.hook)
    return {"dut": dut, "ref": ref, "floor": floor, "trace": trace, "cfg": cfg}


def _post(row: Row) -> dict[str, Any]:
    return {m.name: m for m in row.measurements if m.name.startswith("post ")}


def _rows(sides: dict[str, Any]) -> list[Row]:
    rows, series = step_rows(sides["dut"], sides["ref"], sides["cfg"], sides["trace"], floor=sides["floor"])
    assert [set(p["post_network"]) for p in series] == [set(STAGES)] * len(rows)
    return rows


def test_the_reference_replays_its_own_post_network_work(sides: dict[str, Any]) -> None:
    """Teacher-forced on its own outputs, the reference's stages are its run's: the combine is its velocity
    and the Euler step lands on the latents the run recorded next (a harness self-check)."""
    ref, cfg, trace = sides["ref"], sides["cfg"], sides["trace"]
    for i, inputs in enumerate(trace.inputs):
        out = ref.forward_step(cfg, i, inputs)
        assert {"noise_pred", "cond_pred", "uncond_pred"} <= set(out)
        post = ref.post_network_step(cfg, i, inputs, out)
        assert set(post) == set(STAGES)
        torch.testing.assert_close(post["guided"], out["noise_pred"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(post["latents_next"], trace.outputs[i]["latents"], rtol=1e-5, atol=1e-6)
        assert post["vae_input"].shape[:3] == (1, 4, 1) and post["vae_input"].shape[-2:] == (8, 8)


def test_a_clean_bf16_port_passes_every_post_network_row(sides: dict[str, Any]) -> None:
    rows = _rows(sides)
    for row in rows:
        post = _post(row)
        ratios = {name: m for name, m in post.items() if name.endswith("rel_l2 / floor")}
        assert len(ratios) == len(STAGES)
        for name, m in ratios.items():
            assert m.verdict is Verdict.PASS, (row.subject, name, m.value)
            assert 0.0 <= m.value <= RATIO_PASS, (row.subject, name, m.value)
        # rounding costs the device about what it costs the floor (the unpacking of the tiny model, mean 0
        # and std 1, is exact on both sides: 0 over the floor's absolute allowance)
        for stage in ("guided", "latents_next"):
            assert ratios[f"post {stage} rel_l2 / floor"].value > 0.5
        assert post_network_stage(row) is None


def test_the_branches_are_shown_not_judged(sides: dict[str, Any]) -> None:
    """The true-CFG branches sit above the velocity's floor ratio on a clean port: informative only."""
    for row in _rows(sides):
        branch = [m for m in row.measurements if m.name.startswith(("cond_pred", "uncond_pred"))]
        assert branch and all(m.verdict is None for m in branch)


@pytest.mark.parametrize(("fault", "stage"), [("cfg_sub_swap", "guided"), ("euler_step_scale", "latents_next"),
                                              ("unpack_transpose", "vae_input")])
def test_a_fault_after_the_network_fails_its_stage(sides: dict[str, Any], fault: str, stage: str) -> None:
    """The fault is active around the whole comparison, as in a faulted process: it fires in the device's
    bf16 stage only, its stage FAILs, and the reference and floor sides stay bit-identical to a clean call."""
    dut, ref, floor, cfg, trace = sides["dut"], sides["ref"], sides["floor"], sides["cfg"], sides["trace"]
    inputs = trace.inputs[1]
    teacher = ref.forward_step(cfg, 1, inputs)
    clean_d, clean_r, clean_f = post_network_outputs(dut, ref, floor, cfg, 1, inputs, teacher)
    planted = faults.get(fault)
    assert planted is not None
    with planted:
        d, r, f = post_network_outputs(dut, ref, floor, cfg, 1, inputs, teacher)
    assert planted.fired > 0
    assert f is not None
    for key in STAGES:
        assert torch.equal(r[key], clean_r[key]) and torch.equal(f[key], clean_f[key])  # never reached
        assert torch.equal(d[key], clean_d[key]) is (key != stage)  # only its own stage changed
    with planted:
        rows = _rows(sides)
    # step 0 moves the latents furthest (sigma 1 -> 0.58); the last Euler step (sigma 0.02 -> 0) moves them by
    # 1 % of their norm, so a 10 % error in it stays inside bf16 rounding: only the first step is pinned
    first = _post(rows[0])[f"post {stage} rel_l2 / floor"]
    assert first.verdict is Verdict.FAIL and first.value > RATIO_FAIL, first.value
    assert rows[0].verdict is Verdict.FAIL and post_network_stage(rows[0]) == stage
    for row in rows:
        post = _post(row)
        others = [m for name, m in post.items() if name.endswith("/ floor") and not name.startswith(f"post {stage}")]
        assert all(m.verdict is Verdict.PASS for m in others), [(m.name, m.value) for m in others]


def test_a_golden_reference_without_the_stages_adds_no_rows(sides: dict[str, Any]) -> None:
    """A reference that cannot run the stages (a golden bundle's recording) leaves them out: no row is
    judged on one side's numbers alone."""

    class Recording:
        dtype = torch.float32

        def __init__(self, probe: Any) -> None:
            self._probe = probe

        def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {"noise_pred": self._probe.forward_step(cfg, i, inputs)["noise_pred"]}

    rows, series = step_rows(sides["dut"], Recording(sides["ref"]), sides["cfg"], sides["trace"],
                             floor=sides["floor"])
    assert rows and all(not _post(r) for r in rows) and all("post_network" not in p for p in series)

