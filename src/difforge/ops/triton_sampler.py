"""URSA's Philox draws as Triton kernels: one launch per draw instead of a few hundred.

Why: on an H200 the eager sampler + scheduler step took 8.5 ms at 512^2, 7.8 of them in the draws,
almost all kernel launches - ten Philox rounds of about fifteen int64 ops each, per draw, plus the
softmax, block sums, scans and gathers of :func:`difforge.runtime.philox.inverse_cdf`.  Here:

* :func:`inverse_cdf` - one program per row: the row's two uniforms (Philox4x32-10 in uint32, with
  ``umulhi`` for the high halves), then for logits the row max and the sum of ``exp(x - max)``, then
  the block sums of the float32 weights (``exp(x - max) / sum`` for logits, as the softmax), their
  running sum and the first block reaching ``u0 * total``, then the same inside that block with
  ``u1``.  Reads a row three times (logits) or once, writes one int64.
* :func:`uniform` - the jump decision's uniforms, one element a lane.

Exactness: the Philox words, hence the uniforms, are bitwise :mod:`difforge.runtime.philox`'s (integer
maths).  The sums the uniforms are compared with are float32 reductions and scans in Triton's order,
not torch's, so a code differs from the torch path's only where a uniform falls within that rounding of
a cumulative-sum boundary - the near-boundary case the portable stream already names between devices
and between eager and compiled runs (see :func:`difforge.runtime.philox.inverse_cdf_block`).  The
tests pin the words bitwise and the codes against the torch path, mismatches allowed only at such
boundaries, under ``TRITON_INTERPRET=1``.

Import this module only where a backend offered the sampler kernel
(:meth:`difforge.devices.CUDABackend.fused_kernel` ``("sampler")``), or in tests under the interpreter.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..runtime.philox import cdf_block_size

#: See :data:`difforge.ops.triton_kernels.INTERPRETED`.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
#: Added to every 32-bit counter/key word passed to a kernel: the argument is then always a 64-bit integer
#: (Triton types an int argument by its value, so a seed above 2**31 would otherwise compile a second kernel);
#: the kernel keeps the low 32 bits.
_WIDE = 1 << 32
#: Elements per chunk of the max / sum passes, and columns per step of the block-sum pass.
_CHUNK, _COLS = 2048, 16


@triton.jit
def _word(v):
    """A 32-bit word from an argument passed as ``word + 2**32`` (see ``_WIDE``)."""
    return (v & 0xFFFFFFFF).to(tl.uint32)


@triton.jit
def _philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint32 words: ``umulhi`` and the wrapping product are the 64-bit product's halves."""
    for r in tl.static_range(10):
        if r > 0:
            k0 = k0 + 0x9E3779B9
            k1 = k1 + 0xBB67AE85
        hi0 = tl.umulhi(c0, 0xD2511F53)
        lo0 = c0 * 0xD2511F53
        hi1 = tl.umulhi(c2, 0xCD9E8D57)
        lo1 = c2 * 0xCD9E8D57
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


@triton.jit
def _uniform(w):
    """``(2k + 1) / 2**24`` with ``k`` the word's top 23 bits, exact in float32 (as ``uniform_from_words``)."""
    return ((w >> 8) | 1).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _exp(x, PRECISE: tl.constexpr):
    if PRECISE:  # noqa: SIM108 (a constexpr branch: the other one is never compiled)
        e = libdevice.exp(x)
    else:
        e = tl.exp(x)
    return e


@triton.jit
def _first_reaching(cdf, u, n_valid):
    """Entries of ``cdf`` below ``u * last`` (``last`` = entry ``n_valid - 1``), at most ``n_valid - 1``."""
    idx = tl.arange(0, cdf.shape[0])
    last = tl.sum(tl.where(idx == n_valid - 1, cdf, 0.0), axis=0)
    below = tl.sum(((cdf < last * u) & (idx < n_valid)).to(tl.int32), axis=0)
    return tl.minimum(below, n_valid - 1)


@triton.jit(do_not_specialize=["k", "stride", "c2", "c3", "k0", "k1"])
def _inverse_cdf_kernel(x_ptr, rows_ptr, out_ptr, k, stride, c2, c3, k0, k1,
                        LOGITS: tl.constexpr, SIZE: tl.constexpr, BLOCKS: tl.constexpr,
                        CHUNK: tl.constexpr, COLS: tl.constexpr, PRECISE: tl.constexpr):
    pid = tl.program_id(0)
    base = x_ptr + pid.to(tl.int64) * stride
    n_blocks = tl.cdiv(k, SIZE)
    zero = tl.zeros((), tl.uint32)
    w0, w1, _, _ = _philox(zero, _word(tl.load(rows_ptr + pid)), _word(c2), _word(c3), _word(k0), _word(k1))
    u0, u1 = _uniform(w0), _uniform(w1)

    m = 0.0
    s = 1.0
    if LOGITS:  # softmax in float32: max, then the sum of exp(x - max)
        acc = tl.full((CHUNK,), float("-inf"), tl.float32)
        for start in range(0, k, CHUNK):
            i = start + tl.arange(0, CHUNK)
            acc = tl.maximum(acc, tl.load(base + i, mask=i < k, other=float("-inf")).to(tl.float32))
        m = tl.max(acc, axis=0)
        tot = tl.zeros((CHUNK,), tl.float32)
        for start in range(0, k, CHUNK):
            i = start + tl.arange(0, CHUNK)
            x = tl.load(base + i, mask=i < k, other=float("-inf")).to(tl.float32)
            tot += tl.where(i < k, _exp(x - m, PRECISE), 0.0)
        s = tl.sum(tot, axis=0)

    # block sums: a [BLOCKS, COLS] tile a step, COLS codes of every block at once
    b = tl.arange(0, BLOCKS)[:, None]
    sums = tl.zeros((BLOCKS,), tl.float32)
    for j0 in range(0, SIZE, COLS):
        i = b * SIZE + j0 + tl.arange(0, COLS)[None, :]
        ok = (i < k) & (b < n_blocks)
        x = tl.load(base + i, mask=ok, other=0.0).to(tl.float32)
        if LOGITS:
            x = tl.math.div_rn(_exp(x - m, PRECISE), s)
        sums += tl.sum(tl.where(ok, x, 0.0), axis=1)
    block = _first_reaching(tl.cumsum(sums, axis=0), u0, n_blocks)

    # the code inside the block drawn
    i = block * SIZE + tl.arange(0, SIZE)
    x = tl.load(base + i, mask=i < k, other=0.0).to(tl.float32)
    if LOGITS:
        x = tl.math.div_rn(_exp(x - m, PRECISE), s)
    x = tl.where(i < k, x, 0.0)
    code = _first_reaching(tl.cumsum(x, axis=0), u1, SIZE)
    tl.store(out_ptr + pid, block.to(tl.int64) * SIZE + code.to(tl.int64))


def inverse_cdf(
    x: torch.Tensor, c2: int, c3: int, k0: int, k1: int, rows: torch.Tensor | None = None, logits: bool = False,
) -> torch.Tensor:
    """:func:`difforge.runtime.philox.inverse_cdf` in one launch: one code per row of ``x [R, K]``, int64 ``[R]``.

    ``logits``: rows are logits (softmax in float32 inside), else non-negative weights.  ``rows``: the
    counter row of each row (default ``0 .. R-1``).  Counter and key words are Python ints.
    """
    n_rows, k = x.shape
    out = torch.empty(n_rows, dtype=torch.int64, device=x.device)
    if not n_rows:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    if rows is None:
        rows = torch.arange(n_rows, dtype=torch.int64, device=x.device)
    size = cdf_block_size(k)
    blocks = triton.next_power_of_2(-(-k // size))
    _inverse_cdf_kernel[(n_rows,)](
        x, rows.to(torch.int64).contiguous(), out, k, x.stride(0),
        c2 + _WIDE, c3 + _WIDE, k0 + _WIDE, k1 + _WIDE,
        LOGITS=logits, SIZE=size, BLOCKS=blocks, CHUNK=min(_CHUNK, triton.next_power_of_2(k)),
        COLS=min(_COLS, size), PRECISE=not INTERPRETED,
    )
    return out


@triton.jit(do_not_specialize=["n", "cols", "c2", "c3", "k0", "k1"])
def _uniform_kernel(out_ptr, n, cols, c2, c3, k0, k1, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row, col = i // cols, i % cols
    w0, w1, w2, w3 = _philox((col // 4).to(tl.uint32), row.to(tl.uint32), _word(c2), _word(c3), _word(k0), _word(k1))
    lane = col % 4
    w = tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))
    tl.store(out_ptr + i, _uniform(w), mask=i < n)


def uniform(shape: tuple[int, int], c2: int, c3: int, k0: int, k1: int, device: torch.device) -> torch.Tensor:
    """float32 uniforms ``[R, C]``: column ``j`` of row ``r`` from word ``j % 4`` of counter ``(j // 4, r, c2, c3)``,
    as ``uniform_from_words(grid_words(arange(R), C, c2, c3, k0, k1))``."""
    out = torch.empty(shape, dtype=torch.float32, device=device)
    n = out.numel()
    if n:
        block = 1024
        _uniform_kernel[(triton.cdiv(n, block),)](out, n, shape[1], c2 + _WIDE, c3 + _WIDE, k0 + _WIDE, k1 + _WIDE,
                                                  BLOCK=block)
    return out


# ------------------------------------------------------------------------------------------- metric rate
@triton.jit
def _round(y, dtype: tl.constexpr, PRECISE: tl.constexpr):
    """float32 ``y`` rounded to ``dtype`` (nearest-even) and back to float32, as one torch op's output is."""
    if dtype == tl.float32:
        return y
    elif PRECISE or dtype != tl.bfloat16:
        return y.to(dtype).to(tl.float32)
    else:  # the interpreter's float32 -> bfloat16 cast truncates; round on the bits (finite values)
        bits = y.to(tl.uint32, bitcast=True)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.to(tl.float32, bitcast=True)


@triton.jit
def _distance(e_ptr, sq, w_ptr, sumsq_ptr, r, c, k, ok, D: tl.constexpr, OUT: tl.constexpr, PRECISE: tl.constexpr):
    """``|e|^2 + |E_c|^2 - e . (2 E_c)`` as the torch path rounds it: the sum in float16 (then the logits dtype),
    the product in float32 rounded to float16, the difference rounded to the logits dtype."""
    s1 = _round(_round(sq + tl.load(sumsq_ptr + c, mask=c < k, other=0.0).to(tl.float32), tl.float16, PRECISE),
                OUT, PRECISE)
    mm = tl.zeros(ok.shape, tl.float32)
    for d in tl.static_range(D):
        mm += tl.load(e_ptr + r * D + d).to(tl.float32) * tl.load(w_ptr + d * k + c, mask=c < k, other=0.0).to(tl.float32)
    return _round(s1 - _round(mm, tl.float16, PRECISE), OUT, PRECISE)


@triton.jit(do_not_specialize=["n_rows", "k", "neg_beta", "d_beta"])
def _metric_rate_kernel(e_ptr, sq_ptr, d0_ptr, sumsq_ptr, w_ptr, v_ptr, n_rows, k, neg_beta, d_beta,
                        D: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, PRECISE: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    r = tl.minimum(r, n_rows - 1)  # a ragged last program repeats the last row (the same values, stored twice)
    sq = tl.load(sq_ptr + r).to(tl.float32)
    d0 = tl.load(d0_ptr + r).to(tl.float32)
    out_ty: tl.constexpr = v_ptr.dtype.element_ty
    # softmax(dist * -beta) over the codebook: max, then the sum of exp(a - max), as torch's softmax in float32
    m = tl.full((ROWS, CHUNK), float("-inf"), tl.float32)
    for c0 in range(0, k, CHUNK):
        c = c0 + tl.arange(0, CHUNK)[None, :]
        ok = (c < k) & (r >= 0)
        a = _round(_distance(e_ptr, sq, w_ptr, sumsq_ptr, r, c, k, ok, D, out_ty, PRECISE) * neg_beta, out_ty, PRECISE)
        m = tl.maximum(m, tl.where(ok, a, float("-inf")))
    mx = tl.max(m, axis=1)[:, None]
    acc = tl.zeros((ROWS, CHUNK), tl.float32)
    for c0 in range(0, k, CHUNK):
        c = c0 + tl.arange(0, CHUNK)[None, :]
        ok = (c < k) & (r >= 0)
        a = _round(_distance(e_ptr, sq, w_ptr, sumsq_ptr, r, c, k, ok, D, out_ty, PRECISE) * neg_beta, out_ty, PRECISE)
        acc += tl.where(ok, _exp(a - mx, PRECISE), 0.0)
    total = tl.sum(acc, axis=1)[:, None]
    for c0 in range(0, k, CHUNK):
        c = c0 + tl.arange(0, CHUNK)[None, :]
        ok = (c < k) & (r >= 0)
        dist = _distance(e_ptr, sq, w_ptr, sumsq_ptr, r, c, k, ok, D, out_ty, PRECISE)
        a = _round(dist * neg_beta, out_ty, PRECISE)
        prob = _round(tl.math.div_rn(_exp(a - mx, PRECISE), total), out_ty, PRECISE)
        gap = -_round(dist - d0, out_ty, PRECISE)
        v = _round(_round(prob * d_beta, out_ty, PRECISE) * tl.where(gap > 0, gap, 0.0), out_ty, PRECISE)
        tl.store(v_ptr + r.to(tl.int64) * k + c, v.to(out_ty), mask=ok)


def metric_rate(
    e: torch.Tensor, sq: torch.Tensor, d0: torch.Tensor, sumsq: torch.Tensor, w2t: torch.Tensor,
    neg_beta: float, d_beta: float, dtype: torch.dtype,
) -> torch.Tensor:
    """The metric path's jump rates ``softmax(-beta * D) * d_beta * relu(d0 - D)`` in one launch, ``[..., K]`` in ``dtype``.

    ``e [..., d]``: the normalised codebook vectors of the drawn x1 (float16), ``sq [..., 1]`` their squared
    norms, ``d0 [..., 1]`` the distance of x_t's vector to them, ``sumsq [K]`` and ``w2t [d, K]`` the
    codebook's squared norms and ``2 E^T`` (:class:`difforge.models.ursa.scheduler.MetricPath`); ``dtype``
    the logits' (the distance buffer's).  The distances are recomputed from the codebook in each of the
    three passes (the codebook stays in cache), so nothing but the rates is written.
    """
    lead, dim = e.shape[:-1], e.shape[-1]
    k = sumsq.shape[0]
    v = torch.empty(*lead, k, dtype=dtype, device=e.device)
    n_rows = v.numel() // max(k, 1)
    if n_rows and k:
        rows = 4
        _metric_rate_kernel[(triton.cdiv(n_rows, rows),)](
            e.reshape(n_rows, dim).contiguous(), sq.reshape(n_rows).contiguous(), d0.reshape(n_rows).contiguous(),
            sumsq.contiguous(), w2t.contiguous(), v, n_rows, k, float(neg_beta), float(d_beta),
            D=dim, ROWS=rows, CHUNK=min(512, triton.next_power_of_2(k)), PRECISE=not INTERPRETED,
            enable_fp_fusion=False,
        )
    return v


@dataclass(frozen=True)
class SamplerKernels:
    """What URSA's sampler binds (``PhiloxDraws.kernels``, ``MetricPath.kernels``): plain functions, so the
    objects holding them still copy and deep-copy like any dataclass of tensors."""

    inverse_cdf: Callable[..., torch.Tensor]
    uniform: Callable[..., torch.Tensor]
    metric_rate: Callable[..., torch.Tensor]


KERNELS = SamplerKernels(inverse_cdf, uniform, metric_rate)
