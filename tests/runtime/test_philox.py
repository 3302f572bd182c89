"""The portable Philox4x32-10: Random123's known answers, no int64 overflow, eager = compiled, its floats, and
its two categorical samplers (inverse-CDF, Gumbel-max).

Integer words are exact on every CPU and device, so they are pinned; float tests state their tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from difforge.devices.compile import compile_policy
from difforge.runtime import philox
from difforge.runtime.philox import (
    MASK32,
    cdf_block_size,
    exponential_from_words,
    grid_words,
    gumbel_argmax,
    gumbel_argmax_block,
    gumbel_from_words,
    integers_from_words,
    inverse_cdf,
    inverse_cdf_block,
    inverse_cdf_logits_block,
    philox4x32,
    philox_words,
    uniform_from_words,
)
from tests.dispatch import LOWERED_REASON, dispatch_lowered

# Random123's kat_vectors (philox4x32, 7 and 10 rounds): counter (4 words), key (2 words), expected output.
# Checked against the copy cut-and-pasted from the kat_vectors file into DEShawResearch/fs123
# core123/ut/ut_philox.cpp (test_kat_philox4x32).
KAT = [
    (7, (0, 0, 0, 0), (0, 0), (0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48)),
    (7, (MASK32,) * 4, (MASK32,) * 2, (0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662)),
    (7, (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A)),
    (10, (0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    (10, (MASK32,) * 4, (MASK32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (10, (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize(("rounds", "counter", "key", "want"), KAT)
def test_random123_known_answers(rounds: int, counter: tuple, key: tuple, want: tuple) -> None:
    assert philox_words(*counter, *key, rounds=rounds) == want  # Python ints
    assert tuple(philox4x32(torch.tensor(counter), key, rounds=rounds).tolist()) == want  # int64 tensors
    assert tuple(philox4x32(torch.tensor(counter), torch.tensor(key), rounds=rounds).tolist()) == want


def test_tensor_form_broadcasts_row_by_row() -> None:
    counters = torch.tensor([kat[1] for kat in KAT[3:]])
    keys = torch.tensor([kat[2] for kat in KAT[3:]])
    assert philox4x32(counters, keys).tolist() == [list(kat[3]) for kat in KAT[3:]]
    with pytest.raises(ValueError, match="4 words"):
        philox4x32(torch.zeros(3, dtype=torch.int64), (0, 0))


class _Int64Range(TorchDispatchMode):
    """The smallest and largest value of every int64 tensor an op computes (``empty`` buffers are uninitialised)."""

    def __init__(self) -> None:
        super().__init__()
        self.low, self.high = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        computed = "empty" not in str(func)
        if computed and isinstance(out, torch.Tensor) and out.dtype == torch.int64 and out.numel():
            self.low, self.high = min(self.low, int(out.min())), max(self.high, int(out.max()))
        return out


@pytest.mark.parametrize("inplace", [True, False])
def test_no_intermediate_leaves_zero_to_2_pow_49(inplace: bool) -> None:
    """Every product is split below 2**48, so no backend has to wrap signed int64 (nor know uint32)."""
    rows = torch.tensor([0, 1, MASK32 - 1, MASK32])
    with _Int64Range() as seen:
        words = grid_words(rows, 16, MASK32, MASK32, MASK32, MASK32, inplace=inplace)
    assert seen.low >= 0 and seen.high < 2**49
    assert int(words.min()) >= 0 and int(words.max()) <= MASK32


def test_grid_maps_columns_to_counter_words_and_inplace_equals_functional() -> None:
    rows = torch.tensor([0, 5, 7])
    for ncols in (1, 3, 4, 9, 64):
        got = grid_words(rows, ncols, 11, 2, 0x1234, 0x5678)
        assert torch.equal(got, grid_words(rows, ncols, 11, 2, 0x1234, 0x5678, inplace=False))
        for i, r in enumerate(rows.tolist()):
            for j in range(ncols):
                assert int(got[i, j]) == philox_words(j // 4, r, 11, 2, 0x1234, 0x5678)[j % 4]
    # 0-dim tensors in place of ints (what a compiled block is given) change nothing
    as_tensors = [torch.tensor(v) for v in (11, 2, 0x1234, 0x5678)]
    assert torch.equal(grid_words(rows, 9, *as_tensors), grid_words(rows, 9, 11, 2, 0x1234, 0x5678))


def test_uniforms_are_strictly_inside_0_1_and_their_logs_finite() -> None:
    extremes = torch.tensor([0, 256, 512, MASK32 - 511, MASK32])
    u = uniform_from_words(extremes)
    assert u.dtype == torch.float32
    assert u.tolist() == [2.0**-24, 2.0**-24, 3 * 2.0**-24, 1 - 2.0**-24, 1 - 2.0**-24]
    e, g = exponential_from_words(extremes), gumbel_from_words(extremes)
    assert bool(torch.isfinite(e).all()) and bool((e > 0).all()) and bool(torch.isfinite(g).all())
    assert float(g.min()) > -2.82 and float(g.max()) < 16.65  # the lattice's two ends


def _uniforms(n: int, draw: int) -> torch.Tensor:
    return uniform_from_words(grid_words(torch.arange(1), n, 0, draw, 2024, 12)).flatten().double()


def test_uniform_mean_variance_and_ks_bound() -> None:
    n = 1 << 18
    u = _uniforms(n, 1)
    # 5 standard errors: mean sd sqrt(1/12/n) = 5.6e-4 -> 2.8e-3; variance sd sqrt(1/180/n) = 1.5e-4 -> 7.3e-4
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(float(u.var()) - 1 / 12) < 5 * math.sqrt(1 / 180 / n)
    x = u.sort().values
    ecdf_hi = torch.arange(1, n + 1, dtype=torch.float64) / n
    ks = float(torch.maximum(ecdf_hi - x, x - (ecdf_hi - 1 / n)).max())
    assert ks < 1.95 / math.sqrt(n)  # Kolmogorov's 0.1 % critical value (the words are pinned: not flaky)
    # independent looking draws: neighbours uncorrelated (|r| < 5 / sqrt(n))
    assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 5 / math.sqrt(n)


def test_integers_cover_their_range_evenly() -> None:
    words = grid_words(torch.arange(4), 1 << 14, 3, 0, 1, 2)
    codes = integers_from_words(words, 10)
    assert int(codes.min()) == 0 and int(codes.max()) == 9
    counts = torch.bincount(codes.flatten(), minlength=10).double() / codes.numel()
    assert float((counts - 0.1).abs().max()) < 5 * math.sqrt(0.09 / codes.numel())  # 5 standard errors
    assert torch.equal(integers_from_words(words, 1 << 32), words)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        integers_from_words(words, 0)


def test_gumbel_max_samples_softmax_and_weights() -> None:
    """Frequencies of argmax(logits + G) over 2**16 rows are softmax(logits) within 5 standard errors (<= 1e-2)."""
    rows = 1 << 16
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -30.0])
    p = logits.softmax(-1).double()
    codes = gumbel_argmax(logits.expand(rows, -1), 4, 1, 77, 0)
    freq = torch.bincount(codes, minlength=6).double() / rows
    tol = 5 * torch.sqrt(p * (1 - p) / rows) + 1e-9
    assert bool(((freq - p).abs() <= tol).all()), (freq, p)
    w = torch.tensor([0.0, 3.0, 1.0, 0.0, 4.0])  # weights: log(w) as scores, zeros never drawn
    codes = gumbel_argmax(w.log().expand(rows, -1), 4, 2, 77, 0)
    freq = torch.bincount(codes, minlength=5).double() / rows
    pw = (w / w.sum()).double()
    assert freq[0] == 0 and freq[3] == 0
    assert bool(((freq - pw).abs() <= 5 * torch.sqrt(pw * (1 - pw) / rows) + 1e-9).all()), (freq, pw)


def test_blocks_do_not_change_the_draw() -> None:
    """A row's noise is a function of its index: any chunking gives the same categories."""
    scores = torch.randn(37, 50, generator=torch.Generator().manual_seed(0))
    whole = gumbel_argmax(scores, 9, 1, 5, 6, chunk=1 << 20)
    assert torch.equal(whole, gumbel_argmax(scores, 9, 1, 5, 6, chunk=13))
    assert torch.equal(whole, gumbel_argmax(scores, 9, 1, 5, 6, chunk=1))
    assert not torch.equal(whole, gumbel_argmax(scores, 10, 1, 5, 6))  # another step, other noise
    assert not torch.equal(whole, gumbel_argmax(scores, 9, 1, 5, 7))  # another seed, other noise


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.1 % point of chi-square with ``df`` degrees of freedom (Wilson-Hilferty; within 1 % for df >= 3)."""
    a = 2 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def _chi2(codes: torch.Tensor, p: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of ``codes`` against probabilities ``p`` (codes of zero probability must not occur)."""
    n = codes.numel()
    counts = torch.bincount(codes, minlength=p.numel()).double()
    keep = p > 0
    assert float(counts[~keep].sum()) == 0, "a zero-probability code was drawn"
    expected = p[keep].double() * n
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def test_cdf_block_size_is_about_the_square_root() -> None:
    assert [cdf_block_size(k) for k in (1, 2, 6, 64, 100, 16384, 64000)] == [1, 2, 4, 8, 16, 128, 256]
    assert 64000 % cdf_block_size(64000) == 0 and 16384 % cdf_block_size(16384) == 0  # URSA's books: no padding


@pytest.mark.parametrize("k", [6, 37, 64])
def test_inverse_cdf_passes_a_chi_square_test(k: int) -> None:
    """2**16 rows of one weight vector (a ragged last block for 37, zeros that must never be drawn): Pearson's
    statistic below the 0.1 % critical value.  The words are pinned, so this is deterministic, not flaky."""
    rows = 1 << 16
    gen = torch.Generator().manual_seed(k)
    w = torch.rand(k, generator=gen) ** 3
    w[torch.randperm(k, generator=gen)[: k // 5]] = 0  # some zero weights
    codes = inverse_cdf(w.expand(rows, -1), 4, 2, 77, 0)
    stat, df = _chi2(codes, w / w.sum())
    assert stat < _chi2_critical(df), (stat, df)
    logits = torch.randn(k, generator=gen) * 2  # the logits form: softmax in float32, then the same draw
    codes = inverse_cdf(logits.expand(rows, -1), 4, 1, 77, 0, logits=True)
    stat, df = _chi2(codes, logits.double().softmax(-1))
    assert stat < _chi2_critical(df), (stat, df)


def test_inverse_cdf_matches_softmax_frequencies_within_5_standard_errors() -> None:
    """The same logits as the Gumbel-max test: both samplers estimate softmax(logits)."""
    rows = 1 << 16
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, -30.0])
    p = logits.softmax(-1).double()
    codes = inverse_cdf(logits.expand(rows, -1), 4, 1, 77, 0, logits=True)
    freq = torch.bincount(codes, minlength=6).double() / rows
    assert bool(((freq - p).abs() <= 5 * torch.sqrt(p * (1 - p) / rows) + 1e-9).all()), (freq, p)


def test_inverse_cdf_known_answer_from_python_ints() -> None:
    """Each row's code is the two-level rule on words 0 and 1 of counter ``(0, row, c2, c3)``, recomputed here in
    float64 from :func:`philox_words` on Python ints (a draw this close to a boundary would be skipped: none is)."""
    gen = torch.Generator().manual_seed(5)
    w = torch.rand(40, 100, generator=gen)
    got = inverse_cdf(w, 9, 3, 0xABCDEF, 17)
    size = cdf_block_size(100)  # 16: 7 blocks, the last padded
    for r in range(40):
        u0, u1 = (((word >> 8) | 1) * 2.0**-24 for word in philox_words(0, r, 9, 3, 0xABCDEF, 17)[:2])
        row = w[r].double()
        blocks = torch.nn.functional.pad(row, (0, 7 * size - 100)).view(7, size)
        cb = blocks.sum(-1).cumsum(0)
        b = int((cb < u0 * cb[-1]).sum())
        inner = blocks[b].cumsum(0)
        j = int((inner < u1 * inner[-1]).sum())
        assert int(got[r]) == b * size + j, r


def test_inverse_cdf_rows_steps_keys_and_edge_rows() -> None:
    """A row's code depends on its row number alone; other steps and keys give other codes; an all-zero row
    gives index 0 and NaN weights still a valid index; an empty draw is empty."""
    w = torch.rand(50, 300, generator=torch.Generator().manual_seed(2))
    whole = inverse_cdf(w, 9, 1, 5, 6)
    sub = torch.tensor([3, 17, 41])
    assert torch.equal(inverse_cdf(w[sub], 9, 1, 5, 6, rows=sub), whole[sub])
    assert not torch.equal(whole, inverse_cdf(w, 10, 1, 5, 6)) and not torch.equal(whole, inverse_cdf(w, 9, 1, 5, 7))
    assert not torch.equal(whole, inverse_cdf(w, 9, 2, 5, 6))  # another draw of the same step
    assert torch.equal(inverse_cdf_block(w, torch.arange(50), 9, 1, 5, 6), whole)
    scores = w.log()  # the logits form is the weights form on softmax(logits), op for op
    assert torch.equal(inverse_cdf_logits_block(scores, torch.arange(50), 9, 1, 5, 6),
                       inverse_cdf(scores.softmax(-1), 9, 1, 5, 6))
    odd = torch.zeros(3, 300)
    odd[1, 7] = 1.0
    odd[2] = float("nan")
    codes = inverse_cdf(odd, 0, 1, 2, 3)
    assert codes[0] == 0 and codes[1] == 7 and 0 <= int(codes[2]) < 300
    assert inverse_cdf(torch.empty(0, 300), 0, 1, 2, 3).shape == (0,)
    half = inverse_cdf(w.half(), 9, 1, 5, 6)  # any float dtype: the draw is made in float32
    assert half.dtype == torch.int64 and int((half != whole).sum()) <= 2  # the weights rounded to float16


@pytest.mark.slow
@pytest.mark.skipif(not compile_policy("cpu").available, reason=f"no CPU compile here: {compile_policy('cpu').detail}")
@pytest.mark.skipif(dispatch_lowered(), reason=LOWERED_REASON)
def test_inverse_cdf_compiled_equals_eager_on_cpu() -> None:
    """The inverse-CDF block compiled by Inductor draws the eager block's codes (logits and weights forms)."""
    compiled = torch.compile(inverse_cdf_logits_block, backend="inductor", dynamic=False)
    weights_fn = torch.compile(inverse_cdf_block, backend="inductor", dynamic=False)
    logits = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) * 3
    rows = torch.arange(64)
    for step, key in ((0, (0, 0)), (7, (MASK32, 0x9E3779B9))):
        args = [torch.tensor(v) for v in (step, 1, *key)]
        assert torch.equal(compiled(logits, rows, *args), inverse_cdf_logits_block(logits, rows, step, 1, *key))
        w = logits.softmax(-1)
        assert torch.equal(weights_fn(w, rows, *args), inverse_cdf_block(w, rows, step, 1, *key))


@pytest.mark.slow
@pytest.mark.skipif(not compile_policy("cpu").available, reason=f"no CPU compile here: {compile_policy('cpu').detail}")
@pytest.mark.skipif(dispatch_lowered(), reason=LOWERED_REASON)
def test_compiled_equals_eager_bit_for_bit_on_cpu() -> None:
    """One Inductor graph: the words and the Gumbel-max block (functional form), steps and keys as tensors."""

    def block(scores, rows, c2, c3, k0, k1):  # type: ignore[no-untyped-def]
        words = grid_words(rows, scores.shape[-1], c2, c3, k0, k1, inplace=False)
        return words, gumbel_argmax_block(scores, rows, c2, c3, k0, k1, inplace=False)

    compiled = torch.compile(block, backend="inductor", dynamic=False)
    scores = torch.randn(24, 64, generator=torch.Generator().manual_seed(1))
    rows = torch.arange(24)
    for step, key in ((0, (0, 0)), (7, (MASK32, 0x9E3779B9)), (8, (5, 1))):
        args = [torch.tensor(v) for v in (step, 3, *key)]
        words, codes = compiled(scores, rows, *args)
        assert torch.equal(words, grid_words(rows, 64, step, 3, *key))  # eager, in place
        assert torch.equal(codes, gumbel_argmax_block(scores, rows, step, 3, *key))
    assert philox.ROUNDS == 10
