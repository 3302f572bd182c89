"""shapes-qwen-edit: its recipe reproduces from the seed (the committed weights: tests/models/test_trained.py).

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
from difforge.training.shapes_qwen_edit import SIZE, Recipe, make_data, shape_weights, train

#: make_data(0, 16): sha256 of its pixels and instructions, and the first instructions.
DATA_SHA256 = "064311fc02ab4cda5127e4d4a46b3e8735fb4af8c9938d33e228814dddcd696f"
FIRST_INSTRUCTIONS = ["turn the square into a cross", "make the circle green", "turn the square into a triangle",
                      "move the triangle to the top"]
#: The shrunk recipe's losses, recorded on x86-64 CPU (1 thread; pytest's default threads agree within
#: RTOL), torch 2.13, diffusers 0.42.1.
SHRUNK = Recipe(n_edits=24, arch=Arch(layers=1, heads=2), vae_steps=2, vae_batch=4, steps=3, batch=4, encode_batch=24)
VAE_LOSSES = [2.1564743518829346, 2.31477427482605]
MMDIT_LOSSES = [2.393308639526367, 2.344992160797119, 2.4772872924804688]
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


def test_vae_loss_weighs_shape_pixels_up() -> None:
    data = make_data(0, 16)
    weights = shape_weights(data.sources, 3, 9.0)
    assert weights.shape == (16, SIZE, SIZE) and set(np.unique(weights)) == {1.0, 10.0}
    shape_px = (data.sources != data.sources[:, :1, :1]).any(-1)
    assert (weights[shape_px] == 10).all() and 0.05 < (weights > 1).mean() < 0.5


def test_the_first_training_steps_reproduce() -> None:
    _, summary = train(SHRUNK, log=lambda _: None)
    assert summary["vae_losses"] == pytest.approx(VAE_LOSSES, rel=RTOL)
    assert summary["mmdit_losses"] == pytest.approx(MMDIT_LOSSES, rel=RTOL)
