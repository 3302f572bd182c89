"""dtype policy: what ``auto`` means on each backend, and the errors for unknown/unsupported dtypes."""

from __future__ import annotations

import pytest
import torch

from difforge.devices import DTYPES, dtype_name
from difforge.devices.cpu import CPUBackend
from difforge.devices.cuda import CUDABackend
from difforge.devices.mps import MPSBackend
from difforge.devices.npu import NPUBackend
from difforge.devices.xpu import XPUBackend
from difforge.errors import DtypeError


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (NPUBackend, torch.bfloat16),
        (XPUBackend, torch.bfloat16),
        (MPSBackend, torch.float16),
        (CPUBackend, torch.float32),
    ],
)
def test_auto_dtype(cls: type, expected: torch.dtype) -> None:
    backend = cls()
    assert backend.resolve_dtype("auto") == expected
    assert backend.resolve_dtype(None) == expected


def test_auto_dtype_cuda_is_bf16_when_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert CUDABackend().resolve_dtype("auto") == torch.bfloat16


def test_auto_dtype_cuda_falls_back_to_fp16_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert CUDABackend().resolve_dtype("auto") == torch.float16


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bf16", torch.bfloat16),
        ("BFloat16", torch.bfloat16),
        ("torch.float16", torch.float16),
        ("fp16", torch.float16),
        (torch.bfloat16, torch.bfloat16),
    ],
)
def test_named_dtypes(spec: str | torch.dtype, expected: torch.dtype) -> None:
    assert NPUBackend().resolve_dtype(spec) == expected


def test_unknown_dtype() -> None:
    with pytest.raises(DtypeError) as info:
        CPUBackend().resolve_dtype("int8")
    text = str(info.value)
    assert "'int8'" in text
    assert "auto, float32, bfloat16, float16" in text


def test_unsupported_dtype_per_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MPSBackend, "supported_dtypes", (torch.float32, torch.float16))
    with pytest.raises(DtypeError) as info:
        MPSBackend().resolve_dtype("bf16")
    assert str(info.value) == "dtype bfloat16 is not supported on mps; use one of float32, float16."
    assert MPSBackend().resolve_dtype("fp16") == torch.float16


def test_dtype_names_round_trip() -> None:
    for dtype in set(DTYPES.values()):
        assert DTYPES[dtype_name(dtype)] == dtype
