"""CPU STAND-IN for ``torch_npu`` -- NOT the real Ascend library.

Why it exists: difforge's NPU code paths (backend selection, memory accounting, the fused-op choice
in :mod:`difforge.ops`) must run in CI, where there is no Ascend NPU and no CANN.  The test fixture
``npu_standin`` (tests/conftest.py) puts this directory first on ``sys.path`` so ``import torch_npu``
finds this module for one test.

What it proves: the code calls torch_npu with the real names, parameter names, defaults and return
structure (checked against the torch_npu 2.13.0 wheel, file/line cited on every function), and
that the maths difforge expects from each fused op is the maths the op documents.

What it does NOT prove: anything about Ascend kernels -- their numerics (fp16/bf16 accumulation,
the fused-attention tiling), speed, memory use, or which shapes/dtypes a given CANN version accepts.
Everything here is plain PyTorch on the CPU.

Deliberate differences from the real package:

* It does not call ``torch.utils.rename_privateuse1_backend("npu")`` nor register ``torch.npu``:
  both are process-wide and irreversible, and on torch 2.13 the rename alone makes
  ``torch.accelerator.is_available()`` raise for the rest of the process.  So ``torch.device("npu")``
  stays unparseable here and the device module is reached as ``torch_npu.npu``.
* Options the stand-in does not emulate (dropout, ``pse``, the TND varlen layout, sparse modes 4-8,
  attention sinks) raise ``ValueError`` naming the option instead of silently computing something else.

Knobs for tests (read on every call, so ``monkeypatch.setenv`` works):
``DIFFORGE_STANDIN_NPU_COUNT`` (devices, default 1; 0 = NPU not available),
``DIFFORGE_STANDIN_NPU_NAME`` (default ``Ascend910B-standin``),
``DIFFORGE_STANDIN_NPU_MEMORY`` (bytes per device, default 64 GiB),
``DIFFORGE_STANDIN_CANN_VERSION`` (default ``8.3.RC1-standin``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import npu  # noqa: F401  - the device module, like the real ``torch_npu.npu``
from .version import __version__ as __version__

#: Lets code and tests tell the stand-in from the real library.
__standin__ = True

_FUSION_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD")


# --------------------------------------------------------------------------------------------------
# npu_rms_norm
#   real: torch_npu/_op_plugin_docs.py:3439-3441
#     "torch_npu.npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)"
#   rstd shape/dtype: torch_npu/op_plugin/meta/_meta_registrations.py:2831-2841 (leading dims of
#   ``self`` that gamma does not cover, 1 elsewhere; float32).
# --------------------------------------------------------------------------------------------------
def npu_rms_norm(
    self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the trailing ``gamma.dim()`` dims; returns ``(y, rstd)`` like the real op.

    The first parameter is called ``self`` because that is its name in the real schema.
    """
    if gamma.dim() > self.dim():
        raise ValueError("npu_rms_norm: gamma has more dims than the input.")
    if tuple(self.shape[self.dim() - gamma.dim() :]) != tuple(gamma.shape):
        raise ValueError(
            f"npu_rms_norm: gamma shape {tuple(gamma.shape)} must match the input's trailing dims "
            f"{tuple(self.shape[self.dim() - gamma.dim() :])}."
        )
    dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
    x = self.float()
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = (x * rstd * gamma.float()).to(self.dtype)
    return y, rstd


# --------------------------------------------------------------------------------------------------
# npu_swiglu
#   real: torch_npu/_op_plugin_docs.py:4390-4395  "torch_npu.npu_swiglu(Tensor self, int dim=-1) -> (Tensor)"
#   formula (same docstring): swish(A) * B, A/B the two halves of ``self`` along ``dim``.
#   output shape: torch_npu/op_plugin/meta/_meta_registrations.py:5738-5744 (size[dim] // 2).
# --------------------------------------------------------------------------------------------------
def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``silu(first half) * second half`` along ``dim``; one tensor out, as in the real op."""
    if self.shape[dim] % 2:
        raise ValueError(f"npu_swiglu: size {self.shape[dim]} along dim {dim} is not even.")
    a, b = self.chunk(2, dim=dim)
    return (F.silu(a.float()) * b.float()).to(self.dtype)


# --------------------------------------------------------------------------------------------------
# npu_rotary_mul
#   real: torch_npu/_op_plugin_docs.py:3523-3541
#     "torch_npu.npu_rotary_mul(Tensor input, Tensor r1, Tensor r2, str rotary_mode='half',
#      Tensor? rotate=None) -> Tensor"   (4-D input; 'half' and 'interleave' formulas in that docstring)
#   also torch_npu/onnx/wrapper_onnx_ops.py:1242 (input, r1, r2, rotary_mode="half").
# --------------------------------------------------------------------------------------------------
def npu_rotary_mul(
    input: torch.Tensor,  # the real parameter name (shadows the builtin on purpose)
    r1: torch.Tensor,
    r2: torch.Tensor,
    rotary_mode: str = "half",
    rotate: torch.Tensor | None = None,
) -> torch.Tensor:
    """``r1 * input + r2 * rotate_half(input)`` (or the interleaved pairing), as documented."""
    if input.dim() != 4:
        raise ValueError(f"npu_rotary_mul: input must be 4-D (BNSD/BSND/SBND), got {input.dim()}-D.")
    if rotary_mode not in ("half", "interleave"):
        raise ValueError(f"npu_rotary_mul: rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}.")
    if input.shape[-1] % 2:
        raise ValueError(f"npu_rotary_mul: last dim {input.shape[-1]} must be even.")
    x = input.float()
    if rotate is not None:
        x_new = x @ rotate.float()
    elif rotary_mode == "half":
        x1, x2 = x.chunk(2, dim=-1)
        x_new = torch.cat((-x2, x1), dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
        x_new = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return (r1.float() * x + r2.float() * x_new).to(input.dtype)


# --------------------------------------------------------------------------------------------------
# npu_fusion_attention
#   real signature: torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml:404 (torch_npu 2.13.0):
#     npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout,
#       Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1.,
#       float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647,
#       int inner_precise=0, int[]? prefix=None, int[]? actual_seq_qlen=None,
#       int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False,
#       str softmax_layout="", Tensor? sink=None, Tensor? dropout_mask=None, int seed=0, int offset=0)
#       -> (Tensor, Tensor, Tensor, Tensor, int, int, int)
#   documented form (up to softmax_layout): torch_npu/_op_plugin_docs.py:1592-1598.
#   outputs and their shapes: torch_npu/op_plugin/meta/_meta_registrations.py:2271-2333
#     (attention_out in the input layout; softmax_max/softmax_sum float32 [B, N, Sq, 8];
#      softmax_out empty [0]; seed, offset, numels ints).
#   atten_mask: True/1 = masked out; GQA when Nq/Nkv is a positive integer (_op_plugin_docs.py, 约束说明).
# --------------------------------------------------------------------------------------------------
def npu_fusion_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    prefix: list[int] | None = None,
    actual_seq_qlen: list[int] | None = None,
    actual_seq_kvlen: list[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
    sink: torch.Tensor | None = None,
    dropout_mask: torch.Tensor | None = None,
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """Softmax(mask(scale * Q K^T)) V in float32 on the CPU; returns the real op's 7-tuple."""
    if input_layout not in _FUSION_LAYOUTS:
        raise ValueError(
            f"npu_fusion_attention stand-in: input_layout {input_layout!r} not emulated; "
            f"use one of {', '.join(_FUSION_LAYOUTS)}."
        )
    unsupported = {
        "pse": pse is not None,
        "padding_mask": padding_mask is not None,
        "keep_prob < 1 (dropout)": keep_prob != 1.0,
        "prefix": prefix is not None,
        "actual_seq_qlen/actual_seq_kvlen": actual_seq_qlen is not None or actual_seq_kvlen is not None,
        "sink": sink is not None,
        "dropout_mask": dropout_mask is not None,
        f"sparse_mode={sparse_mode}": sparse_mode not in (0, 1, 2, 3),
    }
    bad = [name for name, used in unsupported.items() if used]
    if bad:
        raise ValueError(f"npu_fusion_attention stand-in does not emulate: {', '.join(bad)}.")
    if query.dtype != key.dtype or key.dtype != value.dtype:
        raise ValueError("npu_fusion_attention: query, key and value must have the same dtype.")

    q = _to_bnsd(query, head_num, input_layout, head_dim=None)
    head_dim = q.shape[-1]
    k = _to_bnsd(key, None, input_layout, head_dim=head_dim)
    v = _to_bnsd(value, k.shape[1], input_layout, head_dim=None)
    batch, n_q, s_q, _ = q.shape
    n_kv, s_kv = k.shape[1], k.shape[2]
    if n_q != head_num:
        raise ValueError(f"npu_fusion_attention: query has {n_q} heads but head_num={head_num}.")
    if n_kv == 0 or n_q % n_kv:
        raise ValueError(f"npu_fusion_attention: Nq/Nkv must be a positive integer, got {n_q}/{n_kv}.")
    if k.shape[0] != batch or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            "npu_fusion_attention: key and value must match in B, N and S (and B must match query)."
        )
    if n_kv != n_q:  # GQA: each group of Nq/Nkv consecutive query heads shares one kv head
        k = k.repeat_interleave(n_q // n_kv, dim=1)
        v = v.repeat_interleave(n_q // n_kv, dim=1)

    scores = scale * torch.matmul(q.float(), k.float().transpose(-1, -2))  # [B, N, Sq, Skv]
    mask = _attention_mask(atten_mask, sparse_mode, s_q, s_kv)
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    finite_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    exp = torch.exp(scores - finite_max)
    row_sum = exp.sum(dim=-1, keepdim=True)
    # A fully masked row gives 0, not NaN (what the real op does with inner_precise=2).
    probs = torch.where(row_sum > 0, exp / row_sum.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
    out = torch.matmul(probs, v.float()).to(query.dtype)  # [B, N, Sq, Dv]

    softmax_max = row_max.expand(batch, n_q, s_q, 8).contiguous()
    softmax_sum = row_sum.expand(batch, n_q, s_q, 8).contiguous()
    softmax_out = query.new_empty([0])
    return _from_bnsd(out, input_layout), softmax_max, softmax_sum, softmax_out, 0, 0, 0


def _to_bnsd(x: torch.Tensor, heads: int | None, layout: str, head_dim: int | None) -> torch.Tensor:
    """Bring one of the supported layouts to [B, N, S, D]; H-layouts need ``heads`` or ``head_dim``."""
    if layout in ("BNSD", "BSND"):
        if x.dim() != 4:
            raise ValueError(f"npu_fusion_attention: layout {layout} needs 4-D tensors, got {x.dim()}-D.")
        return x if layout == "BNSD" else x.transpose(1, 2)
    if x.dim() != 3:
        raise ValueError(f"npu_fusion_attention: layout {layout} needs 3-D tensors, got {x.dim()}-D.")
    if layout == "SBH":
        x = x.transpose(0, 1)
    b, s, h = x.shape
    if heads is None:
        assert head_dim is not None
        if h % head_dim:
            raise ValueError(
                f"npu_fusion_attention: hidden size {h} is not a multiple of head dim {head_dim}."
            )
        heads = h // head_dim
    if heads <= 0 or h % heads:
        raise ValueError(f"npu_fusion_attention: hidden size {h} is not divisible by {heads} heads.")
    return x.reshape(b, s, heads, h // heads).transpose(1, 2)


def _from_bnsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    b, n, s, d = x.shape
    x = x.transpose(1, 2).reshape(b, s, n * d)
    return x if layout == "BSH" else x.transpose(0, 1).contiguous()


def _attention_mask(
    atten_mask: torch.Tensor | None, sparse_mode: int, s_q: int, s_kv: int
) -> torch.Tensor | None:
    """True where a score is masked out, broadcastable to [B, N, Sq, Skv]."""
    if atten_mask is None:  # documented: no mask -> sparse_mode/pre/next_tockens ignored, full compute
        return None
    if sparse_mode in (0, 1):  # the mask is given in full (SS, B1SS, 11SS or BNSS)
        mask = atten_mask.to(torch.bool)
        if tuple(mask.shape[-2:]) != (s_q, s_kv):
            raise ValueError(
                f"npu_fusion_attention: atten_mask's last dims {tuple(mask.shape[-2:])} must be (Sq, Skv)=({s_q}, {s_kv})."
            )
        return mask
    # 2 = leftUpCausal, 3 = rightDownCausal: the passed mask is the compressed 2048x2048 triangle; the
    # causal pattern itself is fixed by the mode, so build it from the shapes.
    ones = torch.ones(s_q, s_kv, dtype=torch.bool)
    diagonal = 1 if sparse_mode == 2 else s_kv - s_q + 1
    return torch.triu(ones, diagonal=diagonal)
