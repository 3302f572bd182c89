"""``difforge compare A B [--floor F]``: pictures from elsewhere, paired by name, judged by the floor rule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from difforge import cli
from difforge.runtime.images import test_picture
from difforge.validate.compare import compare


def _noisy(img: Image.Image, levels: float, seed: int) -> Image.Image:
    a = np.asarray(img.convert("RGB"), dtype=np.float64)
    noise = np.random.default_rng(seed).normal(0, levels, a.shape)
    return Image.fromarray(np.clip(np.rint(a + noise), 0, 255).astype(np.uint8))


@pytest.fixture()
def folders(tmp_path: Path) -> dict[str, Path]:
    out = {k: tmp_path / k for k in ("ref", "floor", "good", "bad")}
    for folder in out.values():
        folder.mkdir()
    for k in range(2):
        ref = test_picture(64 + 16 * k)
        ref.save(out["ref"] / f"p{k}.png")
        _noisy(ref, 2, 10 + k).save(out["floor"] / f"p{k}.png")
        _noisy(ref, 2, 20 + k).save(out["good"] / f"p{k}.png")
        _noisy(ref, 25, 30 + k).save(out["bad"] / f"p{k}.png")
    _noisy(test_picture(64), 2, 1).save(out["good"] / "extra.png")
    return out


def test_a_clean_run_passes_against_its_floor_and_a_broken_one_fails(folders: dict[str, Path]) -> None:
    good = compare(folders["good"], folders["ref"], folders["floor"])
    assert str(good.verdict) == "PASS" and good.exit_code == 0
    assert [p.name for p in good.pairs] == ["p0.png", "p1.png"] and good.only_a == ["extra.png"]
    assert all(0.5 < p.ratio < 2 for p in good.pairs)
    bad = compare(folders["bad"], folders["ref"], folders["floor"])
    assert str(bad.verdict) == "FAIL" and bad.exit_code == 1
    assert all(p.ratio > 3 for p in bad.pairs)


def test_without_a_floor_a_close_pair_is_only_a_warn(folders: dict[str, Path]) -> None:
    assert str(compare(folders["good"], folders["ref"]).verdict) == "WARN"
    flipped = folders["bad"] / "p0.png"
    Image.fromarray(255 - np.asarray(Image.open(flipped).convert("RGB"))).save(flipped)
    assert str(compare(folders["bad"], folders["ref"]).verdict) == "FAIL"


def test_size_mismatch_fails_the_pair(folders: dict[str, Path], tmp_path: Path) -> None:
    test_picture(32).save(folders["good"] / "p0.png")
    result = compare(folders["good"], folders["ref"], folders["floor"])
    assert str(result.pairs[0].verdict) == "FAIL" and "sizes differ" in result.pairs[0].why


def test_cli_report_json_and_usage_errors(folders: dict[str, Path], tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "report"
    res = runner.invoke(cli.app, ["compare", str(folders["bad"]), str(folders["ref"]), "--floor",
                                  str(folders["floor"]), "--out", str(out)])
    assert res.exit_code == 1, res.output
    data = json.loads((out / "report.json").read_text())
    assert data["verdict"] == "FAIL" and len(data["pairs"]) == 2
    assert "| `p0.png` | FAIL |" in (out / "report.md").read_text()
    again = runner.invoke(cli.app, ["compare", str(folders["good"]), str(folders["ref"]), "--floor",
                                    str(folders["floor"]), "--out", str(out), "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["verdict"] == "PASS"  # the old report is replaced
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("x")
    for args in (["compare", str(folders["good"]), str(tmp_path / "missing")],
                 ["compare", str(folders["good"]), str(folders["ref"]), "--out", str(mine)],
                 ["compare", str(folders["good"]), str(tmp_path)]):  # no namesake pictures
        res = runner.invoke(cli.app, args)
        assert res.exit_code == 2, (args, res.output)
    assert (mine / "notes.txt").read_text() == "x"
