"""The NPU backend against the torch_npu stand-in, and without any torch_npu at all."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from difforge.devices import get_backend
from difforge.devices.npu import NPUBackend, cann_version, torch_npu_import_error, torch_npu_module
from difforge.errors import DeviceError
from difforge.runtime.record import RunRecord

GIB = 1024**3


# ---- presence -------------------------------------------------------------------------------------
def test_available_with_standin(npu_standin) -> None:
    assert torch_npu_module() is npu_standin
    assert torch_npu_import_error() is None
    assert NPUBackend.is_available()
    assert NPUBackend.device_count() == 1
    assert type(get_backend("auto")) is NPUBackend


def test_device_count_follows_standin(npu_standin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_COUNT", "3")
    assert NPUBackend.device_count() == 3
    assert get_backend("npu:2").index == 2
    with pytest.raises(DeviceError, match="3 npu device"):
        get_backend("npu:3")


def test_standin_with_zero_devices_is_not_available(npu_standin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_COUNT", "0")
    assert not NPUBackend.is_available()
    assert NPUBackend.device_count() == 0
    with pytest.raises(DeviceError, match="'npu' is not present"):
        get_backend("npu")


def test_not_available_when_torch_npu_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` fail, stand-in or real
    assert torch_npu_module() is None
    assert torch_npu_import_error() == "not installed"
    assert not NPUBackend.is_available()
    assert NPUBackend.device_count() == 0
    with pytest.raises(DeviceError) as info:
        get_backend("npu")
    assert "not present" in str(info.value)
    assert type(get_backend("auto")).__name__ != "NPUBackend"


def test_broken_torch_npu_is_not_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch_npu that dies on import (missing CANN libraries) must not take difforge down with it."""
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise OSError('libhccl.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    assert not NPUBackend.is_available()
    error = torch_npu_import_error()
    assert error is not None and error.startswith("import failed: OSError") and "libhccl.so" in error
    sys.modules.pop("torch_npu", None)


# ---- describe -------------------------------------------------------------------------------------
def test_describe(npu_standin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_COUNT", "2")
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_NAME", "Ascend910_9362")
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_MEMORY", str(64 * GIB))
    monkeypatch.setenv("DIFFORGE_STANDIN_CANN_VERSION", "8.3.RC1")
    info = get_backend("npu:1").describe()
    assert info["backend"] == "npu"
    assert info["device"] == "npu:1"
    assert info["device_name"] == "Ascend910_9362"
    assert info["device_count"] == 2
    assert info["total_memory_bytes"] == 64 * GIB
    assert info["torch_npu"] == npu_standin.__version__ == "2.13.0+standin"
    assert info["cann"] == "8.3.RC1"
    assert info["fused_ops"] == ["attention", "rms_norm", "rotary", "swiglu"]
    assert info["env_presets_applied"] == {}
    # the name and memory were asked for device 1, by index
    assert ("get_device_name", 1) in npu_standin.npu._standin_calls
    assert ("get_device_properties", 1) in npu_standin.npu._standin_calls


def test_str_and_device(npu_standin) -> None:
    backend = NPUBackend()
    assert str(backend) == "npu:0"
    # The stand-in does not rename torch's PrivateUse1 backend, so torch cannot build an npu device.
    with pytest.raises(DeviceError, match="torch_npu"):
        _ = backend.device


def test_cann_version_from_toolkit_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    arch = tmp_path / "x86_64-linux"
    arch.mkdir()
    (arch / "ascend_toolkit_install.info").write_text("package_name=Ascend-cann-toolkit\nversion=8.0.RC3\n")
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    assert cann_version() == "8.0.RC3"
    monkeypatch.delenv("ASCEND_HOME_PATH")
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    assert cann_version() is None


# ---- environment presets ----------------------------------------------------------------------------
def test_presets_applied_only_when_unset_and_recorded(npu_standin, clean_npu_env) -> None:
    clean_npu_env.setenv("TASK_QUEUE_ENABLE", "0")  # the user's choice wins
    backend = NPUBackend()
    applied = backend.apply_env_presets()
    assert applied == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "CPU_AFFINITY_CONF": "1"}
    assert backend.applied_presets == applied
    assert os.environ["TASK_QUEUE_ENABLE"] == "0"
    assert os.environ["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    assert backend.describe()["env_presets_applied"] == applied


def test_all_default_presets_when_nothing_set(npu_standin, clean_npu_env) -> None:
    applied = NPUBackend().apply_env_presets()
    assert applied == {
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "TASK_QUEUE_ENABLE": "2",
        "CPU_AFFINITY_CONF": "1",
    }


def test_precision_preset_is_opt_in(npu_standin, clean_npu_env) -> None:
    backend = NPUBackend()
    backend.apply_env_presets()
    assert "ACL_PRECISION_MODE" not in os.environ
    assert "ACL_PRECISION_MODE" not in backend.applied_presets
    assert ("set_option", None) not in npu_standin.npu._standin_calls
    assert npu_standin.npu._options == {}


def test_precision_preset_opted_in_goes_through_set_option(npu_standin, clean_npu_env) -> None:
    backend = NPUBackend()
    applied = backend.apply_env_presets(opt_in=True)
    assert applied["ACL_PRECISION_MODE"] == "allow_fp32_to_fp16"
    assert os.environ["ACL_PRECISION_MODE"] == "allow_fp32_to_fp16"
    assert npu_standin.npu._options == {"ACL_PRECISION_MODE": "allow_fp32_to_fp16"}
    assert backend.describe()["precision_mode_via_set_option"] is True


def test_precision_preset_respects_user_value(npu_standin, clean_npu_env) -> None:
    clean_npu_env.setenv("ACL_PRECISION_MODE", "must_keep_origin_dtype")
    backend = NPUBackend()
    applied = backend.apply_env_presets(opt_in=True)
    assert "ACL_PRECISION_MODE" not in applied
    assert npu_standin.npu._options == {}
    assert os.environ["ACL_PRECISION_MODE"] == "must_keep_origin_dtype"


def test_every_preset_explains_itself() -> None:
    presets = NPUBackend().env_presets()
    assert [p.name for p in presets if p.opt_in] == ["ACL_PRECISION_MODE"]
    for preset in presets:
        assert preset.why and preset.value


# ---- memory and sync go to the device module ----------------------------------------------------------
def test_memory_functions_routed_to_standin(npu_standin, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFORGE_STANDIN_NPU_COUNT", "2")
    npu = npu_standin.npu
    backend = get_backend("npu:1")
    npu._standin_allocate(3 * GIB, 1)
    npu._standin_free(2 * GIB, 1)
    assert backend.memory_allocated_bytes() == 1 * GIB
    assert backend.peak_memory_bytes() == 3 * GIB
    backend.reset_peak_memory()
    assert backend.peak_memory_bytes() == 1 * GIB
    npu._standin_allocate(5 * GIB, 1)
    assert backend.peak_memory_bytes() == 6 * GIB
    backend.synchronize()
    backend.empty_cache()
    calls = npu._standin_calls
    assert ("reset_peak_memory_stats", 1) in calls
    assert ("synchronize", 1) in calls
    assert ("empty_cache", None) in calls
    # device 0 was never touched by a backend for device 1
    assert all(idx in (1, None) for _, idx in calls)


def test_run_record_phase_reads_npu_peak(npu_standin) -> None:
    npu = npu_standin.npu
    backend = NPUBackend()
    npu._standin_allocate(4 * GIB)  # before the phase: must not count as the phase's peak
    npu._standin_free(4 * GIB)
    record = RunRecord(kind="generate")
    with record.phase("denoise", backend):
        npu._standin_allocate(2 * GIB)
    assert record.phases["denoise"].peak_device_bytes == 2 * GIB
    names = [name for name, _ in npu._standin_calls]
    # sync + reset before, sync after, then the peak read
    assert names[-4:] == ["synchronize", "reset_peak_memory_stats", "synchronize", "max_memory_allocated"]


# ---- opt-in presets asked for by name (--preset) ------------------------------------------------------
def test_opt_in_preset_named_with_a_value(npu_standin, clean_npu_env) -> None:
    backend = NPUBackend()
    asked = backend.opt_in_choices(["ACL_PRECISION_MODE=must_keep_origin_dtype"])
    assert asked == {"ACL_PRECISION_MODE": "must_keep_origin_dtype"}
    applied = backend.apply_env_presets(asked=asked)
    assert applied["ACL_PRECISION_MODE"] == "must_keep_origin_dtype"
    assert npu_standin.npu._options == {"ACL_PRECISION_MODE": "must_keep_origin_dtype"}
    assert NPUBackend().opt_in_choices(["ACL_PRECISION_MODE"]) == {"ACL_PRECISION_MODE": "allow_fp32_to_fp16"}


def test_unknown_or_empty_opt_in_preset_is_refused(npu_standin, clean_npu_env) -> None:
    from difforge.errors import InputError

    with pytest.raises(InputError, match="TASK_QUEUE_ENABLE: not an opt-in preset of the npu backend"):
        NPUBackend().opt_in_choices(["TASK_QUEUE_ENABLE"])  # a default preset, not an opt-in one
    with pytest.raises(InputError, match="give a value after '='"):
        NPUBackend().opt_in_choices(["ACL_PRECISION_MODE="])
