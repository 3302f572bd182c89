"""The Chinese font the zh report carries with it, so its glyphs render on a machine without one.

A subset of Noto Sans CJK SC (OFL 1.1, ``fonts/OFL.txt``) holding the characters of difforge's own
Chinese texts; ``scripts/build_cjk_font.py`` rebuilds it when a translation adds a character (a test
fails until then).  The HTML report embeds it as an ``@font-face`` data URL; matplotlib is given the
file for the plots' labels.  Latin text keeps the page's usual fonts: the subset comes after them in
every font list.
"""

from __future__ import annotations

import base64
from functools import cache
from pathlib import Path

FONT_PATH = Path(__file__).resolve().parent / "fonts" / "difforge-cjk-sc.otf"
#: The CSS family name the report's stylesheet lists after its Latin fonts.
CSS_FAMILY = "difforge-cjk"
#: The family name inside the subset (what matplotlib's font manager calls it).
MPL_FAMILY = "Noto Sans CJK SC"


def chinese_characters() -> set[str]:
    """Every non-ASCII character of the zh report's texts: what the subset must hold."""
    from . import i18n, plots, zh_text

    texts: list[str] = [*i18n.TEXT["zh"].values(), *i18n.RUNG_TITLES["zh"].values(), *plots.ZH_LABELS.values()]
    for name, value in vars(zh_text).items():  # the catalogue, whatever containers it is kept in
        if not name.startswith("__"):
            texts.extend(_strings(value))
    return {ch for text in texts for ch in text if ord(ch) > 0x7E and not ch.isspace()}


def _strings(value: object, depth: int = 0) -> list[str]:
    """Every string inside ``value`` (nested dicts, lists, tuples; compiled patterns skipped)."""
    if isinstance(value, str):
        return [value]
    if depth > 4:
        return []
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k, depth + 1), *_strings(v, depth + 1))]
    if isinstance(value, list | tuple | set | frozenset):
        return [s for v in value for s in _strings(v, depth + 1)]
    return []


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
