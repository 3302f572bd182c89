"""Sync and memory calls go through ``torch.accelerator`` when it drives the backend's device type.

There is no accelerator here, so each test makes ``torch.accelerator.current_accelerator()`` name a
device type and replaces the ``torch.accelerator`` calls with recorders; the device modules are made
to fail (or are the NPU stand-in, which logs its calls) so a test sees which path answered.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from difforge.devices import CPUBackend, CUDABackend, MPSBackend, NPUBackend, get_backend
from difforge.devices.base import current_accelerator_module

GIB = 1024**3
#: The torch.accelerator calls the base backend uses, with what each recorder returns.
ACCELERATOR_ANSWERS: dict[str, Any] = {
    "synchronize": None,
    "empty_cache": None,
    "reset_peak_memory_stats": None,
    "max_memory_allocated": 7 * GIB,
    "memory_allocated": 1 * GIB,
    "memory_reserved": 3 * GIB,
    "get_memory_info": (10 * GIB, 80 * GIB),
    "device_count": 4,
}


class FakeAccelerator:
    """Records every torch.accelerator call as ``(name, args)``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, device_type: str) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        current = SimpleNamespace(type=device_type)  # torch.device("npu") is unparseable under the stand-in
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: current)
        for name, answer in ACCELERATOR_ANSWERS.items():
            monkeypatch.setattr(torch.accelerator, name, self._recorder(name, answer))

    def _recorder(self, name: str, answer: Any) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            self.calls.append((name, args))
            return answer

        return call

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def _forbid(monkeypatch: pytest.MonkeyPatch, module: Any, *names: str) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the device module was called although torch.accelerator drives this device")

    for name in names:
        monkeypatch.setattr(module, name, fail, raising=False)


CUDA_MEMORY_CALLS = (
    "synchronize",
    "empty_cache",
    "reset_peak_memory_stats",
    "max_memory_allocated",
    "memory_allocated",
    "memory_reserved",
    "mem_get_info",
    "device_count",
)


# ---- which torch.accelerator, if any ----------------------------------------------------------------
def test_no_accelerator_on_this_cpu_build() -> None:
    if torch.accelerator.current_accelerator() is not None:
        pytest.skip("this torch build has an accelerator")
    for name in ("cuda", "npu", "xpu", "mps", "cpu"):
        assert current_accelerator_module(name) is None


def test_only_the_current_type_is_driven(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeAccelerator(monkeypatch, "cuda")
    assert current_accelerator_module("cuda") is torch.accelerator
    assert current_accelerator_module("npu") is None
    assert current_accelerator_module("cpu") is None


def test_a_raising_current_accelerator_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(check_available: bool = False) -> None:
        raise RuntimeError("PrivateUse1 renamed without a device module")

    monkeypatch.setattr(torch.accelerator, "current_accelerator", broken)
    assert current_accelerator_module("npu") is None


def test_a_torch_without_torch_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "accelerator")  # torch < 2.6
    assert current_accelerator_module("cuda") is None


# ---- CUDA: everything through torch.accelerator, with the backend's torch.device ------------------------
def test_cuda_sync_and_memory_go_through_torch_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = FakeAccelerator(monkeypatch, "cuda")
    _forbid(monkeypatch, torch.cuda, *CUDA_MEMORY_CALLS)
    backend = CUDABackend(index=1)
    device = torch.device("cuda", 1)

    backend.synchronize()
    backend.reset_peak_memory()
    assert backend.peak_memory_bytes() == 7 * GIB
    assert backend.memory_allocated_bytes() == 1 * GIB
    backend.empty_cache()
    # free 10 GiB plus what the caching allocator holds unused (3 reserved - 1 allocated)
    assert backend.available_memory_bytes() == 12 * GIB

    assert acc.calls == [
        ("synchronize", (device,)),
        ("reset_peak_memory_stats", (device,)),
        ("max_memory_allocated", (device,)),
        ("memory_allocated", (device,)),
        ("empty_cache", ()),
        ("get_memory_info", (device,)),
        ("memory_reserved", (device,)),
        ("memory_allocated", (device,)),
    ]


def test_cuda_device_count_comes_from_torch_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = FakeAccelerator(monkeypatch, "cuda")
    _forbid(monkeypatch, torch.cuda, "device_count")
    monkeypatch.setattr(CUDABackend, "is_available", classmethod(lambda cls: True))
    assert CUDABackend.device_count() == 4
    assert acc.names() == ["device_count"]
    assert get_backend("cuda:3").index == 3


def test_cuda_uses_its_module_when_another_accelerator_is_current(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = FakeAccelerator(monkeypatch, "xpu")
    seen: list[tuple[str, Any]] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append(("synchronize", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 5 * GIB)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: seen.append(("empty_cache", None)))
    backend = CUDABackend()
    backend.synchronize()
    assert backend.peak_memory_bytes() == 5 * GIB
    backend.empty_cache()
    assert seen == [("synchronize", torch.device("cuda")), ("empty_cache", None)]
    assert acc.calls == []


# ---- NPU: torch.accelerator with int indices once torch_npu makes npu current --------------------------
def test_npu_goes_through_torch_accelerator_by_index(npu_standin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_COUNT", "2")
    acc = FakeAccelerator(monkeypatch, "npu")
    backend = get_backend("npu:1")  # the index is checked against torch.accelerator's count (4)
    assert acc.calls == [("device_count", ())]
    acc.calls.clear()
    npu_standin.npu._standin_calls.clear()

    backend.synchronize()
    backend.reset_peak_memory()
    assert backend.peak_memory_bytes() == 7 * GIB
    assert backend.memory_allocated_bytes() == 1 * GIB
    backend.empty_cache()
    assert backend.available_memory_bytes() == 12 * GIB

    assert all(args in ((1,), ()) for _, args in acc.calls), acc.calls  # the index, never torch.device
    assert acc.names() == [
        "synchronize",
        "reset_peak_memory_stats",
        "max_memory_allocated",
        "memory_allocated",
        "empty_cache",
        "get_memory_info",
        "memory_reserved",
        "memory_allocated",
    ]
    assert npu_standin.npu._standin_calls == []  # the device module was not asked


@pytest.mark.parametrize("declined", [NotImplementedError, RuntimeError])
def test_npu_module_answers_what_torch_accelerator_declines(
    npu_standin, monkeypatch: pytest.MonkeyPatch, declined: type[Exception]
) -> None:
    """An out-of-tree allocator that does not back torch.accelerator's stats: torch_npu's own counters."""
    acc = FakeAccelerator(monkeypatch, "npu")

    def decline(*args: Any) -> None:
        raise declined("Allocator for npu is not a DeviceAllocator.")

    for name in ("max_memory_allocated", "memory_allocated", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.accelerator, name, decline)
    npu = npu_standin.npu
    npu._standin_allocate(2 * GIB)
    backend = NPUBackend()
    backend.synchronize()
    assert backend.memory_allocated_bytes() == 2 * GIB
    backend.reset_peak_memory()
    assert backend.peak_memory_bytes() == 2 * GIB
    assert acc.names() == ["synchronize"]
    assert [name for name, _ in npu._standin_calls] == [
        "memory_allocated",
        "reset_peak_memory_stats",
        "max_memory_allocated",
    ]


def test_npu_free_memory_from_its_module_on_a_torch_without_get_memory_info(
    npu_standin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.8/2.9 have torch.accelerator's memory stats but not get_memory_info (added in 2.10)."""
    FakeAccelerator(monkeypatch, "npu")
    monkeypatch.delattr(torch.accelerator, "get_memory_info")
    npu_standin.npu._standin_allocate(4 * GIB)
    # the stand-in's mem_get_info: 64 GiB total minus 4 allocated; reserved 3 - allocated 1 from the fake
    assert NPUBackend().available_memory_bytes() == 60 * GIB + 2 * GIB


def test_npu_without_torch_accelerator_uses_the_standin(npu_standin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "accelerator")
    npu = npu_standin.npu
    npu._standin_allocate(3 * GIB)
    backend = NPUBackend()
    backend.synchronize()
    assert backend.peak_memory_bytes() == 3 * GIB
    assert backend.available_memory_bytes() == 61 * GIB
    assert ("synchronize", 0) in npu._standin_calls


# ---- MPS and CPU ------------------------------------------------------------------------------------------
def test_mps_synchronize_and_empty_cache_through_torch_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = FakeAccelerator(monkeypatch, "mps")
    _forbid(monkeypatch, torch.mps, "synchronize", "empty_cache")
    backend = MPSBackend()
    backend.synchronize()
    backend.empty_cache()
    assert acc.calls == [("synchronize", ()), ("empty_cache", ())]  # torch.mps.synchronize() takes no device


def test_mps_synchronize_falls_back_to_torch_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = FakeAccelerator(monkeypatch, "cuda")
    seen: list[str] = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: seen.append("synchronize"))
    MPSBackend().synchronize()
    assert seen == ["synchronize"] and acc.calls == []


def test_cpu_never_asks_torch_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = FakeAccelerator(
        monkeypatch, "cpu"
    )  # not something torch reports; proves the CPU keeps its own logic
    monkeypatch.setattr("difforge.devices.cpu.host_available_memory", lambda: 123)
    backend = CPUBackend()
    backend.synchronize()
    backend.reset_peak_memory()
    backend.empty_cache()
    assert backend.peak_memory_bytes() is None and backend.memory_allocated_bytes() is None
    assert backend.device_count() == 1
    assert backend.available_memory_bytes() == 123  # host memory (MemAvailable, cgroups), not get_memory_info
    assert acc.calls == []
