"""The IBQ image tokenizer's autoencoder (``AutoencoderVQ``): codebook lookup + 2-D conv decoder.

Module names equal the checkpoint's keys.  The encoder is built too so the state dict loads
strictly; it is only needed for image conditioning.  Every GroupNorm has 32 groups and eps 1e-6;
attention blocks are single-head over the flattened H*W positions and return *without* the residual
(callers add it).  The decode path deliberately keeps the reference's memory layout: the codebook
lookup is permuted to channels-first without a copy, so the convolutions see the same strides (and
pick the same kernels) as the reference's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import VQConfig


def _norm(ch: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, ch, eps=1e-6)


class VAEAttention(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.group_norm = _norm(ch)
        self.to_q, self.to_k, self.to_v = nn.Linear(ch, ch), nn.Linear(ch, ch), nn.Linear(ch, ch)
        self.to_out = nn.ModuleList([nn.Linear(ch, ch)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (-1, *x.shape[1:])
        h = self.group_norm(x).flatten(2).transpose(1, 2).contiguous()  # [B, HW, C]
        q, k, v = (f(h).view(-1, h.shape[1], 1, h.shape[2]).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
        return self.to_out[0](o.flatten(2)).transpose(1, 2).reshape(shape)


class ResBlock(nn.Module):
    def __init__(self, ch_in: int, ch_out: int) -> None:
        super().__init__()
        self.norm1 = _norm(ch_in)
        self.conv1 = nn.Conv2d(ch_in, ch_out, 3, 1, 1)
        self.norm2 = _norm(ch_out)
        self.conv2 = nn.Conv2d(ch_out, ch_out, 3, 1, 1)
        self.conv_shortcut = nn.Conv2d(ch_in, ch_out, 1) if ch_in != ch_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        h = self.conv1(F.silu(self.norm1(x)))
        return self.conv2(F.silu(self.norm2(h))).add_(skip)


class Resample(nn.Module):
    """Nearest x2 then conv (up), or zero-pad right/bottom then stride-2 conv (down)."""

    def __init__(self, ch: int, down: bool) -> None:
        super().__init__()
        self.down = down
        self.conv = nn.Conv2d(ch, ch, 3, 2, 0) if down else nn.Conv2d(ch, ch, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.down:
            return self.conv(F.pad(x, (0, 1, 0, 1)))
        return self.conv(F.interpolate(x, None, (2, 2)))


class ResStage(nn.Module):
    """``resnets`` (each optionally followed by a residual attention), then an optional resampler."""

    def __init__(self, ch_in: int, ch_out: int, depth: int, down: bool = False, up: bool = False) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(ResBlock(ch_in if i == 0 else ch_out, ch_out) for i in range(depth))
        self.attentions = nn.ModuleList()
        self.downsamplers = nn.ModuleList([Resample(ch_out, True)]) if down else nn.ModuleList()
        self.upsamplers = nn.ModuleList([Resample(ch_out, False)]) if up else nn.ModuleList()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, resnet in enumerate(self.resnets):
            x = resnet(x)
            if i < len(self.attentions):
                x = self.attentions[i](x).add_(x)
        for sampler in (*self.downsamplers, *self.upsamplers):
            x = sampler(x)
        return x


class MidBlock(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResBlock(ch, ch), ResBlock(ch, ch)])
        self.attentions = nn.ModuleList([VAEAttention(ch)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x)
        return self.resnets[1](self.attentions[0](x).add_(x))


class Encoder(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        ch = cfg.block_out_channels
        self.conv_in = nn.Conv2d(cfg.in_channels, ch[0], 3, 1, 1)
        self.down_blocks = nn.ModuleList(
            ResStage(ch[max(i - 1, 0)], c, cfg.layers_per_block, down=i < len(ch) - 1) for i, c in enumerate(ch)
        )
        if cfg.attn_down_block:
            self.down_blocks[-1].attentions.extend(VAEAttention(ch[-1]) for _ in range(cfg.layers_per_block))
        self.mid_block = MidBlock(ch[-1])
        self.conv_norm_out = _norm(ch[-1])
        self.conv_out = nn.Conv2d(ch[-1], cfg.latent_channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class Decoder(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        ch = list(reversed(cfg.block_out_channels))
        self.conv_in = nn.Conv2d(cfg.latent_channels, ch[0], 3, 1, 1)
        self.mid_block = MidBlock(ch[0])
        self.up_blocks = nn.ModuleList(
            ResStage(ch[max(i - 1, 0)], c, cfg.layers_per_block + 1, up=i < len(ch) - 1) for i, c in enumerate(ch)
        )
        if cfg.attn_up_block:
            self.up_blocks[0].attentions.extend(VAEAttention(ch[0]) for _ in range(cfg.layers_per_block + 1))
        self.conv_norm_out = _norm(ch[-1])
        self.conv_out = nn.Conv2d(ch[-1], cfg.out_channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mid_block(self.conv_in(x))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class Quantizer(nn.Module):
    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(cfg.num_vq_embeddings, cfg.vq_embed_dim)


class AutoencoderVQ(nn.Module):
    """``decode(ids [B, T, h, w]) -> [B, 3, H, W]`` (T = 1) or ``[B, 3, T, H, W]`` in [-1, 1]."""

    def __init__(self, cfg: VQConfig, index_dtype: torch.dtype = torch.int64) -> None:
        super().__init__()
        self.config = cfg
        self.index_dtype = index_dtype
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.quant_conv = nn.Conv2d(cfg.latent_channels, cfg.vq_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(cfg.vq_embed_dim, cfg.latent_channels, 1)
        self.quantizer = Quantizer(cfg)

    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        z = self.quantizer.embedding(ids.to(self.index_dtype)).permute(0, 4, 1, 2, 3)  # [B, D, T, h, w] view
        t = z.shape[2]
        z = z.transpose(1, 2).flatten(0, 1) if t > 1 else z.squeeze(2)  # frames decode as a batch
        x = self.post_quant_conv(z)
        x = self.decoder(x.to(self.decoder.conv_in.weight))
        return x.view(-1, t, *x.shape[1:]).transpose(1, 2) if t > 1 else x

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``[B, 3, H, W]`` in [-1, 1] -> int32 codes ``[B, h, w]`` (dot-product argmax, as trained)."""
        z = self.quant_conv(self.encoder(x))
        ids = F.linear(z.transpose(1, -1), self.quantizer.embedding.weight).argmax(-1).int()
        return ids.permute(0, 2, 1)


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    """``[B, 3, (T,) H, W]`` in [-1, 1] -> channels-last uint8; truncates like the reference."""
    x = x.permute(0, 2, 3, 4, 1) if x.dim() == 5 else x.permute(0, 2, 3, 1)
    return x.mul(127.5).add_(127.5).clamp(0, 255).byte()
