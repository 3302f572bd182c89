"""Smoke test of benchmarks/bench_qwen_edit.py --tiny: the JSON has its fields; no speed threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import bench_qwen_edit


def test_tiny_benchmark_writes_complete_json(tmp_path: Path) -> None:
    out = tmp_path / "qwen.json"
    bench_qwen_edit.main(["--tiny", "--steps", "2", "--warmup", "1", "--json", str(out)])
    data = json.loads(out.read_text())
    names = [r["name"] for r in data["results"]]
    assert names == [bench_qwen_edit.REFERENCE, bench_qwen_edit.PIPELINE, "difforge, two calls", "difforge default"]
    for r in data["results"]:
        assert r["ms_per_step"] > 0 and r["tokens_per_forward"] == data["tokens_per_forward"]
        assert r["flops_per_step"] == data["flops_per_step"] > 0 and r["tflops"] > 0
    assert [r["forwards_per_step"] for r in data["results"]] == [2, 2, 2, 1]
    pipeline = data["results"][1]  # diffusers' own call on the same transformer: steps timed, its notes say how
    assert "QwenImageEditPlusPipeline.__call__" in pipeline["notes"] and pipeline["ms_min"] > 0
    assert all(v > 0 for v in data["ratios_vs_reference"].values())
    shares = data["step_shares"]  # the instrumented run of "difforge default": true CFG's combine, the Euler step
    assert shares["cfg_ms_per_step"] > 0 and 0 < shares["cfg_share"] < 1 and 0 < shares["scheduler_share"] < 1
    # Meta count of the real model: ~40.9 GB in bf16, ~20.4 GB with fp8 Linear weights (spec §3.3).
    full = data["weight_bytes"]["meta_bf16_vs_fp8"]["full"]
    assert full["params"] == 20_430_401_088
    assert 20.3e9 < full["fp8_linear_weights"] < 20.6e9 and full["bf16"] == 2 * full["params"]
    assert data["flops_formula_spec_5_2"] > 0 and "FlopCounterMode" in data["flops_method"]
    e2e = data["end_to_end"]
    assert e2e["load_s"] > 0 and e2e["first_image_s"] > 0 and e2e["image_size"] == [64, 64]


def test_random_transformer_is_built_on_the_target_device_with_finite_outputs() -> None:
    model = bench_qwen_edit.build_transformer(bench_qwen_edit.TINY_CONFIG, torch.device("cpu"), torch.float32)
    assert all(not p.is_meta for p in model.parameters())
    p = bench_qwen_edit.make_inputs(bench_qwen_edit.SIZES["tiny"], "plus", torch.device("cpu"), torch.float32)
    with torch.no_grad():
        out = model(hidden_states=torch.cat([p.noise, p.image_latents], 1), encoder_hidden_states=p.prompt_embeds,
                    timestep=torch.tensor([0.5]), img_shapes=p.img_shapes, return_dict=False)[0]
    assert torch.isfinite(out).all() and out.abs().max() > 0
    assert bench_qwen_edit.to_fp8_storage(model) > 0
    assert any(p.dtype == torch.float8_e4m3fn for p in model.parameters())


def test_fp8_rows_stand_beside_the_bf16_rows(tmp_path: Path) -> None:
    """``--fp8`` adds the fp8-storage default after the full-precision rows instead of replacing them."""
    out = tmp_path / "qwen.json"
    bench_qwen_edit.main(["--tiny", "--steps", "1", "--warmup", "1", "--fp8", "--no-pipeline", "--json", str(out)])
    data = json.loads(out.read_text())
    rows = {r["name"]: r for r in data["results"]}
    default = bench_qwen_edit.DEFAULT
    assert list(rows) == [bench_qwen_edit.REFERENCE, "difforge, two calls", default, f"{default}, fp8"]
    assert "fp8" not in rows[default]["notes"] and "fp8 e4m3fn weight storage" in rows[f"{default}, fp8"]["notes"]
    weights = data["weight_bytes"]["this_size"]
    assert weights["fp8_linears"] > 0 and weights["fp8_on_device"] < weights["float32_on_device"]
    assert set(data["ratios_vs_reference"]) == set(rows)


def test_the_pipeline_row_times_diffusers_own_call_step_by_step() -> None:
    """Two transformer calls a step (true CFG) for warm-up + timed steps, one time per timed step; the module
    constant the bench sets for the call is restored."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    from difforge.devices import CPUBackend

    size = bench_qwen_edit.SIZES["tiny"]
    model = bench_qwen_edit.build_transformer(bench_qwen_edit.TINY_CONFIG, torch.device("cpu"), torch.float32)
    p = bench_qwen_edit.make_inputs(size, "plus", torch.device("cpu"), torch.float32)
    calls = []
    model.register_forward_hook(lambda module, args, kwargs_out: calls.append(1))
    before = plus.VAE_IMAGE_SIZE
    times, _ = bench_qwen_edit.time_diffusers_pipeline(model, size, p, CPUBackend(), warmup=1, steps=2)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert len(calls) == 2 * (1 + 2)
    assert before == plus.VAE_IMAGE_SIZE


def test_a_run_stopped_midway_leaves_the_rows_it_finished(tmp_path: Path, monkeypatch) -> None:
    """Each finished row is written at once (``partial``), so a step stopped at its time cap keeps its rows."""
    out = tmp_path / "qwen.json"

    def stopped(*a, **k):
        raise KeyboardInterrupt  # what a timeout's signal does to the run

    monkeypatch.setattr(bench_qwen_edit, "time_shares", stopped)  # after the first four rows
    with pytest.raises(KeyboardInterrupt):
        bench_qwen_edit.main(["--tiny", "--steps", "1", "--warmup", "1", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["partial"] and data["benchmark"] == "qwen_edit_denoise"
    assert [r["name"] for r in data["results"]] == [bench_qwen_edit.REFERENCE, bench_qwen_edit.PIPELINE,
                                                    "difforge, two calls", "difforge default"]
