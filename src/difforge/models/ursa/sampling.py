"""Random draws for URSA, always from a CPU ``torch.Generator``.

On the CPU these are the very calls the reference makes, so the random stream matches it bit for
bit.  On an accelerator the *draws* still come from the CPU generator in the same shapes and dtypes
(then move to the device), so a run consumes the stream exactly as a CPU run would: categorical
sampling uses the identity torch.multinomial itself uses for one sample per row,
``argmax(p / q)`` with ``q ~ Exp(1)`` drawn as one ``exponential_`` over the probability tensor.
"""

from __future__ import annotations

import torch


def categorical(prob: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One code per row of ``prob [..., K]`` (unnormalised weights are fine); int64 ``prob.shape[:-1]``."""
    rows = prob.flatten(0, -2)
    if rows.device.type == "cpu":
        out = rows.multinomial(1, generator=generator)
    else:
        q = torch.empty(rows.shape, dtype=rows.dtype).exponential_(1, generator=generator)
        out = (rows / q.to(rows.device, non_blocking=True)).argmax(-1, keepdim=True)
    return out.view(prob.shape[:-1])


def skip_categorical(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> None:
    """Advance ``generator`` exactly as :func:`categorical` on a ``shape`` tensor would, drawing nothing else."""
    numel = 1
    for s in shape:
        numel *= s
    if numel:
        torch.empty(shape, dtype=dtype).exponential_(1, generator=generator)


def uniform(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """``U[0, 1)`` of ``shape``, drawn on the CPU."""
    u = torch.empty(shape, dtype=dtype).uniform_(generator=generator)
    return u if device.type == "cpu" else u.to(device, non_blocking=True)


def random_codes(shape: tuple[int, ...], codebook_size: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Uniform initial codes in ``[0, codebook_size)``, int64, as the reference's ``random_(to=K)``."""
    x = torch.ones(shape, dtype=torch.int64).random_(to=codebook_size, generator=generator)
    return x if device.type == "cpu" else x.to(device)
