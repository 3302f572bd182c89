"""Hostile URSA checkpoint files (security review of c79b0c3, rows D2 / D4 / D8).

Before the fix a 552-byte ``scheduler_model.pth`` holding a stride-0 view (64 x 25M of one float)
and a 1 MB deflate bomb (1 GB of zeros) both loaded - 6.6 GB / 2.3 GB peak RSS, exit 0; an
out-of-range storage offset, a float or NaN ``hidden_size`` and a NaN ``rope_theta`` exited 1
("unexpected ..."); ``num_key_value_heads: true`` ran as 1 and ``num_hidden_layers: 1e9`` grew memory
without a message.  Peak memory is checked through a cheap proxy - every zip read and every
``Tensor.clone`` is counted and a large one fails the test at once - never by timing or RSS.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from difforge.cli import app
from difforge.errors import CheckpointError
from difforge.models.ursa.config import URSATransformerConfig, VQConfig
from difforge.models.ursa.pth import read_pth_tensors
from difforge.models.ursa.vae_fsq import FSQConfig

runner = CliRunner()
BUDGET = 4 << 20  # bytes a refused file may make the reader touch (the real tiny file is 2 KB)


# ---- building .pth files by hand (the opcodes torch.save writes, protocol 2) --------------------


def _uni(text: str) -> bytes:
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _num(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _tuple(items: list[bytes]) -> bytes:
    return b"(" + b"".join(items) + b"t"


def tensor_pickle(numel: int, size: tuple, stride: tuple, offset: int = 0, storage: str = "FloatStorage") -> bytes:
    """``{"path.emb": _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())}``."""

    def dims(v: int) -> bytes:
        return b"\x88" if v is True else _num(v)  # NEWTRUE for the bool case

    prog = b"\x80\x02}" + _uni("path.emb") + b"ctorch._utils\n_rebuild_tensor_v2\n("
    prog += _tuple([_uni("storage"), b"ctorch\n" + storage.encode() + b"\n", _uni("0"), _uni("cpu"), _num(numel)])
    prog += b"Q" + _num(offset) + _tuple([dims(s) for s in size]) + _tuple([dims(s) for s in stride])
    return prog + b"\x89ccollections\nOrderedDict\n)Rt" + b"Rs."


def write_pth(path: Path, pickle_bytes: bytes, storage: bytes | None = None, zeros: int = 0,
              compress: int = zipfile.ZIP_STORED, extra_members: int = 0) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickle_bytes)
        zf.writestr("archive/byteorder", b"little")
        if zeros:
            info = zipfile.ZipInfo("archive/data/0")
            info.compress_type = compress
            with zf.open(info, "w", force_zip64=True) as fh:
                block = bytes(1 << 20)
                for _ in range(zeros // len(block)):
                    fh.write(block)
        elif storage is not None:
            zf.writestr(zipfile.ZipInfo("archive/data/0"), storage, compress_type=compress)
        for i in range(extra_members):
            zf.writestr(f"archive/pad/{i}", b"")
    return path


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count bytes read from zip members and bytes cloned; raise as soon as either passes BUDGET."""
    used = {"read": 0, "clone": 0}
    read, clone = zipfile.ZipExtFile.read, torch.Tensor.clone

    def counted_read(self, n=-1):
        if n is None or n < 0:
            n = BUDGET - used["read"] + 1
        data = read(self, n)
        used["read"] += len(data)
        if used["read"] > BUDGET:
            raise AssertionError(f"read more than {BUDGET} bytes of a hostile file")
        return data

    def counted_clone(self, *args, **kwargs):
        if self.numel() * self.element_size() > BUDGET:
            raise AssertionError(f"cloned {self.numel() * self.element_size()} bytes of a hostile file")
        used["clone"] += self.numel() * self.element_size()
        return clone(self, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counted_read)
    monkeypatch.setattr(torch.Tensor, "clone", counted_clone)
    return used


def test_budget_proxy_lets_the_real_file_through(tiny_ursa: Path, budget: dict[str, int]) -> None:
    got = read_pth_tensors(tiny_ursa / "scheduler" / "scheduler_model.pth")
    assert got["path.emb"].shape == (64, 4)
    assert 0 < budget["read"] < 4096


@pytest.mark.parametrize(
    ("name", "pickle_args", "storage", "needle"),
    [
        ("stride0", (1, (64, 25_000_000), (0, 0)), b"\0" * 4, "repeats its 1-element storage"),
        ("overlap", (64, (64, 4_000_000), (1, 0)), b"\0" * 256, "repeats its 64-element storage"),
        ("offset", (256, (64, 4), (4, 1), 10**6), b"\0" * 1024, "reaches element"),
        ("negative-offset", (256, (64, 4), (4, 1), -4), b"\0" * 1024, "reaches element"),
        ("negative-stride", (256, (64, 4), (-4, 1)), b"\0" * 1024, "negative"),
        ("negative-size", (256, (-64, 4), (4, 1)), b"\0" * 1024, "negative"),
        ("past-the-end", (256, (64, 5), (4, 1)), b"\0" * 1024, "reaches element"),
        ("bool-dim", (256, (True, 4), (4, 1)), b"\0" * 1024, "not an integer"),
        ("huge-dim", (256, (2**70, 4), (4, 1)), b"\0" * 1024, "62 bits"),
        ("huge-numel", (2**40, (64, 4), (4, 1)), b"\0" * 1024, "declares"),
        ("size-mismatch", (512, (64, 4), (4, 1)), b"\0" * 1024, "expected 2048"),
    ],
)
def test_hostile_tensor_views_are_refused_before_allocating(
    tmp_path: Path, budget: dict[str, int], name: str, pickle_args: tuple, storage: bytes, needle: str
) -> None:
    path = write_pth(tmp_path / f"{name}.pth", tensor_pickle(*pickle_args), storage)
    assert path.stat().st_size < 2048
    with pytest.raises(CheckpointError, match="cannot be read as a plain tensor file") as info:
        read_pth_tensors(path)
    assert needle in str(info.value)
    assert budget["clone"] == 0


def test_deflate_bomb_is_refused_without_inflating(tmp_path: Path, budget: dict[str, int]) -> None:
    numel = 16 << 20  # 64 MiB of float32 zeros, deflated to ~64 KB
    path = write_pth(tmp_path / "bomb.pth", tensor_pickle(numel, (64, numel // 64), (numel // 64, 1)),
                     zeros=numel * 4, compress=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(CheckpointError, match="zip bomb"):
        read_pth_tensors(path)
    assert budget["read"] < 1024  # nothing but (at most) the tiny bookkeeping members


def test_member_limits(tmp_path: Path, budget: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    emb = torch.arange(256, dtype=torch.float32).numpy().tobytes()
    many = write_pth(tmp_path / "many.pth", tensor_pickle(256, (64, 4), (4, 1)), emb, extra_members=300)
    with pytest.raises(CheckpointError, match="zip members"):
        read_pth_tensors(many)
    from difforge.models.ursa import pth

    ok = write_pth(tmp_path / "ok.pth", tensor_pickle(256, (64, 4), (4, 1)), emb)
    assert torch.equal(read_pth_tensors(ok)["path.emb"], torch.arange(256.0).view(64, 4))
    monkeypatch.setattr(pth, "MAX_TOTAL_BYTES", 512)
    with pytest.raises(CheckpointError, match="uncompressed bytes"):
        read_pth_tensors(ok)
    monkeypatch.setattr(pth, "MAX_TOTAL_BYTES", 1 << 30)
    monkeypatch.setattr(pth, "MAX_MEMBER_BYTES", 512)
    with pytest.raises(CheckpointError, match="declares 1024 bytes"):
        read_pth_tensors(ok)


def test_legitimate_views_still_read(tmp_path: Path) -> None:
    """torch.save of a transposed view, a slice and a small broadcast: what a real file may hold."""
    base = torch.randn(8, 6)
    small = torch.randn(1, 4).expand(16, 4)  # stride 0, 256 bytes: harmless
    path = tmp_path / "views.pth"
    torch.save({"t": base.T, "s": base[2:5, 1:4], "b": small}, path)
    got = read_pth_tensors(path)
    assert torch.equal(got["t"], base.T) and torch.equal(got["s"], base[2:5, 1:4]) and torch.equal(got["b"], small)


# ---- transformer / VAE configs ---------------------------------------------------------------------

GOOD = URSATransformerConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                             num_hidden_layers=2, max_window_layers=2, vocab_size=378, lm_vocab_size=314,
                             lm_head_size=64, bov_token_id=297).to_dict()


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("hidden_size", 64.5, "must be an integer, got 64.5"),
        ("hidden_size", float("nan"), "must be an integer, got NaN"),
        ("hidden_size", 64.0, "must be an integer"),
        ("hidden_size", "64", "must be an integer"),
        ("num_key_value_heads", True, "must be an integer, got true"),
        ("num_attention_heads", False, "must be an integer, got false"),
        ("num_hidden_layers", 10**9, "between 1 and 1024"),
        ("num_hidden_layers", 0, "between 1 and 1024"),
        ("intermediate_size", -5, "between 1 and"),
        ("vocab_size", 2**40, "between 1 and"),
        ("bov_token_id", -1, "between 0 and"),
        ("rope_theta", float("nan"), "must be a finite number, got NaN"),
        ("rope_theta", float("inf"), "must be a finite number, got Infinity"),
        ("rope_theta", True, "must be a finite number"),
        ("rope_theta", -1e6, "must be positive"),
        ("rope_theta", "1e6", "must be a finite number"),
    ],
)
def test_hostile_transformer_numbers_name_key_and_file(key: str, value: object, needle: str) -> None:
    with pytest.raises(CheckpointError) as info:
        URSATransformerConfig.from_dict({**GOOD, key: value})
    text = str(info.value)
    assert text.startswith("transformer/config.json: ") and f"'{key}'" in text, text
    assert needle in text, text


def test_heads_must_divide_hidden() -> None:
    with pytest.raises(CheckpointError, match="hidden_size must be a multiple of num_attention_heads"):
        URSATransformerConfig.from_dict({**GOOD, "num_attention_heads": 3, "num_key_value_heads": 1})
    assert URSATransformerConfig.from_dict(GOOD).num_key_value_heads == 1
    assert URSATransformerConfig.from_dict({}).num_hidden_layers == 28  # class defaults are the 1.7B model


@pytest.mark.parametrize("cls", [VQConfig, FSQConfig])
@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ({"layers_per_block": 10**9}, "'layers_per_block' must be between 1 and 64"),
        ({"latent_channels": True}, "'latent_channels' must be an integer, got true"),
        ({"num_vq_embeddings": 1.5}, "'num_vq_embeddings' must be an integer"),
        ({"block_out_channels": [32.5, 64]}, "block_out_channels must be a list"),
        ({"block_out_channels": [10**9]}, "block_out_channels must be a list"),
    ],
)
def test_hostile_vae_numbers(cls: type, bad: dict, needle: str) -> None:
    with pytest.raises(CheckpointError, match="vae/config.json") as info:
        cls.from_dict({"num_vq_embeddings": 64, **bad})
    assert needle in str(info.value)


# ---- through the CLI: exit 2, one line, no output ------------------------------------------------


def _copy(tiny_ursa: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-ursa"
    shutil.copytree(tiny_ursa, folder)
    return folder


def _generate(folder: Path, out: Path):
    return runner.invoke(app, ["generate", "--model", str(folder), "--prompt", "x", "--device", "cpu", "-q",
                               "--steps", "2", "--height", "64", "--width", "64", "--output", str(out)],
                         catch_exceptions=False)


def _assert_exit_2(result, out: Path, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("difforge: error: ") and len(err.splitlines()) == 1, err
    assert "unexpected" not in err
    for needle in needles:
        assert needle in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "pickle_args", "storage", "needle"),
    [
        ("stride0", (1, (64, 25_000_000), (0, 0)), b"\0" * 4, "repeats its 1-element storage"),
        ("offset", (256, (64, 4), (4, 1), 10**6), b"\0" * 1024, "reaches element"),
    ],
)
def test_cli_hostile_pth(tiny_ursa: Path, tmp_path: Path, budget: dict[str, int], name: str,
                         pickle_args: tuple, storage: bytes, needle: str) -> None:
    folder = _copy(tiny_ursa, tmp_path)
    write_pth(folder / "scheduler" / "scheduler_model.pth", tensor_pickle(*pickle_args), storage)
    out = tmp_path / "a.png"
    _assert_exit_2(_generate(folder, out), out, "scheduler_model.pth cannot be read", needle)


def test_cli_deflate_bomb(tiny_ursa: Path, tmp_path: Path, budget: dict[str, int]) -> None:
    folder = _copy(tiny_ursa, tmp_path)
    numel = 16 << 20
    write_pth(folder / "scheduler" / "scheduler_model.pth", tensor_pickle(numel, (64, numel // 64), (numel // 64, 1)),
              zeros=numel * 4, compress=zipfile.ZIP_DEFLATED)
    out = tmp_path / "a.png"
    _assert_exit_2(_generate(folder, out), out, "zip bomb")


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("hidden_size", 64.5, "'hidden_size' must be an integer, got 64.5"),
        ("hidden_size", math.nan, "'hidden_size' must be an integer, got NaN"),
        ("rope_theta", math.nan, "'rope_theta' must be a finite number, got NaN"),
        ("num_key_value_heads", True, "'num_key_value_heads' must be an integer, got true"),
        ("num_hidden_layers", 10**9, "'num_hidden_layers' must be between 1 and 1024"),
    ],
)
def test_cli_hostile_transformer_config(tiny_ursa: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        key: str, value: object, needle: str) -> None:
    from difforge.models.ursa import transformer

    built, init = [0], transformer.DecoderLayer.__init__

    def guarded(self, *args, **kwargs):  # without the fix, 10**9 layers are built (on meta) for hours
        built[0] += 1
        if built[0] > 64:
            raise AssertionError("built more than 64 decoder layers")
        init(self, *args, **kwargs)

    monkeypatch.setattr(transformer.DecoderLayer, "__init__", guarded)
    folder = _copy(tiny_ursa, tmp_path)
    path = folder / "transformer" / "config.json"
    data = json.loads(path.read_text())
    data[key] = value
    path.write_text(json.dumps(data))  # NaN is written as the JSON extension Python reads back
    out = tmp_path / "a.png"
    _assert_exit_2(_generate(folder, out), out, "transformer/config.json", needle)
