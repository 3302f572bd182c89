"""Philox4x32-10 in plain integer torch ops: the same random words on every backend.

Philox (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11) is a
counter-based generator: a 128-bit counter and a 64-bit key go through ten rounds of
multiply-high/low and XOR and come out as four 32-bit words.  There is no state to advance, so any
draw can be computed anywhere, in any order, in one pass - the counter says which numbers they are.

Why our own, and written like this:

* ``torch.Generator`` streams differ per device type (CPU mt19937, CUDA/XPU Philox with their own
  counter layout, NPU and MPS their own), and torch 2.13's stateless ``torch.func._random`` Philox
  has no CPU kernel.  A portable stream has to be built from ops every backend has.
* Every value is a 32-bit word held in an **int64** tensor (0 .. 2**32 - 1), and no intermediate
  ever reaches 2**63: the 32x32-bit products are split as ``a * m_lo`` and ``a * m_hi`` with the
  constant's 16-bit halves (each below 2**48), so nothing relies on signed overflow wrapping or on
  uint32 tensors, which some backends lack.  Only ``*``, ``+``, ``&``, ``^``, ``>>`` and ``<<`` on
  int64 are used, so CPU, CUDA, NPU, XPU and MPS compute bit-identical words (integer maths has no
  rounding), eager or compiled.
* Any argument may be a Python int or an int64 tensor; they broadcast.  Counter words that are the
  same for a whole draw (a step number, a draw id) can stay Python ints, so the first round costs
  almost nothing on a ``[rows, 1] x [1, cols]`` grid.

Floats: :func:`uniform_from_words` maps a word to ``(2k + 1) / 2**24`` with 23 random bits ``k`` -
every value is exact in float32 (and bfloat16-free: always float32), strictly inside (0, 1), mean
exactly 1/2, so ``log(u)`` and ``log(-log(u))`` are finite.  The Gumbel noise is ``-log(-log(u))``,
within [-2.81, 16.64]: the cut tails have probability 6e-8 each.

Categorical sampling, two ways (both exact in distribution up to float32 rounding):

* :func:`inverse_cdf` (URSA's default): two uniforms per row - words 0 and 1 of the one counter
  ``(0, row, c2, c3)`` - pick a block of the codebook by the cumulative sum of the block sums, then a
  code inside that block by its own cumulative sum.  ``P(block) * P(code | block)`` is the code's
  weight over the total, and the two short cumulative sums (about ``sqrt(K)`` terms each, blocks of
  :func:`cdf_block_size`) keep float32 rounding and the 2**-23 spacing of the uniforms far below what
  one cumulative sum over ``K`` codes would leave.  Words per draw: ``2 * rows`` (not ``rows * K``).
* :func:`gumbel_argmax`: ``argmax(scores + G)`` with one Gumbel number per (row, code), no softmax;
  ``rows * K`` words, kept for comparison.

Known-answer tests: the Random123 ``kat_vectors`` for philox4x32-7 and -10 (tests/runtime/test_philox.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeAlias

import torch

#: Mask of a 32-bit word.
MASK32 = 0xFFFFFFFF
#: Philox4x32 multipliers and Weyl key increments (Random123 ``PHILOX_M4x32_*``, ``PHILOX_W32_*``).
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
#: Rounds of Philox4x32-10.
ROUNDS = 10
#: Spacing of the uniform lattice: uniforms are odd multiples of 2**-24.
_UNIT = 2.0**-24

Word: TypeAlias = int | torch.Tensor


def _mulhilo(a: Word, m: int) -> tuple[Word, Word]:
    """``(hi, lo)`` 32-bit halves of the 64-bit product ``a * m`` (``a``, ``m`` below 2**32), overflow-free.

    ``m = m_hi * 2**16 + m_lo``; ``p0 = a * m_lo`` and ``p1 = a * m_hi`` are below 2**48, and
    ``s = p0 + (p1 mod 2**16) * 2**16`` below 2**49, so int64 never overflows on any backend.
    """
    p0 = a * (m & 0xFFFF)
    p1 = a * (m >> 16)
    s = p0 + ((p1 & 0xFFFF) << 16)
    return (p1 >> 16) + (s >> 32), s & MASK32


def philox_words(
    c0: Word, c1: Word, c2: Word, c3: Word, k0: Word, k1: Word, rounds: int = ROUNDS
) -> tuple[Word, Word, Word, Word]:
    """The four output words of Philox4x32-``rounds`` for counter ``(c0, c1, c2, c3)`` and key ``(k0, k1)``.

    Arguments are Python ints or int64 tensors holding values in 0 .. 2**32 - 1 (they broadcast);
    the words come back the same way.  Round ``r`` uses the key bumped ``r`` times by (W0, W1).
    """
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
        hi0, lo0 = _mulhilo(c0, M0)
        hi1, lo1 = _mulhilo(c2, M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def philox4x32(counter: torch.Tensor, key: torch.Tensor | Sequence[int], rounds: int = ROUNDS) -> torch.Tensor:
    """Philox4x32-``rounds``: int64 ``counter [..., 4]`` and ``key [..., 2]`` (or two ints) -> int64 ``words [..., 4]``.

    Values are 32-bit words (0 .. 2**32 - 1) stored in int64; the result has the broadcast shape.
    """
    if counter.shape[-1] != 4:
        raise ValueError(f"philox4x32 needs a counter of 4 words in the last dimension, got shape {tuple(counter.shape)}.")
    ks: Sequence[Word] = key.unbind(-1) if isinstance(key, torch.Tensor) else tuple(int(k) & MASK32 for k in key)
    if len(ks) != 2:
        raise ValueError("philox4x32 needs a key of 2 words.")
    c = counter.to(torch.int64).unbind(-1)
    out = philox_words(c[0], c[1], c[2], c[3], ks[0], ks[1], rounds)
    shaped = torch.broadcast_tensors(*(torch.as_tensor(w, dtype=torch.int64, device=counter.device) for w in out))
    return torch.stack(shaped, -1)


def _rounds_inplace(c: list[torch.Tensor], k0: Word, k1: Word, first: int, rounds: int) -> list[torch.Tensor]:
    """Rounds ``first .. rounds - 1`` on four full-size int64 buffers, in place (3 scratch buffers, no allocation).

    The same arithmetic as :func:`philox_words`, op for op; only where the results are written differs.
    """
    t = [torch.empty_like(c[0]) for _ in range(3)]
    m0l, m0h, m1l, m1h = M0 & 0xFFFF, M0 >> 16, M1 & 0xFFFF, M1 >> 16
    for r in range(first, rounds):
        if r:
            k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
        c0, c1, c2, c3 = c
        t0, t1, t2 = t
        torch.mul(c0, m0h, out=t0)  # p1 of c0 * M0
        c0.mul_(m0l)  # p0
        torch.bitwise_and(t0, 0xFFFF, out=t1).bitwise_left_shift_(16).add_(c0)  # s
        t0.bitwise_right_shift_(16).add_(torch.bitwise_right_shift(t1, 32, out=c0))  # hi0
        t1.bitwise_and_(MASK32)  # lo0
        torch.mul(c2, m1h, out=t2)  # p1 of c2 * M1
        c2.mul_(m1l)  # p0
        torch.bitwise_and(t2, 0xFFFF, out=c0).bitwise_left_shift_(16).add_(c2)  # s
        t2.bitwise_right_shift_(16).add_(torch.bitwise_right_shift(c0, 32, out=c2))  # hi1
        c0.bitwise_and_(MASK32)  # lo1
        c = [t2.bitwise_xor_(c1).bitwise_xor_(k0), c0, t0.bitwise_xor_(c3).bitwise_xor_(k1), t1]
        t = [c1, c3, c2]
    return c


def grid_words(
    rows: torch.Tensor, ncols: int, c2: Word, c3: Word, k0: Word, k1: Word, rounds: int = ROUNDS,
    inplace: bool = True,
) -> torch.Tensor:
    """Words ``[len(rows), ncols]`` of a row-by-column grid: column ``j`` of row ``r`` is word ``j % 4`` of
    the counter ``(j // 4, r, c2, c3)``.

    ``rows`` is int64 ``[R]`` (row numbers below 2**32, on the device the words are wanted on).  The
    first round runs on ``[R, 1]`` and ``[1, ncols/4]`` only.  ``inplace`` (eager): rounds two to ten
    overwrite seven preallocated buffers instead of allocating ~20 tensors a round - the same words,
    several times faster on a CPU; ``inplace=False`` is the functional form for ``torch.compile``.
    """
    blocks = -(-ncols // 4)
    cols = torch.arange(blocks, dtype=torch.int64, device=rows.device)
    lead = 1 if inplace else rounds
    words = philox_words(cols[None, :], rows[:, None], c2, c3, k0, k1, min(lead, rounds))
    full = list(torch.broadcast_tensors(*(torch.as_tensor(w, dtype=torch.int64, device=rows.device) for w in words)))
    if inplace and rounds > 1:
        full = _rounds_inplace([w.contiguous() for w in full], k0, k1, 1, rounds)
    return torch.stack(full, -1).view(rows.shape[0], blocks * 4)[:, :ncols]


def uniform_from_words(words: torch.Tensor) -> torch.Tensor:
    """float32 uniforms in (0, 1): ``(2k + 1) / 2**24`` with ``k`` the word's top 23 bits (exact in float32)."""
    return ((words >> 8) | 1).to(torch.float32).mul_(_UNIT)


def integers_from_words(words: torch.Tensor, n: int) -> torch.Tensor:
    """int64 integers in ``[0, n)`` (``n`` at most 2**32): the high word of ``word * n`` (bias below n / 2**32)."""
    if not 0 < n <= 1 << 32:
        raise ValueError(f"integers_from_words needs 0 < n <= 2**32, got {n}.")
    hi, _ = _mulhilo(words, n)  # n = 2**32 splits as (65536, 0): still below 2**48
    assert isinstance(hi, torch.Tensor)
    return hi


def exponential_from_words(words: torch.Tensor) -> torch.Tensor:
    """float32 Exp(1) draws ``-log(u)``: positive and finite (at least 6e-8, at most 16.64)."""
    return uniform_from_words(words).log_().neg_()


def gumbel_from_words(words: torch.Tensor) -> torch.Tensor:
    """float32 standard Gumbel noise ``-log(-log(u))``: finite, within [-2.81, 16.64]."""
    return exponential_from_words(words).log_().neg_()


def gumbel_argmax_block(
    scores: torch.Tensor, rows: torch.Tensor, c2: Word, c3: Word, k0: Word, k1: Word, inplace: bool = True
) -> torch.Tensor:
    """``argmax(scores + G)`` over the last dim of ``scores [r, K]``: one category per row, int64 ``[r]``.

    ``G`` is the Gumbel noise of :func:`grid_words` ``(rows, K, c2, c3, k0, k1)``, in float32 (the
    scores are promoted).  With ``scores`` = logits this samples softmax(logits) exactly in
    distribution (the Gumbel-max identity), with no softmax; with ``scores = log(w)`` it samples the
    weights ``w`` (zero weights are ``-inf``, never chosen unless a whole row is zero).
    """
    words = grid_words(rows, scores.shape[-1], c2, c3, k0, k1, inplace=inplace)
    if inplace:  # uniform_from_words on our own buffer: no int64 temporaries
        u = words.bitwise_right_shift_(8).bitwise_or_(1).to(torch.float32).mul_(_UNIT)
    else:
        u = uniform_from_words(words)
    log_e = u.log_().neg_().log_()
    return torch.sub(scores, log_e, out=log_e).argmax(-1)  # scores + G with G = -log(E), E = -log(u)


BlockFn: TypeAlias = Callable[..., torch.Tensor]


def gumbel_argmax(
    scores: torch.Tensor, c2: Word, c3: Word, k0: Word, k1: Word, chunk: int = 1 << 16,
    block_fn: BlockFn | None = None, rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`gumbel_argmax_block` over ``scores [R, K]`` in row blocks of about ``chunk`` counters.

    ``rows``: the counter row of each score row (default ``0 .. R-1``); a row's noise is a function of
    its row number alone, so drawing a subset of rows gives those rows' numbers of the full draw.  The
    blocks bound the eager temporaries (seven int64 buffers of ``chunk`` words) and keep them in
    cache on a CPU; the result does not depend on ``chunk``.  ``block_fn`` replaces
    :func:`gumbel_argmax_block` (a compiled one: then pass the counter and key words as 0-dim
    tensors, so a new step or seed does not recompile).
    """
    n_rows, k = scores.shape
    per = max(1, chunk // -(-k // 4))
    if rows is None:
        rows = torch.arange(n_rows, dtype=torch.int64, device=scores.device)
    fn = block_fn or gumbel_argmax_block
    parts = [fn(scores[r0 : r0 + per], rows[r0 : r0 + per], c2, c3, k0, k1) for r0 in range(0, n_rows, per)]
    if not parts:
        return torch.empty(0, dtype=torch.int64, device=scores.device)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def cdf_block_size(k: int) -> int:
    """Codes per block of :func:`inverse_cdf_block` for a codebook of ``k``: the smallest power of two at or
    above ``sqrt(k)`` (8 for 64 codes, 128 for 16384, 256 for 64000), so both cumulative sums stay short."""
    return 1 << ((max(k, 1) - 1).bit_length() + 1) // 2


def _first_reaching(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of the non-decreasing ``cdf [r, n]``: the first index whose entry reaches ``u * cdf[:, -1]``.

    Counted as the entries below the target (what ``searchsorted`` returns on a sorted row, in one fused
    reduction everywhere).  ``u < 1`` keeps the target at or below the last entry, and ``u > 0`` above a
    run of leading zeros, so a zero weight is never chosen unless the whole row is zero (then index 0).
    """
    target = cdf[:, -1:] * u[:, None]
    return (cdf < target).sum(-1).clamp_(max=cdf.shape[-1] - 1)


def inverse_cdf_block(
    weights: torch.Tensor, rows: torch.Tensor, c2: Word, c3: Word, k0: Word, k1: Word, inplace: bool = True
) -> torch.Tensor:
    """One category per row of non-negative ``weights [r, K]`` (unnormalised), int64 ``[r]``, by inverse CDF.

    Row ``i`` draws the two uniforms of words 0 and 1 of counter ``(0, rows[i], c2, c3)``: the first picks
    a block of :func:`cdf_block_size` codes with probability (block sum) / (row sum), the second a code
    of that block with probability weight / (block sum).  Weights are used in float32; a ``K`` that is
    not a multiple of the block size is padded with zero weights (never drawn).  ``inplace`` is taken
    for the signature every block shares; with one counter per row the functional rounds are faster.

    The uniforms are the same words on every backend; the sums they are compared with are float32
    reductions and scans, whose rounding (and the softmax's) differs between backends and between eager
    and compiled kernels.  So the same seed gives the same code everywhere except where a uniform falls
    within that rounding of a cumulative-sum boundary - the counterpart of near-tied logits for
    Gumbel-max.
    """
    r, k = weights.shape
    size = cdf_block_size(k)
    blocks = -(-k // size)
    w = weights.float()
    if blocks * size != k:
        w = torch.nn.functional.pad(w, (0, blocks * size - k))
    u = uniform_from_words(grid_words(rows, 2, c2, c3, k0, k1, inplace=False))  # [r, 2]: few counters, functional
    w = w.view(r, blocks, size)
    block = _first_reaching(w.sum(-1).cumsum(-1), u[:, 0])
    chosen = w[torch.arange(r, dtype=torch.int64, device=w.device), block]  # [r, size]: the block drawn
    return block * size + _first_reaching(chosen.cumsum(-1), u[:, 1])


def inverse_cdf_logits_block(
    scores: torch.Tensor, rows: torch.Tensor, c2: Word, c3: Word, k0: Word, k1: Word, inplace: bool = True
) -> torch.Tensor:
    """:func:`inverse_cdf_block` on ``softmax(scores)`` computed in float32: one category per row of logits."""
    return inverse_cdf_block(scores.softmax(-1, dtype=torch.float32), rows, c2, c3, k0, k1, inplace)


def inverse_cdf(
    weights: torch.Tensor, c2: Word, c3: Word, k0: Word, k1: Word, block_fn: BlockFn | None = None,
    rows: torch.Tensor | None = None, logits: bool = False,
) -> torch.Tensor:
    """:func:`inverse_cdf_block` (``logits``: :func:`inverse_cdf_logits_block`) over all of ``weights [R, K]``.

    ``rows``: the counter row of each weight row (default ``0 .. R-1``); a row's uniforms depend on its
    row number alone, so drawing a subset of rows gives those rows' codes of the full draw.  The
    temporaries are one float32 ``[R, K]`` buffer (the softmax, or the weights' float32 copy when they
    are another dtype) and ``[R, K / block]`` and ``[R, block]`` ones, so no chunking is needed.
    ``block_fn``: a compiled block (called with the counter and key words as 0-dim tensors).
    """
    n_rows = weights.shape[0]
    if rows is None:
        rows = torch.arange(n_rows, dtype=torch.int64, device=weights.device)
    if not n_rows:
        return torch.empty(0, dtype=torch.int64, device=weights.device)
    fn = block_fn or (inverse_cdf_logits_block if logits else inverse_cdf_block)
    return fn(weights, rows, c2, c3, k0, k1)
