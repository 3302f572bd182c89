"""Issue 26 (D1): ``validate --out`` never replaces, holds or enters what the validation reads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from difforge.cli import app
from tests.test_cli_inputs import assert_refused

runner = CliRunner()


def fake_bundle(folder: Path, fmt: str) -> dict[str, bytes]:
    """The smallest folder difforge takes for a previous bundle of its own (so ``--out`` could replace it)."""
    from dataclasses import fields

    from difforge.validate.captured import CAPTURED
    from difforge.validate.options import ValidateOptions

    defaults = {f.name: f.default for f in fields(ValidateOptions) if f.name in CAPTURED and isinstance(
        f.default, int | str | float | bool | None)}
    options = {**defaults, "device": "cpu", "dtype": "float32", "fast": [], "disable": [], "extra_seeds": []}
    folder.mkdir(parents=True)
    manifest = json.dumps({
        "format": fmt, "format_version": 1, "difforge": "0.1.0", "model": "tiny-ursa", "options": options,
        "weights": {}, "inputs": {"prompts": [], "images": [], "synthetic": True}, "dtype_plan": {},
        "device": {"label": "cpu bfloat16", "device": "cpu", "dtype": "bfloat16", "random_stream": "cpu"}}).encode()
    (folder / "manifest.json").write_bytes(manifest)
    sums = f"{hashlib.sha256(manifest).hexdigest()}  manifest.json\n".encode()
    (folder / "SHA256SUMS").write_bytes(sums)
    return {"manifest.json": manifest, "SHA256SUMS": sums}


def unchanged(folder: Path, files: dict[str, bytes]) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    for name, data in files.items():
        assert (folder / name).read_bytes() == data


@pytest.fixture(autouse=True)
def _no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge.validate import golden, runner

    for module in (runner, golden):
        monkeypatch.setattr(module, "Ladder", lambda *a, **k: pytest.fail("the run started before --out was checked"))


@pytest.mark.parametrize("sub", ["", "report", "report/deeper"])
def test_out_on_or_inside_the_golden_bundle(tmp_path: Path, sub: str) -> None:
    bundle = tmp_path / "G"
    files = fake_bundle(bundle, "difforge-golden")
    out = bundle / sub if sub else bundle
    result = runner.invoke(app, ["validate", "--model", "tiny-ursa", "--golden", str(bundle), "--out", str(out)])
    assert_refused(result, "lies inside --golden" if sub else "holds --golden")
    unchanged(bundle, files)


def test_out_on_the_golden_bundle_through_a_link(tmp_path: Path) -> None:
    bundle = tmp_path / "G"
    files = fake_bundle(bundle, "difforge-golden")
    (tmp_path / "link").symlink_to(bundle)
    result = runner.invoke(app, ["validate", "--model", "tiny-ursa", "--golden", str(bundle), "--out",
                                 str(tmp_path / "link")])
    assert_refused(result, "holds --golden")
    unchanged(bundle, files)


def test_out_on_the_capture(tmp_path: Path) -> None:
    bundle = tmp_path / "C"
    files = fake_bundle(bundle, "difforge-capture")
    result = runner.invoke(app, ["validate", "--capture", str(bundle), "--out", str(bundle)])
    assert_refused(result, "holds --capture")
    unchanged(bundle, files)


def test_out_holding_the_prompts_file(tmp_path: Path) -> None:
    """A previous report folder with the prompts file in it is refused (the report replaces the folder whole)."""
    out = tmp_path / "r"
    out.mkdir()
    prompts = out / "prompts.txt"
    prompts.write_text("a red circle\n", encoding="utf-8")
    result = runner.invoke(app, ["validate", "--model", "tiny-ursa", "--prompts", str(prompts), "--out", str(out)])
    assert_refused(result, "--out")  # check_out_dir refuses it already: a folder with files of the user
    assert prompts.read_text(encoding="utf-8") == "a red circle\n"


def test_golden_out_inside_the_model_folder(tmp_path: Path) -> None:
    import shutil

    from difforge.models.tiny import ensure_tiny

    model = tmp_path / "m"
    shutil.copytree(ensure_tiny("tiny-ursa"), model)
    result = runner.invoke(app, ["golden", "--model", str(model), "--out", str(model / "bundle")])
    assert_refused(result, "lies inside --model")
    assert not (model / "bundle").exists()


@pytest.mark.parametrize("name", ["SHA256SUMS", "report.json", "manifest.json"])
def test_a_fifo_in_out_is_not_waited_on(tmp_path: Path, name: str) -> None:
    """Recognising a previous report or bundle in --out reads its SHA256SUMS and JSON: a FIFO there hung for ever."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "r"
    out.mkdir()
    os.mkfifo(out / name)
    listed = "report.json" if name != "SHA256SUMS" else "x"
    if name != "SHA256SUMS":
        (out / "SHA256SUMS").write_text(f"{'0' * 64}  {listed}\n")
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'src'}"}
    res = subprocess.run([sys.executable, "-m", "difforge", "validate", "--model", "tiny-ursa", "--quick", "--out",
                          str(out)], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert "files difforge did not write" in res.stderr and len(res.stderr.strip().splitlines()) == 1
