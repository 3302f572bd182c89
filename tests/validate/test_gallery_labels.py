"""Issue 28.10: picture labels read cleanly (a real face, words apart), in Chinese for a zh report; the
semantic sheet shows each edit beside its source; wide pictures fill their tiles; held-out sets do not
repeat a prompt before every distinct one was shown."""

from __future__ import annotations

import numpy as np
from fontTools.ttLib import TTFont
from PIL import Image, ImageDraw

from difforge.shapes.prompts import heldout_caption_set, heldout_edit_set
from difforge.validate import gallery
from difforge.validate.gallery import TILE, contact_sheet, label, semantic_sheet, strip


def _ink_columns(text: str) -> np.ndarray:
    """Which pixel columns of ``text`` drawn by the gallery carry ink."""
    img = Image.new("L", (400, 30), 255)
    gallery._draw_text(ImageDraw.Draw(img), (0, 5), text)  # the caption drawer itself
    return (np.asarray(img) < 128).any(axis=0)


def _gaps(ink: np.ndarray) -> list[int]:
    """Widths of the blank runs between inked runs."""
    cols = np.flatnonzero(ink)
    return [int(b - a - 1) for a, b in zip(cols[:-1], cols[1:], strict=True) if b - a > 1]


def test_words_in_a_caption_stand_apart_from_the_gaps_inside_a_word() -> None:
    """'cross on a' must not read 'cros son a': every gap between words is wider than any gap inside one."""
    ink = _ink_columns("cross on a")
    inside = max(max(_gaps(_ink_columns(w)), default=0) for w in ("cross", "on"))
    between = sorted(_gaps(ink), reverse=True)[:2]  # the two word breaks are the widest gaps
    assert len(between) == 2 and min(between) >= inside + 2, (between, inside)


def test_zh_labels_are_chinese_and_drawn_with_the_bundled_face() -> None:
    cjk = TTFont(str(gallery.CJK_FONT)).getBestCmap()
    for key, text in gallery.LABELS["zh"].items():
        chinese = [ch for ch in text if gallery._is_cjk(ch)]
        assert chinese, key  # no English label left in a zh report
        assert all(ord(ch) in cjk for ch in chinese), (key, [c for c in chinese if ord(c) not in cjk])
    assert label("zh", "input") == "输入图" and label("en", "input") == "input"
    pic = Image.new("RGB", (32, 32), (200, 40, 40))
    en = np.asarray(strip(pic, pic, "d", "r", pic, lang="en"))
    zh = np.asarray(strip(pic, pic, "d", "r", pic, lang="zh"))
    assert en.shape == zh.shape and (en[TILE:] != zh[TILE:]).any()  # the captions differ, the pictures not
    assert (en[:TILE] == zh[:TILE]).all()


def test_the_semantic_sheet_shows_each_edit_beside_its_source() -> None:
    src = [Image.new("RGB", (16, 16), (0, 0, 255)), Image.new("RGB", (16, 16), (0, 255, 0))]
    out = [Image.new("RGB", (16, 16), (255, 0, 0)), Image.new("RGB", (16, 16), (255, 255, 0))]
    sheet = np.asarray(semantic_sheet(out, ["add a red square", "make the square yellow"], src))
    centres = [tuple(sheet[TILE // 2, k * TILE + TILE // 2]) for k in range(4)]
    assert centres == [(0, 0, 255), (255, 0, 0), (0, 255, 0), (255, 255, 0)]  # source, result, source, result
    captions = semantic_sheet(out, ["a", "b"], [None, None])  # captions: no source column
    assert captions.size[0] == 2 * TILE


def test_wide_pictures_fill_their_tiles_and_the_title_sits_on_top() -> None:
    pair = Image.new("RGB", (132, 64), (255, 0, 0))
    sheet = contact_sheet([pair] * 4, ["x"] * 4, columns=2, title="shapes-qwen-edit: 3/4 of these")
    arr = np.asarray(sheet)
    assert sheet.size[0] == 2 * 2 * TILE  # two two-square tiles a row, no empty half tile
    red = (arr[..., 0] > 200) & (arr[..., 1] < 50)
    assert red[:, : 2 * TILE].any(axis=0).sum() > 1.4 * TILE  # the pair spans most of its tile's width
    assert not red[:20].any() and (arr[:20] < 128).any()  # the title's ink above the pictures


def test_heldout_sets_show_every_distinct_prompt_before_a_repeat() -> None:
    for pset, distinct in ((heldout_caption_set(9), 9), (heldout_caption_set(16), 12), (heldout_edit_set(6), 6),
                           (heldout_caption_set(4), 4)):
        prompts = [i.prompt for i in pset.items]
        assert len(set(prompts)) == distinct, prompts
        assert len(set(prompts[:distinct])) == distinct  # repeats only after every distinct one
    full = heldout_caption_set(40)
    assert sorted(i.meta["index"] for i in full.items) == list(range(40))  # the same 40 draws, reordered
    assert [i.id for i in full.items[:3]] == ["c000", "c001", "c002"]
