"""bf16 attention runs under any ATEN_CPU_CAPABILITY, also on AMX CPUs (devices.cpu.fused_sdpa_low_precision_ok)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import torch
from difforge.ops.attention import sdpa_attention
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 64, 4, 32, generator=g) for _ in range(3))
ref = sdpa_attention(q, k, v)
out = sdpa_attention(*(t.bfloat16() for t in (q, k, v))).float()
err = float((out - ref).abs().max())
assert err < 0.05, err
print("ok", err)
"""


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_bf16_attention_runs_under_a_lowered_kernel_level(capability: str) -> None:
    """torch's fused bf16 kernel raises on an AMX host whose dispatch level is lowered; ours falls back to
    the math kernel there (and on other hosts the fused kernel runs).  A fresh process: the level is read
    once, at torch's start."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-2000:]
