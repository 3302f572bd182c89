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
every backend, with no host draw, no host sync and static shapes.  Categorical sampling is Gumbel-max,
``argmax(logits + G)`` (``argmax(log w + G)`` for weights), exact in distribution and with no softmax
over the codebook; the jump step samples every row and keeps the jumping ones with ``torch.where``.
The tokens are not the reference stream's, but they are the same on every device for a seed, up to
logits that are tied within rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...runtime import philox
from ...runtime.philox import BlockFn

#: Philox counter word 3: which draw of a step (word 2 is the step; the initial codes are step 0's).
DRAW_INIT, DRAW_X1, DRAW_JUMP_U, DRAW_JUMP = 0, 1, 2, 3
#: Counters per eager Philox block (seven int64 buffers of this many words): small enough to stay in a
#: CPU's cache, large enough that an accelerator's launches stay few.
HOST_CHUNK, DEVICE_CHUNK = 1 << 16, 1 << 22


@dataclass(frozen=True)
class PhiloxDraws:
    """The portable stream of one run: every draw is a function of (seed, step, draw, position).

    ``block_fn``: a compiled :func:`~difforge.runtime.philox.gumbel_argmax_block` (``cfg.compile``),
    called with the counter and key words as 0-dim device tensors so steps and seeds reuse its graph.
    ``sparse`` (the host, where reading a mask costs no device sync): the jump step draws the jumping
    rows only - the same numbers, since a row's noise is addressed by its index; an accelerator draws
    every row and keeps static shapes.
    """

    seed: int
    device: torch.device
    chunk: int = HOST_CHUNK
    block_fn: BlockFn | None = None
    sparse: bool = False

    @property
    def key(self) -> tuple[int, int]:
        return self.seed & philox.MASK32, (self.seed >> 32) & philox.MASK32

    def _grid(self, rows: int, cols: int, step: int, draw: int) -> torch.Tensor:
        """Words ``[rows, cols]`` of counter ``(col // 4, row, step, draw)``."""
        index = torch.arange(rows, dtype=torch.int64, device=self.device)
        return philox.grid_words(index, cols, step, draw, *self.key)

    def codes(self, shape: tuple[int, int], codebook_size: int) -> torch.Tensor:
        """Uniform initial codes ``[B, N]`` in ``[0, codebook_size)`` (step 0's ``DRAW_INIT`` words)."""
        return philox.integers_from_words(self._grid(*shape, 0, DRAW_INIT), codebook_size)

    def uniform(self, shape: tuple[int, int], step: int) -> torch.Tensor:
        """float32 uniforms in (0, 1) of ``shape`` ``[B, N]`` for ``step``'s jump decision."""
        return philox.uniform_from_words(self._grid(*shape, step, DRAW_JUMP_U))

    def categorical_logits(self, logits: torch.Tensor, step: int, draw: int) -> torch.Tensor:
        """One code per row of softmax(``logits [..., K]``), sampled as ``argmax(logits + G)``: int64 ``logits.shape[:-1]``."""
        rows = logits.flatten(0, -2)
        return self._argmax(rows, step, draw).view(logits.shape[:-1])

    def categorical_weights(
        self, weights: torch.Tensor, step: int, draw: int, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One code per row of non-negative ``weights [..., K]`` as ``argmax(log w + G)``; ``weights`` is consumed.

        ``rows``: the row numbers of ``weights``' rows when it holds a subset of them (default: all, in order).
        A row of zeros has no code to draw: it gives some index, which the jump step discards.
        """
        flat = weights.flatten(0, -2)
        return self._argmax(flat.float().log_(), step, draw, rows).view(weights.shape[:-1])

    def _argmax(self, scores: torch.Tensor, step: int, draw: int, rows: torch.Tensor | None = None) -> torch.Tensor:
        k0, k1 = self.key
        if self.block_fn is None:
            return philox.gumbel_argmax(scores, step, draw, k0, k1, chunk=self.chunk, rows=rows)
        words = [torch.full((), v, dtype=torch.int64, device=self.device) for v in (step, draw, k0, k1)]
        return philox.gumbel_argmax(scores, *words, chunk=DEVICE_CHUNK, block_fn=self.block_fn, rows=rows)


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


def uniform(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, generator: torch.Generator | Draws
) -> torch.Tensor:
    """``U[0, 1)`` of ``shape`` from the reference stream, drawn on the CPU and moved to ``device``."""
    draws = as_draws(generator)
    u = _host_empty(shape, dtype, draws.pin and device.type != "cpu").uniform_(generator=draws.generator)
    return u if device.type == "cpu" else u.to(device, non_blocking=True)


def random_codes(shape: tuple[int, ...], codebook_size: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Uniform initial codes in ``[0, codebook_size)``, int64, as the reference's ``random_(to=K)``."""
    x = torch.ones(shape, dtype=torch.int64).random_(to=codebook_size, generator=generator)
    return x if device.type == "cpu" else x.to(device)
