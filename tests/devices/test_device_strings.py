"""Hostile ``--device`` strings and the backends' available-memory reading (security review, rows D8 / memory).

Before the fix ``cpu:²`` crashed ``int()`` (exit 1, "unexpected ValueError"), while ``cpu:5`` and
``""`` were silently run on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from difforge.cli import app
from difforge.devices import cpu as cpu_mod
from difforge.devices import get_backend
from difforge.devices.cpu import CPUBackend, cgroup_available, meminfo_available
from difforge.devices.cuda import CUDABackend
from difforge.devices.mps import MPSBackend
from difforge.devices.npu import NPUBackend
from difforge.errors import DeviceError

runner = CliRunner()


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("cpu:²", "non-negative integer"),  # str.isdigit() is True, int() raises
        ("cpu:٣", "non-negative integer"),  # Arabic-Indic 3: int() would even accept it
        ("cpu:5", "does not exist"),
        ("cpu:1", "1 cpu device(s)"),
        ("", "device is empty"),
        ("   ", "device is empty"),
        ("cpu:", "non-negative integer"),
    ],
)
def test_cli_refuses_bad_device_string(tmp_out: Path, spec: str, needle: str) -> None:
    out = tmp_out / "a.png"
    r = runner.invoke(app, ["generate", "--prompt", "x", "--device", spec, "--output", str(out)], catch_exceptions=False)
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    err = r.stderr.strip()
    assert err.startswith("difforge: error: ") and len(err.splitlines()) == 1, err
    assert needle.lower() in err.lower(), err
    assert "unexpected" not in err
    assert not out.exists()


def test_cpu_index_zero_and_none_still_work() -> None:
    assert isinstance(get_backend("cpu:0"), CPUBackend)
    assert isinstance(get_backend(None), CPUBackend) or get_backend(None).name != "cpu"


def test_mps_has_one_device(fake_devices) -> None:
    fake_devices(mps=1)
    get_backend("mps:0")
    with pytest.raises(DeviceError, match="does not exist"):
        get_backend("mps:1")


def test_huge_index_is_a_device_error_not_a_crash(fake_devices) -> None:
    fake_devices(cuda=2)
    with pytest.raises(DeviceError, match="does not exist"):
        get_backend("cuda:" + "9" * 5000)  # int() refuses > 4300 digits
    assert get_backend("cuda:" + "0" * 40 + "1").index == 1


# ---- available memory --------------------------------------------------------------------------


def test_meminfo_available_parses_proc_meminfo(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:       24683584 kB\nMemFree: 1 kB\nMemAvailable:   2048 kB\n")
    assert meminfo_available(tmp_path) == 2048 * 1024
    (tmp_path / "meminfo").write_text("MemTotal: 1 kB\n")  # old kernels lack the line
    assert meminfo_available(tmp_path) is None
    assert meminfo_available(tmp_path / "absent") is None


def test_cgroup_v2_and_v1_limits(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("8589934592\n")
    (v2 / "memory.current").write_text("3221225472\n")
    (v2 / "memory.stat").write_text("anon 1\ninactive_file 1073741824\n")
    assert cgroup_available(v2) == 8 * 2**30 - (3 * 2**30 - 2**30)
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_available(v2) is None
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(str(4 * 2**30))
    (v1 / "memory.usage_in_bytes").write_text(str(2**30))
    (v1 / "memory.stat").write_text("total_inactive_file 0\n")
    assert cgroup_available(tmp_path / "v1") == 3 * 2**30
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712")  # v1's "unlimited"
    assert cgroup_available(tmp_path / "v1") is None


def test_cpu_available_is_meminfo_capped_by_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_mod, "meminfo_available", lambda: 20 * 2**30)
    monkeypatch.setattr(cpu_mod, "cgroup_available", lambda: None)
    assert CPUBackend().available_memory_bytes() == 20 * 2**30
    monkeypatch.setattr(cpu_mod, "cgroup_available", lambda: 6 * 2**30)
    assert CPUBackend().available_memory_bytes() == 6 * 2**30


def test_cpu_available_is_real_on_this_machine() -> None:
    got = CPUBackend().available_memory_bytes()
    assert got is not None and got > 0


def test_cuda_style_backends_ask_mem_get_info(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def mem_get_info(device):
        calls.append(device)
        return 5 * 2**30, 80 * 2**30

    monkeypatch.setattr(CUDABackend, "_module", lambda self: SimpleNamespace(mem_get_info=mem_get_info))
    assert CUDABackend(index=1).available_memory_bytes() == 5 * 2**30
    assert calls == [torch.device("cuda", 1)]


def test_unknown_or_failing_memory_query_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CUDABackend, "_module", lambda self: SimpleNamespace())
    assert CUDABackend().available_memory_bytes() is None

    def broken(device):
        raise RuntimeError("driver not initialised")

    monkeypatch.setattr(CUDABackend, "_module", lambda self: SimpleNamespace(mem_get_info=broken))
    assert CUDABackend().available_memory_bytes() is None


def test_npu_passes_its_index(npu_standin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_COUNT", "2")
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_MEMORY", str(64 * 2**30))
    assert NPUBackend(index=1).available_memory_bytes() == 64 * 2**30


def test_mps_budget_minus_driver_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SimpleNamespace(recommended_max_memory=lambda: 16 * 2**30, driver_allocated_memory=lambda: 2**30)
    monkeypatch.setattr(torch, "mps", fake, raising=False)
    assert MPSBackend().available_memory_bytes() == 15 * 2**30
    monkeypatch.setattr(torch, "mps", SimpleNamespace(), raising=False)
    assert MPSBackend().available_memory_bytes() is None
