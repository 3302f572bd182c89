"""Pictures in: decoding users' input images safely, and the one synthetic test picture.

Below the models on purpose: the edit pipelines decode the images a config names, the engine decodes
the API's paths, validate and the demo need a picture when the user gives none - all with the same
rules, from here.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageOps, UnidentifiedImageError

from ..errors import InputError

#: Largest input image difforge decodes (100 megapixels, about 300 MB as RGB).  The edit models resize
#: every reference to about 1 megapixel anyway, so a bigger file is a mistake or a decompression bomb;
#: PIL alone would print a two-line warning up to 179 MP and fail beyond with an error we could only
#: report as "not an image".
MAX_INPUT_PIXELS = 100_000_000


def load_images(paths: Sequence[str | Path]) -> list[Image.Image]:
    """Decode input images to upright RGB, mapping every failure to one InputError sentence.

    Upright: a camera's EXIF orientation tag is applied (``ImageOps.exif_transpose``), so the model
    edits the picture the user sees in a viewer, not the sensor's sideways pixels.  Images above
    :data:`MAX_INPUT_PIXELS` are refused from their header, before any pixel is decoded, and PIL's
    DecompressionBombWarning is silenced because that limit is checked here.
    """
    images = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            raise InputError(f"Input image {path} is a folder; give an image file.")
        if not path.is_file():
            raise InputError(f"Input image {path} does not exist.")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(path) as img:
                    if img.width * img.height > _pixel_limit():
                        raise InputError(_too_large(path, img.width * img.height, f" ({img.width}x{img.height})"))
                    img.load()
                    images.append(ImageOps.exif_transpose(img).convert("RGB"))
        except Image.DecompressionBombError as exc:  # PIL's own, stricter limit fired inside open()
            found = re.search(r"\((\d+) pixels\)", str(exc))
            raise InputError(_too_large(path, int(found.group(1)) if found else None)) from None
        except (UnidentifiedImageError, OSError, ValueError):
            raise InputError(f"{path} is not an image difforge can decode (PNG, JPEG, WebP, ...).") from None
    return images


def _pixel_limit() -> int:
    """MAX_INPUT_PIXELS, or PIL's error limit (twice ``Image.MAX_IMAGE_PIXELS``) if a caller set that lower."""
    pil = Image.MAX_IMAGE_PIXELS
    return MAX_INPUT_PIXELS if pil is None else min(MAX_INPUT_PIXELS, 2 * int(pil))


def _too_large(path: Path, pixels: int | None, dims: str = "") -> str:
    size = f"{pixels:,} pixels{dims}" if pixels is not None else "too many pixels"
    return (
        f"Input image {path} is too large: {size}, more than the {_pixel_limit():,} difforge decodes;"
        " downscale it first (the edit models resize references to about 1 megapixel anyway)."
    )


def test_picture(width: int = 512, height: int | None = None, variant: int = 0) -> Image.Image:
    """The deterministic synthetic picture (gradient sky, red disc, green ground), like the seed's
    "合成测试图片": edits have something to act on without shipping a photo.

    ``variant`` moves the disc and tints the sky, so a multi-image edit gets two different pictures.
    Integer arithmetic only: the same pixels on every machine.
    """
    height = width if height is None else height
    y, x = np.mgrid[0:height, 0:width]
    shift = 37 * variant
    rgb = np.stack(
        [40 + (150 * y) // height, (80 + (100 * x) // width + shift) % 256, 200 - (120 * y) // height], axis=-1
    ).astype(np.uint8)
    img = Image.fromarray(rgb, "RGB")
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, int(height * 0.7), width, height], fill=(60, 140, 60))
    r = min(width, height) // 6
    c = ((width // 2 + variant * width // 5) % width, int(height * 0.45))
    draw.ellipse([c[0] - r, c[1] - r, c[0] + r, c[1] + r], fill=(210, 40, 40))
    return img
