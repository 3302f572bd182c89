"""Random draws for URSA, from one of two streams (the backend's default, or the one a run names).

``reference`` - the reference's own stream, a CPU ``torch.Generator``.  On the CPU these are the very
calls the reference makes, so the random stream matches it bit for bit.  On an accelerator the
*draws* still come from the CPU generator in the same shapes and dtypes (then move to the device), so
a run consumes the stream exactly as a CPU run would: categorical sampling uses the identity
torch.multinomial itself uses for one sample per row, ``argmax(p / q)`` with ``q ~ Exp(1)`` drawn as
one ``exponential_`` over the probability tensor.  That contract has a price on accelerators: every
non-final step draws ``B*N*K`` exponentials on the host (65.5M at 512x512 with a 64000-code book),
which takes longer than the transformer forward, and the jump step's draw count must reach the host
(one sync per step).  ``pin`` (exact) puts the host draws in pinned memory, so their copy to the
device is asynchronous.

``philox`` - the portable stream (:class:`PhiloxDraws`, :mod:`difforge.runtime.philox`), the default
on every accelerator: Philox4x32-10 words computed on the run device from the counter
``(column block, row, step, draw)`` under the key ``seed``, so the same seed gives the same numbers on
every backend, with no host draw, no host sync and static shapes.  Categorical sampling is inverse-CDF
(:data:`INVERSE_CDF`, :func:`~difforge.runtime.philox.inverse_cdf`): two uniforms per token pick a
block of the codebook, then a code in it, from float32 cumulative sums - ``softmax(logits)`` for x1,
the rates themselves for the jump - exact in distribution with ``2*B*N`` words a draw instead of
``B*N*K``.  The jump step samples every row and keeps the jumping ones with ``torch.where``.  The
tokens are not the reference stream's; they are the same on every device for a seed up to
near-boundary cases: a uniform that falls within float32 rounding of a cumulative-sum boundary, where
another device's softmax or summation order (or a compiled kernel's) may land on the neighbouring code.
:data:`GUMBEL_MAX` (``argmax(logits + G)``, one word per token and code, no softmax; near-tied logits
are its boundary case) is kept as the other sampler, for comparison (``URSAPipeline.philox_sampler``);
it is not a run switch, and it gives other tokens.

Counters: every draw of a run has its own ``(step, draw)`` pair in counter words 2 and 3 - the initial
codes ``(0, DRAW_INIT)``, and per step ``(i, DRAW_X1)``, ``(i, DRAW_JUMP_U)``, ``(i, DRAW_JUMP)`` - so no
two draws share a word; inside a draw, words 0 and 1 are the column block and the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, partial
from typing import TYPE_CHECKING

import torch

from ...runtime import philox
from ...runtime.philox import BlockFn, Word
from ...runtime.stages import DRAWS, timed_stage

if TYPE_CHECKING:
    from ...ops.triton_sampler import SamplerKernels

#: Philox counter word 3: which draw of a step (word 2 is the step; the initial codes are step 0's).
DRAW_INIT, DRAW_X1, DRAW_JUMP_U, DRAW_JUMP = 0, 1, 2, 3
#: Counters per eager Gumbel-max block (seven int64 buffers of this many words): small enough to stay in
#: a CPU's cache, large enough that an accelerator's launches stay few.
HOST_CHUNK, DEVICE_CHUNK = 1 << 16, 1 << 22
#: Words below which a grid's Philox rounds run functionally (fewer ops) rather than in place.
SMALL_GRID = 1 << 16
#: The Philox stream's categorical samplers: inverse-CDF (the default) and Gumbel-max (for comparison).
INVERSE_CDF, GUMBEL_MAX = "inverse-cdf", "gumbel-max"
PHILOX_SAMPLERS = (INVERSE_CDF, GUMBEL_MAX)


def _inverse_cdf_fn(x: torch.Tensor, rows: torch.Tensor, c2: Word, c3: Word, k0: Word, k1: Word,
                    logits: bool) -> torch.Tensor:
    block = philox.inverse_cdf_logits_block if logits else philox.inverse_cdf_block
    return block(x, rows, c2, c3, k0, k1, inplace=False)


def _gumbel_max_fn(x: torch.Tensor, rows: torch.Tensor, c2: Word, c3: Word, k0: Word, k1: Word,
                   logits: bool) -> torch.Tensor:
    return philox.gumbel_argmax_block(x if logits else x.float().log(), rows, c2, c3, k0, k1, inplace=False)


def sampler_block(sampler: str) -> BlockFn:
    """The functional block of ``sampler``, what ``cfg.compile`` compiles: ``fn(x, rows, c2, c3, k0, k1, logits)``
    draws one code per row of ``x`` (logits when ``logits``, else non-negative weights)."""
    if sampler not in PHILOX_SAMPLERS:
        raise ValueError(f"Unknown Philox sampler {sampler!r}; expected one of {', '.join(PHILOX_SAMPLERS)}.")
    return _inverse_cdf_fn if sampler == INVERSE_CDF else _gumbel_max_fn


@dataclass(frozen=True)
class PhiloxDraws:
    """The portable stream of one run: every draw is a function of (seed, step, draw, position).

    ``sampler``: :data:`INVERSE_CDF` (default) or :data:`GUMBEL_MAX`.  ``block_fn``: a compiled
    :func:`sampler_block` of that sampler (``cfg.compile``), called with the counter and key words as
    0-dim device tensors so steps and seeds reuse its graph.  ``chunk``: counters per eager Gumbel-max
    block (the inverse-CDF draw needs no blocks).  ``sparse`` (the host, where reading a mask costs no
    device sync): the jump step draws the jumping rows only - the same numbers, since a row's draw is
    addressed by its index; an accelerator draws every row and keeps static shapes.

    ``fused``: whether the inverse-CDF draws and the uniforms run as the device's fused sampler kernels
    (:mod:`difforge.ops.triton_sampler`, one launch a draw): None (default) asks the device's backend
    (``fused_kernel("sampler")``: CUDA with triton, unless ``DIFFORGE_TRITON_KERNELS`` leaves it out);
    True or False decides (tests, benchmarks).  Where used it wins over ``block_fn``: one launch beats a
    compiled graph of several, and both differ from the eager torch draw only at near-boundary uniforms.
    """

    seed: int
    device: torch.device
    chunk: int = HOST_CHUNK
    block_fn: BlockFn | None = None
    sparse: bool = False
    sampler: str = INVERSE_CDF
    fused: bool | None = None

    def __post_init__(self) -> None:
        sampler_block(self.sampler)  # refuse an unknown name here, not at the first draw

    @cached_property
    def kernels(self) -> SamplerKernels | None:
        """The fused sampler kernels this stream draws with (see ``fused``), or None for the torch draws."""
        if self.sampler != INVERSE_CDF or self.fused is False:
            return None
        if self.fused is None:
            from ...devices import BACKENDS
            from ...devices.cuda import TritonKernel

            backend = BACKENDS.get(self.device.type)
            if backend is None or not isinstance(backend(index=self.device.index).fused_kernel("sampler"), TritonKernel):
                return None
        from ...ops import triton_sampler

        return triton_sampler.KERNELS

    @property
    def key(self) -> tuple[int, int]:
        return self.seed & philox.MASK32, (self.seed >> 32) & philox.MASK32

    def _grid(self, rows: int, cols: int, step: int, draw: int) -> torch.Tensor:
        """Words ``[rows, cols]`` of counter ``(col // 4, row, step, draw)`` (in place only for large grids: on a
        small one the ~200 ops' fixed cost dominates, and the functional form has fewer)."""
        index = torch.arange(rows, dtype=torch.int64, device=self.device)
        return philox.grid_words(index, cols, step, draw, *self.key, inplace=rows * cols >= SMALL_GRID)

    @timed_stage(DRAWS)
    def codes(self, shape: tuple[int, int], codebook_size: int) -> torch.Tensor:
        """Uniform initial codes ``[B, N]`` in ``[0, codebook_size)`` (step 0's ``DRAW_INIT`` words)."""
        return philox.integers_from_words(self._grid(*shape, 0, DRAW_INIT), codebook_size)

    @timed_stage(DRAWS)
    def uniform(self, shape: tuple[int, int], step: int) -> torch.Tensor:
        """float32 uniforms in (0, 1) of ``shape`` ``[B, N]`` for ``step``'s jump decision."""
        if self.kernels is not None:
            return self.kernels.uniform(shape, step, DRAW_JUMP_U, *self.key, self.device)
        return philox.uniform_from_words(self._grid(*shape, step, DRAW_JUMP_U))

    @timed_stage(DRAWS)
    def categorical_logits(self, logits: torch.Tensor, step: int, draw: int) -> torch.Tensor:
        """One code per row of softmax(``logits [..., K]``): int64 ``logits.shape[:-1]``; ``logits`` is not changed."""
        return self._draw(logits.flatten(0, -2), step, draw, None, True).view(logits.shape[:-1])

    @timed_stage(DRAWS)
    def categorical_weights(
        self, weights: torch.Tensor, step: int, draw: int, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One code per row of non-negative ``weights [..., K]`` (zero weights never drawn); int64 ``weights.shape[:-1]``.

        ``rows``: the row numbers of ``weights``' rows when it holds a subset of them (default: all, in order).
        A row of zeros has no code to draw: it gives some index, which the jump step discards.  The
        inverse-CDF draw leaves ``weights`` as they are; the eager Gumbel-max draw overwrites float32
        weights with their log.
        """
        return self._draw(weights.flatten(0, -2), step, draw, rows, False).view(weights.shape[:-1])

    def _draw(self, x: torch.Tensor, step: int, draw: int, rows: torch.Tensor | None, logits: bool) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.inverse_cdf(x, step, draw, *self.key, rows=rows, logits=logits)
        words: tuple[Word, ...] = (step, draw, *self.key)
        fn = None
        if self.block_fn is not None:
            words = tuple(torch.full((), v, dtype=torch.int64, device=self.device) for v in words)
            fn = partial(self.block_fn, logits=logits)
        if self.sampler == INVERSE_CDF:
            return philox.inverse_cdf(x, *words, block_fn=fn, rows=rows, logits=logits)
        if fn is None:
            scores = x if logits else x.float().log_()
            return philox.gumbel_argmax(scores, *words, chunk=self.chunk, rows=rows)
        return philox.gumbel_argmax(x, *words, chunk=DEVICE_CHUNK, block_fn=fn, rows=rows)


@dataclass(frozen=True)
class Draws:
    """Where one run's random numbers come from (see the module docstring): the reference's CPU
    ``generator`` (host draws, pinned when ``pin``), or the portable ``philox`` stream."""

    generator: torch.Generator | None = None
    pin: bool = False
    philox: PhiloxDraws | None = None


def as_draws(generator: torch.Generator | Draws) -> Draws:
    """Accept a bare generator (the reference's CPU stream) wherever :class:`Draws` is taken."""
    return generator if isinstance(generator, Draws) else Draws(generator)


def _host_empty(shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """An uninitialised host tensor, page-locked when asked (falls back to pageable if pinning fails)."""
    if pin:
        try:
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        except RuntimeError:  # no pinning support on this accelerator: a pageable copy is still correct
            pass
    return torch.empty(shape, dtype=dtype)


@timed_stage(DRAWS)
def categorical(prob: torch.Tensor, generator: torch.Generator | Draws) -> torch.Tensor:
    """One code per row of ``prob [..., K]`` (unnormalised weights are fine); int64 ``prob.shape[:-1]``."""
    draws = as_draws(generator)
    rows = prob.flatten(0, -2)
    if rows.device.type == "cpu":
        out = rows.multinomial(1, generator=draws.generator)
    else:
        q = _host_empty(tuple(rows.shape), rows.dtype, draws.pin).exponential_(1, generator=draws.generator)
        out = (rows / q.to(rows.device, non_blocking=True)).argmax(-1, keepdim=True)
    return out.view(prob.shape[:-1])


@timed_stage(DRAWS)
def skip_categorical(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator | Draws) -> None:
    """Advance the stream exactly as :func:`categorical` on a ``shape`` tensor would, drawing nothing else.

    The Philox stream has nothing to advance (every draw is addressed by its counter).
    """
    draws = as_draws(generator)
    numel = 1
    for s in shape:
        numel *= s
    if not numel or draws.philox is not None:
        return
    torch.empty(shape, dtype=dtype).exponential_(1, generator=draws.generator)


@timed_stage(DRAWS)
def uniform(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, generator: torch.Generator | Draws
) -> torch.Tensor:
    """``U[0, 1)`` of ``shape`` from the reference stream, drawn on the CPU and moved to ``device``."""
    draws = as_draws(generator)
    u = _host_empty(shape, dtype, draws.pin and device.type != "cpu").uniform_(generator=draws.generator)
    return u if device.type == "cpu" else u.to(device, non_blocking=True)


@timed_stage(DRAWS)
def random_codes(shape: tuple[int, ...], codebook_size: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Uniform initial codes in ``[0, codebook_size)``, int64, as the reference's ``random_(to=K)``."""
    x = torch.ones(shape, dtype=torch.int64).random_(to=codebook_size, generator=generator)
    return x if device.type == "cpu" else x.to(device)
