"""Issue 26 (S3): a bundle's identity is a digest kept outside it, not only its own SHA256SUMS.

``difforge golden`` prints the digest (sha256 of SHA256SUMS); ``validate --golden-digest`` refuses any other
bundle, a forged one whose sums were recomputed included; without a digest the report says the identity was
not checked.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from difforge.cli import app
from difforge.validate.bundle import bundle_digest, identity_note, open_bundle
from tests.security.test_outputs_out_folder import fake_bundle
from tests.test_cli_inputs import assert_refused

runner = CliRunner()
SIZE = ["--height", "64", "--width", "64", "--quick"]
DUT = ["--model", "tiny-ursa", "--device", "cpu", "--dtype", "bfloat16", "--rounds", "1", "--warmup", "0", "--quiet",
       "--no-speed-table", *SIZE]


def forge(bundle: Path, to: Path) -> Path:
    """The attack: another reference picture, SHA256SUMS recomputed, so the bundle's own check passes."""
    shutil.copytree(bundle, to)
    image = next((to / "images").glob("reference_seed*.png"))
    Image.new("RGB", Image.open(image).size, (255, 0, 255)).save(image)
    lines = []
    for line in (to / "SHA256SUMS").read_text().splitlines():
        name = line.split("  ", 1)[1]
        lines.append(f"{hashlib.sha256((to / name).read_bytes()).hexdigest()}  {name}")
    (to / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return to


def test_golden_prints_the_bundles_digest(golden: tuple[Path, str]) -> None:
    bundle, printed = golden
    assert printed == bundle_digest(bundle) == hashlib.sha256((bundle / "SHA256SUMS").read_bytes()).hexdigest()


def test_a_forged_bundle_passes_its_own_sums_but_not_the_digest(golden: tuple[Path, str], tmp_path: Path) -> None:
    bundle, printed = golden
    forged = forge(bundle, tmp_path / "forged")
    opened = open_bundle(forged)  # self-certified: its own SHA256SUMS agree with its files
    assert opened.digest != printed and not opened.digest_checked
    assert "not checked against an external digest" in (identity_note(opened, "--golden") or "")
    with pytest.raises(Exception, match="not the bundle --golden-digest names"):
        open_bundle(forged, digest=printed)
    report = tmp_path / "r"
    result = runner.invoke(app, ["validate", *DUT, "--golden", str(forged), "--golden-digest", printed,
                                 "--out", str(report)])
    assert_refused(result, "not the bundle --golden-digest names")
    assert not report.exists()


@pytest.mark.parametrize(("args", "needle"), [
    (["--golden-digest", "abc"], "64 hex digits"),
    (["--golden-digest", "g" * 64], "64 hex digits"),
    (["--capture-digest", "0" * 64], "--capture too"),
])
def test_malformed_or_orphan_digests_are_refused(golden: tuple[Path, str], tmp_path: Path, args: list[str],
                                                 needle: str) -> None:
    bundle, _ = golden
    result = runner.invoke(app, ["validate", *DUT, "--golden", str(bundle), *args, "--out", str(tmp_path / "r")])
    assert_refused(result, needle)
    assert not (tmp_path / "r").exists()


def test_capture_digest_mismatch_is_refused(tmp_path: Path) -> None:
    capture = tmp_path / "C"
    fake_bundle(capture, "difforge-capture")
    result = runner.invoke(app, ["validate", "--capture", str(capture), "--capture-digest", "0" * 64,
                                 "--out", str(tmp_path / "r")])
    assert_refused(result, "not the bundle --capture-digest names")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow  # two whole validations against the bundle: minutes under load (make test-slow)
def test_report_says_whether_the_identity_was_checked(golden: tuple[Path, str], tmp_path: Path) -> None:
    bundle, printed = golden
    unchecked, checked = tmp_path / "unchecked", tmp_path / "checked"
    result = runner.invoke(app, ["validate", *DUT, "--golden", str(bundle), "--lang", "zh", "--out", str(unchecked)])
    assert result.exit_code == 0, result.output
    notes = json.loads((unchecked / "report.json").read_text(encoding="utf-8"))["notes"]
    assert any("not checked against an external digest (no --golden-digest)" in n and printed in n for n in notes)
    assert "未经外部核对（未给出 --golden-digest）" in (unchecked / "report.md").read_text(encoding="utf-8")
    result = runner.invoke(app, ["validate", *DUT, "--golden", str(bundle), "--golden-digest", f"sha256:{printed}",
                                 "--out", str(checked)])
    assert result.exit_code == 0, result.output
    notes = json.loads((checked / "report.json").read_text(encoding="utf-8"))["notes"]
    assert not any("external digest" in n for n in notes)
