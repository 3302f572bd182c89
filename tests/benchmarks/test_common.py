"""Benchmark plumbing: MFU uses the sourced, dtype-aware peak table that `difforge validate` uses."""

from __future__ import annotations

import pytest
import torch
from benchmarks.common import make_result, peak_tflops


def test_peak_comes_from_the_validate_table(monkeypatch: pytest.MonkeyPatch) -> None:
    assert peak_tflops(torch.device("cpu"), torch.bfloat16) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    cuda = torch.device("cuda", 0)
    assert peak_tflops(cuda, torch.bfloat16) == pytest.approx(989.4)
    assert peak_tflops(cuda, torch.float32) == pytest.approx(66.9)  # fp32 is not the tensor-core peak
    r = make_result("x", [10.0, 12.0, 11.0], cuda, forwards=1, tokens=4, flops=9.894e12, dtype=torch.bfloat16)
    assert r.ms_per_step == 11.0 and r.tflops == pytest.approx(899.45, rel=1e-3)
    assert r.mfu == pytest.approx(r.tflops / 989.4)
