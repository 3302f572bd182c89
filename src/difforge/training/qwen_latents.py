"""The designed latent of ``shapes-qwen-edit``'s VAE: what its encoder is taught to output for a picture.

Why designed and not learnt: with a freely learnt latent (plain reconstruction training) the VAE read
back every picture, but the MMDiT trained on it for what two CPU cores give did not learn the edits
(3-6 of 40 held-out edits right after 5000 steps, pictures covered in blobs), and its decoder turned
latents 0.2-0.4 of a std off into speckles.  The same lesson as shapes-ursa's fixed codebook: give the
transformer a latent in which the world's facts are simple, and it learns the mapping quickly.

For each 4 x 4-pixel cell of a 64 px picture (the VAE's 16 x 16 latent grid), at the cell centre:

- channels 0-2: the background colour (RGB in [-1, 1]); the same in every cell;
- channels 3-5: the colour of the nearest shape pixel within ``FAR / 2`` px, blended linearly into the
  background colour between ``FAR / 2`` and ``FAR`` px (so the value depends on the neighbourhood only,
  which a convolutional encoder can see; the nearest shape's colour over the whole picture could not
  be read back: 0.19-0.25 normalised error against 0.02-0.05 for the local channels);
- channel 6: ``tanh(sd / 3)``, ``sd`` the signed distance in pixels from the cell centre to the
  shapes' outline (positive outside): it places the outline;
- channel 7: which shape the nearest shape pixel belongs to (:data:`SHAPE_CODE`), blended into 0 like
  the colour.  Why: an instruction names a shape ("remove the square"), and with the outline alone the
  MMDiT had to learn to tell a square's distance pattern from a circle's before it could pick the item:
  with a broad second distance field here instead, 5000 steps got 1 of 6 held-out removals and 0 of 6
  reshapes right while additions and background edits were all right.

So a recolour changes channels 3-5 around one shape, a background edit channels 0-2 (and 3-5 away from
the shapes), a removal the outline and shape channels around one shape, and a move, an addition or a
reshape paints one of twenty (shape, anchor) patterns.  The decoder learns to paint pictures from these
latents (with noise added, so near-misses still decode to flat shapes), the encoder learns to produce
them; the pipeline and its loaders see an ordinary ``AutoencoderKLQwenImage``.
"""

from __future__ import annotations

import numpy as np
import torch

from difforge.shapes.world import SHAPES, Scene, mask

#: Pixels per latent cell (the VAE's spatial downsampling).
CELL = 4
#: Shape colour channels: the shape's colour within FAR / 2 px of it, the background's beyond FAR px.
FAR = 8.0
#: The scale (px) of the signed-distance channel.
SHARP = 3.0
#: Channel 7's value near each shape (0: no shape near).
SHAPE_CODE: dict[str, float] = {"circle": -1.0, "square": -1 / 3, "triangle": 1 / 3, "cross": 1.0}
CHANNELS = 8


def shape_ids(scene: Scene) -> np.ndarray:
    """``size x size`` int64: 0 on the background, else 1 + the index in :data:`SHAPES` of the item's shape."""
    out = np.zeros((scene.size, scene.size), dtype=np.int64)
    for item in scene.items:
        out[mask(item, scene.size)] = SHAPES.index(item.shape) + 1
    return out


def designed_latents(images: np.ndarray, ids: np.ndarray, chunk: int = 32) -> torch.Tensor:
    """``N x H x W x 3`` uint8 pictures (flat background, the corner pixel's colour) and their
    :func:`shape_ids` maps (``N x H x W``) -> their designed latents, ``N x 8 x 1 x H/4 x W/4`` float32
    (the VAE's one-frame latent layout)."""
    x = torch.from_numpy(np.ascontiguousarray(images)).float()
    codes = torch.tensor([0.0, *(SHAPE_CODE[s] for s in SHAPES)])
    id_map = torch.from_numpy(np.ascontiguousarray(ids)).reshape(len(ids), -1)
    n, height, width, _ = x.shape
    ys, xs = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
    pixels = torch.stack([ys.flatten(), xs.flatten()], 1)
    gh, gw = height // CELL, width // CELL
    cy, cx = torch.meshgrid(torch.arange(gh) * CELL + CELL / 2, torch.arange(gw) * CELL + CELL / 2, indexing="ij")
    centres = torch.stack([cy.flatten(), cx.flatten()], 1)
    # exact: half-pixel offsets square exactly in float32, so the field is the same on every CPU
    dist = torch.cdist(centres, pixels, compute_mode="donot_use_mm_for_euclid_dist")  # cells x pixels
    far = torch.tensor(float(height + width))
    out = []
    for i in range(0, n, chunk):
        xb = x[i : i + chunk].reshape(-1, height * width, 3)
        ids_b = id_map[i : i + chunk]
        bg = xb[:, :1]  # the world keeps a margin: the corner pixel is background
        fg = ids_b > 0  # b x pixels
        d_fg, nearest = torch.where(fg[:, None], dist, far).min(-1)  # b x cells
        d_bg = torch.where(~fg[:, None], dist, far).min(-1).values
        sd = d_fg - d_bg
        colour = torch.gather(xb, 1, nearest[..., None].expand(-1, -1, 3))
        a = ((FAR - sd) / (FAR / 2)).clamp(0, 1)[..., None]
        bgc = bg.expand_as(colour)
        colour = a * colour + (1 - a) * bgc
        code = a * codes[torch.gather(ids_b, 1, nearest)][..., None]
        z = torch.cat([bgc / 127.5 - 1, colour / 127.5 - 1, torch.tanh(sd / SHARP)[..., None], code], -1)  # b x cells x 8
        out.append(z.transpose(1, 2).reshape(-1, CHANNELS, gh, gw))
    return torch.cat(out).unsqueeze(2)
