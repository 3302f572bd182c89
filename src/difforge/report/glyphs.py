"""Every character difforge's Chinese report texts (and zh picture labels) use: what the embedded font subset must hold.

Kept apart from :mod:`.fonts` (which the plots import) so collecting the texts of the plots, the
report prose and the run-time catalogue creates no import cycle.  ``scripts/build_cjk_font.py``
subsets the font to these characters; ``tests/report/test_fonts.py`` checks the committed subset
still covers them.
"""

from __future__ import annotations

from ..validate import gallery
from . import i18n, plots, zh_text


def is_cjk(ch: str) -> bool:
    """CJK ideographs, radicals, CJK punctuation and full-width forms: what a Latin font lacks.  Symbols
    the texts also use (✓, ×, ≤) are in the common Latin fonts and stay theirs."""
    return "\u2e80" <= ch <= "\u9fff" or "\uff00" <= ch <= "\uffef"


def chinese_characters() -> set[str]:
    """Every CJK character of the zh report's texts: what the subset must hold."""
    texts: list[str] = [*i18n.TEXT["zh"].values(), *i18n.RUNG_TITLES["zh"].values(), *plots.ZH_LABELS.values(),
                        *gallery.LABELS["zh"].values()]  # the picture labels validate draws for a zh report
    for name, value in vars(zh_text).items():  # the catalogue, whatever containers it is kept in
        if not name.startswith("__"):
            texts.extend(_strings(value))
    return {ch for text in texts for ch in text if is_cjk(ch)}


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
