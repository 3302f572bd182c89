"""Python API: saving outputs atomically with their hashes, decoding inputs, option checking."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from difforge import api
from difforge.errors import InputError, OutputError, StepsError
from difforge.runtime.record import RunRecord


def _frames(n: int) -> list[Image.Image]:
    return [Image.fromarray(np.full((32, 48, 3), 20 * i, dtype=np.uint8)) for i in range(n)]


def test_save_single_image_records_sha256(tmp_path: Path) -> None:
    rec = RunRecord(kind="generate")
    paths = api.save_images(_frames(1), tmp_path / "a.png", rec)
    assert paths == [tmp_path / "a.png"]
    assert rec.outputs[0]["sha256"] == hashlib.sha256((tmp_path / "a.png").read_bytes()).hexdigest()
    assert "save" in rec.phases
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]  # no temp file left


@pytest.mark.parametrize("suffix", [".gif", ".webp", ".mp4"])
def test_save_video_formats(tmp_path: Path, suffix: str) -> None:
    if suffix == ".mp4":
        pytest.importorskip("imageio_ffmpeg")
    rec = RunRecord(kind="generate")
    (path,) = api.save_images(_frames(5), tmp_path / f"v{suffix}", rec)
    assert path.stat().st_size > 0
    if suffix != ".mp4":
        with Image.open(path) as im:
            assert getattr(im, "n_frames", 1) == 5
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_frames_to_numbered_pngs(tmp_path: Path) -> None:
    rec = RunRecord(kind="generate")
    paths = api.save_images(_frames(3), tmp_path / "f.png", rec)
    assert [p.name for p in paths] == ["f_000.png", "f_001.png", "f_002.png"]
    assert len(rec.outputs) == 3


def test_unsupported_output_suffix_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="Cannot write"):
        api.save_images(_frames(1), tmp_path / "a.txt", RunRecord(kind="generate"))
    assert list(tmp_path.iterdir()) == []


def test_failed_writer_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_save(self, fp, *a, **k):
        Path(fp).write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", broken_save)
    with pytest.raises(OutputError, match="disk full"):
        api.save_images(_frames(1), tmp_path / "a.png", RunRecord(kind="generate"))
    assert list(tmp_path.iterdir()) == []


def test_load_images_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        api.load_images([tmp_path / "missing.png"])
    (tmp_path / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(InputError, match="not an image"):
        api.load_images([tmp_path / "x.png"])
    _frames(1)[0].convert("L").save(tmp_path / "g.png")
    (img,) = api.load_images([tmp_path / "g.png"])
    assert img.mode == "RGB"


def test_config_checks() -> None:
    with pytest.raises(InputError, match="Unknown option"):
        api.generate("x", colour="red")
    with pytest.raises(StepsError):
        api.generate("x", steps=1)


def test_generate_api_returns_images_and_record(tmp_path: Path) -> None:
    res = api.generate("a red circle", seed=3, height=64, width=64, steps=4, quiet=True,
                       output=str(tmp_path / "a.png"), record=str(tmp_path / "a.json"))
    assert res.image.size == (64, 64)
    loaded = RunRecord.load(tmp_path / "a.json")
    assert loaded.config["seed"] == 3 and loaded.kind == "generate"
    assert len(loaded.step_times_s) == 4
    assert loaded.environment["packages"]["torch"]
    assert any(a.what == "attention" for a in loaded.adaptations)


def test_difforge_validate_stays_the_api_function_after_the_package_is_imported() -> None:
    """Importing ``difforge.validate`` (the API function does it) binds the subpackage on ``difforge``:
    the name must stay callable as documented, and the package's contents reachable."""
    import difforge
    import difforge.validate
    from difforge.errors import InputError

    assert difforge.validate.ValidateOptions is not None
    for _ in range(2):  # a second call used to hit the module object: "'module' object is not callable"
        with pytest.raises(InputError, match="--lang"):
            difforge.validate(model="tiny-ursa", device="cpu", out="unused", lang="xx")
