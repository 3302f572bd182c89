"""The sampler-step benchmark D2's device script calls (difforge.models.ursa.step_bench), at a tiny size."""

from __future__ import annotations

import json

import pytest
import torch

from difforge.models.ursa import step_bench


def test_time_step_reports_every_part_on_the_cpu() -> None:
    r = step_bench.time_step("cpu", torch.float32, tokens=16, codebook=64, repeats=2)
    assert (r["device"], r["dtype"], r["tokens"], r["codebook"], r["fused"]) == ("cpu", "float32", 16, 64, False)
    for part in ("step_ms", "x1_draw_ms", "jump_uniform_ms", "jump_draw_ms"):
        assert r[part] > 0
    assert r["step_ms"] >= r["jump_uniform_ms"]
    assert r["ops_per_step"] > 100  # ten Philox rounds of int64 ops per draw, three draws


def test_main_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    step_bench.main(["--device", "cpu", "--dtype", "float32", "--tokens", "8", "--codebook", "32", "--repeats", "1"])
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == 8 and out["fused"] is False
