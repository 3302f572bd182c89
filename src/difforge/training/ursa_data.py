"""shapes-ursa's data: world scenes, their captions, and the VQ codes of their 4x4-pixel cells.

The image tokenizer is a vector quantiser over the cells of a 16 x 16 grid (4 x 4 pixels each, the VQ
decoder's stride).  Each cell is described by its colours and by the signed distance from the cell's
centre to the shape's outline (negative inside, in pixels), and coded by the nearest codebook entry:

* code ``b`` (``b < 6``): background of colour ``COLOURS[b]``, the outline 4 px or more away;
* code ``6 + 8 * colour + (d + 4)`` for ``d`` in -4 .. 3: a cell of the shape of ``colour`` whose
  centre is ``d`` px from the outline (``d = -4``: deep inside).

The picture a grid stands for (:func:`render_codes`, the decoder's training target) is the shape
colour wherever the bilinearly upsampled distance field is negative, the background elsewhere: on
the world's shapes that reads back correctly by the checker for 99.5 % of held-out scenes.  A shape
code does not name the background colour (the decoder takes it from the neighbouring background
cells): so a held-out (shape, colour, background) combination needs only codes training shows,
since every (shape, colour) pair and every background appears there.

Everything is numpy (and one torch interpolation) with seeded generators, so a seed gives the same
codes on every machine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..shapes.world import (
    BACKGROUNDS,
    COLOURS,
    PALETTE,
    SHAPES,
    Item,
    Scene,
    caption,
    is_heldout,
    mask,
    render,
    scenes,
)

CELL = 4  # pixels per latent cell (the VQ decoder's stride)
REACH = 4  # distances are clipped to [-REACH, REACH] px
LEVELS = 2 * REACH  # shape levels -4 .. 3 (+4 is background)
N_COLOURS = len(COLOURS)
CODEBOOK = N_COLOURS + N_COLOURS * LEVELS
_PALETTE = np.array([PALETTE[c] for c in COLOURS], dtype=np.uint8)


@dataclass(frozen=True)
class Dataset:
    """``images [N, 64, 64, 3]`` uint8 renders, their ``captions`` and the scenes they came from."""

    images: np.ndarray
    captions: list[str]
    scenes: list[Scene]

    def digest(self, n: int) -> str:
        """sha256 of the first ``n`` images' bytes and captions (what the reproducibility test pins)."""
        h = hashlib.sha256(np.ascontiguousarray(self.images[:n]).tobytes())
        h.update("\n".join(self.captions[:n]).encode("utf-8"))
        return h.hexdigest()


def build_dataset(seed: int, n: int, size: int = 64) -> Dataset:
    """``n`` one-item scenes of the world's train split (no held-out combination), rendered."""
    sc = scenes(seed, n, size=size, max_items=1, split="train")
    return Dataset(np.stack([render(s) for s in sc]), [caption(s) for s in sc], sc)


def canonical_dataset(size: int = 64, item_size: int = 24) -> Dataset:
    """The transformer's dataset: one scene per *train* (shape, colour, background) combination (108 of
    the 120), its item centred at ``item_size`` px.

    Why one picture per caption: a world caption names the shape and the colours but not where the
    item is or how big, so a model trained on placed scenes must also choose a layout, and sampling
    every image token at once only draws one coherent item after far more training than the 2-core
    budget allows (the first recipe's 0 of 40: several fragments per picture).  Trained on the
    canonical picture of each caption, every token's target follows from the caption, which is
    exactly what the semantic check needs: a port that changes what the caption means changes the
    picture."""
    rows = [Scene(bg, (Item(shape, colour, size // 2, size // 2, item_size),), size)
            for shape in SHAPES for colour in COLOURS for bg in BACKGROUNDS if bg != colour]
    sc = [s for s in rows if not is_heldout(s)]
    return Dataset(np.stack([render(s) for s in sc]), [caption(s) for s in sc], sc)


def signed_distance(scene: Scene, size: int = 64) -> np.ndarray:
    """``[g, g]`` float32 signed distance (px) from each cell centre to the item's outline, negative inside.

    The outline is the set of midpoints between 4-neighbouring pixels of which one is inside; a cell
    centre (a pixel corner) counts as inside when the pixel to its lower right is."""
    m = mask(scene.items[0], size)
    ys, xs = np.nonzero(m[:, 1:] != m[:, :-1])
    ys2, xs2 = np.nonzero(m[1:, :] != m[:-1, :])
    outline = np.concatenate([np.stack([ys + 0.5, xs + 1.0], 1), np.stack([ys2 + 1.0, xs2 + 0.5], 1)])
    g = size // CELL
    centre = np.arange(g) * CELL + CELL // 2
    cy, cx = np.meshgrid(centre, centre, indexing="ij")
    pts = np.stack([cy.ravel(), cx.ravel()], 1).astype(np.float64)
    d = np.sqrt(((pts[:, None, :] - outline[None]) ** 2).sum(-1)).min(1)
    inside = m[cy.ravel(), cx.ravel()]
    return np.where(inside, -d, d).reshape(g, g).astype(np.float32)


def encode_scene(scene: Scene) -> np.ndarray:
    """``[g, g]`` int64 codes of a one-item scene (see the module docstring)."""
    level = np.clip(np.round(signed_distance(scene, scene.size)), -REACH, REACH).astype(np.int64)
    bg, fg = COLOURS.index(scene.background), COLOURS.index(scene.items[0].colour)
    return np.where(level >= REACH, bg, N_COLOURS + LEVELS * fg + level + REACH)


def encode_dataset(data: Dataset) -> np.ndarray:
    return np.stack([encode_scene(s) for s in data.scenes])


def render_codes(codes: np.ndarray) -> np.ndarray:
    """The picture a code grid stands for, ``[g*CELL, g*CELL, 3]`` uint8: the distance field (background
    cells +4) upsampled bilinearly, the shape colour (the most common among shape cells) where it is
    negative, the background colour (the most common among background cells) elsewhere."""
    g = codes.shape[0]
    is_bg = codes < N_COLOURS
    shape_part = np.where(is_bg, 0, codes - N_COLOURS)
    dist = np.where(is_bg, REACH, shape_part % LEVELS - REACH).astype(np.float32)
    bgs, fgs = codes[is_bg], shape_part[~is_bg] // LEVELS
    bg = int(np.bincount(bgs, minlength=N_COLOURS).argmax()) if bgs.size else 0
    fg = int(np.bincount(fgs, minlength=N_COLOURS).argmax()) if fgs.size else bg
    up = F.interpolate(torch.from_numpy(dist)[None, None], size=(g * CELL, g * CELL), mode="bilinear",
                       align_corners=False)[0, 0].numpy()
    out = np.empty((g * CELL, g * CELL, 3), dtype=np.uint8)
    out[:] = _PALETTE[bg]
    out[up < 0] = _PALETTE[fg]
    return out


def code_features() -> np.ndarray:
    """``[K, 13]`` float32 code vectors: the VQ codebook the decoder reads and the scheduler's metric path
    measures distances in - ``(one-hot background colour, one-hot shape colour, distance / 4)``."""
    out = np.zeros((CODEBOOK, 2 * N_COLOURS + 1), dtype=np.float32)
    for b in range(N_COLOURS):
        out[b, b] = 1.0
        out[b, -1] = 1.0
    for c in range(N_COLOURS):
        for k in range(LEVELS):
            row = N_COLOURS + LEVELS * c + k
            out[row, N_COLOURS + c] = 1.0
            out[row, -1] = (k - REACH) / REACH
    return out
