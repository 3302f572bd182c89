"""The CUDA Triton kernels against the plain PyTorch formulas, run on CPU tensors by Triton's interpreter.

Claims pinned here (see difforge.ops.triton_kernels): rotary bitwise the plain path in every dtype;
swiglu bitwise the plain formula once ``exp`` is the same function (the interpreter's numpy exp here,
libdevice's expf - CUDA's own - on a GPU), so within one ulp of the output dtype of torch's CPU formula;
rms_norm in the plain order with the sum of squares reduced in another order (approximate).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
import torch

from difforge.ops import activation, norm, rotary

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of ``x``'s dtype at each value of ``x`` (as float32)."""
    f = x.float().abs()
    return (torch.nextafter(x, torch.full_like(x, float("inf"))).float() - x.float()).abs().maximum(
        torch.finfo(x.dtype).tiny * torch.ones_like(f)
    )


# ------------------------------------------------------------------------------------------------- rotary
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_is_bitwise_the_plain_path(tk: ModuleType, dtype: torch.dtype) -> None:
    b, seq, heads, d = 2, 7, 3, 24  # d/2 = 12: not a power of two, so the column mask is exercised
    x = randn(b, seq, heads, d, dtype=dtype, scale=3.0)
    angle = randn(seq, d // 2, seed=1) * 10
    table = rotary.rope_table(angle.cos().to(dtype), angle.sin().to(dtype))
    got, want = tk.apply_rotary(x, table), rotary.apply_rotary(x, table)
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got, want)


def test_rotary_kernel_keeps_products_unfused(tk: ModuleType) -> None:
    """float32: a fused multiply-add would differ from the two rounded products in some elements."""
    x = randn(1, 64, 4, 64, scale=5.0, seed=3)
    angle = randn(64, 32, seed=4) * 50
    table = rotary.rope_table(angle.cos(), angle.sin())
    got = tk.apply_rotary(x, table)
    assert torch.equal(got, rotary.apply_rotary(x, table))
    x1, x2 = x.double().chunk(2, -1)
    cos, sin = (t.double() for t in table)
    fma = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2).float()
    assert not torch.equal(got, fma)  # the order is observable in float32, so it is pinned


def test_rotary_other_shapes_take_the_plain_path(tk: ModuleType) -> None:
    x = randn(5, 8)
    table = (randn(5, 4), randn(5, 4))
    assert torch.equal(tk.apply_rotary(x, table), rotary.apply_rotary(x, table))


# ------------------------------------------------------------------------------------------------- swiglu
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_is_the_plain_formula_with_the_same_exp(tk: ModuleType, dtype: torch.dtype) -> None:
    g, u = randn(33, 70, dtype=dtype, scale=4.0, seed=5), randn(33, 70, dtype=dtype, seed=6)
    got = tk.swiglu(g, u)
    gf, uf = g.float(), u.float()
    same_exp = torch.from_numpy(np.exp(-gf.numpy()))  # the interpreter's exp (on a GPU: libdevice expf)
    assert torch.equal(got, (gf * uf / (1 + same_exp)).to(dtype))
    plain = activation.swiglu(g, u)
    assert got.dtype == plain.dtype == dtype
    # torch's CPU exp may differ from numpy's by an ulp: a few float32 ulps after the division, at most one
    # ulp of a half dtype after its rounding
    bound = (4 if dtype == torch.float32 else 1) * ulp(plain)
    assert bool(((got.float() - plain.float()).abs() <= bound).all())


def test_swiglu_divides_with_ieee_rounding(tk: ModuleType) -> None:
    """An approximate division (Triton's plain ``/`` on a GPU) would not be the formula's."""
    g, u = randn(4096, scale=6.0, seed=7), randn(4096, seed=8)
    got = tk.swiglu(g, u)
    den = 1 + torch.from_numpy(np.exp(-g.numpy()))
    assert torch.equal(got, g * u / den)
    assert not torch.equal(got, (g * u) * (1 / den))  # reciprocal-then-multiply is observably different


# ----------------------------------------------------------------------------------------------- rms_norm
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_the_plain_path_to_one_ulp(tk: ModuleType, dtype: torch.dtype) -> None:
    x, w = randn(3, 50, 96, dtype=dtype, scale=3.0, seed=9), randn(96, dtype=dtype, seed=10)
    got, plain = tk.rms_norm(x, w, 1e-6), norm.rms_norm(x, w, 1e-6)
    assert got.dtype == plain.dtype and got.shape == plain.shape
    # the factor may move one ulp of the activation dtype, which the weight multiply scales by up to |w|
    bound = 2 * ulp(plain) if dtype != torch.float32 else plain.abs() * 4e-7 + 1e-7
    assert bool(((got.float() - plain.float()).abs() <= bound).all())
    if dtype != torch.float32:  # the cast factor differs only where the float32 one sat at a rounding boundary
        assert (got == plain).float().mean() > 0.97


def test_rms_norm_casts_the_factor_before_multiplying(tk: ModuleType) -> None:
    x, w = randn(64, 128, dtype=torch.bfloat16, scale=3.0, seed=11), randn(128, dtype=torch.bfloat16, seed=12)
    got = tk.rms_norm(x, w, 1e-6)
    upcast = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * w
    plain = norm.rms_norm(x, w, 1e-6)
    assert (got == plain).float().mean() > (got == upcast).float().mean() + 0.05


def test_rms_norm_promotes_like_torch(tk: ModuleType) -> None:
    x, w = randn(4, 40, dtype=torch.bfloat16, seed=13), randn(40, seed=14)  # float32 weight
    got, plain = tk.rms_norm(x, w, 1e-5), norm.rms_norm(x, w, 1e-5)
    assert got.dtype == plain.dtype == torch.float32
    torch.testing.assert_close(got, plain, rtol=2**-7, atol=1e-6)


def test_a_compiled_region_traces_the_plain_formulas(tk: ModuleType) -> None:
    """Under torch.compile the ops trace the plain path (Inductor fuses it); the kernel here differs from it in
    float32 (the interpreter's exp), so the traced result shows which one ran."""
    g, u = randn(64, 96, scale=6.0, seed=15), randn(64, 96, seed=16)
    x, w = randn(8, 96, scale=3.0, seed=17), randn(96, seed=18)
    plain = activation.swiglu(g, u)
    assert not torch.equal(tk.swiglu(g, u), plain)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(tk.swiglu, backend="eager", fullgraph=True)(g, u), plain)
    assert torch.equal(torch.compile(tk.rms_norm, backend="eager", fullgraph=True)(x, w, 1e-6), norm.rms_norm(x, w, 1e-6))
    torch._dynamo.reset()
