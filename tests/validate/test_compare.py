"""``difforge compare A B [--floor F]``: pictures from elsewhere, paired by name, judged by the floor rule."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from difforge import cli
from difforge.errors import InputError
from difforge.runtime.images import test_picture as picture
from difforge.validate.compare import MAX_PIXELS, NO_FLOOR_WHY, compare, image_size
from difforge.validate.thresholds import NO_FLOOR_COS_DIST
from tests.memory import PEAK_RSS_CODE


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
        ref = picture(64 + 16 * k)
        ref.save(out["ref"] / f"p{k}.png")
        _noisy(ref, 2, 10 + k).save(out["floor"] / f"p{k}.png")
        _noisy(ref, 2, 20 + k).save(out["good"] / f"p{k}.png")
        _noisy(ref, 25, 30 + k).save(out["bad"] / f"p{k}.png")
    _noisy(picture(64), 2, 1).save(out["good"] / "extra.png")
    return out


def test_a_clean_run_passes_against_its_floor_and_a_broken_one_fails(folders: dict[str, Path]) -> None:
    good = compare(folders["good"], folders["ref"], folders["floor"])
    assert str(good.verdict) == "PASS" and good.exit_code == 0
    assert [p.name for p in good.pairs] == ["p0.png", "p1.png"] and good.only_a == ["extra.png"]
    assert all(0.5 < p.ratio < 2 for p in good.pairs)
    bad = compare(folders["bad"], folders["ref"], folders["floor"])
    assert str(bad.verdict) == "FAIL" and bad.exit_code == 1
    assert all(p.ratio > 3 for p in bad.pairs)


def test_without_a_floor_no_pair_passes_or_fails_on_precision(folders: dict[str, Path]) -> None:
    """Issue 28.7: a far pair without a floor is not a FAIL (a clean bf16 picture can be far); the output says why."""
    close = compare(folders["good"], folders["ref"])
    assert str(close.verdict) == "WARN" and "within" in close.pairs[0].why and close.no_floor
    flipped = folders["bad"] / "p0.png"
    Image.fromarray(255 - np.asarray(Image.open(flipped).convert("RGB"))).save(flipped)
    far = compare(folders["bad"], folders["ref"])
    assert str(far.verdict) == "WARN" and far.exit_code == 0
    assert far.pairs[0].metrics["cos_distance"] > NO_FLOOR_COS_DIST and "beyond" in far.pairs[0].why
    assert "not judged (no floor)" in far.pairs[0].why and far.to_dict()["no_floor"] == NO_FLOOR_WHY
    # What no precision explains still fails without a floor: A blank where B is not.
    Image.new("RGB", (64, 64), (128, 128, 128)).save(flipped)
    blank = compare(folders["bad"], folders["ref"])
    assert str(blank.verdict) == "FAIL" and "blank" in blank.pairs[0].why
    r = CliRunner().invoke(cli.app, ["compare", str(folders["good"]), str(folders["ref"])])
    assert r.exit_code == 0 and "note: no --floor" in r.stdout and "precision not judged" in r.stdout, r.output


def test_a_floor_that_is_a_is_refused_like_a_self_comparison(folders: dict[str, Path], tmp_path: Path) -> None:
    """Issue 28.7: a floor byte-identical to A gave PASS at 1.00x; the same folder, a copy, a re-encoding: exit 2."""
    copy, resaved = tmp_path / "copy", tmp_path / "resaved"
    copy.mkdir()
    resaved.mkdir()
    for name in ("p0.png", "p1.png"):
        (copy / name).write_bytes((folders["good"] / name).read_bytes())
        Image.open(folders["good"] / name).save(resaved / name, compress_level=0)  # other bytes, same pixels
    assert (resaved / "p0.png").read_bytes() != (folders["good"] / "p0.png").read_bytes()
    runner = CliRunner()
    for floor, needle in ((folders["good"], "it is A"), (copy, "byte-identical to A's"),
                          (resaved, "same pixels as A's")):
        r = runner.invoke(cli.app, ["compare", str(folders["good"]), str(folders["ref"]), "--floor", str(floor)])
        err = r.stderr.strip()
        assert r.exit_code == 2 and len(err.splitlines()) == 1 and needle in err and "vouch" in err, r.output


def test_size_mismatch_fails_the_pair(folders: dict[str, Path], tmp_path: Path) -> None:
    picture(32).save(folders["good"] / "p0.png")
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
    assert "| p0.png | FAIL |" in (out / "report.md").read_text()
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


def test_the_html_report_shows_every_pair_worst_first_with_its_pictures(folders: dict[str, Path], tmp_path: Path) -> None:
    """Issue 28.7: compare had no HTML and no pictures; the strips are the validation gallery's."""
    bad = folders["bad"] / "p1.png"
    _noisy(picture(80), 40, 7).save(bad)
    (folders["bad"] / "p0.png").write_bytes((folders["good"] / "p0.png").read_bytes())
    out = tmp_path / "cmp"
    res = CliRunner().invoke(cli.app, ["compare", str(folders["bad"]), str(folders["ref"]), "--floor",
                                       str(folders["floor"]), "--out", str(out)])
    assert res.exit_code == 1 and f"report: {out / 'report.html'}" in res.stdout, res.output
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 2 and "Verdict: FAIL" in page
    assert page.index("<code>p1.png</code>: RMSE") < page.index("<code>p0.png</code>: RMSE")  # worst first
    pictures = sorted(p.name for p in (out / "pictures").iterdir())
    assert pictures == ["pair_001.png", "pair_002.png"]
    strip = Image.open(out / "pictures" / "pair_001.png")
    assert strip.width >= 5 * 256  # B | A | |A-B| | floor | |floor-B|
    sums = (out / "SHA256SUMS").read_text()
    assert all(name in sums for name in ("report.html", "report.md", "report.json", "pictures/pair_001.png"))
    data = json.loads((out / "report.json").read_text())
    assert {d["pair"] for d in data["deliverables"] if "pair" in d} == {"p0.png", "p1.png"}
    nofloor = tmp_path / "nofloor"
    CliRunner().invoke(cli.app, ["compare", str(folders["good"]), str(folders["ref"]), "--out", str(nofloor)])
    assert 'id="no-floor"' in (nofloor / "report.html").read_text()


def test_pictures_are_sized_from_their_header_before_decoding(tmp_path: Path) -> None:
    ok = tmp_path / "ok.png"
    Image.new("1", (2048, 2048)).save(ok)
    assert image_size(ok) == (2048, 2048) and MAX_PIXELS == 2048 * 2048
    big = tmp_path / "big.png"
    Image.new("1", (2049, 2048)).save(big)
    with pytest.raises(InputError, match="2049x2048"):
        image_size(big)


def test_two_9999_pixel_pngs_are_refused_in_under_1_gb(tmp_path: Path) -> None:
    """Issue 26 S5: two 777 KB PNGs of 9999x9999 took 22.9 GB; now one line, exit 2, peak RSS < 1 GB."""
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        Image.new("1", (9999, 9999)).save(tmp_path / side / "x.png")  # 12 KB on disk, 300 MB as RGB
    code = (PEAK_RSS_CODE + "import sys\n"
            "from difforge.errors import InputError\n"
            "from difforge.validate.compare import compare\n"
            "try:\n    compare(sys.argv[1], sys.argv[2])\n    print('judged')\n"
            "except InputError as exc:\n    print('refused:', exc)\n"
            "print('peak_mb', peak_rss_bytes() / 2**20)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a"), str(tmp_path / "b")],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert "refused:" in out and "9999x9999" in out, out
    peak = float(out.split("peak_mb")[1])
    assert peak < 1024, out


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT = Path(__file__).resolve().parents[2] / "scripts" / "screenshot_report.sh"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_the_html_report_draws_its_pictures_in_headless_chromium(folders: dict[str, Path], tmp_path: Path) -> None:
    """At 800 px the strips are visible (the test picture's red disc, the heat map's bright noise) above the table."""
    out = tmp_path / "cmp"
    compare_result = CliRunner().invoke(cli.app, ["compare", str(folders["bad"]), str(folders["ref"]), "--floor",
                                                  str(folders["floor"]), "--out", str(out)])
    assert compare_result.exit_code == 1, compare_result.output
    shot = tmp_path / "shot.png"
    subprocess.run([str(SCREENSHOT), str(out / "report.html"), str(shot), "800", "1400"], check=True, timeout=120,
                   capture_output=True)
    arr = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    red = (arr[..., 0] > 180) & (arr[..., 1] < 60) & (arr[..., 2] < 60)
    hot = (arr[..., 0] > 200) & (arr[..., 1] > 150) & (arr[..., 2] < 120)  # the heat map of a 25-level noise pair
    assert red.sum() > 200 and hot.sum() > 200, (red.sum(), hot.sum())
