"""atomic_path and friends: a failed write never leaves a file, a good one appears whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from difforge.errors import OutputError
from difforge.runtime.atomic import atomic_path, atomic_save, atomic_write_bytes, atomic_write_text


def test_success_renames_into_place(tmp_path: Path) -> None:
    final = tmp_path / "sub" / "image.png"
    with atomic_path(final) as tmp:
        assert tmp.parent == final.parent
        assert tmp != final
        assert not final.exists()  # nothing visible until the block succeeds
        tmp.write_bytes(b"data")
    assert final.read_bytes() == b"data"
    assert sorted(p.name for p in final.parent.iterdir()) == ["image.png"]


def test_failure_leaves_no_file(tmp_path: Path) -> None:
    final = tmp_path / "report.html"
    with pytest.raises(ValueError), atomic_path(final) as tmp:
        tmp.write_text("half written")
        raise ValueError("renderer crashed")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []


def test_failure_keeps_the_previous_file(tmp_path: Path) -> None:
    final = tmp_path / "record.json"
    final.write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_path(final) as tmp:
        tmp.write_text("new but interrupted")
        raise KeyboardInterrupt
    assert final.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_success_replaces_existing(tmp_path: Path) -> None:
    final = tmp_path / "out.txt"
    final.write_text("old")
    atomic_write_text(final, "new")
    assert final.read_text() == "new"
    atomic_write_bytes(final, b"\x00\x01")
    assert final.read_bytes() == b"\x00\x01"


def test_atomic_save_with_writer(tmp_path: Path) -> None:
    final = tmp_path / "x.bin"
    assert atomic_save(final, lambda p: p.write_bytes(b"ok")) == final
    assert final.read_bytes() == b"ok"

    def failing(p: Path) -> None:
        p.write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OutputError, match="disk full"):  # one user-facing sentence, not a raw OSError
        atomic_save(tmp_path / "y.bin", failing)
    assert not (tmp_path / "y.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin"]
