"""The Qwen-Image VAE's causal 3-D convolutions as 2-D ones on single pictures (an exact speed-up).

Every causal conv of ``AutoencoderKLQwenImage`` pads ``kernel_t - 1`` zero frames in front of its
input.  A picture is one frame, so of each ``kernel_t x k x k`` kernel only the last temporal tap
ever meets a pixel, and the output is a 2-D convolution with ``weight[:, :, -1]``: the same products,
summed in another order (measured: within 5e-6 of the 3-D form through a whole encode + decode).
oneDNN's conv3d is 2.5-5x slower on a CPU than that conv2d for the tiny and small VAEs (64-256 px),
and a 1-frame conv3d is not the shape accelerator libraries tune either, so this is the default on
every device; ``--disable vae-2d`` runs diffusers' 3-D form.  Video-shaped calls (several frames, a
temporal cache, a temporal stride) always take the 3-D form.

The forward is replaced on each conv *instance* once, at load, before any offload hook wraps it
(accelerate's hooks keep the forward they found), and reads a per-instance flag on every call, so a
reused pipeline switches the form per run without touching the hooks.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

FLAG = "_difforge_vae_2d"


def _forward(self, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
    if not getattr(self, FLAG, False) or not _single_frame(self, x, cache_x):
        return type(self).forward(self, x, cache_x)
    # self._padding is F.pad's order: (w, w, h, h, time in front, 0)
    out = F.conv2d(x[:, :, 0], self.weight[:, :, -1], self.bias, stride=self.stride[1:],
                   padding=(self._padding[2], self._padding[0]), dilation=self.dilation[1:], groups=self.groups)
    return out.unsqueeze(2)


def _single_frame(conv, x: torch.Tensor, cache_x: torch.Tensor | None) -> bool:
    """Whether the 3-D conv of ``x`` is exactly the 2-D conv of its last temporal tap."""
    return (x.shape[2] == 1 and cache_x is None and conv.stride[0] == 1 and conv.dilation[0] == 1
            and conv._padding[4] == conv.kernel_size[0] - 1 and conv._padding[5] == 0)


def causal_convs(vae: torch.nn.Module) -> list[torch.nn.Module]:
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageCausalConv3d

    return [m for m in vae.modules() if isinstance(m, QwenImageCausalConv3d)]


def install(vae: torch.nn.Module, on: bool) -> int:
    """Give every causal conv of ``vae`` the switchable forward (once) and set it to 2-D (``on``) or 3-D;
    returns how many convs there are."""
    convs = causal_convs(vae)
    for m in convs:
        if "forward" not in m.__dict__:
            m.forward = types.MethodType(_forward, m)
        setattr(m, FLAG, bool(on))
    return len(convs)


@contextmanager
def two_d(vae: torch.nn.Module) -> Iterator[int]:
    """Within the context the VAE runs the 2-D form whatever it ran before (training and the recipe's own
    measurements use it on a bare diffusers VAE); yields the number of convs."""
    convs = causal_convs(vae)
    before = [getattr(m, FLAG, False) for m in convs]
    try:
        yield install(vae, True)
    finally:
        for m, flag in zip(convs, before, strict=True):
            setattr(m, FLAG, flag)
