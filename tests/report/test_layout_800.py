"""Issue 28.10 in headless Chromium: at 800 px the report does not run off the page (a wide table scrolls
inside its own box) and no table cell is squeezed until its words wrap a character at a time - the
performance table's option strings above all.  Skipped without Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from difforge.report import write_report
from difforge.validate.verdict import RungResult, Verdict

from .test_render import _result, _speed

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

#: Runs in the page once it is laid out: the page's overflow, and every table cell narrower than its widest
#: word (capped at 12 characters' width, so a sha256 or a long path may still break where it must).
MEASURE = """
<script>
window.addEventListener('load', () => {
  const probe = document.createElement('span');
  probe.style.cssText = 'position:absolute;visibility:hidden;white-space:nowrap';
  document.body.appendChild(probe);
  const squeezed = [];
  for (const cell of document.querySelectorAll('td, th')) {
    // a word may break after a hyphen or a comma (an option list); never inside a run of letters
    const words = cell.innerText.split(/[\\s,-]+/).filter(w => w.length > 1);
    if (!words.length) continue;
    const style = getComputedStyle(cell);
    const code = cell.querySelector('code');
    let need = 0;
    for (const w of words) {
      const face = getComputedStyle(code && code.innerText.includes(w) ? code : cell);
      for (const k of ['fontFamily', 'fontSize', 'fontWeight', 'fontStyle', 'fontVariantNumeric', 'letterSpacing'])
        probe.style[k] = face[k];
      // Chinese breaks between characters by design: four of them on a line is no squeeze
      probe.textContent = /[\\u2e80-\\u9fff]/.test(w) ? w.slice(0, 4) : w.slice(0, 12);
      need = Math.max(need, probe.getBoundingClientRect().width);
    }
    const inner = cell.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    if (inner + 1 < need) squeezed.push([cell.closest('table').className, cell.innerText.slice(0, 40), inner, need]);
  }
  const out = {page: document.documentElement.scrollWidth, view: window.innerWidth, squeezed: squeezed};
  const pre = document.createElement('pre');
  pre.id = 'measured';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def _chromium_works() -> bool:
    if CHROMIUM is None:
        return False
    try:
        return subprocess.run([CHROMIUM, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _measure(html: Path, width: int) -> dict:
    page = html.with_name("measure.html")
    page.write_text(html.read_text().replace("</body>", MEASURE + "</body>"))
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                              f"--user-data-dir={profile}", f"--window-size={width},2000",
                              "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.mark.skipif(not _chromium_works(), reason="chromium is not installed (or does not start)")
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_at_800_px_nothing_overflows_and_no_cell_wraps_a_character_at_a_time(tmp_path: Path, lang: str) -> None:
    result, files = _result(tmp_path)
    _speed(result)
    rows = result.rungs["benchmark"].data["speed"]["rows"]
    rows[0]["name"] = "--disable lm-head-slice,kv-cache-reuse,fused-rms-norm,rotary-table,sdpa-flash"
    result.data["config"] = {"steps": 25, "negative_prompt": " ", "compile": True, "fast": ["unguided-tail"]}
    for key in ("smoke", "determinism", "trajectory", "semantic"):  # the rung table's long names and findings
        result.rungs[key] = RungResult(key, Verdict.PASS, "3 runs with the same seed are bitwise identical " * 3)
    html = write_report(result, tmp_path, lang=lang, files=files)["html"]
    got = _measure(html, 800)
    assert got["page"] <= got["view"], got  # the page itself never scrolls sideways
    assert got["squeezed"] == [], got["squeezed"]
