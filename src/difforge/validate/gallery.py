"""Gallery: the seeds' sample prompts on the device, one contact sheet, and device/reference pairs."""

from __future__ import annotations

import textwrap

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
