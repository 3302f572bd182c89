"""FSQ video VAE (``AutoencoderVQCosmos3D``): dequantise, Haar, causality, tiling, layout, reference pins.

The reference decodes come from ``diffnext`` (baaivision/URSA; scripts/ursa_reference_arrays.py): its
``AutoencoderVQCosmos3D`` was built with the configs below, given the weights that :func:`model` writes (same
generator, same parameter order) through safetensors with ``strict=True``.  They are stored in
data/reference_fsq_decode.npz and compared within the float32 / bfloat16 bounds of parity.py; encoder ids are
discrete and pinned exactly.  In one process on one machine the decodes are bit-identical to the reference
(test_reference_live.py).
"""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from difforge.errors import CheckpointError
from difforge.models.ursa.vae_fsq import (
    AutoencoderVQCosmos3D,
    CausalConv3d,
    FSQConfig,
    FSQuantizer,
    ResBlock3d,
    Upsample3d,
    haar_forward_3d,
    haar_inverse_3d,
)

from .parity import assert_bf16_close, assert_fp32_close, reference

TINY = dict(block_out_channels=(16, 32, 32, 32), layers_per_block=1, latent_channels=8, sample_frames=9,
            num_vq_embeddings=64000, vq_embed_dim=6, temporal_stride=4, spatial_stride=8)
REAL = dict(latent_channels=256, patch_size=2, sample_frames=49, num_vq_embeddings=64000, vq_embed_dim=6,
            temporal_stride=4, spatial_stride=8, block_out_channels=(128, 256, 512, 512), layers_per_block=2)


def model(patch_size: int) -> tuple[AutoencoderVQCosmos3D, torch.Tensor]:
    """Tiny VAE with deterministic fan-in-scaled weights, and ids [1, 7, 3, 4] from the same generator."""
    vae = AutoencoderVQCosmos3D(FSQConfig(**TINY, patch_size=patch_size)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(math.prod(p.shape[1:])))
    return vae, torch.randint(0, 64000, (1, 7, 3, 4), generator=g)


def key_digest(vae: torch.nn.Module) -> str:
    lines = "\n".join(f"{k} {tuple(v.shape)}" for k, v in sorted(vae.state_dict().items()))
    return hashlib.sha256(lines.encode()).hexdigest()


# ------------------------------------------------------------------------------------------ FSQ
def test_dequantize_known_codes() -> None:
    q = FSQuantizer((8, 8, 8, 5, 5, 5))
    # digits (1, 2, 3, 4, 1, 2) -> id 1 + 2*8 + 3*64 + 4*512 + 1*2560 + 2*12800
    code = 1 + 2 * 8 + 3 * 64 + 4 * 512 + 1 * 2560 + 2 * 12800
    ids = torch.tensor([0, 63999, code])
    z = q.dequantize(ids, torch.float32)
    assert z.shape == (3, 6)
    assert z[0].tolist() == [-1.0] * 6
    assert z[1].tolist() == [0.75, 0.75, 0.75, 1.0, 1.0, 1.0]
    assert z[2].tolist() == [-0.75, -0.5, -0.25, 1.0, -0.5, 0.0]
    assert torch.equal(q.dequantize(ids.int(), torch.float32), z)  # any integer index dtype
    q.index_dtype = torch.int32
    assert torch.equal(q.dequantize(ids, torch.float32), z)
    assert q.dequantize(ids, torch.bfloat16).dtype == torch.bfloat16


def test_quantize_saturates_to_the_extreme_codes() -> None:
    q = FSQuantizer((8, 8, 8, 5, 5, 5))
    z = torch.full((1, 6, 2, 1, 1), 10.0)
    z[:, :, 1] = -10.0
    ids = q.quantize(z)
    assert ids.dtype == torch.int32 and ids.flatten().tolist() == [63999, 0]


def test_fsq_config_checks() -> None:
    FSQConfig.from_dict(REAL)  # the published config is accepted
    with pytest.raises(CheckpointError, match="vq_embed_dim"):
        FSQConfig.from_dict({**REAL, "vq_embed_dim": 8})
    with pytest.raises(CheckpointError, match="num_vq_embeddings"):
        FSQConfig.from_dict({**REAL, "num_vq_embeddings": 64001})
    with pytest.raises(CheckpointError, match="temporal_stride"):
        FSQConfig.from_dict({**REAL, "temporal_stride": 8})
    with pytest.raises(CheckpointError, match="sample_frames"):
        FSQConfig.from_dict({**REAL, "sample_frames": 48})
    assert FSQConfig.from_dict({**REAL, "levels": [4, 4, 4]}).levels == (8, 8, 8, 5, 5, 5)  # not a real key


# ------------------------------------------------------------------------------------------ Haar
def test_haar_inverse_of_single_bands() -> None:
    c = 1.0  # a unit coefficient in each band
    x = torch.zeros(1, 8, 1, 1, 1)
    x[0, 0] = c  # LLL: a constant 2x2x2 block (c * (1/sqrt2)^3 * 2 sqrt2 = c)
    torch.testing.assert_close(haar_inverse_3d(x), torch.full((1, 1, 2, 2, 2), c))
    x.zero_()
    x[0, 1] = c  # high along width only: +c on even columns, -c on odd ones
    want = torch.tensor([c, -c]).view(1, 1, 1, 1, 2).expand(1, 1, 2, 2, 2)
    torch.testing.assert_close(haar_inverse_3d(x), want)
    x.zero_()
    x[0, 4] = c  # high along time only
    want = torch.tensor([c, -c]).view(1, 1, 2, 1, 1).expand(1, 1, 2, 2, 2)
    torch.testing.assert_close(haar_inverse_3d(x), want)


def test_haar_forward_by_hand_and_round_trip() -> None:
    block = torch.arange(8.0).view(1, 1, 2, 2, 2)  # value = 4t + 2h + w
    bands = haar_forward_3d(block)[0, :, 0, 0, 0]
    # Each axis maps (a, b) to ((a + b), (a - b)) / sqrt2, then all is divided by 2 sqrt2: 1/8 overall.
    # LLL is the block mean; a single-axis high band is (even half - odd half) / 8 along that axis.
    want = torch.tensor([28 / 8, -4 / 8, -8 / 8, 0, -16 / 8, 0, 0, 0])
    torch.testing.assert_close(bands, want)
    x = torch.randn(2, 3, 4, 6, 8, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(haar_inverse_3d(haar_forward_3d(x)), x)


# ------------------------------------------------------------------------------------------ causality
def test_causal_conv_pads_by_replicating_the_first_frame() -> None:
    torch.manual_seed(0)
    conv = CausalConv3d(2, 3, (3, 1, 1))
    x = torch.randn(1, 2, 4, 3, 3)
    y = conv(x)
    assert y.shape == (1, 3, 4, 3, 3)
    x2 = x.clone()
    x2[:, :, 1:] += 1  # change every frame but the first
    assert torch.equal(conv(x2)[:, :, 0], y[:, :, 0])
    assert not torch.equal(conv(x2)[:, :, 1], y[:, :, 1])
    padded = torch.cat([x[:, :, :1], x[:, :, :1], x], 2)
    torch.testing.assert_close(y, torch.nn.functional.conv3d(padded, conv.weight, conv.bias))


def test_resblock_and_temporal_upsampler_are_causal() -> None:
    torch.manual_seed(0)
    block, up = ResBlock3d(4, 8).eval(), Upsample3d(8, 2, 2).eval()
    x = torch.randn(1, 4, 3, 4, 4)
    with torch.no_grad():
        y = up(block(x))
        assert y.shape == (1, 8, 5, 8, 8)  # T -> 2T - 1, H, W -> 2x
        x2 = x.clone()
        x2[:, :, 1:] = torch.randn(1, 4, 2, 4, 4)
        y2 = up(block(x2))
    assert torch.equal(y2[:, :, 0], y[:, :, 0])  # output frame 0 sees latent frame 0 only
    assert not torch.equal(y2[:, :, 1], y[:, :, 1])


def test_decoder_time_attention_is_not_causal() -> None:
    vae, ids = model(2)
    ids2 = ids[:, :3].clone()
    ids2[:, 2] = (ids2[:, 2] + 1) % 64000
    with torch.no_grad():
        a, b = vae.decode(ids[:, :3]), vae.decode(ids2)
    assert not torch.equal(a[:, :, 0], b[:, :, 0])  # the mid block's temporal attention sees the future


# ------------------------------------------------------------------------------------------ layout
def test_layout_follows_patch_size() -> None:
    p2, p4 = FSQConfig(**TINY, patch_size=2), FSQConfig(**TINY, patch_size=4)
    assert p2.up_layout() == [(2, 0), (2, 2), None] and p4.up_layout() == [(2, 0), (0, 0), None]
    assert p2.decoder_upscale == p4.decoder_upscale == 8
    assert p2.decoder_temporal_upscale == p4.decoder_temporal_upscale == 4
    k2 = AutoencoderVQCosmos3D(p2).state_dict()
    k4 = AutoencoderVQCosmos3D(p4).state_dict()
    assert "decoder.up_blocks.1.upsamplers.0.conv1.weight" in k2  # temporal up-conv
    assert not any(k.startswith("decoder.up_blocks.1.upsamplers") for k in k4)  # parameter-free
    assert k2["decoder.conv_out.0.weight"].shape == (3 * 8, 32, 1, 3, 3)
    assert k4["decoder.conv_out.0.weight"].shape == (3 * 64, 32, 1, 3, 3)
    assert k2["decoder.mid_block.attentions.0.1.to_q.weight"].shape == (32, 32)
    assert k2["encoder.down_blocks.0.downsamplers.0.conv2.weight"].shape == (32, 32, 3, 1, 1)


def test_state_dict_names_equal_the_references() -> None:
    # sha256 of sorted "key shape" lines of the reference's state_dict (see the module docstring).
    want = {
        "p2": "f69ae419cea02561bc692a56740bb80a68d8248afac2f49e0650f6abc923c9e8",
        "p4": "91bdf56d55422eadec882bd780c469405996769a5b4bf365d9a3b8b8257c4ea2",
        "real": "cfe86bab05ef11eeadc63f9819109d9860628b43aad1af8690f7f3358b9db04a",
    }
    with torch.device("meta"):
        got = {
            "p2": AutoencoderVQCosmos3D(FSQConfig(**TINY, patch_size=2)),
            "p4": AutoencoderVQCosmos3D(FSQConfig(**TINY, patch_size=4)),
            "real": AutoencoderVQCosmos3D(FSQConfig.from_dict(REAL)),
        }
    assert {k: key_digest(v) for k, v in got.items()} == want
    assert sum(v.numel() for v in got["real"].state_dict().values()) == 112619766


def test_strict_load_round_trip_through_safetensors(tmp_path) -> None:
    """What loading must preserve is the state dict: every key, shape, dtype and value, nothing extra.

    (Comparing two decodes would test kernel bits instead: on some CPUs ``F.linear`` on a strided input
    takes another path when ``weight.requires_grad`` differs, and ``load_strict`` freezes the weights.)
    """
    from safetensors.torch import load_file, save_file

    from difforge.models.ursa.loader import load_strict

    vae, _ = model(2)
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(tmp_path / "w.safetensors"))
    with torch.device("meta"):
        fresh = AutoencoderVQCosmos3D(vae.config)
    state = load_file(str(tmp_path / "w.safetensors"))
    load_strict(fresh, state, "vae")
    want, got = vae.state_dict(), fresh.state_dict()
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].device.type == "cpu" and got[key].dtype == value.dtype, key
        assert torch.equal(got[key], value), key
    assert not any(p.requires_grad for p in fresh.parameters())  # frozen for inference
    state.pop("decoder.up_blocks.1.upsamplers.0.conv1.bias")
    with torch.device("meta"):
        fresh = AutoencoderVQCosmos3D(vae.config)
    with pytest.raises(CheckpointError, match="upsamplers.0.conv1.bias"):
        load_strict(fresh, state, "vae")


# ------------------------------------------------------------------------------------------ tiling
def test_output_frame_counts() -> None:
    real = FSQConfig.from_dict(REAL)
    assert real.window == 13
    assert [real.output_frames(t) for t in (1, 13, 26, 27)] == [1, 49, 97, 97]
    assert real.tiles_exactly(13) and real.tiles_exactly(26) and not real.tiles_exactly(27)


def test_tiling_drops_first_frame_of_later_windows_and_skips_partial_ones() -> None:
    vae, ids = model(2)
    assert vae.config.window == 3
    with torch.no_grad():
        first, second = vae.decode(ids[:, :3]), vae.decode(ids[:, 3:6])
        six, seven = vae.decode(ids[:, :6]), vae.decode(ids)
    assert first.shape == (1, 3, 9, 24, 32)
    assert torch.equal(six, torch.cat([first, second[:, :, 1:]], 2))
    assert torch.equal(seven, six)  # latent frame 6 starts a window that would run past the end
    assert six.shape[2] == vae.config.output_frames(6) == 17


# ------------------------------------------------------------------------------------------ reference pins
@pytest.mark.parametrize("patch", [2, 4])
def test_decode_matches_reference(patch: int) -> None:
    ref = reference("reference_fsq_decode")
    vae, ids = model(patch)
    with torch.no_grad():
        one, three, six = vae.decode(ids[:, :1]), vae.decode(ids[:, :3]), vae.decode(ids[:, :6])
        half = vae.to(torch.bfloat16).decode(ids[:, :3])
    assert_fp32_close(one, ref[f"p{patch}_t1"])
    assert_fp32_close(six, ref[f"p{patch}_t6"])
    assert_fp32_close(three, ref[f"p{patch}_t6"][:, :, :9])  # the first window is the 3-frame decode
    assert half.dtype == torch.bfloat16
    assert_bf16_close(half, ref[f"p{patch}_t6"][:, :, :9])


def test_parity_bounds_catch_a_small_decoder_fault() -> None:
    """The fp32 bound is tight enough to see a 0.1 % scale error in one conv: a check that cannot fail is none."""
    ref = reference("reference_fsq_decode")
    vae, ids = model(2)
    with torch.no_grad():
        vae.decoder.conv_out[0].weight.mul_(1.001)
        out = vae.decode(ids[:, :1])
    with pytest.raises(AssertionError, match="max relative error"):
        assert_fp32_close(out, ref["p2_t1"])


def test_encode_matches_reference() -> None:
    want = [9574, 17252, 31500, 29987, 54963, 32612, 9574, 17252, 31508, 42787, 54962, 32604, 9062, 7005, 32020,
            32547, 54963, 32092, 42739, 32037, 44844, 54570, 19804, 29931, 42739, 32029, 44844, 55026, 16732,
            29483, 43260, 32029, 44843, 55027, 16731, 29419]
    vae, _ = model(2)
    g = torch.Generator().manual_seed(1)  # replay model()'s draws to where the reference drew its video
    for p in vae.parameters():
        torch.randn(p.shape, generator=g)
    torch.randint(0, 64000, (1, 7, 3, 4), generator=g)
    video = torch.rand(1, 3, 17, 16, 24, generator=g) * 2 - 1
    with torch.no_grad():
        codes = vae.encode(video)  # two 9-frame windows overlapping by one frame -> 2 x 3 latent frames
    assert codes.dtype == torch.int32 and codes.shape == (1, 6, 2, 3)
    assert codes.flatten().tolist() == want
