"""Chinese for the sentences validate writes while it runs (rung findings, row notes, thresholds, notes).

The static prose of the report lives in :mod:`difforge.report.i18n`; these are the texts the rungs build
from numbers and names at run time, in English.  ``translate`` maps each known sentence shape to its
Chinese form, keeping every number, name and code fragment as it was.  Text it does not know is
returned unchanged (a test renders zh reports of passing, failing and skipped validations and fails on
any English sentence left, so a new sentence shape without a translation is caught there).
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: Whole strings with a fixed translation (measurement names, subjects, fixed notes).
EXACT: dict[str, str] = {}

#: (pattern, template) pairs tried in order on a string; the template may use the pattern's groups
#: (``{1}``, ``{name}``) and each group is itself translated first when ``translate_groups`` lists it.
PATTERNS: list[tuple[re.Pattern[str], str]] = []


def translate(text: str, lang: str) -> str:
    """``text`` in ``lang``: unchanged for English (and for anything not in the catalogue)."""
    if lang != "zh" or not text:
        return text
    if text in EXACT:
        return EXACT[text]
    for pattern, template in PATTERNS:
        m = pattern.fullmatch(text)
        if m:
            groups = {k: translate(v, lang) if v else (v or "") for k, v in m.groupdict().items()}
            return template.format(*[translate(g, lang) if g else (g or "") for g in m.groups()], **groups)
    return text


def translator(lang: str) -> Callable[[str], str]:
    """``translate`` bound to one language, for the report's context builder."""
    return lambda text: translate(text, lang) if isinstance(text, str) else text
