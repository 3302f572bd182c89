"""``--parallel ulysses=N``: URSA's joint sequence split over N ranks (DeepSpeed-Ulysses style).

Rank ``r`` holds the ``r``-th stretch of the positions ``[text | bov | image tokens]`` (uneven stretches
when N does not divide the length: padding would be attended, there is no mask) through embeddings,
norms, projections, rotary and MLPs, which all work per token.  Attention needs every position: one
all-to-all per layer turns this rank's ``q, k, v`` rows of every head into every row of this rank's heads
(``H/N`` query heads and the kv heads they read), attention runs on those heads, and one all-to-all
turns the output back into this rank's rows of every head.  After the final norm the hidden rows are
gathered, so every rank applies ``lm_head`` to the same rows one process does and samples the same
codes from the same stream.

Each collective goes through the run's :class:`~difforge.runtime.parallel.Group` (its status header
first).  On the CPU in float32 the result is bit for bit the one-process forward (the per-row matmuls
and the per-head attention round alike in the sharded shapes; ``tests/parallel``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...errors import InputError


def stretches(length: int, world: int) -> list[int]:
    """Positions per rank: ``length // world`` each, one more on the first ``length % world`` ranks."""
    base, extra = divmod(length, world)
    return [base + (r < extra) for r in range(world)]


def check_heads(heads: int, kv_heads: int, world: int) -> None:
    """The head split must give every rank whole query heads and a whole number of the kv heads they read."""
    if heads % world:
        raise InputError(f"--parallel ulysses={world}: the transformer's {heads} attention heads do not divide "
                         f"over {world} ranks; use a divisor of {heads}.")
    per_rank, group = heads // world, heads // kv_heads
    if per_rank % group and group % per_rank:
        raise InputError(f"--parallel ulysses={world}: {per_rank} query heads per rank do not map onto whole kv "
                         f"heads ({kv_heads} kv heads for {heads} query heads); use another divisor of {heads}.")


@dataclass
class SequenceShard:
    """One call's split: the group, every rank's number of positions, this rank's stretch and rotary table."""

    group: Any
    sizes: list[int]
    heads: int
    kv_heads: int
    rope: object | None = None

    @property
    def world(self) -> int:
        return len(self.sizes)

    @property
    def bounds(self) -> tuple[int, int]:
        lo = sum(self.sizes[: self.group.rank])
        return lo, lo + self.sizes[self.group.rank]

    def _kv_slice(self, rank: int) -> slice:
        """The kv heads rank ``rank``'s query heads read (query head h reads kv head h // (heads / kv_heads))."""
        per_rank, group = self.heads // self.world, self.heads // self.kv_heads
        first = rank * per_rank
        return slice(first // group, (first + per_rank - 1) // group + 1)

    def to_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``q, k, v`` ``[B, rows, heads, d]`` of this rank's rows -> ``[B, L, own heads, d]`` of every row: one
        all-to-all for the three (rank j gets its query heads and the kv heads they read)."""
        rows = q.shape[1]
        qs = q.chunk(self.world, dim=2)
        kv = [self._kv_slice(j) for j in range(self.world)]
        parts = [torch.cat([qs[j], k[:, :, kv[j]], v[:, :, kv[j]]], 2) for j in range(self.world)]
        send = torch.cat([p.transpose(0, 1) for p in parts])  # [world * rows, B, h, d], destination-major
        recv = self.group.all_to_all(send, [rows] * self.world, self.sizes).transpose(0, 1)  # [B, L, h, d]
        hq, hk = qs[0].shape[2], kv[0].stop - kv[0].start
        # each contiguous, the layout one process's head slice has
        return (recv[:, :, :hq].contiguous(), recv[:, :, hq:hq + hk].contiguous(), recv[:, :, hq + hk:].contiguous())

    def to_rows(self, o: torch.Tensor) -> torch.Tensor:
        """``[B, L, own heads, d]`` -> ``[B, rows, heads, d]`` of this rank's rows (every rank's heads, in order)."""
        rows = self.sizes[self.group.rank]
        send = o.transpose(0, 1)  # [L, B, h, d]: rank j gets its own stretch of rows
        recv = self.group.all_to_all(send, self.sizes, [rows] * self.world)  # [world * rows, B, h, d]
        return torch.cat(recv.split(rows), dim=2).transpose(0, 1)

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, rows, C]`` of this rank's rows -> ``[B, L, C]`` on every rank (padded to the longest stretch)."""
        longest = max(self.sizes)
        padded = torch.cat([x, x.new_zeros((x.shape[0], longest - x.shape[1], *x.shape[2:]))], 1)
        every = self.group.all_gather(padded)
        return torch.cat([part[:, :n] for part, n in zip(every, self.sizes, strict=True)], 1)
