"""Issue 26 S5/S6: scan reads regular files only, size-capped, and prints no raw control characters."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from difforge.cli import app
from difforge.errors import InputError
from difforge.scan import render_markdown, scan, summary_line
from difforge.scan.follow import read_source
from difforge.scan.result import printable

runner = CliRunner()


def _scan_within(path: Path, seconds: float = 20.0):
    """Scan on a thread; a scan that blocks (a FIFO) or reads forever (/dev/zero) fails the test, not hangs it."""
    box: dict = {}
    worker = threading.Thread(target=lambda: box.setdefault("r", scan(path, "npu", jobs=1)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"scan of {path} did not finish in {seconds} s"
    return box["r"]


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="needs FIFOs and /dev/zero")
def test_a_link_to_dev_zero_and_a_fifo_are_skipped_not_read(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text("def f(t):\n    return t.cuda()\n", encoding="utf-8")
    (tmp_path / "zero.py").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "pipe.py")
    result = _scan_within(tmp_path)
    reasons = {s.path: s.reason for s in result.skipped}
    assert reasons == {f"{tmp_path.name}/pipe.py": "the file is a FIFO, not a regular file",
                       f"{tmp_path.name}/zero.py": "the file is a character device, not a regular file"}
    assert [f.rule for f in result.findings] == ["DF102"]
    # Named directly, neither is a file to scan: one line, exit 2.
    for name in ("zero.py", "pipe.py"):
        r = runner.invoke(app, ["scan", str(tmp_path / name)])
        assert r.exit_code == 2 and "neither a regular file nor a folder" in r.stderr, r.output


def test_read_source_caps_the_size_and_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * 2049)
    assert read_source(big, limit=2049) == b"#" * 2049
    with pytest.raises(InputError, match="larger than"):
        read_source(big, limit=2048)
    with pytest.raises(InputError, match="a folder, not a regular file"):
        read_source(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        read_source(tmp_path / "missing.py")


ESC = "\x1b[2J\x1b[31m"


def _evil(tmp_path: Path) -> Path:
    folder = tmp_path / f"dir{ESC}"
    folder.mkdir()
    path = folder / f"model{ESC}\u202e.py"
    path.write_text("def f(t):\n    return t.cuda()\n", encoding="utf-8")
    (folder / f"broken{ESC}.py").write_bytes(b"\xff\xfe not utf-8")
    return folder


def test_printable_writes_controls_as_escapes_and_keeps_text() -> None:
    assert printable("a\x1b[2Jb\n\t\u202ec \u00e9\u4e2d") == "a\\x1b[2Jb\\n\\t\\u202ec \u00e9\u4e2d"
    assert printable("\udcff") == "\\udcff"  # an undecodable byte of a file name (surrogateescape)


def test_scan_prints_no_raw_control_character_in_the_table_markdown_or_json(tmp_path: Path) -> None:
    folder = _evil(tmp_path)
    r = runner.invoke(app, ["scan", str(folder)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout
    assert "\\x1b[2J" in r.stdout and "DF102" in r.stdout and "skipped" in r.stdout
    result = scan(folder, "npu", jobs=1)
    for text in (render_markdown(result), summary_line(result)):
        assert "\x1b" not in text and "\u202e" not in text
    assert "\\x1b[2J" in render_markdown(result)
    js = runner.invoke(app, ["scan", str(folder), "--json"], catch_exceptions=False).stdout
    assert "\x1b" not in js and json.loads(js)["findings"][0]["path"].startswith(folder.name)
    missing = runner.invoke(app, ["scan", str(tmp_path / f"nope{ESC}")])
    assert missing.exit_code == 2 and "\x1b" not in missing.stderr and "\\x1b" in missing.stderr
