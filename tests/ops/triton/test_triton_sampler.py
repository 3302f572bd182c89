"""URSA's fused Philox sampler kernels (difforge.ops.triton_sampler) against the torch draws, under the interpreter.

Pinned: the uniforms bitwise (integer Philox in uint32 = the int64 torch words); the inverse-CDF codes equal
to the torch path's on many keys and rows, a mismatch allowed only where a uniform sits within float32
rounding of a cumulative-sum boundary (the near-boundary case the stream names); whole scheduler steps give
the torch path's tokens; and the policy that picks the kernels.
"""

from __future__ import annotations

import copy
import dataclasses
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from difforge.devices.cuda import TRITON_ENV, CUDABackend
from difforge.models.ursa.config import SchedulerConfig
from difforge.models.ursa.sampling import GUMBEL_MAX, Draws, PhiloxDraws
from difforge.models.ursa.scheduler import DFMScheduler, MetricPath, fused_rate_kernels
from difforge.runtime import philox

from .conftest import interpreted

CPU = torch.device("cpu")
#: Keys below and above 2**31 (a 32-bit word's sign bit) and of a seed above 2**32.
SEEDS = (0, 1, 7, 2**31 - 1, 2**31, 2**32 - 1, 2**32 + 5, 2**63 - 1, 12345, 987654321, 3, 99, 2**40, 17, 2**33, 424242)


@pytest.fixture
def ts() -> ModuleType:
    return interpreted("triton_sampler")


def _key(seed: int) -> tuple[int, int]:
    return seed & philox.MASK32, (seed >> 32) & philox.MASK32


@pytest.mark.parametrize("seed", SEEDS[:6])
def test_uniforms_are_bitwise_the_torch_stream(ts: ModuleType, seed: int) -> None:
    got = ts.uniform((3, 37), 11, 2, *_key(seed), CPU)  # 37 columns: a ragged last counter
    want = philox.uniform_from_words(philox.grid_words(torch.arange(3), 37, 11, 2, *_key(seed)))
    assert torch.equal(got, want)


def _near_boundary(x: torch.Tensor, row: int, c2: int, c3: int, key: tuple[int, int], logits: bool) -> bool:
    """Whether either uniform of ``row`` sits within float32 rounding (relative 1e-5) of a boundary of its
    cumulative sum, recomputed in float64 from the float32 weights the torch path uses."""
    w = (x[row].softmax(-1, dtype=torch.float32) if logits else x[row].float()).double()
    size = philox.cdf_block_size(w.numel())
    blocks = -(-w.numel() // size)
    w = torch.nn.functional.pad(w, (0, blocks * size - w.numel())).view(blocks, size)
    u0, u1 = (((v >> 8) | 1) * 2.0**-24 for v in philox.philox_words(0, row, c2, c3, *key)[:2])
    cb = w.sum(-1).cumsum(0)
    b = int((cb < u0 * cb[-1]).sum().clamp(max=blocks - 1))
    inner = w[b].cumsum(0)
    return bool(((cb - u0 * cb[-1]).abs() <= 1e-5 * cb[-1]).any() or ((inner - u1 * inner[-1]).abs() <= 1e-5 * inner[-1]).any())


@pytest.mark.parametrize("logits", [True, False])
def test_codes_are_the_torch_paths_on_many_seeds_but_near_boundaries(ts: ModuleType, logits: bool) -> None:
    rows, k, mismatched = 16, 300, 0  # 300 codes: blocks of 32, the last one ragged
    for i, seed in enumerate(SEEDS):
        gen = torch.Generator().manual_seed(i)
        x = torch.randn(rows, k, generator=gen) * 4 if logits else torch.rand(rows, k, generator=gen) ** 4
        key = _key(seed)
        got = ts.inverse_cdf(x, i + 1, 3, *key, logits=logits)
        want = philox.inverse_cdf(x, i + 1, 3, *key, logits=logits)
        for r in (got != want).nonzero().flatten().tolist():
            assert _near_boundary(x, r, i + 1, 3, key, logits), (seed, r, int(got[r]), int(want[r]))
            mismatched += 1
    assert mismatched <= 2  # of 256 draws


def test_half_inputs_subsets_and_edge_rows(ts: ModuleType) -> None:
    gen = torch.Generator().manual_seed(4)
    w = torch.rand(12, 100, generator=gen).half()
    assert torch.equal(ts.inverse_cdf(w, 5, 1, 8, 9), philox.inverse_cdf(w, 5, 1, 8, 9))
    whole = ts.inverse_cdf(w, 5, 1, 8, 9)
    sub = torch.tensor([2, 7, 11])
    assert torch.equal(ts.inverse_cdf(w[sub], 5, 1, 8, 9, rows=sub), whole[sub])  # a row's draw is its own
    odd = torch.zeros(3, 300)
    odd[1, 7] = 1.0
    odd[2] = float("nan")
    codes = ts.inverse_cdf(odd, 0, 1, 2, 3)
    assert codes[0] == 0 and codes[1] == 7 and 0 <= int(codes[2]) < 300
    assert ts.inverse_cdf(torch.empty(0, 300), 0, 1, 2, 3).shape == (0,)
    single = ts.inverse_cdf(torch.ones(4, 1), 0, 1, 2, 3)
    assert single.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("alpha", [0.9, None])  # the metric path and the mixture path
def test_scheduler_steps_give_the_torch_paths_tokens(ts: ModuleType, alpha: float | None) -> None:
    k = 64
    gen = torch.Generator().manual_seed(1)
    scheduler = DFMScheduler(SchedulerConfig(alpha=alpha, c=3.0, shift=1.0, eps=1e-5),
                             torch.randn(k, 8, generator=gen).half())
    logits, x = torch.randn(2, 12, k, generator=gen) * 3, torch.randint(0, k, (2, 12), generator=gen)
    fused_scheduler = copy.copy(scheduler)
    if isinstance(scheduler.path, MetricPath):  # the fused rate too, as MetricPath.to binds it on such a device
        fused_scheduler.path = dataclasses.replace(scheduler.path, kernels=ts.KERNELS)
    for sparse in (False, True):
        fused = Draws(philox=PhiloxDraws(5, CPU, sparse=sparse, fused=True))
        plain = Draws(philox=PhiloxDraws(5, CPU, sparse=sparse, fused=False))
        assert fused.philox is not None and fused.philox.kernels is ts.KERNELS
        for i in (3, 7):
            a = fused_scheduler.step(logits.clone(), i, 8, x, fused)
            b = scheduler.step(logits.clone(), i, 8, x, plain)
            assert torch.equal(a, b), (sparse, i)
            assert i == 7 or int((a != x).sum()) > 0  # some tokens jumped


def test_the_backend_decides_where_the_kernels_run(ts: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRITON_ENV, raising=False)
    assert PhiloxDraws(1, CPU).kernels is None  # the CPU never
    assert PhiloxDraws(1, CPU, fused=True, sampler=GUMBEL_MAX).kernels is None  # inverse-CDF only
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(CUDABackend, "triton_usable", staticmethod(lambda: False))
    assert PhiloxDraws(1, cuda).kernels is None
    monkeypatch.setattr(CUDABackend, "triton_usable", staticmethod(lambda: True))
    assert PhiloxDraws(1, cuda).kernels is ts.KERNELS
    monkeypatch.setenv(TRITON_ENV, "rotary,swiglu")
    assert PhiloxDraws(1, cuda).kernels is None
    assert PhiloxDraws(1, cuda, fused=False).kernels is None


def test_the_step_benchmark_counts_far_fewer_operators_fused(ts: ModuleType) -> None:
    """The figure that bounds an eager step on an accelerator: operators (kernel launches) per step.  The
    fused count here still includes the interpreter's own tensor copies; on a GPU it is lower."""
    from difforge.models.ursa.step_bench import time_step

    torch_draws = time_step(CPU, torch.float32, tokens=16, codebook=300, repeats=1, fused=False)
    fused = time_step(CPU, torch.float32, tokens=16, codebook=300, repeats=1, fused=True)
    assert not torch_draws["fused"] and fused["fused"]
    assert fused["ops_per_step"] * 4 < torch_draws["ops_per_step"], (fused, torch_draws)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_metric_rate_rounds_as_the_torch_rate(ts: ModuleType, dtype: torch.dtype) -> None:
    """Every rounding step of the torch rate is replayed; the 8-term codebook product and the softmax sums are
    reduced in another order (and numpy's exp stands in for expf here), so a rate may differ by an ulp of the
    logits dtype - in half precision rarely, in float32 (no coarse rounding to hide it) often."""
    gen = torch.Generator().manual_seed(3)
    k = 300
    path = MetricPath.build(torch.randn(k, 8, generator=gen).half(), 0.9, 3.0, 1e-5)
    logits = torch.randn(2, 9, k, generator=gen).to(dtype)  # 18 rows: a ragged last program of 4
    x1, xt = torch.randint(0, k, (2, 9), generator=gen), torch.randint(0, k, (2, 9), generator=gen)
    want = path.rate(logits.clone(), xt, x1, 0.4)
    e = F.normalize(path.emb[x1], dim=-1, eps=path.eps)
    got = ts.metric_rate(e, e.square().sum(-1, True), path.pair_dist(path.emb[xt], path.emb[x1]), path.emb_sumsq,
                         path.emb_mul2t, -path.beta(0.4), path.d_beta(0.4), dtype)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    else:
        ulp = (torch.nextafter(want, torch.full_like(want, float("inf"))).float() - want.float()).abs()
        assert bool(((got.float() - want.float()).abs() <= ulp).all())
        assert (got == want).float().mean() > 0.99
    fused = dataclasses.replace(path, kernels=ts.KERNELS)
    assert torch.equal(fused.rate(logits.clone(), xt, x1, 0.4), got)  # what a step on such a device computes


def test_the_backend_decides_where_the_rate_kernel_runs(ts: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRITON_ENV, raising=False)
    assert fused_rate_kernels(CPU) is None
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(CUDABackend, "triton_usable", staticmethod(lambda: True))
    assert fused_rate_kernels(cuda) is ts.KERNELS
    monkeypatch.setenv(TRITON_ENV, "sampler")
    assert fused_rate_kernels(cuda) is None
    path = MetricPath.build(torch.randn(16, 8).half(), 0.9, 3.0, 1e-5)
    assert path.kernels is None and path.to(CPU).kernels is None
    bound = dataclasses.replace(path, kernels=ts.KERNELS)
    assert copy.deepcopy(bound).kernels == ts.KERNELS  # plain functions: a bound path still deep-copies
