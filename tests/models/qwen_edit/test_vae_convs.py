"""The VAE's causal convs as 2-D convs on single pictures: the default, exact within float rounding, switchable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from difforge.models.qwen_edit import vae_convs

from .conftest import card, load, make_cfg, pixels

T = TypeVar("T")
TOL = 1e-5  # measured 4e-7 (encode) and 5e-6 (decode) on the tiny VAE at 64-256 px


def _vae(folder: Path) -> torch.nn.Module:
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage.from_pretrained(str(folder / "vae")).eval()


def _conv2d_calls(run: Callable[[], T]) -> tuple[T, int]:
    """``run()`` under no_grad, and how many times it called ``F.conv2d``."""
    calls = []
    conv2d = torch.nn.functional.conv2d

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return conv2d(*args, **kwargs)

    torch.nn.functional.conv2d = counting
    try:
        with torch.no_grad():
            return run(), len(calls)
    finally:
        torch.nn.functional.conv2d = conv2d


def _encode(vae: torch.nn.Module, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: vae.encode(x).latent_dist.mode()


def test_two_d_form_equals_diffusers_three_d_form(edit_folder: Path) -> None:
    """Encode + decode of a picture: the 2-D form is within float rounding of diffusers' 3-D form, and every
    conv took the 2-D path (a conv that silently kept conv3d would show as too few calls to conv2d)."""
    vae = _vae(edit_folder)
    x = torch.rand(1, 3, 1, 64, 96, generator=torch.Generator().manual_seed(0)) * 2 - 1

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        z = vae.encode(x).latent_dist.mode()
        return z, vae.decode(z).sample

    (z3, y3), _ = _conv2d_calls(both)
    n = vae_convs.install(vae, True)
    (z2, y2), calls = _conv2d_calls(both)
    print(f"vae 2-D vs 3-D: latents {(z2 - z3).abs().max().item():.3g}, pixels {(y2 - y3).abs().max().item():.3g}; "
          f"{calls} conv2d calls over {n} convs")
    assert (z2 - z3).abs().max().item() <= TOL and (y2 - y3).abs().max().item() <= TOL
    assert calls >= n > 0  # every causal conv ran as a conv2d


def test_video_shaped_calls_keep_the_three_d_form(edit_folder: Path) -> None:
    """Five frames: diffusers encodes the first frame alone (that chunk is a single picture: 2-D) and the others
    with a temporal cache, which keep conv3d, so the cached chunks add no 2-D call and the latents stay
    within float rounding."""
    vae = _vae(edit_folder)
    x = torch.rand(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    z3, video3 = _conv2d_calls(_encode(vae, x))  # diffusers' own 2-D layers (the spatial resamplers)
    _, picture3 = _conv2d_calls(_encode(vae, x[:, :, :1]))
    vae_convs.install(vae, True)
    z2, video = _conv2d_calls(_encode(vae, x))
    _, picture = _conv2d_calls(_encode(vae, x[:, :, :1]))
    assert 0 < video - video3 <= picture - picture3  # the cached chunks added none
    assert z3.shape[2] > 1 and (z2 - z3).abs().max().item() <= TOL


def test_default_on_and_switched_per_run(edit_folder: Path) -> None:
    """Loaded with the default, a run with ``--disable vae-2d`` uses the 3-D form and says so; the next default
    run is back on 2-D; the pictures agree within one grey level."""
    from difforge.runtime.record import RunRecord

    qe, record = load(edit_folder, make_cfg(edit_folder))
    assert {a.what: a.choice for a in record.adaptations}["vae convs"].startswith("2-D convolutions")
    convs = vae_convs.causal_convs(qe.pipe.vae)
    images = []
    for disable in ([], ["vae-2d"], []):
        cfg = make_cfg(edit_folder, disable=disable)
        rec = RunRecord("edit")
        images.append(pixels(qe(cfg, images=[card()], record=rec)[0]))
        on = not disable
        assert all(getattr(m, vae_convs.FLAG) is on for m in convs)
        choice = {a.what: a.choice for a in rec.adaptations}["vae convs"]
        assert choice.startswith("2-D") if on else choice == "diffusers' causal 3-D convolutions"
    assert np.array_equal(images[0], images[2])
    assert np.abs(images[0] - images[1]).max() <= 1.5 / 255  # one grey level of rounding
