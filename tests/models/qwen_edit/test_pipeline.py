"""The edit loop: equal to diffusers' __call__, reproducible, observable, and its input errors.

The validation hooks (teacher-forced steps, components, FLOPs, operators) are tested in test_probe.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from difforge.errors import DifforgeError, InputError, SizeError, StepsError
from difforge.models.qwen_edit.loop import EXACT_OPTIMISATIONS
from difforge.models.qwen_edit.references import fit_area

from .conftest import card, load, make_cfg, pixels, probe

PHASES = {"load", "encode", "denoise", "decode"}


def _diffusers_reference(qe, cfg, images, monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, torch.Tensor]:
    """diffusers' own __call__ with the same inputs (its fixed 1024²/384² areas patched to the tiny ones).

    Returns the image and the final packed latents (caught by diffusers' step-end callback).
    """
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit_mod
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus as plus_mod

    s = qe.settings
    if qe.plus:
        monkeypatch.setattr(plus_mod, "VAE_IMAGE_SIZE", s.reference_area)
        monkeypatch.setattr(plus_mod, "CONDITION_IMAGE_SIZE", s.condition_area)
        image = images
    else:
        original = edit_mod.calculate_dimensions
        monkeypatch.setattr(edit_mod, "calculate_dimensions", lambda _area, ratio: original(s.reference_area, ratio))
        image = images[0]
    latents: list[torch.Tensor] = []

    def catch(_pipe, _i, _t, kwargs):
        latents.append(kwargs["latents"].clone())
        return kwargs

    image = qe.pipe(
        image=image, prompt=cfg.prompt, negative_prompt=" ", true_cfg_scale=cfg.true_cfg, height=cfg.height,
        width=cfg.width, num_inference_steps=cfg.steps, generator=torch.Generator("cpu").manual_seed(cfg.seed),
        output_type="pil", callback_on_step_end=catch, callback_on_step_end_tensor_inputs=["latents"],
    ).images[0]
    return pixels(image), latents[-1]


@pytest.mark.parametrize("which", ["edit", "plus"])
def test_loop_equals_diffusers_call(which: str, edit_folder: Path, plus_folder: Path, monkeypatch) -> None:
    folder = plus_folder if which == "plus" else edit_folder
    images = [card(96, 64), card(64, 80, flip=True)] if which == "plus" else [card(96, 64)]
    # Bit-identity needs diffusers' own arithmetic: every exact speed-up off.  The default path is
    # checked against diffusers within a tolerance in test_perf_exact.py.
    cfg = make_cfg(folder, disable=list(EXACT_OPTIMISATIONS))
    qe, record = load(folder, cfg)
    final: list[torch.Tensor] = []
    ours = pixels(qe(cfg, record, images, step_hook=lambda i, inp, out: final.append(out["latents"]))[0])
    theirs, latents = _diffusers_reference(qe, cfg, images, monkeypatch)
    print(f"{which}: max |ours - diffusers|: image {np.abs(ours - theirs).max()}, "
          f"latents {(final[-1] - latents).abs().max().item()}")
    assert np.array_equal(ours, theirs)
    assert torch.equal(final[-1], latents)
    assert set(record.phases) >= PHASES
    assert len(record.step_times_s) == 2 and all(t > 0 for t in record.step_times_s)
    assert record.extra["true_cfg"] is True and record.extra["tokens"]["text"] > 0
    print(which, {k: round(v.wall_s, 3) for k, v in record.phases.items()})


def test_same_seed_same_image_other_seed_differs(edit_folder: Path) -> None:
    cfg = make_cfg(edit_folder)
    qe, record = load(edit_folder, cfg)
    first = pixels(qe(cfg, record, [card()])[0])
    second = pixels(qe(cfg, record, [card()])[0])
    other = pixels(qe(make_cfg(edit_folder, seed=1), record, [card()])[0])
    assert np.array_equal(first, second)
    assert np.abs(first - other).max() > 0


def test_plus_two_images_default_size_follows_last_image(plus_folder: Path) -> None:
    cfg = make_cfg(plus_folder, height=None, width=None)
    qe, record = load(plus_folder, cfg)
    out = qe(cfg, record, [card(64, 64), card(128, 64)])
    expected = fit_area(qe.settings.output_area, 2.0)  # (width, height) of the last image's 2:1 aspect
    assert out[0].size == expected
    one = qe(cfg, record, [card(128, 64)])  # the first reference must matter
    assert not np.array_equal(pixels(out[0]), pixels(one[0]))
    assert record.extra["zero_cond_t"] is True


def test_before_decode_offload_equals_no_offload(plus_folder: Path) -> None:
    cfg = make_cfg(plus_folder)
    qe, record = load(plus_folder, cfg)
    plain = pixels(qe(cfg, record, [card()])[0])
    off_cfg = make_cfg(plus_folder, offload="before-decode")
    qe_off, rec_off = load(plus_folder, off_cfg)
    offloaded = pixels(qe_off(off_cfg, rec_off, [card()])[0])
    assert np.array_equal(plain, offloaded)
    assert any(a.what == "offload" and a.choice == "before-decode" for a in rec_off.adaptations)
    assert qe_off.pipe.transformer.device.type == "cpu"
    again = pixels(qe_off(off_cfg, rec_off, [card()])[0])  # a second run brings the weights back
    assert np.array_equal(plain, again)


@pytest.mark.parametrize("plan", ["model", "sequential"])
def test_accelerator_offload_plans_refused_on_cpu(plan: str, edit_folder: Path) -> None:
    with pytest.raises(DifforgeError, match="accelerator"):
        load(edit_folder, make_cfg(edit_folder, offload=plan))


def test_input_errors(edit_folder: Path, plus_folder: Path) -> None:
    cfg = make_cfg(edit_folder)
    qe, record = load(edit_folder, cfg)
    with pytest.raises(InputError, match="exactly one"):
        qe(cfg, record, [card(), card()])
    with pytest.raises(InputError, match="reference image"):
        qe(cfg, record, [])
    with pytest.raises(InputError, match="reference image"):
        qe(cfg, record, None)
    with pytest.raises(SizeError, match="multiples of 16") as err:
        qe(make_cfg(edit_folder, height=72), record, [card()])
    assert "\n" not in str(err.value)
    for height, width in ((0, 64), (64, -16)):  # not silently replaced by the default size
        with pytest.raises(SizeError, match=f"positive multiples of 16 for this model, got {height}x{width}"):
            qe(make_cfg(edit_folder, height=height, width=width), record, [card()])
    with pytest.raises(StepsError, match="at least 2"):
        qe(make_cfg(edit_folder, steps=1), record, [card()])
    plus, plus_record = load(plus_folder, make_cfg(plus_folder))
    assert len(plus(make_cfg(plus_folder), plus_record, [card(), card(64, 64), card(32, 96)])) == 1


def test_no_negative_prompt_still_runs_true_cfg_and_cfg_off_below_one(edit_folder: Path) -> None:
    cfg = make_cfg(edit_folder, true_cfg=1.0)
    qe, record = load(edit_folder, cfg)
    qe(cfg, record, [card()])
    assert record.extra["true_cfg"] is False
    assert probe(qe).flops_per_step(cfg)["forwards_per_step"] == 1
    qe(make_cfg(edit_folder), record, [card()])
    assert record.extra["true_cfg"] is True


def test_diffusers_style_call_equals_the_run_contract(edit_folder: Path) -> None:
    """``pipe(image=..., prompt=..., generator=...)`` - diffusers' call - runs difforge's loop unchanged."""
    cfg = make_cfg(edit_folder, negative_prompt="blurry", true_cfg=3.0)
    qe, record = load(edit_folder, cfg)
    expected = pixels(qe(cfg, record, [card()])[0])
    out = qe(image=card(), prompt=cfg.prompt, negative_prompt="blurry", true_cfg_scale=3.0, height=64, width=64,
             num_inference_steps=2, generator=torch.Generator().manual_seed(0))
    assert np.array_equal(pixels(out.images[0]), expected)
    arr = qe(image=card(), prompt=cfg.prompt, negative_prompt="blurry", true_cfg_scale=3.0, height=64, width=64,
             num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="np").images
    assert arr.shape == (1, 64, 64, 3) and np.allclose(arr[0], expected)


def _record(record) -> dict[str, tuple[str, bool]]:
    return {a.what: (a.choice, a.exact) for a in record.adaptations}


def test_a_reused_pipeline_runs_each_cfg_like_a_fresh_one(edit_folder: Path) -> None:
    """Caches, exact speed-ups, VAE tiling and offload follow each run's cfg, and so does its record."""
    from difforge.runtime.record import RunRecord

    cached = make_cfg(edit_folder, fast=["first-block-cache=0.5"])
    qe, load_record = load(edit_folder, cached)
    first = pixels(qe(cached, load_record, [card()])[0])
    other = make_cfg(edit_folder, disable=list(EXACT_OPTIMISATIONS), vae_tiling=True, offload="before-decode")
    record = RunRecord("edit")
    reused = pixels(qe(other, record, [card()])[0])
    fresh, fresh_record = load(edit_folder, other)
    assert np.array_equal(reused, pixels(fresh(other, fresh_record, [card()])[0]))
    assert not np.array_equal(first, reused)  # the cache did change the output, and is gone now
    assert _record(record) == _record(fresh_record)
    assert "step cache" not in _record(record) and _record(record)["offload"][0] == "before-decode"
    assert qe.pipe.vae.use_tiling and not qe.pipe.transformer.is_cache_enabled
    again = pixels(qe(cached, record, [card()])[0])  # and back: same as the first run
    assert np.array_equal(again, first)
    assert {"vae", "offload"}.isdisjoint(_record(record)) and not _record(record)["step cache"][1]
    assert not qe.pipe.vae.use_tiling and record.extra["speed"]["fast"] == ["first-block-cache=0.5"]
    # What is set up at load cannot change per run; the pipeline stays usable after the refusal.
    with pytest.raises(InputError, match="loaded without --compile; reload the pipeline") as err:
        qe(make_cfg(edit_folder, compile=True), record, [card()])
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="--offload none; reload the pipeline to run with --offload model"):
        qe(make_cfg(edit_folder, offload="model"), record, [card()])
    assert qe.options.first_block_cache == 0.5 and qe.offload == "none" and not qe.options.compile
