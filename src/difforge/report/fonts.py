"""The Chinese font the zh report carries with it, so its glyphs render on a machine without one.

A subset of Noto Sans CJK SC (OFL 1.1, ``fonts/OFL.txt``) holding the characters of difforge's own
Chinese texts; ``scripts/build_cjk_font.py`` rebuilds it when a translation adds a character (a test
fails until then).  The HTML report embeds it as an ``@font-face`` data URL; matplotlib is given the
file for the plots' labels.  The subset holds no Latin glyph, so listing it first in the page's font list
leaves Latin text to the usual fonts, character by character; it must come first, because a browser
that meets a Chinese character before the web font is needed draws that character as an empty box.
"""

from __future__ import annotations

import base64
from functools import cache
from pathlib import Path

FONT_PATH = Path(__file__).resolve().parent / "fonts" / "difforge-cjk-sc.otf"
#: The CSS family name the zh report's stylesheet lists first (see the module docstring).
CSS_FAMILY = "difforge-cjk"
#: The family name inside the subset (what matplotlib's font manager calls it).
MPL_FAMILY = "Noto Sans CJK SC"


@cache
def font_face_css() -> str:
    """The ``@font-face`` rule with the subset inlined (the report stays one self-contained file)."""
    data = base64.b64encode(FONT_PATH.read_bytes()).decode()
    return (f"@font-face {{ font-family: '{CSS_FAMILY}'; font-style: normal; font-weight: 400; "
            f"src: url(data:font/otf;base64,{data}) format('opentype'); }}")


@cache
def register_matplotlib() -> str:
    """Add the subset to matplotlib's font manager once; the family name to list after the Latin one."""
    from matplotlib import font_manager

    font_manager.fontManager.addfont(str(FONT_PATH))
    return MPL_FAMILY
