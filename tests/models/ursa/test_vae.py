"""IBQ VQ decoder: shapes, frame folding, a hand-checked small case, uint8 truncation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from difforge.models.ursa import AutoencoderVQ, VQConfig
from difforge.models.ursa.vae import to_uint8

CFG = VQConfig(block_out_channels=(32, 32), layers_per_block=1, latent_channels=4, num_vq_embeddings=10,
               vq_embed_dim=3, attn_up_block=True, spatial_stride=2)


def model() -> AutoencoderVQ:
    torch.manual_seed(0)
    vae = AutoencoderVQ(CFG).eval()
    with torch.no_grad():
        for p in vae.parameters():
            p.normal_(0, 0.1)
    return vae


def test_decode_shapes_and_frames_fold_into_batch() -> None:
    vae = model()
    ids = torch.randint(0, 10, (1, 3, 2, 5))
    with torch.no_grad():
        video = vae.decode(ids)
        assert video.shape == (1, 3, 3, 4, 10)  # [B, C, T, H, W], stride 2
        for t in range(3):
            torch.testing.assert_close(video[:, :, t], vae.decode(ids[:, t : t + 1]), rtol=1e-5, atol=1e-5)
        assert vae.decode(ids[:, :1]).shape == (1, 3, 4, 10)


def test_decode_starts_with_codebook_lookup_and_post_quant_conv() -> None:
    vae = model()
    ids = torch.tensor([[[[1, 4], [7, 2]]]])
    seen = {}
    vae.decoder.conv_in.register_forward_hook(lambda m, i, o: seen.update(x=i[0]))
    with torch.no_grad():
        vae.decode(ids)
        z = vae.quantizer.embedding.weight[ids[0, 0]].permute(2, 0, 1)[None]  # [1, D, 2, 2]
        want = F.conv2d(z, vae.post_quant_conv.weight, vae.post_quant_conv.bias)
    torch.testing.assert_close(seen["x"], want)


def test_float_ids_are_cast_to_the_index_dtype() -> None:
    vae = model()
    ids = torch.randint(0, 10, (1, 1, 2, 2))
    with torch.no_grad():
        assert torch.equal(vae.decode(ids.to(torch.int32)), vae.decode(ids))


def test_encode_returns_int_codes() -> None:
    vae = model()
    with torch.no_grad():
        codes = vae.encode(torch.rand(1, 3, 8, 6) * 2 - 1)
    assert codes.dtype == torch.int32 and codes.shape == (1, 4, 3)


def test_uint8_truncates_toward_zero_and_clamps() -> None:
    x = torch.tensor([-2.0, -1.0, 0.0, 0.999, 1.0, 3.0]).view(1, 1, 1, 6).expand(1, 3, 1, 6)
    out = to_uint8(x)
    assert out.shape == (1, 1, 6, 3) and out.dtype == torch.uint8
    assert out[0, 0, :, 0].tolist() == [0, 0, 127, 254, 255, 255]  # 127.5 -> 127, 254.87 -> 254


@pytest.mark.parametrize("bad", [{"block_out_channels": ["wide", 64]}, {"block_out_channels": 128}])
def test_malformed_vae_config_is_one_checkpoint_error(bad: dict) -> None:
    from difforge.errors import CheckpointError
    from difforge.models.ursa.config import VQConfig
    from difforge.models.ursa.vae_fsq import FSQConfig

    for cls in (VQConfig, FSQConfig):
        with pytest.raises(CheckpointError, match="vae/config.json is malformed"):
            cls.from_dict({"num_vq_embeddings": 64, **bad})
