"""Report prose in English and Chinese (``--lang``); numbers and identifiers stay as they are."""

from __future__ import annotations

import json
from pathlib import Path

#: Where the prose lives: one JSON object per language, key -> text (``str.format`` fields in braces).
#: Data, not code: each language's table is the same keys in another language, which Python would repeat.
TEXTS_FILE = Path(__file__).parent / "templates" / "texts.json"
TEXT: dict[str, dict[str, str]] = json.loads(TEXTS_FILE.read_text(encoding="utf-8"))

RUNG_TITLES = {
    "en": {"smoke": "smoke", "determinism": "determinism", "benchmark": "benchmark", "operator": "operator",
           "component": "component", "step": "teacher-forced step", "trajectory": "trajectory",
           "semantic": "semantic"},
    "zh": {"smoke": "基本运行", "determinism": "确定性", "benchmark": "性能基准", "operator": "算子级",
           "component": "组件级", "step": "逐步教师强制", "trajectory": "完整轨迹",
           "semantic": "语义"},
}


def texts(lang: str) -> dict[str, str]:
    return TEXT.get(lang, TEXT["en"])
