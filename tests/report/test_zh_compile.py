"""The compile lines a run records (devices/compile.py auto_compile's reasons, URSA's compile adaptations) read in
Chinese in a zh report: every number kept, no English sentence left."""

from __future__ import annotations

import re

import pytest

from difforge.devices.compile import CompilePolicy, auto_compile
from difforge.report.zh_text import translate

CUDA = CompilePolicy("cuda", True, label="inductor", detail="mode default")


def _reasons() -> list[str]:
    return [
        auto_compile(CompilePolicy("cpu", True), 0.05, 0, 25, False).reason,
        auto_compile(CompilePolicy("cuda", False, detail="triton is not installed"), 0.05, 0, 25, False).reason,
        auto_compile(CUDA, None, 0, 25, False).reason,
        auto_compile(CUDA, 0.0522, 25, 25, True).reason,
        auto_compile(CUDA, 0.0522, 0, 25, False).reason,
    ]


@pytest.mark.parametrize("index", range(5))
def test_every_auto_compile_reason_translates_with_its_numbers(index: int) -> None:
    text = _reasons()[index]
    zh = translate(text, "zh")
    assert zh != text and re.search(r"[\u4e00-\u9fff]", zh)
    assert set(re.findall(r"\d+(?:\.\d+)?", text)) <= set(re.findall(r"\d+(?:\.\d+)?", zh))
    leftover = re.sub(r"triton is not installed|eager|\bcuda\b|\bcpu\b|--compile|token|ms|\bs\b", "", zh)
    assert not re.search(r"[A-Za-z]{3,}", leftover), zh


def test_the_compile_adaptation_lines_translate() -> None:
    chosen = auto_compile(CUDA, 0.0522, 500, 25, True)
    assert chosen.compile
    lines = ["eager (auto)", "inductor: regional (decoder layer), chosen automatically",
             f"{chosen.reason}; mode default; not bit for bit",
             "auto: compiled by an earlier call of this pipeline (cost already paid)"]
    for line in lines:
        zh = translate(line, "zh")
        assert zh != line and re.search(r"[\u4e00-\u9fff]", zh), line
    assert translate(lines[2], "zh").endswith("模式 default；并非逐位一致")
