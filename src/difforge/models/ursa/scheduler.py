"""Discrete flow matching sampler (URSA's ``KineticOptimalScheduler``) on the metric or mixture path.

The random stream is the contract: for each non-final step the reference draws (1) a categorical
sample x1 from softmax(logits), (2) one uniform per token, (3) a categorical sample for the tokens
that jump; the final step draws only (1).  Operation order below follows the reference wherever it
decides rounding - notably the distance buffer is written into the logits tensor's own storage (so it
takes the logits dtype) while the codebook terms stay float16.

Every ``generator`` argument also takes a :class:`~.sampling.Draws` (pinned host draws, or the
portable Philox stream).  On the Philox stream the same three draws are inverse-CDF samples (x1 from
``softmax(logits)`` in float32, the jump from the rates) and uniforms, all addressed by (step, draw,
position), and the jump step samples every row and keeps the jumping ones with ``torch.where``: no
data-dependent shape, no host sync.  The reference stream keeps
the reference's ``categorical(v[jump])``, whose draw count - and therefore the rest of the CPU stream -
depends on how many tokens jump, so that one host sync per step stays there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ...runtime.stages import SAMPLER, timed_stage
from .config import SchedulerConfig
from .sampling import DRAW_JUMP, DRAW_X1, Draws, as_draws, categorical, skip_categorical, uniform

if TYPE_CHECKING:
    from ...ops.triton_sampler import SamplerKernels


def fused_rate_kernels(device: torch.device) -> SamplerKernels | None:
    """:mod:`difforge.ops.triton_sampler`'s kernels when ``device``'s backend offers the fused rate, else None."""
    from ...devices import BACKENDS
    from ...devices.cuda import TritonKernel

    backend = BACKENDS.get(device.type)
    if backend is None or not isinstance(backend(index=device.index).fused_kernel("rate"), TritonKernel):
        return None
    from ...ops import triton_sampler

    return triton_sampler.KERNELS


def timestep_t(i: int, num_steps: int, shift: float = 1.0) -> float:
    """Continuous time of step ``i``: ``1 - s*sigma / (1 + (s-1)*sigma)`` with ``sigma = 1 - i/N``."""
    sigma = 1 - i / num_steps
    return 1 - shift * sigma / (1 + (shift - 1) * sigma)


@dataclass
class MetricPath:
    """Metric-induced path over an L2-normalised float16 codebook.

    ``kernels``: the device's fused rate kernel (:func:`difforge.ops.triton_sampler.metric_rate`), set by
    :meth:`to` when the device's backend offers ``fused_kernel("rate")`` (CUDA with triton, unless
    ``DIFFORGE_TRITON_KERNELS`` leaves it out): the rates in one launch instead of about a dozen passes over
    ``[B, N, K]``.  It rounds every step as :meth:`rate` does, but sums the codebook product in float32 in
    order and the softmax in Triton's order, so a rate can differ by an ulp of the logits dtype.  Chosen per
    device, so a run and validation's teacher-forced step on that device compute the same rates.
    """

    emb: torch.Tensor  # [K, D] normalised codebook (float16)
    emb_sumsq: torch.Tensor  # [K]
    emb_mul2t: torch.Tensor  # [D, K] = 2 * emb^T
    alpha: float
    c: float
    eps: float
    kernels: SamplerKernels | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, codebook: torch.Tensor, alpha: float, c: float, eps: float) -> MetricPath:
        emb = F.normalize(codebook, dim=-1, eps=eps)
        return cls(emb, emb.square().sum(-1), emb.mul(2).T.contiguous(), float(alpha), float(c), float(eps))

    def to(self, device: torch.device) -> MetricPath:
        return MetricPath(self.emb.to(device), self.emb_sumsq.to(device), self.emb_mul2t.to(device), self.alpha,
                          self.c, self.eps, fused_rate_kernels(torch.device(device)))

    def beta(self, t: float) -> float:
        return self.c * (t / (1 - t)) ** self.alpha

    def d_beta(self, t: float) -> float:
        numerator = self.c * self.alpha * (t ** (self.alpha - 1)) if t > 0 else 0
        return numerator / (1 - t) ** (self.alpha + 1)

    def dist_to_codebook(self, e: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``|e'|^2 + |E_k|^2 - e'.(2E_k)`` with e' = e renormalised; written into ``out`` when given."""
        e = F.normalize(e, dim=-1, eps=self.eps)
        return torch.add(e.square().sum(-1, True), self.emb_sumsq, out=out).sub_(e @ self.emb_mul2t)

    def pair_dist(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = F.normalize(a, dim=-1, eps=self.eps), F.normalize(b, dim=-1, eps=self.eps)
        return a.sub(b).abs_().square_().sum(-1, keepdim=True)

    def velocity(
        self, logits: torch.Tensor, x_t: torch.Tensor, t: float, generator: torch.Generator | Draws
    ) -> torch.Tensor:
        """Rate of jumping to each code; overwrites ``logits`` (it becomes the distance buffer)."""
        return self.rate(logits, x_t, categorical(logits.softmax(-1), generator), t)

    def rate(self, logits: torch.Tensor, x_t: torch.Tensor, x1: torch.Tensor, t: float) -> torch.Tensor:
        """:meth:`velocity` for a drawn ``x1``; overwrites ``logits`` (the fused kernel leaves them as they are)."""
        d_beta = self.d_beta(t)
        emb_x1 = self.emb[x1]
        if self.kernels is not None:
            e = F.normalize(emb_x1, dim=-1, eps=self.eps)
            return self.kernels.metric_rate(e, e.square().sum(-1, True), self.pair_dist(self.emb[x_t], emb_x1),
                                            self.emb_sumsq, self.emb_mul2t, -self.beta(t), d_beta, logits.dtype)
        dist = self.dist_to_codebook(emb_x1, out=logits)
        prob = dist.mul(-self.beta(t)).softmax(-1)
        d0 = self.pair_dist(self.emb[x_t], emb_x1)
        dist = torch.relu_(dist.sub_(d0).neg_())
        return prob.mul_(d_beta).mul_(dist)

    def add_noise(self, x1: torch.Tensor, t: float, generator: torch.Generator) -> torch.Tensor:
        """Sample x_t ~ softmax(-beta(t) * D(E[x1], .)), wholly in the codebook dtype."""
        return categorical(self.dist_to_codebook(self.emb[x1]).mul_(-self.beta(t)).softmax(-1), generator)


@dataclass
class MixturePath:
    """Uniform-noise mixture path (``alpha: null``)."""

    codebook_size: int

    def to(self, device: torch.device) -> MixturePath:
        return self

    def velocity(
        self, logits: torch.Tensor, x_t: torch.Tensor, t: float, generator: torch.Generator | Draws
    ) -> torch.Tensor:
        return self.rate(logits, x_t, categorical(logits.softmax(-1), generator), t)

    def rate(self, logits: torch.Tensor, x_t: torch.Tensor, x1: torch.Tensor, t: float) -> torch.Tensor:
        """:meth:`velocity` for a drawn ``x1``; overwrites ``logits``."""
        return logits.zero_().scatter_(-1, x1.unsqueeze(-1), 1 / (1 - t))

    def add_noise(self, x1: torch.Tensor, t: float, generator: torch.Generator) -> torch.Tensor:
        """Keep x1 where a uniform draw is >= 1 - t, else a uniformly random code."""
        tt = torch.tensor(t, dtype=torch.float16)  # the reference keeps t in the codebook dtype here
        x0 = torch.empty(x1.shape, dtype=x1.dtype).random_(to=self.codebook_size, generator=generator)
        u = torch.empty(x1.shape, dtype=torch.float16).uniform_(generator=generator)
        keep_noise = u.lt(1 - tt).to(x1.device)
        return x0.to(x1.device).where(keep_noise, x1)


class DFMScheduler:
    """Step rule and timesteps.  ``codebook`` is ``scheduler_model.pth``'s ``path.emb`` (kept float16)."""

    def __init__(self, cfg: SchedulerConfig, codebook: torch.Tensor) -> None:
        self.config = cfg
        self.codebook_size = int(codebook.shape[0])
        self.path: MetricPath | MixturePath
        if cfg.alpha is None:
            self.path = MixturePath(self.codebook_size)
        else:
            self.path = MetricPath.build(codebook.to(torch.float16), cfg.alpha, cfg.c, cfg.eps)  # type: ignore[arg-type]

    @property
    def is_metric(self) -> bool:
        return isinstance(self.path, MetricPath)

    def to(self, device: torch.device) -> DFMScheduler:
        self.path = self.path.to(device)
        return self

    def t(self, i: int, num_steps: int) -> float:
        return timestep_t(i, num_steps, self.config.shift)

    def timesteps(self, num_steps: int) -> list[float]:
        return [self.t(i, num_steps) for i in range(num_steps)]

    @timed_stage(SAMPLER)
    def step(
        self, logits: torch.Tensor, i: int, num_steps: int, x: torch.Tensor, generator: torch.Generator | Draws
    ) -> torch.Tensor:
        """Tokens after step ``i``.  ``logits [B, N, K]`` is consumed (overwritten); ``x [B, N]`` is not."""
        draws = as_draws(generator)
        if draws.philox is not None:
            return self._philox_step(logits, i, num_steps, x, draws)
        if i == num_steps - 1:
            return categorical(logits.softmax(-1), generator)
        t = self.t(i, num_steps)
        v = self.path.velocity(logits, x, t, generator)
        u = uniform(tuple(x.shape), v.dtype, x.device, generator)
        thresh = self.jump_probability(v, x, i, num_steps)
        out, jump = x.clone(), u < thresh
        out[jump] = categorical(v[jump], generator)
        return out

    def jump_probability(self, v: torch.Tensor, x: torch.Tensor, i: int, num_steps: int) -> torch.Tensor:
        """Probability ``[B, N]`` that each token leaves its code during step ``i``: ``1 - exp(-dt * total rate
        to the other codes)``.  Zeroes ``v``'s rate of staying (``v[..., x]``) in place, so ``v`` is then the
        jump's categorical weights.  One function for both streams, so validation's teacher-forced sampler
        check (``URSAProbe.sampler_step``) computes exactly what a run computes."""
        dt = self.t(i + 1, num_steps) - self.t(i, num_steps)
        return 1 - v.scatter_(-1, x[..., None], 0).sum(-1).mul_(-dt).exp_()

    def _philox_step(self, logits: torch.Tensor, i: int, num_steps: int, x: torch.Tensor, draws: Draws) -> torch.Tensor:
        """:meth:`step` on the Philox stream: x1 drawn from the logits (inverse-CDF over their float32 softmax,
        or Gumbel-max with no softmax), and a jump step that draws every row and keeps the jumping ones with
        ``torch.where`` (static shapes, no host sync) - on the host (``sparse``) only the jumping rows, which
        are the same numbers."""
        ph = draws.philox
        assert ph is not None
        x1 = ph.categorical_logits(logits, i, DRAW_X1)  # the logits are left for rate() to overwrite
        if i == num_steps - 1:
            return x1
        v = self.path.rate(logits, x, x1, self.t(i, num_steps))
        u = ph.uniform((x.shape[0], x.shape[1]), i)
        jump = u < self.jump_probability(v, x, i, num_steps)
        if ph.sparse:  # the host: only the jumping rows, by their row numbers - the same numbers as drawing all
            index = jump.flatten().nonzero().squeeze(1)
            out = x.clone()
            out.view(-1)[index] = ph.categorical_weights(v.flatten(0, -2)[index], i, DRAW_JUMP, rows=index)
            return out
        # every row drawn; a row that cannot jump (all-zero rate) gives some index, discarded by the where
        return torch.where(jump, ph.categorical_weights(v, i, DRAW_JUMP), x)

    @timed_stage(SAMPLER)
    def skip_first_step(
        self, shape: tuple[int, int, int], dtype: torch.dtype, generator: torch.Generator | Draws
    ) -> None:
        """Metric path, step 0 (t = 0): no token can move (the rate is exactly 0), so only advance the stream.

        On the reference stream the three draws are: the x1 categorical over ``[B*N, K]``, ``B*N``
        uniforms, and a categorical over the jumping rows - zero rows, so nothing drawn.  The Philox
        stream has nothing to advance: step 1's draws are addressed by their own step number.
        """
        if not self.is_metric:
            raise ValueError("skip_first_step holds only on the metric path.")
        draws = as_draws(generator)
        if draws.philox is not None:
            return
        b, n, k = shape
        skip_categorical((b * n, k), dtype, draws)
        torch.empty((b, n), dtype=dtype).uniform_(generator=draws.generator)

    def add_noise(self, x1: torch.Tensor, t: float, generator: torch.Generator) -> torch.Tensor:
        return self.path.add_noise(x1, t, generator)
