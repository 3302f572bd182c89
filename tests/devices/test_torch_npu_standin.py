"""The stand-in must keep the real torch_npu call shapes, and compute what each fused op documents.

Expected signatures are copied from the torch_npu 2.13.0 wheel (file and line in the stand-in's
comments).  If a test here fails after editing the stand-in, the stand-in drifted from the real API.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

REAL_SIGNATURES = {
    "npu_rms_norm": "(self, gamma, epsilon=1e-06)",
    "npu_swiglu": "(self, dim=-1)",
    "npu_rotary_mul": "(input, r1, r2, rotary_mode='half', rotate=None)",
    "npu_fusion_attention": (
        "(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None, "
        "scale=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0, "
        "prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, "
        "sync=False, softmax_layout='', sink=None, dropout_mask=None, seed=0, offset=0)"
    ),
}
REAL_DEVICE_SIGNATURES = {
    "is_available": "()",
    "device_count": "()",
    "synchronize": "(device=None)",
    "get_device_name": "(device_name=None)",
    "get_device_properties": "(device_name=None)",
    "mem_get_info": "(device=None)",
    "empty_cache": "()",
    "reset_peak_memory_stats": "(device=None)",
    "memory_allocated": "(device=None)",
    "max_memory_allocated": "(device=None)",
    "memory_reserved": "(device=None)",
    "max_memory_reserved": "(device=None)",
    "set_option": "(option)",
    "set_device": "(device)",
    "current_device": "()",
}


def _sig(fn: object) -> str:
    """Signature text without annotations, in the spelling of the real Python definitions."""
    params = []
    for p in inspect.signature(fn).parameters.values():  # type: ignore[arg-type]
        params.append(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}")
    return "(" + ", ".join(params) + ")"


def test_is_marked_as_standin(npu_standin) -> None:
    assert npu_standin.__standin__ is True
    assert npu_standin.__version__.startswith("2.13.0")
    assert "NOT the real" in (npu_standin.__doc__ or "")


@pytest.mark.parametrize("name", sorted(REAL_SIGNATURES))
def test_op_signatures_match_real(npu_standin, name: str) -> None:
    assert _sig(getattr(npu_standin, name)) == REAL_SIGNATURES[name]


@pytest.mark.parametrize("name", sorted(REAL_DEVICE_SIGNATURES))
def test_device_module_signatures_match_real(npu_standin, name: str) -> None:
    assert _sig(getattr(npu_standin.npu, name)) == REAL_DEVICE_SIGNATURES[name]


def test_import_leaves_torch_alone(npu_standin) -> None:
    # torch.npu / the 'npu' device type would be process-wide and could not be undone.
    assert getattr(torch, "npu", None) is None
    assert (
        torch.accelerator.current_accelerator() is None
        or torch.accelerator.current_accelerator().type != "npu"
    )


def test_device_module_availability_knob(npu_standin, monkeypatch: pytest.MonkeyPatch) -> None:
    npu = npu_standin.npu
    assert npu.is_available() and npu.device_count() == 1
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_COUNT", "0")
    assert not npu.is_available()
    with pytest.raises(AssertionError, match="Invalid device id"):
        npu.get_device_name(0)


def test_device_properties_and_mem_info(npu_standin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_MEMORY", "1000")
    npu = npu_standin.npu
    props = npu.get_device_properties(0)
    assert props.total_memory == 1000 and props.name == "Ascend910B-standin"
    npu._standin_allocate(300)
    assert npu.mem_get_info() == (700, 1000)
    assert npu.get_device_name("npu:0") == props.name


def test_set_option_validates_precision_mode(npu_standin) -> None:
    with pytest.raises(ValueError, match="ACL_PRECISION_MODE"):
        npu_standin.npu.set_option({"ACL_PRECISION_MODE": "fp16_everywhere"})
    with pytest.raises(TypeError):
        npu_standin.npu.set_option("ACL_PRECISION_MODE")


# ---- numerics: the documented formula of each op ----------------------------------------------------------
def test_rms_norm(npu_standin) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    gamma = torch.randn(16)
    y, rstd = npu_standin.npu_rms_norm(x, gamma, epsilon=1e-5)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma
    torch.testing.assert_close(y, expected)
    assert rstd.shape == (2, 5, 1) and rstd.dtype == torch.float32
    torch.testing.assert_close(rstd, torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


def test_rms_norm_keeps_dtype_and_checks_gamma(npu_standin) -> None:
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    y, rstd = npu_standin.npu_rms_norm(x, torch.ones(8, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and rstd.dtype == torch.float32
    with pytest.raises(ValueError, match="gamma"):
        npu_standin.npu_rms_norm(x, torch.ones(4, dtype=torch.bfloat16))


def test_swiglu(npu_standin) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10)
    torch.testing.assert_close(npu_standin.npu_swiglu(x), F.silu(x[..., :5]) * x[..., 5:])
    assert npu_standin.npu_swiglu(x).shape == (2, 3, 5)


def test_swiglu_other_dim_and_odd_size(npu_standin) -> None:
    x = torch.randn(4, 6, 3)
    torch.testing.assert_close(npu_standin.npu_swiglu(x, dim=1), F.silu(x[:, :3]) * x[:, 3:])
    with pytest.raises(ValueError, match="not even"):
        npu_standin.npu_swiglu(x, dim=-1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def test_rotary_half_matches_rotate_half(npu_standin) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8)  # BNSD
    angles = torch.randn(1, 1, 5, 4)
    cos = torch.cat((angles.cos(), angles.cos()), -1)
    sin = torch.cat((angles.sin(), angles.sin()), -1)
    out = npu_standin.npu_rotary_mul(x, cos, sin)
    torch.testing.assert_close(out, x * cos + _rotate_half(x) * sin)
    # a rotation keeps each pair's norm
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


def test_rotary_interleave_and_rotate_matrix(npu_standin) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 2, 3, 4)
    r1, r2 = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    out = npu_standin.npu_rotary_mul(x, r1, r2, "interleave")
    x_new = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    torch.testing.assert_close(out, r1 * x + r2 * x_new)
    # the documented 'half' rotate matrix reproduces the plain 'half' mode
    rotate = torch.zeros(4, 4)
    rotate[:2, 2:] = torch.eye(2)
    rotate[2:, :2] = -torch.eye(2)
    torch.testing.assert_close(
        npu_standin.npu_rotary_mul(x, r1, r2, "half", rotate), npu_standin.npu_rotary_mul(x, r1, r2, "half")
    )
    with pytest.raises(ValueError, match="4-D"):
        npu_standin.npu_rotary_mul(x[0], r1, r2)
    with pytest.raises(ValueError, match="rotary_mode"):
        npu_standin.npu_rotary_mul(x, r1, r2, "full")


# ---- npu_fusion_attention ----------------------------------------------------------------------------------------
def _sdpa_bnsd(q, k, v, scale, causal=False, mask=None):
    return F.scaled_dot_product_attention(
        q, k, v, scale=scale, is_causal=causal, attn_mask=mask, enable_gqa=True
    )


def _qkv(b=2, nq=4, nkv=4, sq=5, skv=7, d=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, nq, sq, d, generator=g, dtype=dtype)
    k = torch.randn(b, nkv, skv, d, generator=g, dtype=dtype)
    v = torch.randn(b, nkv, skv, d, generator=g, dtype=dtype)
    return q, k, v


def _to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    b, n, s, d = x.shape
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    bsh = x.transpose(1, 2).reshape(b, s, n * d)
    return bsh if layout == "BSH" else bsh.transpose(0, 1).contiguous()


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
@pytest.mark.parametrize("nkv", [4, 2, 1])
def test_fusion_attention_layouts_and_gqa(npu_standin, layout: str, nkv: int) -> None:
    q, k, v = _qkv(nkv=nkv)
    scale = q.shape[-1] ** -0.5
    out = npu_standin.npu_fusion_attention(
        _to_layout(q, layout), _to_layout(k, layout), _to_layout(v, layout), 4, layout, scale=scale
    )
    assert len(out) == 7
    attn, softmax_max, softmax_sum, softmax_out, seed, offset, numels = out
    torch.testing.assert_close(attn, _to_layout(_sdpa_bnsd(q, k, v, scale), layout))
    assert softmax_max.shape == softmax_sum.shape == (2, 4, 5, 8)
    assert softmax_max.dtype == softmax_sum.dtype == torch.float32
    assert softmax_out.numel() == 0
    assert (seed, offset, numels) == (0, 0, 0)


def test_fusion_attention_default_scale_is_one(npu_standin) -> None:
    q, k, v = _qkv()
    out = npu_standin.npu_fusion_attention(q, k, v, 4, "BNSD")[0]
    torch.testing.assert_close(out, _sdpa_bnsd(q, k, v, 1.0))


def test_fusion_attention_softmax_stats(npu_standin) -> None:
    q, k, v = _qkv()
    _, smax, ssum, *_ = npu_standin.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.5)
    scores = 0.5 * q @ k.transpose(-1, -2)
    torch.testing.assert_close(smax[..., 0], scores.amax(-1))
    torch.testing.assert_close(ssum[..., 0], torch.exp(scores - scores.amax(-1, keepdim=True)).sum(-1))


def test_fusion_attention_explicit_mask_true_means_masked(npu_standin) -> None:
    q, k, v = _qkv()
    masked = torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) < 0.3
    masked[:, 0] = False  # keep one key per row
    out = npu_standin.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=masked, scale=0.3)[0]
    torch.testing.assert_close(out, _sdpa_bnsd(q, k, v, 0.3, mask=~masked))


@pytest.mark.parametrize(("sparse_mode", "sq", "skv"), [(2, 5, 7), (3, 5, 7), (3, 6, 6)])
def test_fusion_attention_causal_sparse_modes(npu_standin, sparse_mode: int, sq: int, skv: int) -> None:
    q, k, v = _qkv(sq=sq, skv=skv)
    compressed = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)
    out = npu_standin.npu_fusion_attention(
        q, k, v, 4, "BNSD", atten_mask=compressed, sparse_mode=sparse_mode, scale=0.25
    )[0]
    diagonal = 0 if sparse_mode == 2 else skv - sq
    keep = torch.tril(torch.ones(sq, skv, dtype=torch.bool), diagonal=diagonal)
    torch.testing.assert_close(out, _sdpa_bnsd(q, k, v, 0.25, mask=keep))


def test_fusion_attention_fully_masked_row_is_zero(npu_standin) -> None:
    q, k, v = _qkv()
    masked = torch.zeros(5, 7, dtype=torch.bool)
    masked[2] = True
    out = npu_standin.npu_fusion_attention(q, k, v, 4, "BNSD", atten_mask=masked)[0]
    assert torch.isfinite(out).all()
    assert (out[:, :, 2] == 0).all()


def test_fusion_attention_keeps_dtype(npu_standin) -> None:
    q, k, v = _qkv(dtype=torch.bfloat16)
    out = npu_standin.npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.3)[0]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.float(), _sdpa_bnsd(q.float(), k.float(), v.float(), 0.3), atol=2e-2, rtol=2e-2
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_layout": "TND"}, "TND"),
        ({"keep_prob": 0.9}, "dropout"),
        ({"pse": torch.zeros(1)}, "pse"),
        ({"sparse_mode": 4, "atten_mask": torch.zeros(5, 7, dtype=torch.bool)}, "sparse_mode=4"),
        ({"head_num": 3}, "head_num=3"),
    ],
)
def test_fusion_attention_rejects_what_it_does_not_emulate(npu_standin, kwargs: dict, message: str) -> None:
    q, k, v = _qkv()
    args = {"head_num": 4, "input_layout": "BNSD", **kwargs}
    with pytest.raises(ValueError, match=message):
        npu_standin.npu_fusion_attention(q, k, v, **args)


def test_fusion_attention_rejects_non_integer_group(npu_standin) -> None:
    q, k, v = _qkv(nkv=3)
    with pytest.raises(ValueError, match="Nq/Nkv"):
        npu_standin.npu_fusion_attention(q, k, v, 4, "BNSD")
