"""shapes-qwen-edit: its recipe reproduces from the seed (no weights are committed yet: docs/shapes-training.md).

The full recipe (``make train-shapes``) takes about half an hour, so CI never runs it; these tests
rerun its first steps on a shrunk configuration (fewer edits, a one-layer MMDiT, a few steps of each
stage) and compare the losses with the ones recorded when the recipe was written, and check the
dataset generator's bytes.  A change that breaks reproducibility (the world's sampling, the
tokenizer, the seeding, the loss) fails here, not in a half-hour retrain.
"""

from __future__ import annotations

import numpy as np
import pytest

from difforge.training.qwen_parts import Arch, all_instructions, build_tokenizer, check_tokenizer
from difforge.training.shapes_qwen_edit import SIZE, Recipe, _crop_offsets, make_data, shape_weights, train

#: make_data(0, 16): sha256 of its pixels and instructions, and the first instructions.
DATA_SHA256 = "064311fc02ab4cda5127e4d4a46b3e8735fb4af8c9938d33e228814dddcd696f"
FIRST_INSTRUCTIONS = ["turn the square into a cross", "make the circle green", "turn the square into a triangle",
                      "move the triangle to the top"]
#: The shrunk recipe's losses, recorded on x86-64 CPU (1 thread; pytest's default threads agree within
#: RTOL), torch 2.13, diffusers 0.42.1.
SHRUNK = Recipe(n_edits=24, arch=Arch(layers=1, heads=2), vae_steps=2, vae_batch=4, dec_steps=2, steps=3, batch=4,
                encode_batch=24)
VAE_LOSSES = [1.1018571853637695, 1.108776569366455]
DECODER_LOSSES = [1.2417609691619873, 1.162696361541748]
MMDIT_LOSSES = [2.339109420776367, 2.3047564029693604, 2.5135207176208496]
#: Float rounding differs between CPUs and thread counts; a changed recipe moves losses by far more.
RTOL = 2e-3


def test_the_dataset_generator_reproduces() -> None:
    data = make_data(0, 16)
    assert data.digest() == DATA_SHA256
    assert data.instructions[:4] == FIRST_INSTRUCTIONS
    assert data.sources.shape == (16, 64, 64, 3) and data.targets.dtype.name == "uint8"


def test_the_tokenizer_spells_every_world_word_as_one_token() -> None:
    tok = build_tokenizer()
    check_tokenizer(tok)  # the system prompt is exactly the 64 tokens diffusers drops
    assert len(all_instructions()) == len(set(all_instructions()))


def test_vae_crops_always_hold_a_shape_and_weigh_its_pixels_up() -> None:
    data = make_data(0, 16)
    weights = shape_weights(data.sources, 3, 9.0)
    assert weights.shape == (16, SIZE, SIZE) and set(np.unique(weights)) == {1.0, 10.0}
    shape_px = (data.sources != data.sources[:, :1, :1]).any(-1)
    assert (weights[shape_px] == 10).all() and 0.05 < (weights > 1).mean() < 0.5
    rng = np.random.default_rng(0)
    for i in range(16):
        for _ in range(20):
            y, x = _crop_offsets(rng, weights[i] > 1, 32, 4)
            assert y % 4 == 0 and x % 4 == 0 and 0 <= y <= SIZE - 32 and 0 <= x <= SIZE - 32
            assert (weights[i, y : y + 32, x : x + 32] > 1).any()


def test_the_first_training_steps_reproduce() -> None:
    _, summary = train(SHRUNK, log=lambda _: None)
    assert summary["vae_losses"] == pytest.approx(VAE_LOSSES, rel=RTOL)
    assert summary["decoder_losses"] == pytest.approx(DECODER_LOSSES, rel=RTOL)
    assert summary["mmdit_losses"] == pytest.approx(MMDIT_LOSSES, rel=RTOL)
