"""shapes-qwen-edit: its recipe reproduces from the seed (no weights are committed yet: docs/shapes-training.md).

The full recipe (``make train-shapes``) takes tens of minutes, so CI never runs it; these tests rerun
its first steps on a shrunk configuration (fewer edits, a one-layer MMDiT, a few steps of each
stage) and compare the losses with the ones recorded when the recipe was written, and check the
dataset generator's bytes.  A change that breaks reproducibility (the world's sampling, the
tokenizer, the seeding, the loss) fails here, not in a half-hour retrain.
"""

from __future__ import annotations

import pytest

from difforge.training.qwen_parts import Arch, all_instructions, build_tokenizer, check_tokenizer
from difforge.training.shapes_qwen_edit import Recipe, make_data, train

#: make_data(0, 16): sha256 of its pixels and instructions, and the first instructions.
DATA_SHA256 = "699bf32b1f188644fc3c35cc3d59776ac27fc74262037c5eb1ae22860feef38d"
FIRST_INSTRUCTIONS = ["turn the square into a triangle", "make the cross yellow", "move the square to the top",
                      "remove the cross"]
#: The shrunk recipe's losses, recorded on x86-64 CPU (2 threads, torch 2.13, diffusers 0.42.1).
SHRUNK = Recipe(n_edits=24, arch=Arch(layers=1, heads=2), vae_steps=2, vae_batch=4, steps=3, batch=4,
                encode_batch=24)
VAE_LOSSES = [1.4282066822052002, 0.9154574871063232]
MMDIT_LOSSES = [2.3259117603302, 2.2318532466888428, 2.282616138458252]
#: Float rounding differs between CPUs and thread counts; a changed recipe moves losses by far more.
RTOL = 2e-3
#: Held-out edits (heldout_edit_set(40) indices) the committed model gets right at fp32 with the
#: run defaults; one of each kind that is cheap to check.
CORRECT_HELDOUT = [0, 1, 2]


def test_the_dataset_generator_reproduces() -> None:
    data = make_data(0, 16)
    assert data.digest() == DATA_SHA256
    assert data.instructions[:4] == FIRST_INSTRUCTIONS
    assert data.sources.shape == (16, 64, 64, 3) and data.targets.dtype.name == "uint8"


def test_the_tokenizer_spells_every_world_word_as_one_token() -> None:
    tok = build_tokenizer()
    check_tokenizer(tok)  # the system prompt is exactly the 64 tokens diffusers drops
    assert len(all_instructions()) == len(set(all_instructions()))


def test_the_first_training_steps_reproduce() -> None:
    _, summary = train(SHRUNK, log=lambda _: None)
    assert summary["vae_losses"] == pytest.approx(VAE_LOSSES, rel=RTOL)
    assert summary["mmdit_losses"] == pytest.approx(MMDIT_LOSSES, rel=RTOL)
