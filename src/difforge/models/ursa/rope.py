"""URSA's 3-D rotary positions and frequency tables.

Every token has a (t, h, w) coordinate.  Text slot p is (p, p, p); the begin-of-video token sits at
(S, S, S) after S text slots; latent cell (ti, hi, wi) is (S + 1 + ti, hi, wi), flattened t-major.
Each of the d/2 rotation slots reads one axis: the first 3*(d//8) slots cycle t, h, w, the rest
cycle h, w.  Frequencies are ``1 / theta**(2i/d)`` computed as a float32 power then a reciprocal,
the order the reference uses.
"""

from __future__ import annotations

import torch


def positions(latent_shape: tuple[int, int, int], text_len: int) -> torch.Tensor:
    """``[text_len + 1 + T*H*W, 3]`` int64 coordinates for one text+image sequence."""
    t, h, w = latent_shape
    text = torch.arange(text_len, dtype=torch.int64)[:, None].expand(-1, 3)
    bov = torch.full((1, 3), text_len, dtype=torch.int64)
    grid = torch.stack(
        torch.meshgrid(
            torch.arange(t, dtype=torch.int64) + text_len + 1,
            torch.arange(h, dtype=torch.int64),
            torch.arange(w, dtype=torch.int64),
            indexing="ij",
        ),
        dim=-1,
    ).reshape(-1, 3)
    return torch.cat([text, bov, grid])


def slot_axes(head_dim: int) -> torch.Tensor:
    """Which axis (0=t, 1=h, 2=w) each of the ``head_dim // 2`` rotation slots reads."""
    rep_thw = head_dim // 8
    rep_hw = (head_dim // 2 - 3 * rep_thw) // 2
    axes = [0, 1, 2] * rep_thw + [1, 2] * rep_hw
    if len(axes) != head_dim // 2:
        raise ValueError(f"head_dim {head_dim} cannot be split into URSA's t/h/w rotary slots.")
    return torch.tensor(axes, dtype=torch.int64)


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """float32 ``1 / theta**(2i/d)`` for i < d/2, as pow-then-reciprocal."""
    scale = torch.arange(0, head_dim, 2).float() / head_dim
    return torch.pow(theta, scale).reciprocal_()


def cos_sin(pos: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``/``sin`` tables ``[L, head_dim // 2]`` in ``dtype`` for positions ``[L, 3]``."""
    axes = slot_axes(head_dim).to(pos.device)
    coord = pos.index_select(1, axes)  # [L, d/2] integer coordinate per slot
    angle = coord * inv_freq(head_dim, theta).to(pos.device)[None, :]
    return angle.cos().to(dtype), angle.sin().to(dtype)
