"""A Qwen-Image-Edit call in numbered stages: ``settings_for`` decides a call's settings without touching the
pipeline, ``configure`` returns them and switches only what differs, and the diffusers-style call runs
with the settings in force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from difforge.errors import InputError
from difforge.models.qwen_edit.call import EditCall, RunSettings
from difforge.models.qwen_edit.loop import EXACT_OPTIMISATIONS
from difforge.runtime.record import RunRecord

from .conftest import card, load, make_cfg


def _processors(qe) -> list[str]:
    return [type(p).__name__ for p in qe.pipe.transformer.attn_processors.values()]


def test_settings_for_changes_nothing_and_configure_returns_what_it_installed(edit_folder: Path) -> None:
    cfg = make_cfg(edit_folder)
    qe, _ = load(edit_folder, cfg)
    loaded, processors = qe.installed, _processors(qe)
    other = make_cfg(edit_folder, disable=list(EXACT_OPTIMISATIONS), vae_tiling=True, offload="before-decode")
    asked = qe.settings_for(other)
    assert asked == RunSettings.of(other) and asked.offload == "before-decode" and asked.vae_tiling
    assert qe.installed is loaded and _processors(qe) == processors  # deciding is not switching
    assert qe.configure(other) == asked == qe.installed
    assert (qe.offload, qe.vae_tiling, qe.options) == ("before-decode", True, asked.options)
    assert qe.configure(other) == asked and qe.installed is not loaded
    with pytest.raises(InputError, match="loaded without --compile"):
        qe.settings_for(make_cfg(edit_folder, compile=True))
    assert qe.installed == asked  # a refused run changes nothing


def test_the_call_is_its_stages(edit_folder: Path) -> None:
    cfg = make_cfg(edit_folder, steps=3)
    qe, _ = load(edit_folder, cfg)
    record = RunRecord("edit")
    with torch.inference_mode():  # what __call__ runs them under
        call = qe.check_inputs(cfg, record, [card()])
        assert isinstance(call, EditCall) and (call.steps, call.height, call.width) == (3, 64, 64)
        settings = qe.configure(cfg, record)
        qe.check_memory(call)
        prepared = qe.encode(call)
        latents = qe.denoise_latents(call, prepared)
        staged = qe.decode_output(call, settings, prepared, latents)[0]
    whole = qe(cfg, RunRecord("edit"), [card()])[0]
    assert np.array_equal(np.asarray(staged), np.asarray(whole))  # the stages one by one are the call
    assert {"encode", "denoise", "decode"} <= set(record.phases) and record.extra["steps"] == 3


def test_the_diffusers_call_runs_with_the_settings_in_force(edit_folder: Path) -> None:
    cfg = make_cfg(edit_folder, fast=["first-block-cache=0.5"])
    qe, _ = load(edit_folder, cfg)
    fields = qe.installed.config_fields()
    assert fields["fast"] == ["first-block-cache=0.5"] and fields["offload"] == "none"
    qe(image=card(), prompt="make the sky red", num_inference_steps=2, height=64, width=64)
    assert qe.installed.config_fields() == fields
