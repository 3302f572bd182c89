"""Which graph compiler ``cfg.compile`` selects on each device, where its caches live, and when it pays.

A backend asks :func:`compile_policy` once (:meth:`difforge.devices.Backend.compile_policy`) and keeps
the answer; models only call :meth:`CompilePolicy.compile` on the function they want compiled.

Regional compile - compiling the repeated decoder layer once instead of the whole model - keeps the
compile time of a 28-layer transformer to that of one layer, and the compiled graph is reused by
every layer because the weights are graph inputs.  The choice per device:

* cuda: Inductor in its default mode.  ``max-autotune`` benchmarks every matmul shape: on the H200 it
  took 75 s at URSA 512² and did not finish in 150 s at 1024², so it is only used on request
  (``DIFFORGE_COMPILE_MODE``, :data:`MODE_ENV`).  CUDA graphs are left out (the default mode has none):
  on the reference random stream the sampler's host draws and data-dependent jump step sit between
  forwards, and graph capture of the Philox step is still to be measured.
* npu: torchair's ``get_npu_backend()`` when torchair is importable (standalone or bundled in
  torch_npu), else eager - Inductor has no Ascend code generator.
* cpu: Inductor's default mode, only when a C++ compiler is on the PATH (Inductor's CPU code
  generator needs one); else eager.
* xpu / mps: Inductor's default mode.

A device whose compiler is missing runs eager and says so: the policy carries the reason, and the
caller records it.

The compile's cost is bounded two ways.  :func:`use_compile_caches` puts Inductor's and Triton's
on-disk caches (FX graph cache, AOTAutograd cache, generated kernels) under ``DIFFORGE_HOME``, so a
second process compiling the same model pays seconds, not minutes.  :func:`auto_compile` decides,
when the run did not ask, whether compiling pays: the classic rent-or-buy rule - stay eager until
the time eager has lost (steps run so far and this call's, times an estimated saving per step) reaches
the compile's estimated cost (much lower with a warm cache).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError

#: The C++ compilers Inductor's CPU code generator can use, in the order they are looked for.
CPP_COMPILERS = ("g++", "c++", "clang++")
#: Where torchair lives: the standalone package, or bundled inside torch_npu.
TORCHAIR_MODULES = ("torchair", "torch_npu.dynamo.torchair")
#: Asks for another Inductor mode than the default, e.g. ``max-autotune-no-cudagraphs`` (slow to compile).
MODE_ENV = "DIFFORGE_COMPILE_MODE"
#: The modes torch.compile takes for Inductor.
INDUCTOR_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: The cache folders, each set only when the user has not: Inductor's (FX graph and AOTAutograd caches,
#: generated kernels) and Triton's (its compiled kernels, Inductor's and hand-written ones alike).
CACHE_ENV = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
#: Inductor's switches for its on-disk caches; a user's value wins.
CACHE_SWITCH_ENV = ("TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE")
#: Estimated seconds of a first regional compile with an empty cache, and with this model already in it.
#: Cold: the issue's goal for URSA 512² on a GPU in the default mode (max-autotune took 75 s there);
#: warm: dynamo still traces, Inductor loads its graph and kernels from disk.
COLD_COMPILE_S = 30.0
WARM_COMPILE_S = 5.0
#: Estimated share of an eager step a compiled step saves, per device type where compile may be chosen
#: without being asked.  H200, 2026-12-04: URSA 512² fp16 52.2 -> 18.1 ms/step (0.65, max-autotune),
#: Qwen-Image-Edit-Plus fp8 853 -> 599 (0.30); the lower one is used.  Absent (cpu, mps): never
#: automatic - the CPU is the reference's device, where eager's bit-exact tokens are the point.
AUTO_SAVED_SHARE = {"cuda": 0.30, "npu": 0.30, "xpu": 0.30}


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
    mode = requested_mode()
    if device_type == "cuda":
        return CompilePolicy(device_type, True, "inductor", mode, "inductor", _mode_detail(mode))
    if device_type == "cpu" and cpp_compiler() is None:
        return CompilePolicy(device_type, False, detail="no C++ compiler on PATH (Inductor's CPU backend needs one)")
    if device_type == "cpu" and os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() == "default":
        # measured with torch 2.13: Inductor still emits at::vec code, which the 'default' kernel family's
        # headers do not declare, so every compiled CPU kernel fails to build
        return CompilePolicy(device_type, False, detail="ATEN_CPU_CAPABILITY=default: Inductor's CPU kernels need "
                                                        "a vector kernel family (avx2, avx512, neon ...)")
    return CompilePolicy(device_type, True, "inductor", mode, "inductor", _mode_detail(mode))


def requested_mode() -> str | None:
    """The Inductor mode :data:`MODE_ENV` asks for (None: the default mode); an unknown one is refused."""
    mode = os.environ.get(MODE_ENV, "").strip()
    if not mode or mode == "default":
        return None
    if mode not in INDUCTOR_MODES:
        raise InputError(f"{MODE_ENV}={mode!r} is not an Inductor mode; use one of {', '.join(INDUCTOR_MODES)}.")
    return mode


def _mode_detail(mode: str | None) -> str:
    return "default mode" if mode is None else f"mode {mode} ({MODE_ENV})"


# ------------------------------------------------------------------------------------------- caches
@dataclass(frozen=True)
class CompileCaches:
    """Where this process's compile caches are, and which of them the user chose."""

    root: Path  # difforge's own folder for compile markers (under DIFFORGE_HOME)
    folders: dict[str, str]  # environment variable -> folder in force
    user_set: tuple[str, ...]  # the variables the user (or the Makefile) had set

    def marker(self, key: str) -> Path:
        """The file that says ``key`` (a model, dtype, device and shape) was compiled into these caches."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", key)[:150]
        return self.root / "compiled" / f"{name}.json"

    def is_warm(self, key: str) -> bool:
        """Whether ``key`` was compiled before with these caches (so a compile now mostly reads from disk)."""
        return self.marker(key).is_file()

    def mark(self, key: str, seconds: float) -> None:
        """Note that ``key`` is now in the caches (``seconds``: what its compile took, for the record)."""
        path = self.marker(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "compile_s": round(seconds, 3), "torch": torch.__version__}) + "\n",
                        encoding="utf-8")


def use_compile_caches(home: Path) -> CompileCaches:
    """Put Inductor's and Triton's caches under ``home/compile`` unless the user set them; keep the on-disk
    FX graph and AOTAutograd caches on unless the user switched them.

    Call it before the first compile of the process: Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` when it
    first needs its cache folder and then writes its default (``/tmp/torchinductor_<user>``) back into the
    environment.  A user's (or the Makefile's) value always wins.  Calling it again changes nothing.
    """
    root = Path(home) / "compile"
    user_set = tuple(name for name in CACHE_ENV if os.environ.get(name))
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(root / CACHE_ENV["TORCHINDUCTOR_CACHE_DIR"])
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor)
    # Triton's beside Inductor's: under ours, or under the user's Inductor folder when only that was set
    triton = os.environ.get("TRITON_CACHE_DIR") or str(Path(inductor) / CACHE_ENV["TRITON_CACHE_DIR"])
    os.environ.setdefault("TRITON_CACHE_DIR", triton)
    _cache_switches_on()
    return CompileCaches(root, {"TORCHINDUCTOR_CACHE_DIR": inductor, "TRITON_CACHE_DIR": triton}, user_set)


def _cache_switches_on() -> None:
    """The FX graph cache and the AOTAutograd cache on (torch >= 2.6 has them on already; 2.5 had the second off)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    fx_env, autograd_env = CACHE_SWITCH_ENV
    if not os.environ.get(fx_env):
        inductor_config.fx_graph_cache = True
    if not os.environ.get(autograd_env) and hasattr(functorch_config, "enable_autograd_cache"):
        functorch_config.enable_autograd_cache = True


# ------------------------------------------------------------------------------------------- when it pays
@dataclass(frozen=True)
class CompileChoice:
    """Whether a run compiles, and the one line that says why (the RunRecord's detail)."""

    compile: bool
    reason: str


def auto_compile(
    policy: CompilePolicy,
    eager_step_s: float | None,
    steps_done: int,
    steps_now: int,
    warm: bool,
) -> CompileChoice:
    """Compile without being asked only where it earns its cost back (rent or buy).

    ``eager_step_s``: a measured eager step of this model at this size (None: none yet, so no estimate);
    ``steps_done``: eager steps already run in this process at this size (each lost the saving);
    ``steps_now``: the steps of this call (its batch rides in the measured step time); ``warm``: the
    compile caches already hold this model.  Compile when the time eager has lost and would lose in this
    call - ``(steps_done + steps_now) * eager_step_s * AUTO_SAVED_SHARE`` - reaches the compile's estimated
    cost (:data:`WARM_COMPILE_S` or :data:`COLD_COMPILE_S`): never more than about twice the best choice's
    time, whatever the run's length turns out to be.
    """
    share = AUTO_SAVED_SHARE.get(policy.device_type)
    if share is None:
        return CompileChoice(False, f"auto: eager; compile is never chosen unasked on {policy.device_type} "
                                    "(the reference's device keeps eager's exact tokens; --compile asks)")
    if not policy.available:
        return CompileChoice(False, f"auto: eager; no compiler here ({policy.detail})")
    if eager_step_s is None:
        return CompileChoice(False, "auto: eager; no eager step measured yet at this size to estimate the saving")
    cost = WARM_COMPILE_S if warm else COLD_COMPILE_S
    lost = (steps_done + steps_now) * eager_step_s * share
    cache = "warm cache" if warm else "cold cache"
    numbers = (f"{steps_done} + {steps_now} steps x {1000 * eager_step_s:.1f} ms x {share:.2f} saved = {lost:.1f} s "
               f"{'>=' if lost >= cost else '<'} {cost:.0f} s estimated compile ({cache})")
    return CompileChoice(lost >= cost, f"auto: {'compiled' if lost >= cost else 'eager'}; {numbers}")
