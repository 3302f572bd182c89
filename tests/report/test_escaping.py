"""Prompts, paths and error text are data: report.md and report.html show them as inert text.

report.md is rendered with markdown-it (CommonMark + GFM tables, as GitHub/GitLab do) to check
what a reader's viewer would actually do with it: no script, no remote image, no link, no broken
table, no injected heading.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from PIL import Image

from difforge.report import write_report
from difforge.report.render import md_escape
from difforge.validate.options import ValidationResult
from difforge.validate.verdict import Row, RungResult, Verdict

SCRIPT = "<script>alert(1)</script>"
IMAGE = "![x](http://evil.example/pixel.png)"
LINK = "[click](http://evil.example/)"
PROMPT = f"a cat {SCRIPT} {IMAGE} {LINK} | broken | table *bold* _it_ `code` &amp;\n# Injected heading"
MODEL = "/models/<b>bold</b>|x"


def _result(out: Path) -> tuple[ValidationResult, list[Path]]:
    img = out / "images" / "gallery_0_device.png"
    img.parent.mkdir(parents=True)
    Image.new("RGB", (16, 16), (10, 200, 10)).save(img)
    row = Row(f"prompt {PROMPT}")
    row.add("cosine", 0.9999, ">= 0.999", Verdict.PASS)
    row.note = f"note {SCRIPT} | {IMAGE}"
    smoke = RungResult.from_rows("smoke", [row], f"error: cannot read {MODEL} | {SCRIPT}")
    result = ValidationResult(Verdict.FAIL, {"smoke": smoke}, out, data={
        "options": {"model": MODEL}, "family": "ursa", "device_label": "cpu bfloat16",
        "reference_label": "cpu float32", "environment": {"packages": {"torch": "2.x"}, "env": {"X": SCRIPT}},
        "reproduce": [f"difforge validate --model '{MODEL}' --prompts 'p```q.txt' --out r"],
        "adaptations": [{"what": "norm", "choice": IMAGE, "exact": True, "detail": PROMPT}],
        "gallery": {"entries": [{"prompt": PROMPT, "device": "gallery_0_device.png"}]},
        "notes": [f"note {PROMPT}"], "verdict_reasons": [f"reason {SCRIPT}"],
    })
    return result, [img]


def _cells(row_html: str) -> int:
    return len(re.findall(r"<t[dh][ >]", row_html))


def test_markdown_report_shows_hostile_text_inert(tmp_path: Path) -> None:
    result, files = _result(tmp_path)
    md = write_report(result, tmp_path, files=files)["markdown"].read_text()
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert "<script" not in html and "<b>" not in html  # raw HTML is text, not markup
    assert "evil.example" not in re.sub(r">[^<]*<", "><", html)  # no src=/href= to it: only in text nodes
    assert "alert(1)" in html and "&lt;script&gt;" in html  # ... but the text itself is all there
    assert "Injected heading</h1>" not in html  # a newline in a prompt does not start a block
    assert "<em>bold</em>" not in html and "<em>it</em>" not in html and "<code>code</code>" not in html
    # every table row has as many cells as its header: a '|' in a value did not open a column
    for table in re.findall(r"<table>.*?</table>", html, flags=re.S):
        rows = re.findall(r"<tr>.*?</tr>", table, flags=re.S)
        assert len({_cells(r) for r in rows}) == 1, table
    # the reproduce block stays one code block with the command verbatim, backticks and all
    code = re.findall(r"<pre><code[^>]*>(.*?)</code></pre>", html, flags=re.S)
    assert len(code) == 1 and "p```q.txt" in code[0] and "&lt;b&gt;bold&lt;/b&gt;|x" in code[0]
    # the report's own markup still works: headings, the verdict in bold, the image link
    assert "<h1>" in html and "<strong>FAIL</strong>" in html and 'href="images/gallery_0_device.png"' in html


def test_html_report_escapes_hostile_text(tmp_path: Path) -> None:
    result, files = _result(tmp_path)
    html = write_report(result, tmp_path, files=files)["html"].read_text()
    assert SCRIPT not in html and "<b>bold</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'src="http' not in html and 'href="http' not in html


@pytest.mark.parametrize(("raw", "escaped"), [
    ("rel_l2 max_abs gallery_0_device.png", "rel_l2 max_abs gallery_0_device.png"),  # in-word _ is inert
    ("_it_ *b* `c` a|b [l](u) <i> &amp; ~s~ $m$ \\", r"\_it\_ \*b\* \`c\` a\|b \[l\](u) \<i> \&amp; \~s\~ \$m\$ \\"),
    ("two\nlines\r\n# heading", "two lines # heading"),
])
def test_md_escape(raw: str, escaped: str) -> None:
    assert md_escape(raw) == escaped
