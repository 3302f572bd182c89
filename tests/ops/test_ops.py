"""Portable ops: plain maths against hand formulas, OpSet selection, overrides, NPU paths via the stand-in."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from difforge.devices import CPUBackend, CUDABackend, NPUBackend
from difforge.ops import (
    OpSet,
    apply_rotary,
    rms_norm,
    rope_table,
    sdpa_attention,
    select_ops,
    swiglu,
    swiglu_packed,
)
from difforge.runtime.record import RunRecord

G = torch.Generator().manual_seed(0)


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=G).to(dtype)


def test_rms_norm_matches_formula_in_float32() -> None:
    x, w = randn(3, 5, 16), randn(16)
    want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(rms_norm(x, w, 1e-6), want, rtol=1e-6, atol=1e-6)


def test_rms_norm_casts_rsqrt_factor_before_multiplying() -> None:
    x, w = randn(64, 128, dtype=torch.bfloat16) * 3, randn(128, dtype=torch.bfloat16)
    factor = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(torch.bfloat16)
    assert torch.equal(rms_norm(x, w, 1e-6), (x * factor) * w)
    upcast = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * w
    assert not torch.equal(rms_norm(x, w, 1e-6), upcast)  # the order is observable, so it is pinned


def test_swiglu_is_float32_expression_cast_back() -> None:
    g, u = randn(32, 256, dtype=torch.bfloat16) * 4, randn(32, 256, dtype=torch.bfloat16)
    want = (g.float() * u.float() / (1 + torch.exp(-g.float()))).to(torch.bfloat16)
    assert torch.equal(swiglu(g, u), want)
    assert torch.equal(swiglu_packed(torch.cat([g, u], -1)), want)
    torch.testing.assert_close(swiglu(g.float(), u.float()), F.silu(g.float()) * u.float(), rtol=1e-5, atol=1e-6)


def test_rotary_rotates_pairs_i_and_i_plus_half_interleaved() -> None:
    b, seq, h, d = 2, 5, 3, 8
    x, angle = randn(b, seq, h, d), randn(seq, d // 2)
    out = apply_rotary(x, rope_table(angle.cos(), angle.sin()))
    for i in range(d // 2):
        c, s = angle[:, i].cos()[None, :, None], angle[:, i].sin()[None, :, None]
        x1, x2 = x[..., i], x[..., i + d // 2]
        torch.testing.assert_close(out[..., 2 * i], x1 * c - x2 * s)
        torch.testing.assert_close(out[..., 2 * i + 1], x1 * s + x2 * c)


def test_rotary_half_precision_rounds_once() -> None:
    x, angle = randn(1, 4, 2, 8, dtype=torch.bfloat16), randn(4, 4)
    cos, sin = angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)
    out = apply_rotary(x, rope_table(cos, sin))
    x1, x2 = x.float().chunk(2, -1)
    a = (x1 * cos.float()[:, None] - x2 * sin.float()[:, None]).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16 and torch.equal(out[..., 0::2], a)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Per head, explicit softmax; query head j uses kv head j // (heads / kv_heads)."""
    heads, kv = q.shape[2], k.shape[2]
    out = torch.empty_like(q)
    for j in range(heads):
        kj, vj = k[:, :, j // (heads // kv)], v[:, :, j // (heads // kv)]
        scores = q[:, :, j] @ kj.transpose(1, 2) / math.sqrt(q.shape[-1])
        out[:, :, j] = scores.softmax(-1) @ vj
    return out


def test_attention_bidirectional_gqa_matches_naive() -> None:
    q, k, v = randn(2, 7, 4, 16), randn(2, 7, 2, 16), randn(2, 7, 2, 16)
    torch.testing.assert_close(sdpa_attention(q, k, v), naive_attention(q, k, v), rtol=1e-5, atol=1e-5)
    # bidirectional: the first query sees a change in the last key
    k2 = k.clone()
    k2[:, -1] += 1
    assert not torch.allclose(sdpa_attention(q, k2, v)[:, 0], sdpa_attention(q, k, v)[:, 0])


def test_select_ops_cpu_is_plain_and_recorded() -> None:
    ops = select_ops(CPUBackend())
    assert ops.rms_norm is rms_norm and ops.swiglu is swiglu and ops.swiglu_packed is None
    assert ops.index_dtype == torch.int64
    record = RunRecord("generate")
    ops.record_to(record)
    chosen = {a.what: a for a in record.adaptations}
    assert chosen["attention"].choice == "sdpa" and chosen["rms_norm"].exact


def test_select_ops_cuda_keeps_sdpa_without_torch_npu() -> None:
    ops = select_ops(CUDABackend())
    assert ops.attention is sdpa_attention and ops.names()["attention"] == "sdpa"


def test_overrides_win_and_are_per_instance() -> None:
    def broken(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return x * 0

    a = select_ops(CPUBackend(), {"rms_norm": broken})
    b = select_ops(CPUBackend())
    assert a.rms_norm is broken and b.rms_norm is rms_norm
    assert a.choices["rms_norm"].name.startswith("override:") and not a.choices["rms_norm"].exact
    with pytest.raises(ValueError, match="Unknown op override"):
        select_ops(CPUBackend(), {"layer_norm": broken})


def test_npu_fused_paths_selected_and_match_plain_maths(npu_standin) -> None:
    ops = select_ops(NPUBackend())
    assert isinstance(ops, OpSet)
    assert ops.names()["rms_norm"] == "torch_npu.npu_rms_norm"
    assert ops.names()["swiglu"] == "torch_npu.npu_swiglu"
    assert ops.names()["rotary"] == "torch_npu.npu_rotary_mul"
    assert ops.names()["attention"] == "torch_npu.npu_fusion_attention"
    assert not ops.choices["attention"].exact

    x, w = randn(2, 6, 32), randn(32)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6))
    g, u = randn(4, 24), randn(4, 24)
    torch.testing.assert_close(ops.swiglu_packed(torch.cat([g, u], -1)), swiglu(g, u))
    torch.testing.assert_close(ops.swiglu(g, u), swiglu(g, u))

    q, k, v = randn(2, 5, 4, 16), randn(2, 5, 2, 16), randn(2, 5, 2, 16)
    torch.testing.assert_close(ops.attention(q, k, v), sdpa_attention(q, k, v), rtol=1e-5, atol=1e-5)

    # rotary: layouts differ (rotate-half vs interleaved) but q.k products, hence attention, agree
    angle = randn(5, 8)
    cos, sin = angle.cos(), angle.sin()
    qa, ka = (ops.rotary(t, ops.rope_table(cos, sin)) for t in (q, k.repeat_interleave(2, 2)))
    qb, kb = (apply_rotary(t, rope_table(cos, sin)) for t in (q, k.repeat_interleave(2, 2)))
    torch.testing.assert_close(qa[..., :8], qb[..., 0::2])
    torch.testing.assert_close(qa @ ka.transpose(-1, -2), qb @ kb.transpose(-1, -2), rtol=1e-5, atol=1e-5)
