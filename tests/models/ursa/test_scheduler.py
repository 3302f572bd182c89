"""DFM scheduler: timesteps, beta maths, the random stream, metric and mixture paths."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from difforge.models.ursa import DFMScheduler, SchedulerConfig, timestep_t
from difforge.models.ursa.sampling import categorical, skip_categorical

K, D = 16, 4
CODEBOOK = torch.randn(K, D, generator=torch.Generator().manual_seed(1))
METRIC = SchedulerConfig(alpha=0.9, c=3.0)


def make(cfg: SchedulerConfig = METRIC) -> DFMScheduler:
    return DFMScheduler(cfg, CODEBOOK)


def test_timesteps_shift_one_and_three() -> None:
    assert timestep_t(0, 25) == 0.0
    assert timestep_t(1, 25) == 0.040000000000000036  # spec example: 1 - (1 - 1/25), in doubles
    assert timestep_t(24, 25) < 1
    s, sigma = 3.0, 1 - 2 / 4
    assert timestep_t(2, 4, 3.0) == 1 - s * sigma / (1 + (s - 1) * sigma)
    ts = make().timesteps(25)
    assert [t < 0.9 for t in ts].count(False) == 2  # default trunc leaves the last two steps unguided


def test_beta_and_dbeta() -> None:
    path = make().path
    assert path.beta(0.5) == 3.0 * 1.0**0.9
    assert path.d_beta(0.0) == 0
    t = 0.3
    assert path.d_beta(t) == 3.0 * 0.9 * t ** (0.9 - 1) / (1 - t) ** 1.9


def test_codebook_is_float16_and_normalised() -> None:
    path = make().path
    assert path.emb.dtype == torch.float16
    torch.testing.assert_close(path.emb.float().norm(dim=-1), torch.ones(K), atol=2e-3, rtol=0)


def test_metric_velocity_small_case() -> None:
    path = make().path
    logits = torch.randn(1, 3, K, generator=torch.Generator().manual_seed(2))
    x_t = torch.tensor([[0, 5, 9]])
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    v = path.velocity(logits.clone(), x_t, 0.4, g1)
    x1 = torch.multinomial(logits.softmax(-1).flatten(0, 1), 1, generator=g2).view(1, 3)
    e = path.emb.float()
    e1 = F.normalize(e[x1], dim=-1)
    dist = (e1[..., None, :] - e[None, None]).pow(2).sum(-1)  # [1, 3, K]
    d0 = (e[x_t] - e1).pow(2).sum(-1, keepdim=True)
    beta, dbeta = path.beta(0.4), path.d_beta(0.4)
    want = dbeta * torch.softmax(-beta * dist, -1) * torch.relu(d0 - dist)
    torch.testing.assert_close(v, want, rtol=2e-2, atol=2e-3)
    assert (v >= 0).all() and (v[dist > d0 + 1e-2] == 0).all()  # no rate towards codes farther than x_t


def test_first_step_changes_nothing_but_consumes_randomness() -> None:
    sched = make()
    x = torch.randint(0, K, (2, 6))
    g = torch.Generator().manual_seed(3)
    before = g.get_state().clone()
    out = sched.step(torch.randn(2, 6, K), 0, 10, x, g)
    assert torch.equal(out, x)
    assert not torch.equal(before, g.get_state())
    g2 = torch.Generator().manual_seed(3)
    sched.skip_first_step((2, 6, K), torch.float32, g2)
    assert torch.equal(g.get_state(), g2.get_state())  # the shortcut consumes exactly the same draws


def test_generator_consumption_order() -> None:
    """Non-final step = categorical(B*N x K), uniform(B*N), categorical(jumped rows)."""
    sched = make()
    z, x = torch.randn(1, 5, K) * 4, torch.randint(0, K, (1, 5))
    got = sched.step(z.clone(), 6, 10, x, torch.Generator().manual_seed(11))
    g = torch.Generator().manual_seed(11)
    probs = z.softmax(-1)
    x1 = torch.multinomial(probs.flatten(0, 1), 1, generator=g).view(1, 5)
    v = sched.path.velocity(z.clone(), x, sched.t(6, 10), torch.Generator().manual_seed(11))
    u = torch.empty(1, 5).uniform_(generator=g)
    v.scatter_(-1, x[..., None], 0)
    dt = sched.t(7, 10) - sched.t(6, 10)
    jump = u < 1 - torch.exp(-dt * v.sum(-1))
    want = x.clone()
    want[jump] = torch.multinomial(v[jump], 1, generator=g)[:, 0]
    assert x1.shape == (1, 5)
    assert torch.equal(got, want)
    final = sched.step(z.clone(), 9, 10, x, torch.Generator().manual_seed(4))
    assert torch.equal(final, torch.multinomial(probs[0], 1, generator=torch.Generator().manual_seed(4)).T)


def test_device_style_categorical_equals_multinomial() -> None:
    p = torch.rand(40, K)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a = categorical(p, g1)
    q = torch.empty_like(p).exponential_(1, generator=g2)
    assert torch.equal(a, (p / q).argmax(-1)) and torch.equal(g1.get_state(), g2.get_state())
    g3 = torch.Generator().manual_seed(5)
    skip_categorical((40, K), torch.float32, g3)
    assert torch.equal(g3.get_state(), g1.get_state())


def test_mixture_path_velocity_and_step() -> None:
    sched = make(SchedulerConfig(alpha=None))
    assert not sched.is_metric
    z = torch.randn(1, 4, K)
    x1 = torch.multinomial(z.softmax(-1)[0], 1, generator=torch.Generator().manual_seed(9))[:, 0]
    v = sched.path.velocity(z.clone(), torch.zeros(1, 4, dtype=torch.long), 0.5, torch.Generator().manual_seed(9))
    assert torch.equal(v[0].argmax(-1), x1) and torch.allclose(v.sum(-1), torch.full((1, 4), 2.0))
    x = torch.randint(0, K, (1, 4))
    out = sched.step(z * 50, 8, 10, x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == torch.int64
    noisy = sched.add_noise(torch.full((200,), 3), 0.999, torch.Generator().manual_seed(0))
    assert (noisy == 3).float().mean() > 0.9  # t near 1 keeps the target almost everywhere
