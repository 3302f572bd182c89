"""Issue 28.1 and 28.3 end to end: a --quick validation of tiny-ursa says beside its pictures that they were
made with fewer steps than the model's default, and its performance table measures every row the same way
at the size the pictures came out at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difforge.report import write_report
from difforge.validate.options import ValidateOptions
from difforge.validate.runner import run_validation


@pytest.mark.slow  # one whole tiny-ursa validation with its speed table: ~35 s of CPU
def test_quick_pictures_say_their_steps_and_every_speed_row_is_measured_alike(tmp_path: Path) -> None:
    opts = ValidateOptions(model="tiny-ursa", device="cpu", dtype="bfloat16", reference="cpu:float32", quick=True,
                           out=tmp_path / "r", quiet=True, height=128, width=128, rounds=2, warmup=1,
                           speed_table=True)
    result = run_validation(opts, write_report)
    gallery = result.data["gallery"]
    assert gallery["steps"] == 4 and gallery["default_steps"] > 4 and gallery["steps_lowered"]
    html = result.report_paths["html"].read_text()
    figure = html[html.index('<figure class="strip">'):html.index("</figure>", html.index('<figure class="strip">'))]
    assert f"Made with 4 denoising steps (--quick); the model draws with {gallery['default_steps']}" in figure
    speed = result.rungs["benchmark"].data["speed"]
    assert (speed["header"]["width"], speed["header"]["height"]) == (128, 128)
    rows = [r for r in speed["rows"] if "error" not in r]
    assert len(rows) >= 3
    assert {(r["rounds"], r["warmup"]) for r in rows} == {(2, 1)}  # the validated row's rounds, on every row
    data = json.loads(result.report_paths["json"].read_text())
    assert data["rungs"]["benchmark"]["data"]["speed"]["header"]["width"] == 128
    md = result.report_paths["markdown"].read_text()
    assert "None×None" not in md and "128×128" in md
    assert md.count("2 after 1 warm-up") == len(rows)
