"""Gallery: the seeds' sample prompts on the device, one contact sheet, device/reference pairs, and per
prompt a strip a reviewer judges at a glance: input | reference | device | difference heat map."""

from __future__ import annotations

import textwrap

import numpy as np
from PIL import Image, ImageDraw, ImageFont

CAPTION_H = 44
TILE = 256


def _font() -> ImageFont.ImageFont:
    return ImageFont.load_default()


def _tile(img: Image.Image, caption: str, tile: int = TILE) -> Image.Image:
    """One image scaled into a square tile with a two-line caption under it."""
    canvas = Image.new("RGB", (tile, tile + CAPTION_H), "white")
    thumb = img.convert("RGB").copy()
    thumb.thumbnail((tile, tile), Image.Resampling.NEAREST if max(img.size) < tile else Image.Resampling.LANCZOS)
    if max(thumb.size) < tile:  # tiny models give tiny images: enlarge them so they can be seen
        scale = tile // max(thumb.size)
        thumb = thumb.resize((thumb.size[0] * scale, thumb.size[1] * scale), Image.Resampling.NEAREST)
    canvas.paste(thumb, ((tile - thumb.size[0]) // 2, (tile - thumb.size[1]) // 2))
    draw = ImageDraw.Draw(canvas)
    lines = textwrap.wrap(caption, width=max(10, tile // 7))[:3]
    for k, line in enumerate(lines):
        draw.text((4, tile + 2 + 13 * k), line, fill="black", font=_font())
    return canvas


def contact_sheet(images: list[Image.Image], captions: list[str], columns: int = 3) -> Image.Image:
    """A grid of captioned tiles (PIL only, so it renders anywhere)."""
    if not images:
        raise ValueError("contact sheet needs at least one image")
    tiles = [_tile(img, cap) for img, cap in zip(images, captions, strict=False)]
    columns = max(1, min(columns, len(tiles)))
    rows = (len(tiles) + columns - 1) // columns
    w, h = tiles[0].size
    sheet = Image.new("RGB", (columns * w, rows * h), "white")
    for k, t in enumerate(tiles):
        sheet.paste(t, ((k % columns) * w, (k // columns) * h))
    return sheet


def pair(device_img: Image.Image, reference_img: Image.Image, device_label: str, reference_label: str,
         ) -> Image.Image:
    """Reference left, device right (the seed report's layout: "左：CPU float32，右：NPU float16")."""
    return contact_sheet([reference_img, device_img], [reference_label, device_label], columns=2)


#: Difference (0-255 levels, worst channel) at which the heat map saturates.
HEAT_MAX_LEVELS = 32


def difference_map(device_img: Image.Image, reference_img: Image.Image) -> Image.Image:
    """|device - reference| per pixel (worst channel) as a heat map: black 0, brightest from HEAT_MAX_LEVELS levels."""
    from matplotlib import colormaps

    a = np.asarray(device_img.convert("RGB"), dtype=np.float64)
    b = np.asarray(reference_img.convert("RGB").resize(device_img.size), dtype=np.float64)
    diff = np.clip(np.abs(a - b).max(axis=-1) / HEAT_MAX_LEVELS, 0.0, 1.0)
    rgb = colormaps["inferno"](diff)[..., :3]
    return Image.fromarray((rgb * 255).round().astype(np.uint8))


def strip(device_img: Image.Image, reference_img: Image.Image, device_label: str, reference_label: str,
          input_img: Image.Image | None = None) -> Image.Image:
    """[input |] reference | device | difference: the layout a sign-off looks at first."""
    images = [reference_img, device_img, difference_map(device_img, reference_img)]
    captions = [reference_label, device_label, f"|difference| (bright: {HEAT_MAX_LEVELS}+ levels)"]
    if input_img is not None:
        images.insert(0, input_img)
        captions.insert(0, "input")
    return contact_sheet(images, captions, columns=len(images))
