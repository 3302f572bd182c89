"""Reference-image resizing, exactly as the two diffusers edit pipelines do it.

Edit resizes its one reference to ``reference_area`` and shows that same resized image to both the
vision-language encoder and the VAE.  Edit-Plus resizes each reference twice: to
``condition_area`` for the VL encoder and to ``reference_area`` for the VAE.  The areas come from
:class:`~.settings.EditSettings` (1024² / 384² for real checkpoints).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import PIL.Image
import torch

from ...errors import InputError


def fit_area(area: int, aspect: float) -> tuple[int, int]:
    """(width, height) with about ``area`` pixels and the given width/height ratio, sides multiples of 32."""
    width = math.sqrt(area * aspect)
    height = width / aspect
    return int(round(width / 32) * 32), int(round(height / 32) * 32)


@dataclass
class References:
    prompt_images: PIL.Image.Image | list[PIL.Image.Image]  # what the VL encoder sees
    vae_images: torch.Tensor | list[torch.Tensor]  # [-1, 1] tensors, (1, 3, 1, H, W) each
    vae_sizes: list[tuple[int, int]]  # (width, height) per reference


def check_images(images: list[PIL.Image.Image] | None, plus: bool) -> list[PIL.Image.Image]:
    if not images:
        raise InputError("Qwen-Image-Edit needs a reference image; pass one with --image.")
    if not plus and len(images) > 1:
        raise InputError(
            f"Qwen-Image-Edit takes exactly one reference image but got {len(images)};"
            " use a Qwen-Image-Edit-2509/2511 (Plus) model for several."
        )
    for image in images:
        if not isinstance(image, PIL.Image.Image):
            raise InputError(f"Reference images must be decoded PIL images, got {type(image).__name__}.")
    return [image if image.mode == "RGB" else image.convert("RGB") for image in images]


def check_fit(images: list[PIL.Image.Image], area: int, purpose: str) -> None:
    """Raise InputError for a reference so elongated that :func:`fit_area` would round a side to 0.

    Without this an 8x2000 picture surfaces as "--height/--width ... got 1504x0" for flags the user
    never gave, or as a bare ValueError from the resize.  A side stays >= 32 pixels while the ratio
    of the long side to the short one is below about ``area / 256``.
    """
    for n, image in enumerate(images, 1):
        width, height = fit_area(area, image.width / image.height)
        if width == 0 or height == 0:
            long, short = max(image.width, image.height), min(image.width, image.height)
            which = f"Reference image {n}" if len(images) > 1 else "The reference image"
            raise InputError(
                f"{which} is {image.width}x{image.height} pixels, an aspect ratio of about 1:{round(long / short)} that"
                f" this model cannot fit into its {purpose} of about {area:,} pixels; crop or pad it to under"
                f" 1:{area // 256}."
            )


def prepare_references(
    image_processor, images: list[PIL.Image.Image], plus: bool, reference_area: int, condition_area: int
) -> References:
    """Resize references like diffusers (``image_processor`` is the pipeline's VaeImageProcessor)."""
    if not plus:
        image = images[0]
        width, height = fit_area(reference_area, image.width / image.height)
        resized = image_processor.resize(image, height, width)
        tensor = image_processor.preprocess(resized, height, width).unsqueeze(2)
        return References(resized, tensor, [(width, height)])
    prompt_images: list[PIL.Image.Image] = []
    tensors: list[torch.Tensor] = []
    sizes: list[tuple[int, int]] = []
    for image in images:
        aspect = image.width / image.height
        cond_w, cond_h = fit_area(condition_area, aspect)
        vae_w, vae_h = fit_area(reference_area, aspect)
        prompt_images.append(image_processor.resize(image, cond_h, cond_w))
        tensors.append(image_processor.preprocess(image, vae_h, vae_w).unsqueeze(2))
        sizes.append((vae_w, vae_h))
    return References(prompt_images, tensors, sizes)
