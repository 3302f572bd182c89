"""The one reading rule: regular files only, size-capped while reading, inside the root after every link."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from difforge.errors import CheckpointError, InputError
from difforge.runtime.reading import describe_size, read_bytes, read_text, resolve_inside


def test_a_regular_file_reads_whole_up_to_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"x" * 100)
    assert read_bytes(path, limit=100, what="a.json") == b"x" * 100


def test_over_the_limit_is_refused_naming_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"x" * 2049)
    with pytest.raises(InputError, match=r"a\.json is larger than 2 KB"):
        read_bytes(path, limit=2048, what="a.json")


def test_a_fifo_is_refused_at_once_by_name_not_as_missing(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(InputError, match="is a FIFO, not a regular file") as err:
        read_bytes(fifo, limit=10, what=f"the file {fifo}")
    assert time.monotonic() - start < 5  # opening did not wait for a writer
    assert "Missing" not in str(err.value) and "does not exist" not in str(err.value)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_is_a_device_not_an_endless_read() -> None:
    with pytest.raises(InputError, match="is a character device, not a regular file"):
        read_bytes("/dev/zero", limit=10, what="/dev/zero")


def test_a_link_to_dev_zero_is_refused_the_same(tmp_path: Path) -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    link = tmp_path / "config.yaml"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="character device"):
        read_text(link, limit=10, what="config.yaml")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="no /proc")
def test_a_file_that_reports_size_zero_is_still_capped() -> None:
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(InputError, match="larger than 16 bytes"):
        read_bytes("/proc/self/status", limit=16, what="status")


def test_a_folder_and_a_socket_are_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a folder, not a regular file"):
        read_bytes(tmp_path, limit=10, what="x")
    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        with pytest.raises(InputError, match="is a socket, not a regular file"):
            read_bytes(sock_path, limit=10, what="x")


def test_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        read_bytes(tmp_path / "nope", limit=10, what="nope", error=CheckpointError)


def test_a_linked_folder_escaping_the_root_is_outside(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "model", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")
    (root / "transformer").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CheckpointError, match="outside") as err:
        read_bytes(root / "transformer" / "config.json", limit=10, what="transformer/config.json",
                   error=CheckpointError, root=root)
    assert str(elsewhere) in str(err.value)
    with pytest.raises(CheckpointError, match="outside"):
        resolve_inside(root, root / "transformer", "transformer/")


def test_a_link_that_stays_inside_is_fine(tmp_path: Path) -> None:
    root = tmp_path / "model"
    (root / "a").mkdir(parents=True)
    (root / "a" / "w.json").write_text("{}")
    (root / "b").symlink_to(root / "a", target_is_directory=True)
    (root / "c.json").symlink_to(Path("a") / "w.json")
    assert read_text(root / "b" / "w.json", limit=10, what="b/w.json", root=root) == "{}"
    assert read_text(root / "c.json", limit=10, what="c.json", root=root) == "{}"
    # the root given through a link of its own is still the same root
    alias = tmp_path / "alias"
    alias.symlink_to(root, target_is_directory=True)
    assert resolve_inside(alias, alias / "c.json", "c.json") == (root / "a" / "w.json").resolve()


def test_an_extra_root_counts_as_inside(tmp_path: Path) -> None:
    root, blobs = tmp_path / "snap", tmp_path / "blobs"
    root.mkdir()
    blobs.mkdir()
    (blobs / "h").write_text("{}")
    (root / "config.json").symlink_to(blobs / "h")
    with pytest.raises(CheckpointError, match="outside"):
        read_text(root / "config.json", limit=10, what="c", error=CheckpointError, root=root)
    assert read_text(root / "config.json", limit=10, what="c", root=root, also=[blobs.resolve()]) == "{}"


def test_a_link_loop_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(CheckpointError, match="cannot be resolved"):
        read_bytes(tmp_path / "a", limit=10, what="a", error=CheckpointError, root=tmp_path)


def test_bad_utf8_is_one_line_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_bytes(b"ok\xff\xfe")
    with pytest.raises(InputError, match=r"not UTF-8 text \(byte 2"):
        read_text(path, limit=100, what="p.txt")


def test_sizes_read_as_people_write_them() -> None:
    assert describe_size(16 << 20) == "16 MB"
    assert describe_size(1536) == "1.5 KB"
    assert describe_size(300) == "300 bytes"


def test_check_file_holds_files_a_library_opens_to_the_same_rule(tmp_path: Path) -> None:
    from difforge.runtime.reading import check_file

    root = tmp_path / "model"
    root.mkdir()
    good = root / "w.safetensors"
    good.write_bytes(b"x" * 10)
    assert check_file(good, what="w", root=root) == good.resolve()
    with pytest.raises(CheckpointError, match="larger than 8 bytes"):
        check_file(good, what="w", root=root, limit=8)
    os.mkfifo(root / "f")
    with pytest.raises(CheckpointError, match="is a FIFO"):
        check_file(root / "f", what="f", root=root)
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(b"y")
    (root / "link.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointError, match="outside"):
        check_file(root / "link.safetensors", what="link", root=root)


def test_open_file_gives_a_seekable_handle_on_the_checked_file(tmp_path: Path) -> None:
    from difforge.runtime.reading import open_file

    path = tmp_path / "a.bin"
    path.write_bytes(b"0123456789")
    with open_file(path, what="a.bin", root=tmp_path) as fh:
        fh.seek(5)
        assert fh.read() == b"56789"
    with pytest.raises(CheckpointError, match="larger than 4 bytes"):
        open_file(path, what="a.bin", limit=4)
    os.mkfifo(tmp_path / "f")
    with pytest.raises(CheckpointError, match="is a FIFO"):
        open_file(tmp_path / "f", what="f")
