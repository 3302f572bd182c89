"""Which graph compiler ``cfg.compile`` selects on each device: the compile half of the device policy.

A backend asks :func:`compile_policy` once (:meth:`difforge.devices.Backend.compile_policy`) and keeps
the answer; models only call :meth:`CompilePolicy.compile` on the function they want compiled.

Regional compile - compiling the repeated decoder layer once instead of the whole model - keeps the
compile time of a 28-layer transformer to that of one layer, and the compiled graph is reused by
every layer because the weights are graph inputs.  The choice per device:

* cuda: Inductor, mode ``max-autotune-no-cudagraphs``.  CUDA graphs are left out because, on the
  reference random stream, the sampler's host draws and data-dependent jump step sit between forwards
  (the default Philox stream has neither; CUDA graphs there are still to be measured).
* npu: torchair's ``get_npu_backend()`` when torchair is importable (standalone or bundled in
  torch_npu), else eager - Inductor has no Ascend code generator.
* cpu: Inductor's default mode, only when a C++ compiler is on the PATH (Inductor's CPU code
  generator needs one); else eager.
* xpu / mps: Inductor's default mode.

A device whose compiler is missing runs eager and says so: the policy carries the reason, and the
caller records it.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

#: The C++ compilers Inductor's CPU code generator can use, in the order they are looked for.
CPP_COMPILERS = ("g++", "c++", "clang++")
#: Where torchair lives: the standalone package, or bundled inside torch_npu.
TORCHAIR_MODULES = ("torchair", "torch_npu.dynamo.torchair")


def cpp_compiler() -> str | None:
    """The path of the first C++ compiler on PATH, or None (then Inductor cannot compile on the CPU)."""
    return next((path for path in map(shutil.which, CPP_COMPILERS) if path), None)


@dataclass(frozen=True)
class CompilePolicy:
    """How to compile on one device: ``backend`` is a torch.compile backend (a name or a callable)."""

    device_type: str
    available: bool
    backend: str | Callable[..., Any] | None = None
    mode: str | None = None
    label: str = "eager"
    detail: str = ""

    def compile(self, fn: Callable[..., Any]) -> Callable[..., Any] | None:
        """``torch.compile(fn)`` per this policy with static shapes; ``None`` when the policy is eager.

        ``dynamic=False``: a run's shapes are fixed per size, and a size change recompiles (bounded by
        dynamo's recompile limit) rather than paying for symbolic shapes on every call.
        """
        if not self.available:
            return None
        return torch.compile(fn, **self.torch_compile_kwargs())

    def torch_compile_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``torch.compile`` (also what diffusers' ``compile_repeated_blocks`` takes)."""
        kwargs: dict[str, Any] = {"backend": self.backend, "dynamic": False}
        if self.mode is not None:
            kwargs["mode"] = self.mode
        return kwargs


def _torchair_backend() -> tuple[Callable[..., Any] | None, str]:
    """torchair's NPU backend and where it came from, or ``(None, reason)``."""
    for name in TORCHAIR_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        try:
            config = module.CompilerConfig()
            return module.get_npu_backend(compiler_config=config), name
        except Exception as exc:  # noqa: BLE001 - any failure means "run eager", with the reason recorded
            return None, f"{name}.get_npu_backend() failed: {exc}"
    return None, "torchair is not importable"


def compile_policy(device_type: str) -> CompilePolicy:
    """The compile choice for ``device_type`` (``cuda``, ``npu``, ``cpu`` ...)."""
    if not hasattr(torch, "compile"):
        return CompilePolicy(device_type, False, detail="this torch has no torch.compile")
    if device_type == "npu":
        backend, where = _torchair_backend()
        if backend is None:
            return CompilePolicy(device_type, False, detail=where)
        return CompilePolicy(device_type, True, backend, None, "torchair", f"{where}.get_npu_backend()")
    if device_type == "cuda":
        return CompilePolicy(device_type, True, "inductor", "max-autotune-no-cudagraphs", "inductor",
                             "mode max-autotune-no-cudagraphs")
    if device_type == "cpu" and cpp_compiler() is None:
        return CompilePolicy(device_type, False, detail="no C++ compiler on PATH (Inductor's CPU backend needs one)")
    if device_type == "cpu" and os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() == "default":
        # measured with torch 2.13: Inductor still emits at::vec code, which the 'default' kernel family's
        # headers do not declare, so every compiled CPU kernel fails to build
        return CompilePolicy(device_type, False, detail="ATEN_CPU_CAPABILITY=default: Inductor's CPU kernels need "
                                                        "a vector kernel family (avx2, avx512, neon ...)")
    return CompilePolicy(device_type, True, "inductor", None, "inductor", "default mode")
