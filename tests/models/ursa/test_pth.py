"""Static .pth reader: reads torch.save output, never executes a pickle."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from difforge.errors import CheckpointError
from difforge.models.ursa.pth import read_pth_tensors


def test_reads_torch_save_output(tmp_path: Path) -> None:
    emb = torch.randn(7, 3)
    half = torch.randn(4, 6).half()
    path = tmp_path / "scheduler_model.pth"
    torch.save({"path.emb": emb, "other": half[:, 1:4]}, path)
    got = read_pth_tensors(path)
    assert torch.equal(got["path.emb"], emb)
    assert got["other"].dtype == torch.float16 and torch.equal(got["other"], half[:, 1:4])


def test_tiny_scheduler_file_matches_torch_load(tiny_ursa: Path) -> None:
    path = tiny_ursa / "scheduler" / "scheduler_model.pth"
    want = torch.load(path, weights_only=True)["path.emb"]
    assert torch.equal(read_pth_tensors(path)["path.emb"], want)


class _Exploit:
    def __reduce__(self):  # noqa: D105 - runs a command when unpickled
        import os

        return (os.system, ("touch EXPLOITED_MARKER",))


def test_refuses_malicious_pickle_without_running_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pth"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("evil/data.pkl", pickle.dumps({"path.emb": _Exploit()}, protocol=2))
    with pytest.raises(CheckpointError, match="refuses global"):
        read_pth_tensors(path)
    assert not (tmp_path / "EXPLOITED_MARKER").exists()


def test_refuses_non_zip_and_missing(tmp_path: Path) -> None:
    raw = tmp_path / "legacy.pth"
    buf = io.BytesIO()
    torch.save({"x": torch.ones(1)}, buf, _use_new_zipfile_serialization=False)
    raw.write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError, match="cannot be read"):
        read_pth_tensors(raw)
    with pytest.raises(CheckpointError, match="Missing file"):
        read_pth_tensors(tmp_path / "nope.pth")
