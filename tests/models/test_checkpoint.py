"""check_safetensors_header: what a header declares, and one named sentence for every broken file.

The parsing is safetensors' own (``safe_open``); these cases pin that each corruption it refuses
reaches the user as a CheckpointError naming the file, and that the data is never read.
"""

from __future__ import annotations

import json
import resource
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from difforge.errors import CheckpointError
from difforge.models.checkpoint import check_safetensors_header, load_safetensors, safetensors_keys

F32 = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
BF16 = {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}
DATA = bytes(22)


def raw(header: dict | list | str | bytes, data: bytes = DATA) -> bytes:
    """A file: the 8-byte little-endian header length, the header, the data."""
    if isinstance(header, dict | list):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header)) + header + data


def refused(path: Path, *words: str) -> str:
    with pytest.raises(CheckpointError) as err:
        check_safetensors_header(path)
    text = str(err.value)
    assert str(path) in text and "\n" not in text, text
    for word in words:
        assert word in text, (word, text)
    return text


def test_dtypes_and_shapes_from_the_header(tmp_path: Path) -> None:
    path = tmp_path / "ok.safetensors"
    save_file({"w": torch.ones(4, 3, dtype=torch.bfloat16), "s": torch.tensor(2.0),
               "q": torch.zeros(2, 5).to(torch.float8_e4m3fn)}, str(path), metadata={"format": "pt"})
    assert check_safetensors_header(path) == {
        "w": {"dtype": "BF16", "shape": [4, 3]},
        "s": {"dtype": "F32", "shape": []},
        "q": {"dtype": "F8_E4M3", "shape": [2, 5]},
    }
    assert sorted(safetensors_keys(path)) == ["q", "s", "w"]
    assert load_safetensors(path)["w"].dtype == torch.bfloat16
    empty = tmp_path / "empty-header.safetensors"
    empty.write_bytes(raw({}, b""))
    assert check_safetensors_header(empty) == {}


GOOD = raw({"a": F32, "b": BF16})

BROKEN = {
    # name -> (file bytes, words in the message)
    "empty": (b"", ["not a valid safetensors", "8-byte header length"]),
    "short": (b"garbage", ["not a valid safetensors", "8-byte header length"]),
    "random": (b"\xff" * 64, ["not a valid safetensors", "100 MB"]),
    "huge-length": (struct.pack("<Q", 2**40) + b"{}", ["not a valid safetensors", "100 MB"]),
    "length-past-end": (struct.pack("<Q", 1000) + b"{}", ["not a valid safetensors", "past the end"]),
    "not-json": (raw("not json at all!", b""), ["not a valid safetensors", "invalid JSON"]),
    "not-utf8": (raw(b"\xff\xfe{}", b""), ["not a valid safetensors", "UTF-8"]),
    "list": (raw([1, 2], b""), ["not a JSON object"]),
    "deep": (raw('{"a": {"x": ' + "[" * 10_000 + "]" * 10_000 + "}}", b""), ["nested too deeply"]),
    "entry-not-object": (raw({"a": 3}), ["not a valid safetensors"]),
    "no-offsets": (raw({"a": {"dtype": "F32", "shape": [2, 2]}}), ["data_offsets"]),
    "unknown-dtype": (raw({"a": {**F32, "dtype": "Q7"}, "b": BF16}), ["Q7"]),
    "negative-shape": (raw({"a": {**F32, "shape": [-2, -2]}, "b": BF16}), ["not a valid safetensors"]),
    "shape-mismatch": (raw({"a": {**F32, "shape": [2, 3]}, "b": BF16}), ["not a valid safetensors"]),
    "overlap": (raw({"a": F32, "b": {**BF16, "data_offsets": [10, 16]}}, bytes(16)), ["invalid offset"]),
    "gap": (raw({"a": F32, "b": {**BF16, "data_offsets": [20, 26]}}, bytes(26)), ["invalid offset"]),
    "metadata-not-strings": (raw({"__metadata__": {"x": 1}, "a": F32, "b": BF16}), ["not a valid safetensors"]),
    "truncated": (GOOD[:-1], ["truncated", "download it again"]),
    "truncated-in-header": (GOOD[:20], ["past the end"]),
    "trailing-bytes": (GOOD + b"x", ["bytes after its tensors"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_every_broken_file_is_one_named_sentence(case: str, tmp_path: Path) -> None:
    data, words = BROKEN[case]
    path = tmp_path / f"{case}.safetensors"
    path.write_bytes(data)
    refused(path, *words)
    with pytest.raises(CheckpointError):
        load_safetensors(path)


def test_unreadable_paths(tmp_path: Path) -> None:
    assert "No such file" in refused(tmp_path / "missing.safetensors", "cannot be read")
    folder = tmp_path / "folder.safetensors"
    folder.mkdir()
    refused(folder, "is a folder, not a regular file")


def test_the_data_is_not_read(tmp_path: Path) -> None:
    """A 1 GiB (sparse) file: its header is read through a memory map, its data never touched."""
    path = tmp_path / "big.safetensors"
    n = 2**28
    with open(path, "wb") as fh:
        fh.write(raw({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}, b""))
        fh.truncate(fh.tell() + 4 * n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert check_safetensors_header(path) == {"w": {"dtype": "F32", "shape": [n]}}
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024, grown_kib
