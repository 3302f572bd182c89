"""The kernels compile for sm_90 (the H200 the device script runs on), and the PTX holds what their
exactness claims rest on.  The interpreter runs the Python of a kernel, not its compiled form: this is
the check, without a GPU, that the compiled form exists and rounds as the docstrings say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HAVE_TRITON

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed (it has wheels for Linux only)")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ptx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, int]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    done = subprocess.run([sys.executable, "-m", "tests.ops.triton.compile_sm90"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_kernel_compiles_to_a_cubin(ptx: dict[str, dict[str, int]]) -> None:
    assert set(ptx) == {"rms_norm", "swiglu", "rotary", "inverse_cdf_logits", "metric_rate", "uniform"}
    assert all(counts["cubin_bytes"] > 0 for counts in ptx.values())


def test_no_multiply_add_is_contracted(ptx: dict[str, dict[str, int]]) -> None:
    """Every float32 multiply/add/sub of rotary and rms_norm is an explicitly rounded ``.rn`` op."""
    for name in ("rotary", "rms_norm"):  # (metric_rate holds libdevice exp, whose range reduction uses fma)
        ops = ptx[name]
        assert not any(op.startswith("fma") for op in ops), ops
        assert ops.get("mul.rn.f32", 0) > 0 and not any(op in ops for op in ("mul.f32", "add.f32", "sub.f32")), ops


def test_swiglu_divides_ieee_and_takes_libdevice_exp(ptx: dict[str, dict[str, int]]) -> None:
    ops = ptx["swiglu"]
    assert ops.get("div.rn.f32", 0) > 0 and not any(op.startswith("div.full") or op.startswith("div.approx") for op in ops)
    # libdevice's expf: a range reduction with fma around ex2 (Triton's own exp is a bare ex2 of x*log2(e))
    assert ops.get("ex2.approx.ftz.f32", 0) > 0 and any(op.startswith("fma") for op in ops), ops
    assert ops.get("cvt.rn.bf16.f32", 0) > 0  # round-to-nearest-even into bfloat16


def test_the_sampler_multiplies_32_bit_words(ptx: dict[str, dict[str, int]]) -> None:
    assert ptx["uniform"].get("mul.hi.u32", 0) >= 20  # two products a round, ten rounds
    assert ptx["inverse_cdf_logits"].get("mul.hi.u32", 0) >= 18  # counter word 0 is 0 there: round one folds c0's
    assert ptx["inverse_cdf_logits"].get("div.rn.f32", 0) > 0
