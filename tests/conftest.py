"""Shared test set-up: an isolated DIFFORGE_HOME (tiny models built once per session) and quiet runs."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# Tiny checkpoints are deterministic, so every worker may share one cache; `make test` points it
# at the repo's .difforge-home.  Direct pytest runs get one too.
os.environ.setdefault("DIFFORGE_HOME", str(Path(__file__).resolve().parent.parent / ".difforge-home"))
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# Triton chooses compiled or interpreted when it is imported, and test modules collected before
# tests/ops/triton (URSA's compile tests) import it through Inductor: set the interpreter here, first, wherever
# there is no GPU, or the kernel tests of tests/ops/triton skip in the whole suite (they did: 40 skips in CI).
if importlib.util.find_spec("triton") is not None and "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def available(monkeypatch: pytest.MonkeyPatch):
    """``available(8 * 2**30)``: the memory the CPU backend reports from now on (None = cannot say).

    Memory-estimate tests set it so they never depend on this machine's RAM.
    """
    from difforge.devices.cpu import CPUBackend
    from difforge.runtime.memory import SKIP_ENV

    monkeypatch.delenv(SKIP_ENV, raising=False)

    def set_to(n: int | None) -> None:
        monkeypatch.setattr(CPUBackend, "available_memory_bytes", lambda self: n)

    return set_to


@pytest.fixture
def tmp_out(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    return out


STANDIN_DIR = Path(__file__).resolve().parent / "standin"


@pytest.fixture
def npu_standin(monkeypatch: pytest.MonkeyPatch):
    """Make ``import torch_npu`` return the CPU stand-in (tests/standin/torch_npu) for one test.

    The stand-in follows the real torch_npu function signatures but computes on the CPU; it lets
    the NPU code paths run here.  It is not the real library and proves nothing about Ascend
    kernels' numerics.
    """
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(STANDIN_DIR))
    for name in [m for m in sys.modules if m == "torch_npu" or m.startswith("torch_npu.")]:
        monkeypatch.delitem(sys.modules, name)
    module = importlib.import_module("torch_npu")
    yield module
    for name in [m for m in sys.modules if m == "torch_npu" or m.startswith("torch_npu.")]:
        sys.modules.pop(name, None)
