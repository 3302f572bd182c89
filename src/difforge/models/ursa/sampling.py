"""Random draws for URSA, from a CPU ``torch.Generator`` unless a run opts into device draws.

On the CPU these are the very calls the reference makes, so the random stream matches it bit for
bit.  On an accelerator the *draws* still come from the CPU generator in the same shapes and dtypes
(then move to the device), so a run consumes the stream exactly as a CPU run would: categorical
sampling uses the identity torch.multinomial itself uses for one sample per row,
``argmax(p / q)`` with ``q ~ Exp(1)`` drawn as one ``exponential_`` over the probability tensor.

That contract has a price on accelerators: every non-final step draws ``B*N*K`` exponentials on the
host (65.5M at 512x512 with a 64000-code book), which takes longer than the transformer forward.
Two switches exist for it, carried by :class:`Draws`:

* ``pin`` (exact): host draws land in pinned memory, so their copy to the device is asynchronous
  instead of a blocking pageable copy.  Same numbers, same stream.
* ``on_device`` (opt-in, ``cfg.fast=["device-rng"]``): draws come from a generator on the run device,
  and the jump step samples every row and keeps the jumping ones with ``torch.where`` - static shapes,
  no host sync.  Every token is drawn from the same distribution, but from another random stream,
  so tokens are not those of a CPU run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ...devices import Backend


@dataclass(frozen=True)
class Draws:
    """Where one run's random numbers come from (see the module docstring)."""

    generator: torch.Generator
    pin: bool = False
    on_device: bool = False


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
    if draws.on_device:
        gen = draws.generator
        q = torch.empty(rows.shape, dtype=rows.dtype, device=gen.device).exponential_(1, generator=gen)
        out = rows.div(q.to(rows.device)).argmax(-1, keepdim=True)
    elif rows.device.type == "cpu":
        out = rows.multinomial(1, generator=draws.generator)
    else:
        q = _host_empty(tuple(rows.shape), rows.dtype, draws.pin).exponential_(1, generator=draws.generator)
        out = (rows / q.to(rows.device, non_blocking=True)).argmax(-1, keepdim=True)
    return out.view(prob.shape[:-1])


def skip_categorical(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator | Draws) -> None:
    """Advance the stream exactly as :func:`categorical` on a ``shape`` tensor would, drawing nothing else."""
    draws = as_draws(generator)
    numel = 1
    for s in shape:
        numel *= s
    if not numel:
        return
    where = draws.generator.device if draws.on_device else torch.device("cpu")
    torch.empty(shape, dtype=dtype, device=where).exponential_(1, generator=draws.generator)


def uniform(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, generator: torch.Generator | Draws
) -> torch.Tensor:
    """``U[0, 1)`` of ``shape``, drawn on the CPU (or on ``device`` for device draws)."""
    draws = as_draws(generator)
    if draws.on_device:
        gen = draws.generator
        return torch.empty(shape, dtype=dtype, device=gen.device).uniform_(generator=gen).to(device)
    u = _host_empty(shape, dtype, draws.pin and device.type != "cpu").uniform_(generator=draws.generator)
    return u if device.type == "cpu" else u.to(device, non_blocking=True)


def random_codes(shape: tuple[int, ...], codebook_size: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Uniform initial codes in ``[0, codebook_size)``, int64, as the reference's ``random_(to=K)``."""
    x = torch.ones(shape, dtype=torch.int64).random_(to=codebook_size, generator=generator)
    return x if device.type == "cpu" else x.to(device)


def device_generator(backend: Backend, generator: torch.Generator) -> torch.Generator:
    """A generator on the backend's device seeded by one draw from the run's CPU ``generator`` (``device-rng``).

    The seed draw keeps a run reproducible from ``cfg.seed`` alone.  A device without its own
    generator type gets the backend's CPU generator for that seed (the draws then run on the host).
    """
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator))
    try:
        return torch.Generator(device=backend.device).manual_seed(seed)
    except RuntimeError:
        return backend.generator(seed)
