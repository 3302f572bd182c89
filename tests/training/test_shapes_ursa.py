"""shapes-ursa: the recipe reproduces from its seed.

(The committed model's own behaviour is tested in tests/models/test_trained.py.)

The loss values are pinned with a relative tolerance of 1e-4 (not bit for bit: BLAS kernels and
thread counts may round differently on another machine; a changed recipe moves them far more).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from difforge.shapes.world import HELDOUT_COMBOS, combos
from difforge.training.shapes_ursa import Recipe, train
from difforge.training.ursa_data import build_dataset, canonical_dataset
from difforge.training.ursa_text import build_tokenizer

#: A shrunk recipe (64 scenes, a 32-channel VQ decoder, one 32-wide layer, a few steps of each stage, the
#: last transformer step on the full 320 text slots) so the test runs in seconds.
SHRUNK = Recipe(images=64, vae_channels=(32, 32, 32), vae_steps=2, vae_batch=2, vae_full_fraction=0.0,
                encoder_steps=1, encoder_batch=1, hidden=32, intermediate=64, layers=1, steps=3, batch=4,
                sparse_pads=4, full_text_fraction=0.34)
SHRUNK_DECODER_L1 = [0.6660885810852051, 0.7265335321426392]
SHRUNK_ENCODER_CE = [4.074547290802002]
SHRUNK_LOSSES = [3.984196186065674, 3.9794058799743652, 4.002992153167725]
REL_TOL = 1e-4

FIRST_CAPTIONS = [
    "a blue triangle on a black background", "a green circle on a red background",
    "a black triangle on a yellow background", "a green cross on a yellow background",
    "a yellow cross on a blue background", "a red circle on a black background",
    "a green circle on a red background", "a green cross on a white background",
]
FIRST_DIGEST = "40fcc1a80d053fccb9f4198c6c501c13da1f7aed1b894ff41666b011f84a0364"


def close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(math.isclose(g, w, rel_tol=REL_TOL) for g, w in zip(got, want, strict=True))


def test_dataset_reproduces() -> None:
    data = build_dataset(0, 8)
    assert data.captions == FIRST_CAPTIONS
    assert data.digest(8) == FIRST_DIGEST
    assert data.images.shape == (8, 64, 64, 3) and data.images.dtype == np.uint8


CANONICAL_DIGEST = "9208ca5d44e8a9786dfe3e0d6b6bc94622780288b65415f4edfac567e575b7c5"


def test_canonical_dataset_is_every_train_combination_once() -> None:
    """The transformer's data: one centred 24 px item per (shape, colour, background) combination of the
    train split - all 120 but the 12 held out, none twice."""
    data = canonical_dataset()
    seen = [next(iter(combos(s))) for s in data.scenes]
    assert len(seen) == len(set(seen)) == 120 - len(HELDOUT_COMBOS) == 108
    assert not set(seen) & HELDOUT_COMBOS
    assert {(it.cx, it.cy, it.size) for s in data.scenes for it in s.items} == {(32, 32, 24)}
    assert data.digest(108) == CANONICAL_DIGEST


def test_captions_are_seven_tokens() -> None:
    tok = build_tokenizer()
    for caption in FIRST_CAPTIONS:
        assert len(tok.encode(caption, add_special_tokens=False).ids) == 7


def test_first_training_steps_reproduce() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train(SHRUNK, log=lambda _: None, check_decoder=False)
    finally:
        torch.set_num_threads(threads)
    assert close(result.vq_decoder_losses, SHRUNK_DECODER_L1), result.vq_decoder_losses
    assert close(result.vq_encoder_losses, SHRUNK_ENCODER_CE), result.vq_encoder_losses
    assert close(result.losses, SHRUNK_LOSSES), result.losses
