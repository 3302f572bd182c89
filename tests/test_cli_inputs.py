"""CLI inputs from the c79b0c3 security review: paths that collide, bad numbers, bad text, bad pictures.

Each case is a user mistake, so it must end as one ``difforge: error:`` line with exit code 2 - never
exit 0 with a damaged result, never exit 1 "unexpected ..." - and must leave every file as it was.
"""

from __future__ import annotations

import os
import struct
import warnings
import zlib
from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from difforge import api
from difforge.cli import app
from difforge.config import MAX_SEED, RunConfig
from difforge.errors import InputError, out_of_memory_message

runner = CliRunner()
ORIENTATION = 0x0112  # EXIF tag; 6 means "rotate 90 degrees clockwise to display"


def _invoke(args: list[str]):
    return runner.invoke(app, args, catch_exceptions=False)


def assert_refused(result, needle: str) -> str:
    """Exit 2 and exactly one error line containing ``needle`` (case-insensitive)."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("difforge: error: "), err
    assert len(err.splitlines()) == 1, f"expected one line, got: {err!r}"
    assert "unexpected" not in err and "Traceback" not in result.stdout + result.stderr
    assert needle.lower() in err.lower(), err
    return err


@pytest.fixture
def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Refusals must come before any work: loading a model fails the test."""

    def must_not_load(*a, **k):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(api, "load_pipeline", must_not_load)


@pytest.fixture
def in_png(tmp_out: Path) -> Path:
    from difforge.demo import write_test_picture

    return write_test_picture(tmp_out / "in.png", size=64)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _png_header(path: Path, width: int, height: int) -> Path:
    """A few-hundred-byte PNG whose header claims ``width`` x ``height``: a decompression bomb's shape."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)
    return path


def _rotated_card(path: Path) -> Path:
    """64x32 as stored (left half blue, right half red) with EXIF orientation 6: 32x64 when displayed."""
    img = Image.new("RGB", (64, 32), (255, 0, 0))
    img.paste((0, 0, 255), (0, 0, 32, 32))
    exif = Image.Exif()
    exif[ORIENTATION] = 6
    img.save(path, exif=exif.tobytes(), **({"quality": 95} if path.suffix == ".jpg" else {}))
    return path


# ---- D3: outputs that would overwrite each other or an input -------------------------------------


@pytest.mark.parametrize("spelling", ["same", "dot-slash", "symlink", "hardlink"])
def test_record_on_the_output_is_refused(
    tmp_out: Path, monkeypatch: pytest.MonkeyPatch, no_load: None, spelling: str
) -> None:
    """--record naming the --output file (however spelled) would replace the image with JSON."""
    monkeypatch.chdir(tmp_out)
    Path("a.png").write_bytes(b"the user's earlier image")
    record = {"same": "a.png", "dot-slash": "./a.png", "symlink": "link.json", "hardlink": "hard.json"}[spelling]
    if spelling == "symlink":
        os.symlink("a.png", "link.json")
    if spelling == "hardlink":
        os.link("a.png", "hard.json")
    before = _snapshot(tmp_out)
    r = _invoke(["generate", "--prompt", "x", "--output", "a.png", "--record", record])
    assert_refused(r, "same file as --output")
    assert _snapshot(tmp_out) == before
    assert Path("link.json").is_symlink() or spelling != "symlink"


@pytest.mark.parametrize("flag", ["--output", "--record"])
def test_output_or_record_on_an_input_image_is_refused(
    tmp_out: Path, in_png: Path, monkeypatch: pytest.MonkeyPatch, no_load: None, flag: str
) -> None:
    """Writing over the --image would destroy the user's original picture."""
    monkeypatch.chdir(tmp_out)
    before = _snapshot(tmp_out)
    other = {"--output": ["--record", "r.json"], "--record": ["--output", "o.png"]}[flag]
    r = _invoke(["edit", "--image", "in.png", "--prompt", "x", flag, "./in.png", *other])
    assert_refused(r, "is the input image")
    assert _snapshot(tmp_out) == before


# ---- D8 / D9: numbers no run can use ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--guidance", "nan"], "--guidance must be a number from 0 to 100"),
        (["--guidance", "inf"], "--guidance must be a number"),
        (["--guidance", "-inf"], "--guidance must be a number"),
        (["--guidance", "1e300"], "--guidance must be a number"),
        (["--guidance-trunc", "2"], "--guidance-trunc must be a number from 0 to 1"),
        (["--guidance-trunc", "-0.5"], "--guidance-trunc"),
        (["--guidance-trunc", "nan"], "--guidance-trunc"),
        (["--seed", str(2**63)], "--seed must be a whole number from 0 to 9223372036854775807"),
        (["--seed", str(2**64)], "--seed must be a whole number"),
        (["--seed", "-1"], "--seed must be a whole number"),
    ],
)
def test_generate_bad_numbers_are_named_errors(tmp_out: Path, no_load: None, args: list[str], needle: str) -> None:
    r = _invoke(["generate", "--prompt", "x", *args, "--output", str(tmp_out / "a.png")])
    assert_refused(r, needle)
    assert list(tmp_out.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--true-cfg", "nan"], "--true-cfg must be a number from 0 to 100"),
        (["--true-cfg", "inf"], "--true-cfg must be a number"),
        (["--seed", "-1"], "--seed must be a whole number"),
        (["--seed", str(2**63)], "--seed must be a whole number"),
    ],
)
def test_edit_bad_numbers_are_named_errors(
    tmp_out: Path, in_png: Path, no_load: None, args: list[str], needle: str
) -> None:
    r = _invoke(["edit", "--image", str(in_png), "--prompt", "x", *args, "--output", str(tmp_out / "a.png")])
    assert_refused(r, needle)
    assert [p.name for p in tmp_out.iterdir()] == ["in.png"]


def test_every_runconfig_checks_its_numbers() -> None:
    """The rule lives in RunConfig itself, so the validate runner and the diffusers-style calls get it too."""
    assert RunConfig(model="x", seed=MAX_SEED, guidance=100, guidance_trunc=1.0, true_cfg=0).seed == MAX_SEED
    for bad in (dict(seed=True), dict(seed=1.5), dict(guidance="7"), dict(true_cfg=float("nan")), dict(steps=1)):
        with pytest.raises(InputError):
            RunConfig(model="x", **bad)


def test_diffusers_style_calls_check_their_numbers(tiny_pipe) -> None:
    with pytest.raises(InputError, match="--guidance"):
        tiny_pipe(prompt="x", height=64, width=64, num_inference_steps=2, guidance_scale=float("nan"))


# ---- D8: prompts that are not UTF-8 text ----------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "edit"])
def test_non_utf8_prompt_is_a_named_error(tmp_out: Path, in_png: Path, no_load: None, command: str) -> None:
    """Python turns non-UTF-8 argv bytes into lone surrogates; tokenizers then raised a bare TypeError."""
    images = ["--image", str(in_png)] if command == "edit" else []
    r = _invoke([command, *images, "--prompt", "a\udcffb", "--output", str(tmp_out / "a.png")])
    assert_refused(r, "not valid UTF-8")
    r = _invoke([command, *images, "--prompt", "x", "--negative-prompt", "\udc80", "--output", str(tmp_out / "a.png")])
    assert_refused(r, "negative prompt is not valid UTF-8")
    assert [p.name for p in tmp_out.iterdir()] == ["in.png"]


def test_bytes_prompt_via_the_api_is_a_named_error(tiny_pipe) -> None:
    with pytest.raises(InputError, match="must be text"):
        api.generate(b"a red cat", steps=2, height=64, width=64)
    with pytest.raises(InputError, match="must be text .str., got bytes"):  # the diffusers-style URSA call
        tiny_pipe(prompt=b"a red cat", height=64, width=64, num_inference_steps=2)
    with pytest.raises(InputError, match="not valid UTF-8"):
        tiny_pipe.tokenizer.encode(["fine", "a\udcffb"])


# ---- D10: reference images that are too thin or too large; OOM on a CPU ----------------------------


@pytest.mark.parametrize(
    ("model", "size_args"),
    [("tiny-qwen-edit", []), ("tiny-qwen-edit", ["--height", "64", "--width", "64"]), ("tiny-qwen-edit-plus", [])],
)
def test_extreme_aspect_reference_names_the_image(tmp_out: Path, in_png: Path, model: str, size_args: list[str]) -> None:
    """8x2000 used to give "got 1504x0" for flags never given, or an unexpected ValueError."""
    Image.new("RGB", (8, 2000), (200, 30, 30)).save(tmp_out / "thin.png")
    images = ["--image", str(tmp_out / "thin.png")] + (["--image", str(in_png)] if model.endswith("plus") else [])
    r = _invoke(["edit", *images, "--prompt", "x", "--model", model, "--steps", "2", *size_args,
                 "--output", str(tmp_out / "a.png")])
    err = assert_refused(r, "is 8x2000 pixels, an aspect ratio of about 1:250")
    assert "got" not in err and "crop or pad" in err
    assert sorted(p.name for p in tmp_out.iterdir()) == ["in.png", "thin.png"]


@pytest.mark.parametrize(("side", "shown"), [(12000, "144,000,000 pixels (12000x12000)"), (16000, "256,000,000 pixels")])
def test_huge_image_is_too_large_not_not_an_image(tmp_out: Path, no_load: None, side: int, shown: str) -> None:
    """Refused from the header with its pixel count and the limit; PIL's bomb warning never reaches the user."""
    big = _png_header(tmp_out / "big.png", side, side)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = _invoke(["edit", "--image", str(big), "--prompt", "x", "--output", str(tmp_out / "a.png")])
    err = assert_refused(r, f"is too large: {shown}")
    assert "more than the 100,000,000" in err
    assert not [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]
    assert [p.name for p in tmp_out.iterdir()] == ["big.png"]


def test_bomb_warning_below_the_limit_is_silenced(tmp_out: Path, in_png: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between PIL's warning and error thresholds an image loads, without PIL's two-line warning."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)  # 64x64 = 4096: PIL warns (> 3000), errors only > 6000
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (img,) = api.load_images([in_png])
    assert img.size == (64, 64)
    assert not [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]


@pytest.mark.parametrize("family", ["ursa", "qwen-edit", "qwen-edit-plus"])
@pytest.mark.parametrize("plan", ["none", "before-decode", "model", "sequential"])
def test_oom_on_cpu_does_not_suggest_offloading(family: str, plan: str) -> None:
    msg = out_of_memory_message("cpu", plan, family)
    assert "--offload" not in msg and "cannot help on the CPU" in msg
    assert "reduce --height/--width" in msg and "--dtype bfloat16" in msg
    assert ("--vae-tiling" in msg) == (family != "ursa")
    assert "--offload model" in out_of_memory_message("cuda:0", "before-decode", family)  # accelerators unchanged


def test_oom_on_cpu_through_the_cli(tmp_out: Path, in_png: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge.models.qwen_edit import QwenEditPipeline

    def boom(self, *a, **k):
        raise torch.OutOfMemoryError("CPU out of memory")

    monkeypatch.setattr(QwenEditPipeline, "__call__", boom)
    r = _invoke(["edit", "--image", str(in_png), "--prompt", "x", "--device", "cpu", "--output", str(tmp_out / "a.png")])
    err = assert_refused(r, "cpu ran out of memory")
    assert "--offload" not in err and "--vae-tiling" in err
    assert [p.name for p in tmp_out.iterdir()] == ["in.png"]


# ---- D11: EXIF orientation ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_exif_orientation_is_applied_when_loading(tmp_path: Path, suffix: str) -> None:
    """Orientation 6: the stored 64x32 (blue left) is shown 32x64 with blue on top, and edited that way."""
    from difforge.models.qwen_edit.pipeline import _open_images

    path = _rotated_card(tmp_path / f"card{suffix}")
    (img,) = api.load_images([path])
    (again,) = _open_images(RunConfig(model="x", images=[str(path)]), plus=False)  # validate's path
    for im in (img, again):
        assert im.size == (32, 64)
        top, bottom = im.getpixel((16, 8)), im.getpixel((16, 56))
        assert top[2] > 200 and top[0] < 50, top  # blue
        assert bottom[0] > 200 and bottom[2] < 50, bottom  # red


def test_edit_of_a_rotated_photo_is_upright(tmp_out: Path) -> None:
    """The default output size follows the displayed (portrait) aspect, not the stored landscape one."""
    path = _rotated_card(tmp_out / "photo.jpg")
    r = _invoke(["edit", "--image", str(path), "--prompt", "x", "--steps", "2", "--device", "cpu", "-q",
                 "--output", str(tmp_out / "a.png")])
    assert r.exit_code == 0, r.stderr
    with Image.open(tmp_out / "a.png") as out:
        assert out.height > out.width, out.size


@pytest.fixture(scope="module")
def tiny_pipe():
    """The built-in tiny URSA on the CPU, loaded once for the diffusers-style and tokenizer checks."""
    return api.load_pipeline("tiny-ursa", device="cpu", dtype="float32", task="generate")
