"""Weight hashes are read once: the cache answers while a file is unchanged, and never after it changed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from difforge.runtime import hashes


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DIFFORGE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    reads: list[Path] = []
    real = hashes.sha256_file

    def counting(path: str | Path) -> str:
        reads.append(Path(path))
        return real(path)

    monkeypatch.setattr(hashes, "sha256_file", counting)
    return reads


def test_unchanged_file_is_hashed_once_and_a_changed_one_again(home: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "w.safetensors"
    big.write_bytes(b"a" * (hashes.MIN_CACHED_BYTES + 10))
    reads = _count_reads(monkeypatch)
    first = hashes.file_sha256(big)
    assert first == hashlib.sha256(big.read_bytes()).hexdigest()
    assert hashes.file_sha256(big) == first and len(reads) == 1  # second answer from the cache
    assert (home / hashes.CACHE_NAME).is_file()
    big.write_bytes(b"b" * (hashes.MIN_CACHED_BYTES + 10))  # same size, new content and mtime
    st = big.stat()
    os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    second = hashes.file_sha256(big)
    assert second == hashlib.sha256(big.read_bytes()).hexdigest() != first and len(reads) == 2


def test_a_damaged_or_unwritable_cache_never_changes_the_digest(home: Path, tmp_path: Path) -> None:
    big = tmp_path / "w.bin"
    big.write_bytes(b"x" * (hashes.MIN_CACHED_BYTES + 1))
    home.mkdir(parents=True)
    (home / hashes.CACHE_NAME).write_text("{not json")
    want = hashlib.sha256(big.read_bytes()).hexdigest()
    assert hashes.file_sha256(big) == want
    stale = {str(big.resolve()): {"size": 1, "mtime_ns": 1, "inode": 1, "sha256": "0"}}
    (home / hashes.CACHE_NAME).write_text(json.dumps(stale))
    assert hashes.file_sha256(big) == want  # a stale entry is not trusted
