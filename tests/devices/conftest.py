"""Helpers for the device tests: pretend any set of backends is present, and keep os.environ clean."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from difforge.devices import BACKENDS

NPU_PRESET_NAMES = ("PYTORCH_NPU_ALLOC_CONF", "TASK_QUEUE_ENABLE", "CPU_AFFINITY_CONF", "ACL_PRECISION_MODE")


@pytest.fixture
def fake_devices(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``fake_devices(npu=2, cuda=1)``: backends named get that many devices, all others none (cpu stays)."""

    def install(**counts: int) -> None:
        for name, cls in BACKENDS.items():
            if name == "cpu":
                continue
            n = counts.get(name, 0)
            monkeypatch.setattr(cls, "is_available", classmethod(lambda c, n=n: n > 0))
            monkeypatch.setattr(cls, "device_count", classmethod(lambda c, n=n: n))

    return install


@pytest.fixture
def clean_npu_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Unset every NPU preset for the test and restore the caller's values afterwards.

    ``setenv`` then ``delenv`` makes monkeypatch remember the original state, so whatever a backend
    writes into os.environ during the test is undone at teardown.
    """
    for name in NPU_PRESET_NAMES:
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    return monkeypatch
