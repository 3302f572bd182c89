"""The HTML report opens in headless Chromium with its images visible (skipped without Chromium)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from difforge.report import write_report

from .test_render import _result

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium_works() -> bool:
    """An installed browser that cannot even print its version is a broken machine, not a report bug."""
    if CHROMIUM is None:
        return False
    try:
        return subprocess.run([CHROMIUM, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "screenshot_report.sh"


@pytest.mark.skipif(not _chromium_works(), reason="chromium is not installed (or does not start)")
def test_report_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    result, files = _result(tmp_path)
    html = write_report(result, tmp_path, files=files)["html"]
    shot = tmp_path / "shot.png"
    subprocess.run([str(SCRIPT), str(html), str(shot), "1000", "4000"], check=True, timeout=120,
                   capture_output=True)
    arr = np.asarray(Image.open(shot).convert("RGB"))
    assert arr.shape[:2] == (4000, 1000)
    # the embedded plots and the red contact-sheet tile are drawn: plot blue and pure red pixels exist
    red = (arr[..., 0] > 180) & (arr[..., 1] < 40) & (arr[..., 2] < 40)
    assert red.sum() > 100
    assert arr.std() > 10  # not a blank page


def test_the_committed_report_screenshots_are_1280px_and_small() -> None:
    """docs/report-en.png and docs/report-zh.png: the en and zh reports at 1280 px, pictures first (how
    they were made: docs/validate.md), a few hundred KB at most."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    for name in ("report-en.png", "report-zh.png"):
        path = docs / name
        assert path.stat().st_size < 400 * 1024, name
        with Image.open(path) as im:
            assert im.size[0] == 1280 and im.size[1] >= 1200, (name, im.size)
