"""Issue 26 (W8, D2): every output path is checked before the run, and only difforge's own files are replaced.

W8: ``--record`` / ``--perf-dump`` / ``--out`` where nothing can be created: exit 2 before ``--output`` is
touched (root passes ``os.access`` on /proc, so the check creates a file there for real).
D2: a FIFO, a device node or a link at an output path is refused; a regular file of the user's needs
``--overwrite``; a previous difforge output (marked picture, RunRecord, perf dump) is replaced as before.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from difforge import api
from difforge.cli import app
from difforge.runtime.outputs import SOFTWARE, is_difforge_json, is_difforge_picture, save_options
from tests.test_cli_inputs import assert_refused

runner = CliRunner()
RUN = ["--model", "tiny-ursa", "-p", "a red circle", "--steps", "2", "--height", "64", "--width", "64", "--device", "cpu", "--quiet"]


@pytest.fixture
def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "load_pipeline", lambda *a, **k: pytest.fail("the model loaded before the outputs "
                                                                         "were checked"))


@pytest.fixture
def unwritable(tmp_path: Path) -> Path:
    """A folder nothing can be created in, whatever the mode bits say to root."""
    if os.geteuid() == 0:
        if not Path("/proc/self").is_dir():
            pytest.skip("no /proc here")
        return Path("/proc/difforge-no-such-folder")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return folder


def test_unwritable_record_or_perf_dump_leaves_the_output_untouched(tmp_path: Path, unwritable: Path,
                                                                     no_load: None) -> None:
    out = tmp_path / "out.png"
    Image.new("RGB", (8, 8), (1, 2, 3)).save(out, **save_options("PNG"))  # a previous difforge output
    before = out.read_bytes()
    for flag in ("--record", "--perf-dump"):
        result = runner.invoke(app, ["generate", *RUN, "-o", str(out), flag, str(unwritable / "run.json")])
        assert_refused(result, f"Cannot write {flag}")
        assert out.read_bytes() == before


def test_unwritable_out_folder_is_refused_before_validate_loads(unwritable: Path, monkeypatch: pytest.MonkeyPatch):
    from difforge.validate import runner as validate_runner

    monkeypatch.setattr(validate_runner, "Ladder", lambda *a, **k: pytest.fail("the run started before --out was "
                                                                               "checked"))
    for command in ("validate", "golden", "capture"):
        result = runner.invoke(app, [command, "--model", "tiny-ursa", "--quick", "--out", str(unwritable / "r")])
        assert_refused(result, "Cannot write --out")


def test_fifo_link_and_device_are_never_replaced(tmp_path: Path, no_load: None) -> None:
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"the user's own picture")
    link = tmp_path / "link.png"
    link.symlink_to(mine)
    cases = [(fifo, "a FIFO"), (link, "a symbolic link")]
    if os.geteuid() == 0:  # a device node of our own (never /dev/null itself: a regression would replace it)
        device = tmp_path / "null.png"
        os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        cases.append((device, "a character device"))
    for path, what in cases:
        for flag, extra in (("--output", []), ("--record", ["-o", str(tmp_path / "x.png")])):
            target = ["-o", str(path)] if flag == "--output" else [*extra, "--record", str(path)]
            result = runner.invoke(app, ["generate", *RUN, *target, "--overwrite"])
            assert_refused(result, f"{flag} {path} is {what}")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()
    assert mine.read_bytes() == b"the user's own picture"
    assert not (tmp_path / "x.png").exists()


def test_a_users_file_needs_overwrite_and_a_previous_output_does_not(tmp_path: Path) -> None:
    out, record = tmp_path / "out.png", tmp_path / "run.json"
    out.write_bytes(b"not difforge's")
    record.write_text('{"my": "notes"}')
    result = runner.invoke(app, ["generate", *RUN, "-o", str(out)])
    assert_refused(result, "did not write; pass --overwrite")
    result = runner.invoke(app, ["generate", *RUN, "-o", str(tmp_path / "new.png"), "--record", str(record)])
    assert_refused(result, "did not write; pass --overwrite")
    assert out.read_bytes() == b"not difforge's" and record.read_text() == '{"my": "notes"}'
    assert not (tmp_path / "new.png").exists()

    result = runner.invoke(app, ["generate", *RUN, "-o", str(out), "--record", str(record), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert is_difforge_picture(out) and is_difforge_json(record)
    with Image.open(out) as im:
        assert im.getexif().get(0x0131) == SOFTWARE
    first = json.loads(record.read_text())["outputs"][0]["sha256"]
    result = runner.invoke(app, ["generate", *RUN[:-1], "--seed", "1", "--quiet", "-o", str(out), "--record",
                                 str(record)])  # difforge's own files: replaced without --overwrite
    assert result.exit_code == 0, result.output
    assert json.loads(record.read_text())["outputs"][0]["sha256"] != first


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "TIFF", "GIF"])
def test_every_picture_format_carries_the_mark(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"a.{fmt.lower()}"
    Image.new("RGB", (8, 8)).save(path, format=fmt, **save_options(fmt))
    assert is_difforge_picture(path)
    Image.new("RGB", (8, 8)).save(path, format=fmt)  # the same picture, not saved by difforge
    assert not is_difforge_picture(path)


def test_each_frame_file_of_a_video_run_is_checked(tmp_path: Path, no_load: None) -> None:
    """``--num-frames 3 -o out.png`` writes out_000.png ... out_002.png: each is checked like --output."""
    (tmp_path / "out_001.png").write_bytes(b"the user's")
    result = runner.invoke(app, ["generate", "--model", "tiny-ursa-video", *RUN[2:], "--num-frames", "3",
                                 "-o", str(tmp_path / "out.png")])
    assert_refused(result, f"--output {tmp_path / 'out_001.png'} is a file difforge did not write")
    assert (tmp_path / "out_001.png").read_bytes() == b"the user's"
