"""The FSQ video tokenizer's autoencoder (``AutoencoderVQCosmos3D``): FSQ codes -> causal 3-D decoder.

URSA's video checkpoints tokenise with a Cosmos-style 3-D autoencoder and a finite scalar quantiser
(FSQ).  An FSQ code has no learned codebook: its id is a mixed-radix number whose digits, centred and
scaled, *are* the latent.  The decoder is a causal video U-Net:

- every 3x3x3 convolution is factorised into a spatial (1,3,3) then a temporal (3,1,1) convolution;
  temporal padding replicates the first frame on the left, so frame ``t`` never sees frame ``t+1``
  through a convolution (the mid block's temporal attention is bidirectional, though);
- every GroupNorm has one group and normalises each frame on its own;
- upsampling repeats elements (``repeat_interleave``) and adds a convolution of the result to it;
- the last convolution emits ``3 * patch_size**3`` channels that an inverse 3-D Haar transform turns
  into pixels (one level per factor 2 of ``patch_size``), after which the first ``patch_size - 1``
  frames are dropped (they decode the replicated first frame).

Module names equal the checkpoint's keys, and the layout is built from ``vae/config.json`` (the real
checkpoints use ``patch_size`` 2, not the class default 4, which changes which up-blocks resample and
so the weight names).  The reference's memory layouts are kept op for op where they reach a
convolution, because CPU convolution kernels round differently for channels-last inputs; that is
what makes the decode bit-equal to the reference on the CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import CheckpointError
from .config import vae_config_from_dict

#: The quantiser levels of every published FSQ checkpoint.  The reference constructs its quantiser
#: without arguments, so these apply whatever the config says (it has no key for them).
FSQ_LEVELS = (8, 8, 8, 5, 5, 5)
_HAAR = 0.7071067811865476  # 1/sqrt(2), the Haar filter tap
_HAAR_RESCALE = 2 * 2**0.5  # per-level gain of the orthonormal 3-D transform that the model undoes


@dataclass(frozen=True)
class FSQConfig:
    """``AutoencoderVQCosmos3D`` config.  Only the keys the reference class declares are read."""

    in_channels: int = 3
    out_channels: int = 3
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 16
    sample_frames: int = 17
    num_vq_embeddings: int = 64000
    vq_embed_dim: int = 6
    patch_size: int = 4
    temporal_stride: int = 4
    spatial_stride: int = 8
    levels: tuple[int, ...] = FSQ_LEVELS  # not a config key: fixed in the reference (see FSQ_LEVELS)
    decoder_dtype: str | None = None  # not declared by this class, so never read (the pipeline asks)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FSQConfig:
        """Read the declared keys and check that the decoder they build produces the stated strides."""
        cfg = vae_config_from_dict(cls, data, exclude=frozenset({"levels", "decoder_dtype"}))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if len(self.block_out_channels) < 2 or self.layers_per_block < 1:
            raise CheckpointError("vae/config.json: the FSQ autoencoder needs >= 2 block_out_channels and layers.")
        if self.patch_size < 1 or self.patch_size & (self.patch_size - 1):
            raise CheckpointError(f"vae/config.json: patch_size must be a power of 2, got {self.patch_size}.")
        if self.vq_embed_dim != len(self.levels):
            raise CheckpointError(
                f"vae/config.json: vq_embed_dim is {self.vq_embed_dim} but the FSQ quantiser has "
                f"{len(self.levels)} levels {self.levels}."
            )
        if not 0 < self.num_vq_embeddings <= math.prod(self.levels):
            raise CheckpointError(
                f"vae/config.json: num_vq_embeddings {self.num_vq_embeddings} exceeds the "
                f"{math.prod(self.levels)} codes of FSQ levels {self.levels}."
            )
        if self.sample_frames < 1 or (self.sample_frames - 1) % self.temporal_stride:
            raise CheckpointError(
                f"vae/config.json: sample_frames {self.sample_frames} is not 1 plus a multiple of "
                f"temporal_stride {self.temporal_stride}."
            )
        if self.decoder_temporal_upscale != self.temporal_stride:
            raise CheckpointError(
                f"vae/config.json says temporal_stride {self.temporal_stride} but its decoder upsamples time "
                f"by {self.decoder_temporal_upscale}; fix the config."
            )

    def up_layout(self) -> list[tuple[int, int] | None]:
        """Per decoder up-block: ``(spatial, temporal)`` factors (2 or 0), or None for no resampler.

        The last block never resamples.  Temporal upsampling happens in up-blocks ``1..n_t`` and
        every temporal up-block also upsamples space; space alone is upsampled from block 0 while
        more spatial than temporal steps remain.  (A ``(0, 0)`` block has a parameter-free resampler.)
        """
        n_space = int(math.log2(self.spatial_stride)) - int(math.log2(self.patch_size))
        n_time = int(math.log2(self.temporal_stride)) - int(math.log2(self.patch_size))
        layout: list[tuple[int, int] | None] = []
        for i in range(len(self.block_out_channels) - 1):
            if i >= len(self.block_out_channels) - 2:
                layout.append(None)
                continue
            temporal = 0 < i < n_time + 1
            spatial = temporal or (i < n_space and n_space > n_time)
            layout.append((2 if spatial else 0, 2 if temporal else 0))
        return layout

    def down_layout(self) -> list[tuple[int, int] | None]:
        """Per encoder down-block: ``(spatial, temporal)`` flags (1 = halve), or None for none."""
        n_space = int(math.log2(self.spatial_stride)) - int(math.log2(self.patch_size))
        n_time = int(math.log2(self.temporal_stride)) - int(math.log2(self.patch_size))
        n = len(self.block_out_channels)
        return [(int(i < n_space), int(i < n_time)) if i < n - 2 else None for i in range(n - 1)]

    @property
    def decoder_upscale(self) -> int:
        """Pixels per latent cell that the decoder really produces (checked against spatial_stride)."""
        return self.patch_size * 2 ** sum(1 for u in self.up_layout() if u and u[0])

    @property
    def decoder_temporal_upscale(self) -> int:
        return self.patch_size * 2 ** sum(1 for u in self.up_layout() if u and u[1])

    @property
    def window(self) -> int:
        """Latent frames per decoder call (temporal tile)."""
        return (self.sample_frames - 1) // self.temporal_stride + 1

    def output_frames(self, latent_frames: int) -> int:
        """Frames that :meth:`AutoencoderVQCosmos3D.decode` returns for ``latent_frames`` latent frames.

        One window gives ``(t - 1) * stride + 1``.  Longer latents decode in whole windows only (a
        trailing partial window is skipped, as in the reference) and every later window loses its
        first frame, so this is *not* ``(t - 1) * stride + 1`` once there is more than one window.
        """
        s, w = self.temporal_stride, self.window
        if latent_frames <= w:
            return (latent_frames - 1) * s + 1
        return (w - 1) * s + 1 + (latent_frames // w - 1) * (w - 1) * s

    def tiles_exactly(self, latent_frames: int) -> bool:
        """True when no latent frame is skipped by the temporal tiling."""
        return latent_frames <= self.window or latent_frames % self.window == 0


# ---------------------------------------------------------------------------------------------- blocks
class FrameGroupNorm(nn.GroupNorm):
    """One-group GroupNorm applied to every frame separately (``[B, C, T, H, W]`` in and out)."""

    def __init__(self, ch: int) -> None:
        super().__init__(1, ch, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        y = super().forward(x.transpose(1, 2).flatten(0, 1))  # frames as a batch, [B*T, C, H, W]
        return y.view(b, -1, *y.shape[1:]).transpose(1, 2)  # a view: the reference's layout


class CausalConv3d(nn.Conv3d):
    """Conv3d that pads time only on the left, by replicating the first frame.

    Spatial padding is the usual zero padding.  ``time_stride`` lets a stride-2 spatial conv keep
    time (and vice versa); the left pad ``(k_t - 1) + (1 - s_t)`` keeps ``ceil(T / s_t)`` frames.
    """

    def __init__(self, ch_in: int, ch_out: int, kernel: int | tuple[int, int, int], stride: int = 1,
                 padding: int = 0, time_stride: int | None = None) -> None:
        super().__init__(ch_in, ch_out, kernel, stride, padding)
        s_t = time_stride or self.stride[0]
        self.stride = (s_t, *self.stride[1:])
        self.padding = (0, *self.padding[1:])
        self.time_pad = (self.kernel_size[0] - 1) + (1 - s_t) if self.kernel_size[0] > 1 else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.time_pad:
            x = F.pad(x, (0, 0, 0, 0, self.time_pad, 0), mode="replicate")
        return super().forward(x)


def factorised_conv(ch_in: int, ch_out: int) -> nn.Sequential:
    """A 3x3x3 conv as spatial (1,3,3) then causal temporal (3,1,1); keys ``.0`` and ``.1``."""
    return nn.Sequential(CausalConv3d(ch_in, ch_out, (1, 3, 3), 1, 1), CausalConv3d(ch_out, ch_out, (3, 1, 1)))


class AxisAttention(nn.Module):
    """Single-head self-attention over space (each frame's H*W) or over time (each pixel's T).

    Pre-normed by a per-frame GroupNorm and adds its own residual.  The time variant has no causal
    mask: within a window, early frames see later ones.
    """

    def __init__(self, ch: int, over: str) -> None:
        super().__init__()
        if over not in ("space", "time"):
            raise ValueError(f"over must be 'space' or 'time', got {over!r}")
        self.over = over
        self.group_norm = FrameGroupNorm(ch)
        self.to_q, self.to_k, self.to_v = nn.Linear(ch, ch), nn.Linear(ch, ch), nn.Linear(ch, ch)
        self.to_out = nn.ModuleList([nn.Linear(ch, ch)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        y = self.group_norm(x)
        if self.over == "space":  # sequences of h*w tokens, one per (b, t)
            seq = y.permute(0, 2, 3, 4, 1).reshape(b * t, 1, h * w, c)
        else:  # sequences of t tokens, one per (b, h, w)
            seq = y.permute(0, 3, 4, 2, 1).reshape(b * h * w, 1, t, c)
        o = self.to_out[0](F.scaled_dot_product_attention(self.to_q(seq), self.to_k(seq), self.to_v(seq)))
        if self.over == "space":
            o = o.view(b, t, h, w, c).permute(0, 4, 1, 2, 3)
        else:
            o = o.view(b, h, w, t, c).permute(0, 4, 3, 1, 2)
        return o.add_(x)


def factorised_attention(ch: int) -> nn.Sequential:
    """Spatial then temporal attention; keys ``.0`` and ``.1``."""
    return nn.Sequential(AxisAttention(ch, "space"), AxisAttention(ch, "time"))


class ResBlock3d(nn.Module):
    def __init__(self, ch_in: int, ch_out: int) -> None:
        super().__init__()
        self.norm1 = FrameGroupNorm(ch_in)
        self.conv1 = factorised_conv(ch_in, ch_out)
        self.norm2 = FrameGroupNorm(ch_out)
        self.conv2 = factorised_conv(ch_out, ch_out)
        self.conv_shortcut = CausalConv3d(ch_in, ch_out, 1) if ch_in != ch_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        h = self.conv1(F.silu(self.norm1(x)))
        return self.conv2(F.silu(self.norm2(h))).add_(skip)


class Upsample3d(nn.Module):
    """Repeat elements x2 in time (minus the first copy, to stay causal) and/or space, each followed
    by ``x + conv(x)``; then a 1x1x1 conv.  ``(0, 0)`` is a parameter-free identity."""

    def __init__(self, ch: int, spatial: int, temporal: int) -> None:
        super().__init__()
        self.spatial, self.temporal = spatial == 2, temporal == 2
        self.conv1 = CausalConv3d(ch, ch, (3, 1, 1)) if self.temporal else None
        self.conv2 = CausalConv3d(ch, ch, (1, 3, 3), 1, 1) if (self.spatial or self.temporal) else None
        self.conv3 = CausalConv3d(ch, ch, 1) if (self.spatial or self.temporal) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv1 is not None:
            x = x.repeat_interleave(2, dim=2)[:, :, 1:]  # T -> 2T - 1: frame 0 stays single
            x = self.conv1(x).add_(x)
        if self.spatial and self.conv2 is not None:
            x = x.repeat_interleave(2, dim=3).repeat_interleave(2, dim=4)
            x = self.conv2(x).add_(x)
        return self.conv3(x) if self.conv3 is not None else x


class Downsample3d(nn.Module):
    """Encoder resampler: stride-2 spatial conv plus 2x2 average pool, and/or the temporal analogue."""

    def __init__(self, ch: int, spatial: int, temporal: int) -> None:
        super().__init__()
        self.spatial, self.temporal = spatial == 1, temporal == 1
        active = self.spatial or self.temporal
        self.conv1 = CausalConv3d(ch, ch, (1, 3, 3), 2, time_stride=1) if active else None
        self.conv2 = CausalConv3d(ch, ch, (3, 1, 1), 1, time_stride=2) if self.temporal else None
        self.conv3 = CausalConv3d(ch, ch, 1) if active else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.spatial and self.conv1 is not None:
            pooled = F.avg_pool3d(x, (1, 2, 2), (1, 2, 2))
            x = self.conv1(F.pad(x, (0, 1, 0, 1, 0, 0))).add_(pooled)
        if self.conv2 is not None:
            x = F.pad(x, (0, 0, 0, 0, 1, 0), mode="replicate")
            x = self.conv2(x).add_(F.avg_pool3d(x, (2, 1, 1), (2, 1, 1)))
        return self.conv3(x) if self.conv3 is not None else x


class Stage3d(nn.Module):
    """``resnets`` then an optional ``upsamplers.0`` / ``downsamplers.0``."""

    def __init__(self, ch_in: int, ch_out: int, depth: int, up: tuple[int, int] | None = None,
                 down: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(ResBlock3d(ch_in if i == 0 else ch_out, ch_out) for i in range(depth))
        self.upsamplers = nn.ModuleList([Upsample3d(ch_out, *up)]) if up is not None else nn.ModuleList()
        self.downsamplers = nn.ModuleList([Downsample3d(ch_out, *down)]) if down is not None else nn.ModuleList()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        for sampler in (*self.downsamplers, *self.upsamplers):
            x = sampler(x)
        return x


class MidBlock3d(nn.Module):
    """resnet, (space attention, time attention), resnet."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResBlock3d(ch, ch), ResBlock3d(ch, ch)])
        self.attentions = nn.ModuleList([factorised_attention(ch)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


# ---------------------------------------------------------------------------------------------- Haar
def _haar_taps(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Low (c, c) and high (c, -c) filters in x's dtype (the reference keeps them as module buffers,
    so a half-precision model rounds them too)."""
    lo = torch.tensor([_HAAR, _HAAR], dtype=torch.float32).to(device=x.device, dtype=x.dtype)
    return lo, lo * torch.tensor([1.0, -1.0], dtype=x.dtype, device=x.device)


def _merge_axis(low: torch.Tensor, high: torch.Tensor, dim: int, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Inverse one-axis Haar step: ``y[2n + k] = low[n] * lo[k] + high[n] * hi[k]``."""
    taps = [low * lo[k] + high * hi[k] for k in range(2)]
    y = torch.stack(taps, dim=dim + 1)
    return y.flatten(dim, dim + 1)


def haar_inverse_3d(x: torch.Tensor) -> torch.Tensor:
    """One level of the inverse 3-D Haar transform: ``[B, 8C, T, H, W] -> [B, C, 2T, 2H, 2W]``.

    Channel block ``4*t + 2*h + w`` holds the band that is high-pass along the axes whose bit is set.
    Width is merged first, then height, then time, and the result is scaled by ``2*sqrt(2)`` because
    the forward transform divided by it.
    """
    lo, hi = _haar_taps(x)
    bands = list(x.chunk(8, dim=1))
    bands = [_merge_axis(bands[2 * i], bands[2 * i + 1], 4, lo, hi) for i in range(4)]  # width
    bands = [_merge_axis(bands[2 * i], bands[2 * i + 1], 3, lo, hi) for i in range(2)]  # height
    return _merge_axis(bands[0], bands[1], 2, lo, hi).mul_(_HAAR_RESCALE)  # time


def _split_axis(x: torch.Tensor, dim: int, taps: torch.Tensor) -> list[torch.Tensor]:
    """Forward one-axis Haar step: ``band_f[n] = x[2n] * taps[f, 0] + x[2n+1] * taps[f, 1]``.

    Done as a depthwise stride-2 convolution (what the encoder was trained with, so the sums round
    the same way); an odd length is reflect-padded by one at the end.
    """
    g = x.shape[1]
    kernel = [1, 1, 1]
    kernel[dim - 2] = 2
    stride = tuple(kernel)
    if x.shape[dim] % 2:
        x = torch.cat([x, x.narrow(dim, x.shape[dim] - 2, 1)], dim)
    return [F.conv3d(x, f.view(1, 1, *kernel).repeat(g, 1, 1, 1, 1), stride=stride, groups=g) for f in taps]


def haar_forward_3d(x: torch.Tensor) -> torch.Tensor:
    """One level of the forward 3-D Haar transform (inverse of :func:`haar_inverse_3d` on even sizes)."""
    taps = torch.stack(_haar_taps(x))
    out = []
    for t_band in _split_axis(x, 2, taps):
        for h_band in _split_axis(t_band, 3, taps):
            out.extend(_split_axis(h_band, 4, taps))
    return torch.cat(out, dim=1).mul_(1.0 / _HAAR_RESCALE)


# ---------------------------------------------------------------------------------------------- coder
class Decoder3d(nn.Module):
    def __init__(self, cfg: FSQConfig) -> None:
        super().__init__()
        ch = list(reversed(cfg.block_out_channels))
        self.patch_size = cfg.patch_size
        self.conv_in = factorised_conv(cfg.latent_channels, ch[0])
        self.mid_block = MidBlock3d(ch[0])
        # Block i maps ch[i-1] -> ch[i] (block 0 keeps ch[0]); the smallest width, ch[-1], is unused.
        self.up_blocks = nn.ModuleList(
            Stage3d(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block + 1, up=up) for i, up in enumerate(cfg.up_layout())
        )
        self.conv_norm_out = FrameGroupNorm(ch[-2])
        self.conv_out = factorised_conv(ch[-2], cfg.out_channels * cfg.patch_size**3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mid_block(self.conv_in(x))
        for block in self.up_blocks:
            x = block(x)
        x = self.conv_out(F.silu(self.conv_norm_out(x)))
        for _ in range(int(math.log2(self.patch_size))):
            x = haar_inverse_3d(x)
        return x[:, :, self.patch_size - 1 :]  # these frames decode the replicated first frame


class Encoder3d(nn.Module):
    def __init__(self, cfg: FSQConfig) -> None:
        super().__init__()
        ch = cfg.block_out_channels
        self.patch_size = cfg.patch_size
        self.conv_in = factorised_conv(cfg.in_channels * cfg.patch_size**3, ch[0])
        self.down_blocks = nn.ModuleList(
            Stage3d(ch[i], ch[i + 1], cfg.layers_per_block, down=down) for i, down in enumerate(cfg.down_layout())
        )
        self.mid_block = MidBlock3d(ch[-1])
        self.conv_norm_out = FrameGroupNorm(ch[-1])
        self.conv_out = factorised_conv(ch[-1], cfg.latent_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Repeat the first frame so the patch grid is causal: patch 0 holds frame 0 only.
        x = torch.cat([x[:, :, :1].repeat_interleave(self.patch_size, 2), x[:, :, 1:]], 2)
        for _ in range(int(math.log2(self.patch_size))):
            x = haar_forward_3d(x)
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        return self.conv_out(F.silu(self.conv_norm_out(self.mid_block(x))))


class FSQuantizer(nn.Module):
    """Finite scalar quantiser.  Parameter- and buffer-free: levels are config, tensors are built per
    call on the ids' device in the index dtype (so no meta-device buffers survive strict loading)."""

    def __init__(self, levels: tuple[int, ...], index_dtype: torch.dtype = torch.int64) -> None:
        super().__init__()
        self.levels = tuple(int(v) for v in levels)
        self.index_dtype = index_dtype

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        levels = torch.tensor(self.levels, dtype=self.index_dtype, device=device)
        basis = torch.tensor([math.prod(self.levels[:j]) for j in range(len(self.levels))], dtype=self.index_dtype,
                             device=device)
        return levels, basis, levels // 2

    def dequantize(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``[..., ]`` ids -> ``[..., D]`` centred digits ``(digit_j - L_j//2) / (L_j//2)`` in ``dtype``.

        Digit ``j`` is ``id // basis_j mod L_j`` with ``basis`` the running product of the levels.
        The division is done in float32 (the true-division result type of integer tensors) before
        the cast, like the reference.
        """
        levels, basis, half = self._tables(ids.device)
        digits = ids.to(self.index_dtype).unsqueeze(-1).floor_divide(basis).fmod(levels) - half
        return digits.div(half).to(dtype)

    def quantize(self, z: torch.Tensor) -> torch.Tensor:
        """``[B, D, T, h, w]`` -> int32 ids ``[B, T, h, w]``: tanh-bound each channel, round, mix radix."""
        levels, basis, half = self._tables(z.device)
        lv = levels.float()
        half_l = (lv - 1) * (1 + 1e-3) / 2
        offset = torch.where(levels % 2 == 0, 0.5, 0.0).to(z.device)
        shift = (offset / half_l).atanh()
        zt = z.transpose(1, -1)  # [B, w, T, h, D]
        q = ((zt + shift).tanh() * half_l - offset).round()
        ids = (q + half).mul(basis).sum(-1).int()
        return ids.permute(0, 2, 3, 1)


class AutoencoderVQCosmos3D(nn.Module):
    """``decode(ids [B, T, h, w]) -> [B, 3, T', H, W]`` in [-1, 1], T' = ``config.output_frames(T)``."""

    def __init__(self, cfg: FSQConfig, index_dtype: torch.dtype = torch.int64) -> None:
        super().__init__()
        self.config = cfg
        self.encoder = Encoder3d(cfg)
        self.decoder = Decoder3d(cfg)
        self.quant_conv = CausalConv3d(cfg.latent_channels, cfg.vq_embed_dim, 1)
        self.post_quant_conv = CausalConv3d(cfg.vq_embed_dim, cfg.latent_channels, 1)
        self.quantizer = FSQuantizer(cfg.levels, index_dtype)

    @property
    def index_dtype(self) -> torch.dtype:
        return self.quantizer.index_dtype

    @index_dtype.setter
    def index_dtype(self, dtype: torch.dtype) -> None:
        self.quantizer.index_dtype = dtype

    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, T, h, w]`` (or ``[B, h, w]`` for one frame) -> pixels ``[B, 3, T', H, W]``.

        The latent is decoded in temporal windows of ``config.window`` frames; see
        :meth:`FSQConfig.output_frames` for how many frames come back.
        """
        if ids.dim() == 3:
            ids = ids.unsqueeze(1)
        # Channels-first *view* of a channels-last latent, as in the reference (see module docstring).
        z = self.quantizer.dequantize(ids, self.post_quant_conv.weight.dtype).permute(0, 4, 1, 2, 3)
        z = self.post_quant_conv(z)
        return self.decode_latent(z.to(self.decoder.conv_in[0].weight.dtype))

    def decode_latent(self, z: torch.Tensor) -> torch.Tensor:
        """Temporal tiling: whole windows only; every window after the first drops its first frame."""
        w = self.config.window
        if z.shape[2] <= w:
            return self.decoder(z)
        tiles = [self.decoder(z[:, :, s : s + w]) for s in range(0, z.shape[2] - w + 1, w)]
        return torch.cat([tile[:, :, 1:] if i else tile for i, tile in enumerate(tiles)], dim=2)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Video ``[B, 3, T, H, W]`` in [-1, 1] -> int32 codes ``[B, T', h, w]`` (for conditioning).

        Tiled like the reference: windows of ``sample_frames`` frames overlapping by one frame.
        """
        n, t = self.config.sample_frames, x.shape[2]
        if t <= n:
            z = self.encoder(x)
        else:
            z = torch.cat([self.encoder(x[:, :, s : s + n]) for s in range(0, t, n - 1) if s + n <= t], dim=2)
        return self.quantizer.quantize(self.quant_conv(z))
