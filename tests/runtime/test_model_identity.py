"""A model folder's identity (the hashes that decide "made from other weights") follows links and hidden paths."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from difforge.runtime.hashes import model_file_hashes
from difforge.validate.bundle import first_difference, weight_hashes


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFORGE_HOME", str(tmp_path / "home"))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_component_folder_behind_a_link_is_hashed_and_a_swap_shows(tmp_path: Path) -> None:
    model, a, b = tmp_path / "m", tmp_path / "a", tmp_path / "b"
    for folder, data in ((a, b"weights A"), (b, b"weights B")):
        folder.mkdir()
        (folder / "w.safetensors").write_bytes(data)
    model.mkdir()
    (model / "model_index.json").write_text("{}")
    (model / "transformer").symlink_to(a, target_is_directory=True)
    before = model_file_hashes(model)
    assert before["transformer/w.safetensors"] == _sha(b"weights A")
    (model / "transformer").unlink()
    (model / "transformer").symlink_to(b, target_is_directory=True)
    after = model_file_hashes(model)
    assert after["transformer/w.safetensors"] == _sha(b"weights B")
    assert first_difference(before, after) == "transformer/w.safetensors differs"


def test_hidden_shards_count_and_bookkeeping_does_not(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / ".h").mkdir(parents=True)
    (model / ".h" / "w.safetensors").write_bytes(b"hidden shard")
    (model / ".git").mkdir()
    (model / ".git" / "FETCH_HEAD").write_text("differs per clone")
    meta = model / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "w.safetensors.metadata").write_text("timestamp 1")
    (meta / "w.safetensors").write_bytes(b"a shard hidden in bookkeeping")
    (model / "transformer").mkdir()
    (model / "transformer" / "x.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "../.cache/huggingface/download/w.safetensors", "b": 3}}))
    hashes = model_file_hashes(model)
    assert hashes[".h/w.safetensors"] == _sha(b"hidden shard")
    assert ".git/FETCH_HEAD" not in hashes
    assert ".cache/huggingface/download/w.safetensors.metadata" not in hashes
    # bookkeeping a shard index names is weights, whatever the folder
    assert hashes[".cache/huggingface/download/w.safetensors"] == _sha(b"a shard hidden in bookkeeping")


def test_loops_fifos_and_dangling_links_end(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "sub").mkdir(parents=True)
    (model / "sub" / "f.json").write_text("{}")
    (model / "sub" / "loop").symlink_to(model, target_is_directory=True)
    (model / "dangling").symlink_to(tmp_path / "nothing")
    os.mkfifo(model / "pipe")
    hashes = model_file_hashes(model)
    assert list(hashes) == ["sub/f.json"]


def test_weight_hashes_use_the_identity_rule(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / ".h").mkdir(parents=True)
    (model / ".h" / "w.safetensors").write_bytes(b"x")
    assert weight_hashes(model) == {".h/w.safetensors": _sha(b"x")}
    assert "has no file .h/w.safetensors" in str(first_difference(weight_hashes(model), {}))


def test_a_folder_reached_twice_counts_under_both_paths(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "store" / "a").mkdir(parents=True)
    (model / "store" / "a" / "w.safetensors").write_bytes(b"w")
    (model / "transformer").symlink_to(Path("store") / "a", target_is_directory=True)
    assert set(model_file_hashes(model)) == {"store/a/w.safetensors", "transformer/w.safetensors"}


def test_paths_multiplied_by_links_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each level links twice to the next: 2^n paths from n folders, refused past the bound, not walked for hours."""
    from difforge.errors import CheckpointError
    from difforge.runtime import hashes

    monkeypatch.setattr(hashes, "MAX_ENTRIES", 1000)
    model = tmp_path / "m"
    levels = [model / f"l{i}" for i in range(12)]
    for level in levels:
        level.mkdir(parents=True)
    for here, below in zip(levels, levels[1:], strict=False):
        for name in ("x", "y"):
            (here / name).symlink_to(below, target_is_directory=True)
    with pytest.raises(CheckpointError, match="more than 1000 entries"):
        model_file_hashes(model)


def test_file_sha256_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    from difforge.errors import InputError
    from difforge.runtime.hashes import file_sha256

    os.mkfifo(tmp_path / "f")
    with pytest.raises(InputError, match="is a FIFO, not a regular file"):
        file_sha256(tmp_path / "f")
    if Path("/dev/zero").exists():
        with pytest.raises(InputError, match="character device"):
            file_sha256("/dev/zero")
