"""Gallery: the seeds' sample prompts on the device, one contact sheet, device/reference pairs, and per
prompt a strip a reviewer judges at a glance: input | reference | device | difference heat map."""

from __future__ import annotations

import textwrap
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

CAPTION_H = 48
TILE = 256
#: Caption size in pixels.  Pillow's built-in default font is a 10 px face whose spacing merges words
#: ("cros son a"); a real face at this size reads cleanly.
FONT_PX = 13
LINE_PX = 15
#: The report's embedded CJK subset (a data file read here, not an import of the report box): zh labels.
CJK_FONT = Path(__file__).resolve().parents[1] / "report" / "fonts" / "difforge-cjk-sc.otf"

#: The labels the pictures carry, in the report's language (``--lang``).  Every Chinese character here is
#: in the CJK subset (report/glyphs.py collects them; tests/report/test_fonts.py checks).
LABELS = {
    "en": {"input": "input", "difference": "|difference| (bright: {levels}+ levels)", "source": "source",
           "reference": "reference: {label}", "device": "device: {label}", "edited": "edited: {prompt}"},
    "zh": {"input": "输入图", "difference": "|差异|（最大：{levels}+ 级）", "source": "源图",
           "reference": "参考：{label}", "device": "被测设备：{label}", "edited": "编辑结果：{prompt}"},
}


def label(lang: str, key: str, **values: Any) -> str:
    """One picture label in ``lang`` (English for a language without its own)."""
    return LABELS.get(lang, LABELS["en"])[key].format(**values)


@cache
def _fonts() -> tuple[ImageFont.ImageFont, ImageFont.ImageFont | None]:
    """(Latin face, CJK face or None): matplotlib's DejaVu Sans (a dependency already), else Pillow's default."""
    try:
        import matplotlib

        latin: ImageFont.ImageFont = ImageFont.truetype(
            str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"), FONT_PX)
    except (ImportError, OSError):
        latin = ImageFont.load_default(FONT_PX)
    try:
        cjk: ImageFont.ImageFont | None = ImageFont.truetype(str(CJK_FONT), FONT_PX)
    except OSError:
        cjk = None
    return latin, cjk


def _is_cjk(ch: str) -> bool:
    return "\u2e80" <= ch <= "\u9fff" or "\uff00" <= ch <= "\uffef"


def _draw_text(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str) -> None:
    """``text`` run by run: CJK runs in the CJK face, the rest in the Latin one (Pillow has no fallback)."""
    latin, cjk = _fonts()
    x, y = xy
    run, run_cjk = "", False
    for ch in [*text, None]:
        is_cjk = ch is not None and cjk is not None and _is_cjk(ch)
        if ch is None or (run and is_cjk != run_cjk):
            font = cjk if run_cjk and cjk is not None else latin
            draw.text((x, y), run, fill="black", font=font)
            x += int(draw.textlength(run, font=font))
            run = ""
        if ch is not None:
            run, run_cjk = run + ch, is_cjk


def _wrap(caption: str, width_px: int) -> list[str]:
    """Lines that fit ``width_px`` (measured with the faces that draw them), at most three."""
    latin, cjk = _fonts()
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))

    def width(text: str) -> float:
        return sum(probe.textlength(ch, font=cjk if cjk is not None and _is_cjk(ch) else latin) for ch in text)

    chars = max(8, int(width_px / max(1.0, width("n"))))
    while chars > 8 and any(width(line) > width_px for line in textwrap.wrap(caption, width=chars)):
        chars -= 1
    return textwrap.wrap(caption, width=chars)[:3]


def _tile(img: Image.Image, caption: str, tile: int = TILE, aspect: int = 1) -> Image.Image:
    """One image scaled into a tile ``aspect`` squares wide (a source | result pair is two) with a caption
    of up to three lines under it."""
    width = tile * aspect
    canvas = Image.new("RGB", (width, tile + CAPTION_H), "white")
    thumb = img.convert("RGB").copy()
    thumb.thumbnail((width, tile), Image.Resampling.NEAREST if max(img.size) < tile else Image.Resampling.LANCZOS)
    if thumb.size[0] < width and thumb.size[1] < tile:  # tiny models give tiny images: enlarge them to be seen
        scale = min(width // thumb.size[0], tile // thumb.size[1])
        thumb = thumb.resize((thumb.size[0] * scale, thumb.size[1] * scale), Image.Resampling.NEAREST)
    canvas.paste(thumb, ((width - thumb.size[0]) // 2, (tile - thumb.size[1]) // 2))
    draw = ImageDraw.Draw(canvas)
    for k, line in enumerate(_wrap(caption, width - 8)):
        _draw_text(draw, (4, tile + 2 + LINE_PX * k), line)
    return canvas


def contact_sheet(images: list[Image.Image], captions: list[str], columns: int = 3, title: str = "") -> Image.Image:
    """A grid of captioned tiles (PIL only, so it renders anywhere), with an optional title line on top.

    Tiles take the widest picture's shape in whole squares (a source | result pair fills a two-square tile),
    so a sheet of wide pictures has no empty half tiles."""
    if not images:
        raise ValueError("contact sheet needs at least one image")
    aspect = max(1, max(round(img.size[0] / max(1, img.size[1])) for img in images))
    tiles = [_tile(img, cap, aspect=aspect) for img, cap in zip(images, captions, strict=False)]
    columns = max(1, min(columns, len(tiles)))
    rows = (len(tiles) + columns - 1) // columns
    w, h = tiles[0].size
    top = (len(_wrap(title, columns * w - 8)) * LINE_PX + 8) if title else 0
    sheet = Image.new("RGB", (columns * w, rows * h + top), "white")
    if title:
        draw = ImageDraw.Draw(sheet)
        for k, line in enumerate(_wrap(title, columns * w - 8)):
            _draw_text(draw, (4, 4 + LINE_PX * k), line)
    for k, t in enumerate(tiles):
        sheet.paste(t, ((k % columns) * w, top + (k // columns) * h))
    return sheet


def pair(device_img: Image.Image, reference_img: Image.Image, device_label: str, reference_label: str,
         ) -> Image.Image:
    """Reference left, device right (the seed report's layout: "左：CPU float32，右：NPU float16")."""
    return contact_sheet([reference_img, device_img], [reference_label, device_label], columns=2)


def semantic_sheet(results: list[Image.Image], prompts: list[str], sources: list[Image.Image | None],
                   lang: str = "en") -> Image.Image:
    """The semantic rung's sheet: each result after its prompt; an edit's result beside its source picture
    (source | result pairs, two pairs a row), so a reviewer sees what the edit had to change."""
    if not any(src is not None for src in sources):
        return contact_sheet(results, prompts)
    images: list[Image.Image] = []
    captions: list[str] = []
    for result, prompt, src in zip(results, prompts, sources, strict=True):
        if src is not None:
            images.append(src)
            captions.append(label(lang, "source"))
        images.append(result)
        captions.append(label(lang, "edited", prompt=prompt))
    return contact_sheet(images, captions, columns=4)


def picture_steps(steps: int | None, default_steps: int | None, lowered: bool) -> dict[str, Any]:
    """What the report says beside a picture about its steps: ``lowered`` when --quick ran fewer steps than the
    model draws with (its pictures are half-formed by design; the semantic rung's are at the default)."""
    return {"steps": steps, "default_steps": default_steps,
            "steps_lowered": bool(lowered and steps and default_steps and steps < default_steps)}


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
          input_img: Image.Image | None = None, lang: str = "en") -> Image.Image:
    """[input |] reference | device | difference: the layout a sign-off looks at first (the labels as given,
    the input's and the heat map's in ``lang``)."""
    images = [reference_img, device_img, difference_map(device_img, reference_img)]
    captions = [reference_label, device_label, label(lang, "difference", levels=HEAT_MAX_LEVELS)]
    if input_img is not None:
        images.insert(0, input_img)
        captions.insert(0, label(lang, "input"))
    return contact_sheet(images, captions, columns=len(images))
