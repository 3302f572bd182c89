"""Exact training-time speed-up for the Qwen-Image VAE on single pictures.

The VAE's causal 3-D convolutions pad two zero frames in front of a one-frame input, so of each
3 x k x k kernel only the last temporal tap ever meets a pixel: the output is a 2-D convolution with
``weight[:, :, -1]``.  oneDNN's conv3d with 8-64 channels is several times slower on a CPU than the
equivalent conv2d, so training swaps the forward of every such layer for the 2-D one while the
context is open.  The same taps are trained (the other taps multiply zeros in either form and get no
gradient), so the weights saved are those the 3-D form would have produced, within float rounding.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F


def _single_frame_forward(self, x: torch.Tensor, cache_x: torch.Tensor | None = None) -> torch.Tensor:
    if x.shape[2] != 1 or cache_x is not None or self.stride[0] != 1:
        return type(self).forward(self, x, cache_x)
    # self._padding is F.pad's order: (w, w, h, h, 2 * t, 0)
    out = F.conv2d(x[:, :, 0], self.weight[:, :, -1], self.bias, stride=self.stride[1:],
                   padding=(self._padding[2], self._padding[0]))
    return out.unsqueeze(2)


@contextmanager
def single_frame_convs(vae: torch.nn.Module) -> Iterator[int]:
    """Within the context every causal conv of ``vae`` runs as the equivalent 2-D convolution on
    one-frame inputs; yields how many layers were swapped."""
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageCausalConv3d

    swapped = [m for m in vae.modules() if isinstance(m, QwenImageCausalConv3d)]
    for m in swapped:
        m.forward = types.MethodType(_single_frame_forward, m)
    try:
        yield len(swapped)
    finally:
        for m in swapped:
            del m.forward
