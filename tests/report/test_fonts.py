"""The zh report carries its Chinese font: the subset covers every character the report writes, the HTML
embeds it, matplotlib draws the zh plots with it, and Chromium renders every one of those characters as
a real glyph, not an empty box, on a machine without any CJK font."""

from __future__ import annotations

import re
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
from fontTools.ttLib import TTFont
from PIL import Image

from difforge.report import write_report
from difforge.report.fonts import CSS_FAMILY, FONT_PATH, font_face_css
from difforge.report.glyphs import chinese_characters
from difforge.report.plots import step_error_plot

from .test_render import _result
from .test_screenshot import _chromium_works

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "screenshot_report.sh"
CELL = 48  # px per character cell
COLS = 20


def test_the_subset_covers_every_character_of_the_zh_texts() -> None:
    cmap = TTFont(str(FONT_PATH)).getBestCmap()
    missing = sorted(ch for ch in chinese_characters() if ord(ch) not in cmap)
    assert not missing, f"rebuild the subset (scripts/build_cjk_font.py): {''.join(missing)}"
    assert FONT_PATH.stat().st_size < 600 * 1024  # a subset, not the 16 MB face
    assert (FONT_PATH.parent / "OFL.txt").read_text().count("SIL OPEN FONT LICENSE") >= 1


def test_only_the_zh_html_embeds_the_font_and_lists_it_first(tmp_path: Path) -> None:
    (tmp_path / "zh").mkdir()
    (tmp_path / "en").mkdir()
    result, files = _result(tmp_path / "zh")
    zh = write_report(result, tmp_path / "zh", lang="zh", files=files)["html"].read_text()
    result, files = _result(tmp_path / "en")
    en = write_report(result, tmp_path / "en", lang="en", files=files)["html"].read_text()
    assert "@font-face" in zh and "data:font/otf;base64," in zh and "@font-face" not in en
    assert re.search(rf'body \{{ font-family: "{CSS_FAMILY}", ', zh)


def _missing_glyph_warnings(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if "missing from" in str(w.message)]


def test_zh_plots_draw_their_labels_with_the_embedded_font() -> None:
    data = {"seeds": [{"seed": 0, "steps": [{"step": i, "cosine": 0.9995, "rel_l2": 0.02, "ratio": 1.2}
                                            for i in range(3)]}]}
    assert _missing_glyph_warnings(lambda: step_error_plot(data, None, "zh")) == []

    def latin_only() -> None:  # the control: the same label without the subset has no glyphs
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.set_title("去噪步", fontfamily="DejaVu Sans")
        fig.canvas.draw()
        plt.close(fig)

    assert _missing_glyph_warnings(latin_only)


def _cells(html: Path, shot: Path, n: int) -> list[np.ndarray]:
    rows = (n + COLS - 1) // COLS
    subprocess.run([str(SCRIPT), str(html), str(shot), str(COLS * CELL), str(rows * CELL)], check=True, timeout=120,
                   capture_output=True)
    ink = np.asarray(Image.open(shot).convert("L")) < 128
    return [ink[(i // COLS) * CELL:(i // COLS + 1) * CELL, (i % COLS) * CELL:(i % COLS + 1) * CELL] for i in range(n)]


def _page(path: Path, chars: list[str], font_family: str, css: str) -> Path:
    cells = "".join(f'<div class="c">{c}</div>' for c in chars)
    path.write_text(f"""<!DOCTYPE html><html><head><meta charset="utf-8"><style>{css}
body {{ margin: 0; background: #fff; font-family: {font_family}; width: {COLS * CELL}px; }}
.c {{ width: {CELL}px; height: {CELL}px; font-size: 36px; line-height: {CELL}px; text-align: center; float: left;
      color: #000; overflow: hidden; }}
</style></head><body>{cells}</body></html>""", encoding="utf-8")
    return path


@pytest.mark.skipif(not _chromium_works(), reason="chromium is not installed (or does not start)")
def test_chromium_draws_every_zh_character_of_the_report_as_a_glyph(tmp_path: Path) -> None:
    """Each character in its own cell, in the zh report's own font list: an empty box (what a browser
    draws for a character no font has, here the private-use U+E000) is the same picture in every cell,
    so a cell equal to it is a missing glyph.  The control page, without the embedded font, must show
    exactly that, or this check could not fail."""
    result, files = _result(tmp_path)
    report = write_report(result, tmp_path, lang="zh", files=files)["html"].read_text()
    chars = sorted(chinese_characters())
    assert len(chars) > 100
    probe = ["\ue000", *chars]
    # the report's own font lists: the body text's, and code's (options such as 默认 sit in <code>)
    for which, pattern in (("body", r"body \{ font-family: ([^;]+);"), ("code", r"code, pre \{ font-family: ([^;]+);")):
        family = re.search(pattern, report).group(1)
        with_font = _cells(_page(tmp_path / f"{which}.html", probe, family, font_face_css()), tmp_path / f"{which}.png",
                           len(probe))
        box = with_font[0]
        assert box.sum() > 50  # the empty box is drawn
        boxes = [ch for ch, cell in zip(chars, with_font[1:], strict=True) if (cell ^ box).sum() < 20]
        assert not boxes, f"{which}: drawn as empty boxes: {''.join(boxes)}"
        assert all(cell.sum() > 20 for cell in with_font[1:])  # and nothing blank

    control = _cells(_page(tmp_path / "without.html", probe[:21], family, ""), tmp_path / "without.png", 21)
    assert sum((cell ^ control[0]).sum() < 20 for cell in control[1:]) >= 18  # no font: boxes everywhere
