"""``--device`` parsing: auto order, indices, and the one-sentence errors a user sees."""

from __future__ import annotations

import pytest

from difforge.devices import AUTO_ORDER, available_backends, get_backend
from difforge.devices.cpu import CPUBackend
from difforge.devices.cuda import CUDABackend
from difforge.devices.mps import MPSBackend
from difforge.devices.npu import NPUBackend
from difforge.devices.xpu import XPUBackend
from difforge.errors import DeviceError, DifforgeError


def test_auto_order_is_npu_cuda_xpu_mps_cpu() -> None:
    assert AUTO_ORDER == ("npu", "cuda", "xpu", "mps", "cpu")


@pytest.mark.parametrize(
    ("present", "expected"),
    [
        ({"npu": 1, "cuda": 1, "xpu": 1, "mps": 1}, NPUBackend),
        ({"cuda": 2, "xpu": 1, "mps": 1}, CUDABackend),
        ({"xpu": 1, "mps": 1}, XPUBackend),
        ({"mps": 1}, MPSBackend),
        ({}, CPUBackend),
    ],
)
def test_auto_picks_first_present_backend(fake_devices, present: dict[str, int], expected: type) -> None:
    fake_devices(**present)
    for spec in ("auto", None, "  AUTO "):  # "" is refused (tests/devices/test_device_strings.py)
        assert type(get_backend(spec)) is expected


def test_available_backends_lists_present_in_auto_order(fake_devices) -> None:
    fake_devices(mps=1, npu=1)
    assert available_backends() == ["npu", "mps", "cpu"]


@pytest.mark.parametrize(("spec", "cls", "index"), [("cuda:1", CUDABackend, 1), ("npu:1", NPUBackend, 1)])
def test_index_is_parsed(fake_devices, spec: str, cls: type, index: int) -> None:
    fake_devices(cuda=2, npu=2)
    backend = get_backend(spec)
    assert type(backend) is cls
    assert backend.index == index


def test_plain_name_has_no_index(fake_devices) -> None:
    fake_devices(cuda=2)
    assert get_backend("cuda").index is None
    assert get_backend("CUDA").index is None


def test_cpu_and_mps_ignore_index(fake_devices) -> None:
    fake_devices(mps=1)
    assert get_backend("cpu:0").index is None  # cpu:1 and up do not exist (test_device_strings.py)
    assert get_backend("mps:0").index is None


def _one_sentence(exc: DifforgeError) -> str:
    text = str(exc)
    assert "\n" not in text
    assert text.endswith(".")
    assert text.replace("e.g.", "eg").count(". ") == 0, f"more than one sentence: {text!r}"
    return text


def test_unknown_device_lists_choices() -> None:
    with pytest.raises(DeviceError) as info:
        get_backend("tpu")
    text = _one_sentence(info.value)
    assert "'tpu'" in text
    for name in ("auto", "npu", "cuda", "xpu", "mps", "cpu"):
        assert name in text


def test_bad_index_text(fake_devices) -> None:
    fake_devices(cuda=1)
    with pytest.raises(DeviceError) as info:
        get_backend("cuda:x")
    assert "non-negative integer" in _one_sentence(info.value)


def test_absent_device_names_what_is_present(fake_devices) -> None:
    fake_devices(mps=1)
    with pytest.raises(DeviceError) as info:
        get_backend("npu")
    text = _one_sentence(info.value)
    assert "'npu' is not present" in text
    assert "mps, cpu" in text


def test_index_out_of_range(fake_devices) -> None:
    fake_devices(npu=2)
    get_backend("npu:1")
    with pytest.raises(DeviceError) as info:
        get_backend("npu:2")
    text = _one_sentence(info.value)
    assert "npu:2" in text
    assert "2 npu device(s)" in text


def test_device_error_is_a_difforge_error_with_exit_code_2() -> None:
    with pytest.raises(DifforgeError) as info:
        get_backend("gpu")
    assert info.value.exit_code == 2
