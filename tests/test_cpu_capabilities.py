"""scripts/cpu_capabilities.py: which kernel families CI reruns the parity tests under."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cpu_capabilities.py"


def load():
    spec = importlib.util.spec_from_file_location("cpu_capabilities", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lower_capabilities_never_ask_for_more_than_the_cpu_has() -> None:
    lower = load().lower_capabilities
    assert lower("AVX512") == ["default", "avx2"]
    assert lower("AVX2") == ["default"]
    assert lower("DEFAULT") == []
    assert lower("SVE256") == ["default"]  # aarch64 (Ascend hosts): the portable path only
    assert lower("ZVECTOR") == ["default"]
