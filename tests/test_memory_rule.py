"""The memory tests' peak RSS counts the child alone, even when the parent that starts it is large."""

from __future__ import annotations

import subprocess
import sys

from tests.memory import PEAK_RSS_CODE, peak_rss_bytes


def test_a_childs_peak_does_not_inherit_its_parents() -> None:
    """A parent holding 600 MB starts a small child: the child's peak is its own (well under 600 MB), while the
    parent's own peak counts what it holds.  ``ru_maxrss`` would give the child at least the parent's 600 MB."""
    held = bytearray(600 << 20)
    held[:: 4096] = b"\x01" * len(held[:: 4096])  # touch every page so it is resident
    assert peak_rss_bytes() > 600 << 20
    code = PEAK_RSS_CODE + "print(peak_rss_bytes())\n"
    child = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1 << 20 < child < 300 << 20, child
    del held
