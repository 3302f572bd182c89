"""The VAE's causal convs as 2-D convs on single pictures: the default, exact within float rounding, switchable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from difforge.models.qwen_edit import vae_convs

from .conftest import card, load, make_cfg, pixels

TOL = 1e-5  # measured 4e-7 (encode) and 5e-6 (decode) on the tiny VAE at 64-256 px


def _vae(folder: Path) -> torch.nn.Module:
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage.from_pretrained(str(folder / "vae")).eval()


def test_two_d_form_equals_diffusers_three_d_form(edit_folder: Path) -> None:
    """Encode + decode of a picture: the 2-D form is within float rounding of diffusers' 3-D form, and every
    conv took the 2-D path (a conv that silently kept conv3d would show as no call to conv2d)."""
    vae = _vae(edit_folder)
    x = torch.rand(1, 3, 1, 64, 96, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        z3 = vae.encode(x).latent_dist.mode()
        y3 = vae.decode(z3).sample
        n = vae_convs.install(vae, True)
        calls = []
        conv2d = torch.nn.functional.conv2d

        def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls.append(1)
            return conv2d(*args, **kwargs)

        torch.nn.functional.conv2d = counting
        try:
            z2 = vae.encode(x).latent_dist.mode()
            y2 = vae.decode(z2).sample
        finally:
            torch.nn.functional.conv2d = conv2d
    print(f"vae 2-D vs 3-D: latents {(z2 - z3).abs().max().item():.3g}, pixels {(y2 - y3).abs().max().item():.3g}; "
          f"{len(calls)} conv2d calls over {n} convs")
    assert (z2 - z3).abs().max().item() <= TOL and (y2 - y3).abs().max().item() <= TOL
    assert len(calls) >= n > 0  # every causal conv ran as a conv2d


def _conv2d_calls(vae: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    calls = []
    conv2d = torch.nn.functional.conv2d

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return conv2d(*args, **kwargs)

    torch.nn.functional.conv2d = counting
    try:
        with torch.no_grad():
            return vae.encode(x).latent_dist.mode(), len(calls)
    finally:
        torch.nn.functional.conv2d = conv2d


def test_video_shaped_calls_keep_the_three_d_form(edit_folder: Path) -> None:
    """Five frames: diffusers encodes the first frame alone (that chunk is a single picture: 2-D) and the others
    with a temporal cache, which keep conv3d, so the cached chunks add no 2-D call and the latents stay
    within float rounding."""
    vae = _vae(edit_folder)
    x = torch.rand(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    z3, video3 = _conv2d_calls(vae, x)  # diffusers' own 2-D layers (the spatial resamplers)
    _, picture3 = _conv2d_calls(vae, x[:, :, :1])
    vae_convs.install(vae, True)
    z2, video = _conv2d_calls(vae, x)
    _, picture = _conv2d_calls(vae, x[:, :, :1])
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
