"""The designed latent shapes-qwen-edit's VAE learns: each channel says what its docstring says."""

from __future__ import annotations

import numpy as np
import torch

from difforge.shapes.world import PALETTE, Item, Scene, render
from difforge.training.qwen_latents import CELL, FAR, SHAPE_CODE, designed_latents, shape_ids


def _rgb(name: str) -> torch.Tensor:
    return torch.tensor(PALETTE[name], dtype=torch.float32) / 127.5 - 1


def _scene(colour: str = "red") -> Scene:
    return Scene("blue", (Item("square", colour, 16, 32, 24), Item("circle", "white", 48, 32, 24)), 64)


def _latents(*scenes: Scene, chunk: int = 32) -> torch.Tensor:
    return designed_latents(np.stack([render(s) for s in scenes]), np.stack([shape_ids(s) for s in scenes]), chunk)


def test_channels_carry_background_shape_colour_and_outline() -> None:
    image = render(_scene())
    z = _latents(_scene())[0, :, 0]  # 8 x 16 x 16
    assert z.shape == (8, 16, 16)
    assert torch.allclose(z[:3], _rgb("blue")[:, None, None].expand(3, 16, 16))
    centre_px = image[CELL // 2 :: CELL, CELL // 2 :: CELL]  # the pixel just below-right of each cell centre
    inside = torch.from_numpy((centre_px != image[0, 0]).any(-1))
    # inside a shape both distance fields are negative, outside positive (zero on the outline itself)
    assert (z[6][inside] <= 0).all() and (z[6][~inside] >= 0).all() and (z[7][inside] <= 0).all()
    assert (z[6][inside] < 0).sum() > 0.8 * inside.sum() and (z[6] > 0.9).sum() > 128
    # the colour channels hold each shape's colour on it, the background's far from every shape
    assert torch.allclose(z[3:6, 8, 4], _rgb("red")) and torch.allclose(z[3:6, 8, 12], _rgb("white"))
    assert torch.allclose(z[3:6, 0, 8], _rgb("blue"))  # top centre: more than FAR px from both shapes
    assert FAR < 16
    # the shape channel names the nearby shape, 0 far from both
    assert z[7, 8, 4] == SHAPE_CODE["square"] and z[7, 8, 12] == SHAPE_CODE["circle"] and z[7, 0, 8] == 0


def test_the_latent_is_local_and_the_same_in_any_chunking() -> None:
    """Recolouring one shape changes the colour channels near it only; the batch split changes nothing."""
    za, zb = _latents(_scene(), _scene("green"), chunk=1)
    changed = (za - zb).abs().amax(0)[0] > 0  # 16 x 16 cells
    assert changed[:, :8].any() and not changed[:, 9:].any()
    assert not (za - zb)[[0, 1, 2, 6, 7]].any()  # only the colour channels
    assert torch.equal(_latents(_scene(), _scene("green"), chunk=2)[1], zb)
