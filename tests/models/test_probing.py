"""The op-level floor emulates a bf16/fp16 kernel on float32 kernels: equal to a clean low-precision
kernel's result where it rounds the same way, and untouched by a broken low-precision kernel."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from difforge.models.probing import LowPrecisionOnFloat32, emulated
from difforge.ops import plain_ops


class _BrokenBf16Mul(TorchFunctionMode):
    """A porting fault: every bf16 multiply is 2 % off (float32 untouched)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in (torch.Tensor.mul, torch.Tensor.__mul__, torch.mul) and isinstance(out, torch.Tensor) \
                and out.dtype == torch.bfloat16:
            return out * 1.02
        return out


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 64, generator=g).bfloat16(), torch.randn(64, generator=g).bfloat16()


def test_a_clean_kernel_equals_its_emulation() -> None:
    ops = plain_ops()
    x, w = _inputs()
    assert torch.equal(ops.rms_norm(x, w, 1e-6).float(), emulated(ops.rms_norm, torch.bfloat16, x, w, 1e-6))
    assert torch.equal(ops.swiglu(x, x).float(), emulated(ops.swiglu, torch.bfloat16, x, x))
    ref = ops.rms_norm(x.float(), w.float(), 1e-6)
    assert not torch.equal(emulated(ops.rms_norm, torch.bfloat16, x, w, 1e-6), ref)  # it does round


def test_a_broken_kernel_does_not_reach_the_emulation() -> None:
    ops = plain_ops()
    x, w = _inputs()
    clean = emulated(ops.rms_norm, torch.bfloat16, x, w, 1e-6)
    with _BrokenBf16Mul():
        broken = ops.rms_norm(x, w, 1e-6).float()
        floor = emulated(ops.rms_norm, torch.bfloat16, x, w, 1e-6)
    assert torch.equal(floor, clean)
    assert float((broken - clean).abs().max()) > 0.01


def test_mixed_and_in_place_calls() -> None:
    x = torch.randn(4, 4).bfloat16()
    with LowPrecisionOnFloat32(torch.bfloat16):
        mixed = x * torch.ones(4, 4)  # float32 involved: computed and kept in float32
        y = x.clone()
        y.add_(1)  # in place on a bf16 tensor: the original is written
        dtype = y.dtype
    assert mixed.dtype == torch.float32 and dtype == torch.bfloat16
    assert torch.equal(y, x + 1)


def test_two_low_precision_dtypes_out_and_an_asked_dtype() -> None:
    """URSA's sampler mixes its run dtype with a float16 codebook: both are emulated on float32 kernels, a
    result written through ``out=`` lands in the caller's tensor at its dtype, and ``softmax(x, dtype=float32)``
    stays float32 as asked."""
    a, b = torch.randn(3, 5).half(), torch.randn(3, 5).half()
    out = torch.empty(3, 5, dtype=torch.bfloat16)
    with LowPrecisionOnFloat32(torch.bfloat16, torch.float16):
        got = torch.add(a, b, out=out)
        probs = out.softmax(-1, dtype=torch.float32)
        mixed = out.clone().sub_(a)  # bf16 - fp16 promotes to float32, stored in bf16
        half = a * b
    assert got is out and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), (a.float() + b.float()).half().bfloat16().float(), rtol=0, atol=0)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, out.float().softmax(-1), rtol=1e-6, atol=1e-7)
    assert mixed.dtype == torch.bfloat16 and half.dtype == torch.float16
    torch.testing.assert_close(mixed.float(), (out.float() - a.float()).bfloat16().float(), rtol=0, atol=0)
