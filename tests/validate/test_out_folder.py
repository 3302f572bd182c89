"""``validate --out DIR``: the report appears whole or not at all, and never over a user's own files.

The report is built in a hidden sibling of DIR and renamed into place when complete; a failure or
an interrupt removes it and every parent folder the run made.  An existing DIR must be empty or a
previous difforge report (replaced whole); anything else is refused with exit 2 before any work.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from difforge.cli import app
from difforge.errors import DifforgeError, OutputError, SizeError
from difforge.validate import ValidateOptions, Verdict, runner
from difforge.validate.outdir import is_report_folder

from .ladder_run import run_validation

TINY = {"steps": 2, "height": 32, "width": 32}


def _opts(out: Path, model: str = "tiny-ursa", **kw: Any) -> ValidateOptions:
    base: dict[str, Any] = {"device": "cpu", "dtype": "bfloat16", "quick": True, "quiet": True, "rounds": 1,
                            "warmup": 0, "speed_table": False, **TINY}
    return ValidateOptions(model=model, out=out, **{**base, **kw})


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones included) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _everything(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _interrupt(*args: Any, **kwargs: Any) -> None:
    raise KeyboardInterrupt  # what Ctrl-C (or SIGTERM, through the CLI's handler) raises


# ---- D7: a failed or interrupted run leaves nothing --------------------------------------------------------
def test_ctrl_c_after_images_were_saved_leaves_no_folder_at_all(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner._Climb, "gallery", _interrupt)  # by then device/reference images are saved
    with pytest.raises(KeyboardInterrupt):
        run_validation(_opts(tmp_path / "a" / "b"))
    assert _everything(tmp_path) == []  # no a/b/images/..., no hidden staging folder, no empty a/


def test_a_crash_while_writing_the_report_leaves_no_half_report(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import difforge.report

    real = difforge.report.write_report

    def half(result: Any, out: Path, **kw: Any) -> Any:
        (Path(out) / "report.json").write_text("{}")
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr(difforge.report, "write_report", half)
    with pytest.raises(RuntimeError, match="renderer crashed"):
        run_validation(_opts(tmp_path / "r"))
    assert _everything(tmp_path) == []
    monkeypatch.setattr(difforge.report, "write_report", real)


def test_a_late_user_error_removes_the_parents_the_run_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def late(*args: Any, **kwargs: Any) -> None:
        raise SizeError("num_frames must be 1 plus a multiple of 4 for this model, got 2.")

    monkeypatch.setattr(runner.Ladder, "run", late)
    (tmp_path / "keep").mkdir()
    with pytest.raises(SizeError):
        run_validation(_opts(tmp_path / "keep" / "a" / "b", model="tiny-qwen-edit"))
    assert _everything(tmp_path) == ["keep"]  # a/ and a/b/ are gone, the folder that was there stays


# ---- D12: never over a user's files; a previous report is replaced whole ----------------------------------
@pytest.mark.parametrize("user_files", [{"report.md": "my notes"}, {"images/device_seed0.png": "my picture"},
                                        {"todo.txt": "keep"}])
def test_a_folder_with_user_files_is_refused_before_anything_runs(tmp_path: Path, user_files: dict[str, str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "mine"
    for name, text in user_files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = _tree(tmp_path)
    def must_not_load(*args: Any, **kwargs: Any) -> None:
        raise DifforgeError("refused too late: a model was loaded")

    monkeypatch.setattr(runner.Ladder, "load", must_not_load)
    with pytest.raises(OutputError, match="files difforge did not write"):
        run_validation(_opts(out))
    r = CliRunner().invoke(app, ["validate", "--out", str(out), "--device", "cpu", "--quick", "-q"])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [f"difforge: error: --out {out} is a folder with files difforge did "
                                             "not write; give a new or empty folder (a previous difforge report "
                                             "folder is replaced as a whole)."]
    assert _tree(tmp_path) == before


def test_a_previous_report_is_replaced_whole_and_survives_a_failed_rerun(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r"
    out.mkdir()  # an empty folder is fine
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\na blue square\n")
    first = run_validation(_opts(out, quick=False, prompts=str(prompts)))
    assert (out / "images" / "gallery_1_device.png").is_file() and is_report_folder(out)

    second = run_validation(_opts(out))  # one prompt: the old gallery_1 files must not linger
    assert second.verdict is not Verdict.FAIL, second.rung_verdicts()
    assert not (out / "images" / "gallery_1_device.png").exists()
    assert _everything(tmp_path) == sorted(["prompts.txt", "r", *(f"r/{p}" for p in _everything(out))])
    assert all(p.parent == out for p in second.report_paths.values())  # the final paths, not the staging ones
    for line in (out / "SHA256SUMS").read_text().splitlines():  # the listing matches the folder exactly
        digest, name = line.split("  ")
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    assert first.report_paths["json"] == second.report_paths["json"]

    kept, listing = _tree(out), _everything(tmp_path)
    monkeypatch.setattr(runner._Climb, "gallery", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_validation(_opts(out))
    assert _tree(out) == kept and _everything(tmp_path) == listing  # the old report, byte for byte, and no leftovers


def test_what_counts_as_a_previous_report(tmp_path: Path) -> None:
    out = tmp_path / "r"
    run_validation(_opts(out, model="tiny-qwen-edit"))
    assert is_report_folder(out)
    data = json.loads((out / "report.json").read_text())
    synthetic = data["dut_record"]["config"]["images"]
    assert synthetic == [str(out / "images" / "input_synthetic.png")]  # where it is now, not the staging folder
    (out / "notes.txt").write_text("mine")
    assert not is_report_folder(out)  # one file difforge did not list: the folder is the user's
    (out / "notes.txt").unlink()
    (out / "report.json").write_text(json.dumps({**data, "verdict": "PASS?"}))
    assert not is_report_folder(out)  # report.json no longer matches SHA256SUMS
    (out / "report.json").unlink()
    assert not is_report_folder(out)
    assert not is_report_folder(tmp_path)


def test_user_pictures_are_copied_byte_for_byte_into_the_deliverables(tmp_path: Path) -> None:
    from difforge.runtime.images import test_picture
    from difforge.validate import ValidateOptions
    from difforge.validate.ladder import Ladder

    src = tmp_path / "in.JPG"
    test_picture(64).save(src, format="JPEG", quality=90)
    lad = Ladder(ValidateOptions(model="tiny-qwen-edit", out=tmp_path / "r", device="cpu", dtype="bfloat16",
                                 images=[str(src)], quiet=True))
    lad.prepare_inputs()
    lad.make_out_dir()
    try:
        lad.save_inputs()
        copied = lad.work / "images" / "input_0.jpg"
        assert copied.read_bytes() == src.read_bytes() and copied in lad.files
    finally:
        lad.discard_output()
