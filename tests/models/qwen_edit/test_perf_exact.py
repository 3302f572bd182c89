"""Speed-ups of the Qwen-Edit loop: exact ones change outputs only by float rounding, fast ones are labelled.

Tolerances (tiny models, fp32, CPU): batched CFG vs two calls and real vs complex RoPE are float
rounding - 1e-5 absolute on velocities of magnitude ~1 (measured: a few 1e-7); whole runs with
every exact speed-up on vs diffusers' path: 1e-5 on the final latents and at most one 8-bit level
on the image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from difforge.errors import InputError
from difforge.models.qwen_edit.attention import apply_rope, real_rope_table
from difforge.models.qwen_edit.loop import EXACT_OPTIMISATIONS, Denoiser, SpeedOptions, denoise

from .conftest import card, load, make_cfg, pixels

EXACT_TOL = 1e-5
ALL_OFF = list(EXACT_OPTIMISATIONS)


def _run(folder: Path, images, **kw):
    cfg = make_cfg(folder, **kw)
    qe, record = load(folder, cfg)
    final: list[torch.Tensor] = []
    image = pixels(qe(cfg, record, images, step_hook=lambda i, inp, out: final.append(out["latents"]))[0])
    return qe, cfg, record, image, final[-1]


def _velocities(qe, cfg, batched: bool) -> torch.Tensor:
    p = qe.prepared_for(cfg)
    t = qe._timesteps(p, 4)[1]
    with torch.inference_mode():
        return Denoiser(qe.pipe.transformer, batched_cfg=batched).velocity(p, p.noise, t, cfg.true_cfg)


@pytest.mark.parametrize("real_rope", [True, False])
def test_batched_cfg_equals_two_calls(plus_folder: Path, real_rope: bool) -> None:
    """One batch-2 call with the shorter text padded == two batch-1 calls, with either processor path."""
    disable = [] if real_rope else ["real-rope"]
    qe, cfg, *_ = _run(plus_folder, [card(), card(64, 80, flip=True)], disable=disable)
    p = qe.cached_prepared(cfg)
    assert p.prompt_embeds.shape[1] != p.negative_embeds.shape[1]  # the ragged case is the one exercised
    batch = Denoiser(qe.pipe.transformer).cfg_batch(p)
    assert batch.mask is None and batch.text_lengths == (p.prompt_embeds.shape[1], p.negative_embeds.shape[1])
    two = _velocities(qe, cfg, batched=False)
    one = _velocities(qe, cfg, batched=True)
    diff = (one - two).abs().max().item()
    print(f"batched CFG vs two calls (real_rope={real_rope}): max abs diff {diff:.3g}, scale {two.abs().max():.3g}")
    assert diff <= EXACT_TOL


def test_masked_batch_equals_two_calls_with_diffusers_processor(edit_folder: Path) -> None:
    """Loaded with diffusers' processor, a batched run falls back to a padding mask; still exact."""
    qe, cfg, *_ = _run(edit_folder, [card()], disable=ALL_OFF)
    p = qe.cached_prepared(cfg)
    p._batch = None
    batch = Denoiser(qe.pipe.transformer).cfg_batch(p)
    assert batch.text_lengths is None and batch.mask is not None and not bool(batch.mask.all())
    diff = (_velocities(qe, cfg, batched=True) - _velocities(qe, cfg, batched=False)).abs().max().item()
    print(f"masked batched CFG vs two calls: max abs diff {diff:.3g}")
    assert diff <= EXACT_TOL


def test_real_rope_equals_complex_rope() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 37, 3, 16, generator=gen)
    angles = torch.rand(37, 8, generator=gen) * 50
    freqs = torch.polar(torch.ones_like(angles), angles)
    diff = (apply_rope(x, real_rope_table(freqs)) - apply_rope(x, freqs)).abs().max().item()
    print(f"real vs complex RoPE: max abs diff {diff:.3g}")
    assert diff <= 1e-6
    assert not torch.equal(apply_rope(x, freqs), x)  # it does rotate


def test_default_run_matches_diffusers_path(plus_folder: Path) -> None:
    """Every exact speed-up on vs every one off (diffusers' arithmetic, bit-identical to its __call__)."""
    images = [card(96, 64), card(64, 80, flip=True)]
    _, _, record, image, latents = _run(plus_folder, images)
    _, _, ref_record, ref_image, ref_latents = _run(plus_folder, images, disable=ALL_OFF)
    lat = (latents - ref_latents).abs().max().item()
    img = np.abs(image - ref_image).max()
    print(f"default vs diffusers path: latents {lat:.3g}, image {img:.3g}")
    assert lat <= EXACT_TOL and img <= 1 / 255
    chosen = {a.what: a for a in record.adaptations}
    assert chosen["cfg"].choice.startswith("one batch-2") and chosen["cfg"].exact
    assert chosen["rope"].choice.startswith("real-valued") and chosen["rope"].exact
    assert chosen["denoise loop"].exact
    assert record.extra["forwards_per_step"] == 1 and ref_record.extra["forwards_per_step"] == 2
    ref = {a.what: a.choice for a in ref_record.adaptations}
    assert ref["cfg"].startswith("two batch-1") and ref["rope"].startswith("diffusers complex64")
    assert chosen["vae convs"].choice.startswith("2-D convolutions") and chosen["vae convs"].exact
    assert ref["vae convs"] == "diffusers' causal 3-D convolutions"


class _SyncCounter(TorchDispatchMode):
    """Counts ops that force a device->host synchronisation on an accelerator."""

    SYNCING = {"_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "is_nonzero", "equal"}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SYNCING:
            self.seen.append(name)
        if name in ("_to_copy", "copy_"):
            out = kwargs.get("device") if kwargs else None
            if out is not None and torch.device(out).type == "cpu" and any(
                isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args
            ):
                self.seen.append(f"{name} to host")
        return func(*args, **(kwargs or {}))


def test_denoise_loop_has_no_host_syncs(plus_folder: Path) -> None:
    qe, cfg, record, *_ = _run(plus_folder, [card()])
    p = qe.cached_prepared(cfg)
    timesteps = qe._timesteps(p, 3)
    counter = _SyncCounter()
    with torch.inference_mode(), counter:
        out = denoise(qe.denoiser(cfg), qe.pipe.scheduler, p, timesteps, cfg.true_cfg)
    assert out.shape == p.noise.shape and torch.isfinite(out).all()
    assert counter.seen == [], counter.seen
    with counter:  # the counter does see a sync when one happens
        torch.ones(2).sum().item()
    assert counter.seen == ["_local_scalar_dense"]
    assert next(a for a in record.adaptations if a.what == "denoise loop").choice == "no host syncs, static shapes"


@pytest.mark.parametrize("fast, syncs", [("first-block-cache=0.05", True), ("taylorseer=2", False)])
def test_the_record_names_the_option_that_adds_host_syncs(plus_folder: Path, fast: str, syncs: bool) -> None:
    """First-Block-Cache reads its residual ratio with .item() (every call after the first); the record says so."""
    cfg = make_cfg(plus_folder, fast=[fast])
    qe, record = load(plus_folder, cfg)
    qe._prepare(cfg, [card()])
    p = qe.cached_prepared(cfg)
    counter = _SyncCounter()
    with torch.inference_mode(), counter:
        denoise(qe.denoiser(cfg), qe.pipe.scheduler, p, qe._timesteps(p, 3), cfg.true_cfg)
    assert set(counter.seen) <= {"item"} and (0 < len(counter.seen) <= 3 if syncs else not counter.seen)
    loop = next(a for a in record.adaptations if a.what == "denoise loop").choice
    assert loop == ("static shapes; a host sync in each transformer call (first-block-cache)" if syncs
                    else "no host syncs, static shapes")


@pytest.mark.parametrize("fast", ["first-block-cache=0.4", "taylorseer=3"])
def test_fast_caches_are_labelled_inexact_and_change_little(plus_folder: Path, fast: str) -> None:
    images = [card()]
    _, _, _, base_image, base = _run(plus_folder, images, steps=10)
    qe, _, record, image, latents = _run(plus_folder, images, steps=10, fast=[fast])
    step_cache = next(a for a in record.adaptations if a.what == "step cache")
    assert step_cache.exact is False
    diff = (latents - base).abs().max().item()
    print(f"{fast}: max abs latent change {diff:.3g} (latent scale {base.abs().max():.3g})")
    assert 0 < diff <= 0.1 * base.abs().max().item()
    assert np.abs(image - base_image).max() <= 0.1
    assert qe.pipe.transformer.is_cache_enabled


def test_unknown_or_bad_names_are_input_errors() -> None:
    with pytest.raises(InputError, match="Unknown --disable 'fused-everything'"):
        SpeedOptions.parse(disable=["fused-everything"])
    with pytest.raises(InputError, match="Unknown --fast 'teacache'"):
        SpeedOptions.parse(fast=["teacache"])
    with pytest.raises(InputError, match="positive threshold"):
        SpeedOptions.parse(fast=["first-block-cache=-1"])
    opts = SpeedOptions.parse(disable=["real-rope"], fast=["taylorseer"], compile=True)
    assert (opts.real_rope, opts.batched_cfg, opts.taylorseer, opts.compile) == (False, True, 5, True)


def test_fast_names_are_refused_at_load(edit_folder: Path) -> None:
    with pytest.raises(InputError, match="Unknown --fast"):
        load(edit_folder, make_cfg(edit_folder, fast=["magic"]))
