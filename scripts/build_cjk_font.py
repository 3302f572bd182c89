"""Rebuild the report's embedded Chinese font: a subset of Noto Sans CJK SC with just the glyphs the
zh report's own texts use.

Why a subset: a zh report must render on a machine without any CJK font (the HTML embeds the font,
matplotlib is given the file), and the whole Noto Sans CJK SC face is ~16 MB.  The subset holds every
character of difforge's Chinese strings (report/templates/texts.json and plot_labels.json, report/zh_text.py), so it
is a few hundred KB; text from the user (a Chinese prompt) falls back to the system's fonts.
``tests/report/test_fonts.py`` fails when a Chinese string uses a character the subset lacks: run

    pip download --no-deps noto-cjk-sans-otc==0.0.1 -d /tmp/font && unzip -o /tmp/font/*.whl -d /tmp/font
    python scripts/build_cjk_font.py /tmp/font/noto_cjk_sans_otc/NotoSansCJK-Regular.ttc

The font is under the SIL Open Font License 1.1 (its text ships beside the subset as OFL.txt).
"""

from __future__ import annotations

import sys
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTCollection

from difforge.report.fonts import FONT_PATH
from difforge.report.glyphs import chinese_characters

SC_FACE = "Noto Sans CJK SC"


def main(collection: str) -> int:
    faces = TTCollection(collection).fonts
    face = next((f for f in faces if f["name"].getDebugName(4) == SC_FACE), None)
    if face is None:
        print(f"build_cjk_font: {collection} has no {SC_FACE} face", file=sys.stderr)
        return 2
    chars = chinese_characters()
    options = subset.Options()
    options.name_IDs = ["*"]  # keep the copyright and licence records
    options.notdef_outline = True
    options.layout_features = ["*"]
    options.hinting = False
    options.desubroutinize = True
    sub = subset.Subsetter(options)
    sub.populate(text="".join(sorted(chars)))
    sub.subset(face)
    FONT_PATH.parent.mkdir(parents=True, exist_ok=True)
    face.save(str(FONT_PATH))
    print(f"{FONT_PATH}: {len(chars)} characters, {FONT_PATH.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_file():
        print("usage: build_cjk_font.py NotoSansCJK-Regular.ttc", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
