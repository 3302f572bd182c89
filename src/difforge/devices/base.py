"""The one small protocol every device backend implements.

A backend answers the questions the rest of difforge asks about an accelerator: is it here, which
``torch.device`` is it, how do I wait for it, how much memory did the last phase peak at, which
dtype should I default to and which fused kernels may I use.  Everything device-specific lives in
one backend file; the rest of the code only talks to this protocol.

What comes from ``torch.accelerator`` and what does not
--------------------------------------------------------
``torch.accelerator`` speaks for one device type per process: the accelerator this torch build was
compiled for (cuda, xpu, mps), or the out-of-tree one registered through PrivateUse1 (the real
torch_npu registers ``npu``).  When that is this backend's type, the device-agnostic calls go
through it:

* ``synchronize`` -> ``torch.accelerator.synchronize`` and ``device_count`` ->
  ``torch.accelerator.device_count`` (both torch >= 2.6);
* ``reset_peak_memory`` / ``peak_memory_bytes`` / ``memory_allocated_bytes`` / ``empty_cache`` ->
  ``torch.accelerator.reset_peak_memory_stats`` / ``max_memory_allocated`` / ``memory_allocated`` /
  ``empty_cache``, and the reserved-but-unused term of ``available_memory_bytes`` ->
  ``torch.accelerator.memory_reserved`` (torch >= 2.8);
* the free memory of ``available_memory_bytes`` -> ``torch.accelerator.get_memory_info``
  (torch >= 2.10).

The device module (``torch.cuda``, ``torch.xpu``, ``torch.mps``, ``torch.npu`` / ``torch_npu.npu``)
answers instead when ``torch.accelerator`` is not driving this device type (another accelerator is
current, or this torch has none), when this torch predates the call (difforge supports torch >= 2.5,
so each call is looked up, not assumed), and when the call raises ``RuntimeError`` /
``NotImplementedError`` / ``ValueError`` - what ``torch.accelerator`` does when the device's own
backend has not implemented the hook behind it (an out-of-tree allocator that is not a
``c10::DeviceAllocator``).  The vendor module is the authority ``torch.accelerator`` delegates to, so
asking it gives the same answer.

Never from ``torch.accelerator``: availability (each backend asks its own module, because
``torch.accelerator.is_available()`` only answers for the current accelerator), the device name and
total memory (``torch.accelerator`` has no name or properties call), and everything host-side - the
CPU backend keeps its own host-memory logic (MemAvailable, cgroup limits), since the CPU is not an
accelerator and ``torch.accelerator`` never describes it.  MPS keeps its Metal-specific memory
counters for the same reason (see :mod:`difforge.devices.mps`).

Device arguments are whatever :meth:`Backend._device_arg` returns: the ``torch.device`` by default,
an int index on the NPU (see :mod:`difforge.devices.npu`).  ``torch.accelerator`` takes either.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, ClassVar

import torch

from ..errors import DtypeError, InputError
from .compile import CompilePolicy, compile_policy

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the spelling used in configs and records."""
    return str(dtype).removeprefix("torch.")


#: The random streams a run can draw from (see :attr:`Backend.random_stream`).
#: ``philox``: the portable counter-based stream (:mod:`difforge.runtime.philox`), computed on the
#: run device from (seed, step, position), the same numbers on every backend.
PHILOX_STREAM = "philox"
#: ``reference``: the reference implementation's own stream, a CPU ``torch.Generator``
#: (:meth:`Backend.generator`), drawn on the host in the reference's order and copied to the device.
REFERENCE_STREAM = "reference"
RANDOM_STREAMS = (PHILOX_STREAM, REFERENCE_STREAM)

#: Exceptions with which ``torch.accelerator`` says "this device's backend does not implement that":
#: ``RuntimeError`` (a ``TORCH_CHECK`` in c10, e.g. an allocator that is not a DeviceAllocator),
#: ``NotImplementedError`` (``TORCH_CHECK_NOT_IMPLEMENTED``) and ``ValueError`` (a device argument its
#: index parser refuses).  The device module is asked instead; if it fails too, its error propagates.
_ACCELERATOR_DECLINES = (RuntimeError, NotImplementedError, ValueError)


class _NoAnswer:
    """Returned by :meth:`Backend._device_call` when neither torch.accelerator nor the module has the call."""


NO_ANSWER = _NoAnswer()


def current_accelerator_module(device_type: str) -> ModuleType | None:
    """``torch.accelerator`` when it drives ``device_type`` in this process, else None.

    None on a torch without ``torch.accelerator`` (< 2.6), on a CPU-only build (no current
    accelerator), when another device type is current, and when asking raises (a PrivateUse1 backend
    renamed without a device module behind it makes torch.accelerator raise for the process).
    """
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return None
    try:
        current = accelerator.current_accelerator()
    except Exception:  # noqa: BLE001 - "cannot tell" means "not driven by torch.accelerator"
        return None
    return accelerator if current is not None and current.type == device_type else None


@dataclass
class EnvPreset:
    """An environment variable a backend recommends, and whether difforge applied it."""

    name: str
    value: str
    why: str
    opt_in: bool = False  # precision-reducing presets are only applied when asked for


@dataclass
class Backend(ABC):
    """Base backend: the device-agnostic behaviour, built on ``torch.accelerator`` where possible."""

    index: int | None = None
    applied_presets: dict[str, str] = field(default_factory=dict)
    _compile_policy: CompilePolicy | None = field(default=None, init=False, repr=False, compare=False)

    name: ClassVar[str] = "base"
    #: Fused ops this backend provides (names used by :mod:`difforge.ops`).
    fused_ops: ClassVar[frozenset[str]] = frozenset()
    #: dtypes the backend can compute in; ``auto`` picks :meth:`preferred_dtype`.
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16, torch.float16)
    #: Whether this backend's attention kernel writes the full ``L x L`` score matrix (a math-path
    #: SDPA).  Memory estimates add it only here: flash / memory-efficient kernels (CPU, CUDA, NPU's
    #: fusion attention) never hold it, and counting it there would refuse sizes that run fine.
    attention_materialises_scores: ClassVar[bool] = False
    #: Whether a host-to-device copy from page-locked memory overlaps the host on this device
    #: (cuda, npu, xpu).  URSA's per-step host random draws use it; on the CPU there is no copy.
    pinned_host_copies: ClassVar[bool] = False
    #: The random stream a run draws from when it does not name one (URSA: ``--fast``/``--disable
    #: philox-rng``).  Every accelerator draws on the device from the portable Philox stream, so the
    #: sampler never waits for host draws and a seed gives the same numbers on every backend; the CPU
    #: backend keeps the reference's own CPU stream (bit-exact parity with the reference).
    random_stream: ClassVar[str] = PHILOX_STREAM
    #: Whether the device is the host itself: its memory is host memory (estimates count weights and
    #: activations once) and there is nowhere to offload to.
    is_host: ClassVar[bool] = False
    #: The variable that hides or reorders this kind of device (``CUDA_VISIBLE_DEVICES`` ...), if any.
    visible_devices_env: ClassVar[str | None] = None
    #: Other variables that change how a run on this device behaves without being presets.
    extra_env_vars: ClassVar[tuple[str, ...]] = ()
    #: The torch.distributed process-group backend for ``--parallel`` runs on this device (hccl on the
    #: NPU, nccl on CUDA, gloo everywhere else); :mod:`difforge.runtime.parallel` asks, and records it.
    dist_backend: ClassVar[str] = "gloo"

    # ---- presence -------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def is_available(cls) -> bool:
        """Whether this kind of device is usable in this process (each backend answers for itself)."""

    @classmethod
    def device_count(cls) -> int:
        """Devices of this kind: torch.accelerator's count when it drives this type, else the module's."""
        if not cls.is_available():
            return 0
        accelerator = current_accelerator_module(cls.name)
        if accelerator is not None and hasattr(accelerator, "device_count"):
            return int(accelerator.device_count())
        count = getattr(cls._module(), "device_count", None)
        return int(count()) if count is not None else 1

    @classmethod
    def rank_index(cls, local_rank: int) -> int | None:
        """The device index of a ``--parallel`` rank: ``LOCAL_RANK`` modulo the devices of this kind where
        there are several, None (the one device) where there is one (the CPU: every rank on ``cpu``)."""
        count = cls.device_count()
        return local_rank % count if count > 1 else None

    @property
    def device(self) -> torch.device:
        return torch.device(self.name) if self.index is None else torch.device(self.name, self.index)

    def __str__(self) -> str:
        return str(self.device)

    # ---- the device module (torch.cuda, torch.npu, torch.xpu, torch.mps) ------------------
    @classmethod
    def _module(cls) -> Any | None:
        """The device module, for what torch.accelerator does not cover or cannot answer."""
        return getattr(torch, cls.name, None)

    def _device_arg(self) -> Any:
        """What torch.accelerator and device-module calls take for this device (``torch.device`` here)."""
        return self.device

    def _device_call(self, name: str, module_name: str | None = None, with_device: bool = True) -> Any:
        """``torch.accelerator.<name>`` when it drives this device, else the module's ``<module_name>``.

        ``module_name`` defaults to ``name`` (the two APIs share most names; ``get_memory_info`` is
        ``mem_get_info`` on the modules).  Returns :data:`NO_ANSWER` when neither has the call, so
        callers can tell "unsupported" from a real zero.  See the module docstring for when the module
        answers instead of torch.accelerator.
        """
        args = (self._device_arg(),) if with_device else ()
        accelerator = current_accelerator_module(self.name)
        call: Callable[..., Any] | None = getattr(accelerator, name, None) if accelerator is not None else None
        if call is not None:
            try:
                return call(*args)
            except _ACCELERATOR_DECLINES:
                pass  # the device's backend lacks this torch.accelerator hook: its own module answers
        module = self._module()
        call = getattr(module, module_name or name, None) if module is not None else None
        return NO_ANSWER if call is None else call(*args)

    def device_name(self) -> str:
        mod = self._module()
        if mod is not None and hasattr(mod, "get_device_name"):
            return str(mod.get_device_name(self._device_arg()))
        return self.name

    def total_memory_bytes(self) -> int | None:
        mod = self._module()
        if mod is not None and hasattr(mod, "get_device_properties"):
            return int(mod.get_device_properties(self._device_arg()).total_memory)
        return None

    def available_memory_bytes(self) -> int | None:
        """Bytes a new allocation can still get on this device now, or None when the backend cannot say.

        Pipelines compare their memory estimate with this *before* allocating, so a size that cannot
        fit is refused with one sentence instead of an out-of-memory crash (or, on the host, the OOM
        killer).  The free bytes come from ``torch.accelerator.get_memory_info`` or the module's
        ``mem_get_info`` (both ``(free, total)``); blocks torch's caching allocator holds but no tensor
        uses are added back, since the driver counts them as taken but torch can reuse them.  A
        device that cannot answer gives None and the caller skips the check, recording why.
        """
        try:
            info = self._device_call("get_memory_info", "mem_get_info")
        except Exception:  # noqa: BLE001 - a driver that cannot answer is "unknown", never a crash
            return None
        if info is NO_ANSWER:
            return None
        free = int(info[0])
        try:
            reserved, allocated = self._device_call("memory_reserved"), self._device_call("memory_allocated")
        except Exception:  # noqa: BLE001 - the free figure alone is still a (conservative) answer
            return free
        if reserved is not NO_ANSWER and allocated is not NO_ANSWER:
            free += max(0, int(reserved) - int(allocated))
        return free

    def synchronize(self) -> None:
        self._device_call("synchronize")

    def reset_peak_memory(self) -> None:
        self._device_call("reset_peak_memory_stats")

    def peak_memory_bytes(self) -> int | None:
        peak = self._device_call("max_memory_allocated")
        return None if peak is NO_ANSWER else int(peak)

    def memory_allocated_bytes(self) -> int | None:
        allocated = self._device_call("memory_allocated")
        return None if allocated is NO_ANSWER else int(allocated)

    def empty_cache(self) -> None:
        self._device_call("empty_cache", with_device=False)

    # ---- randomness -------------------------------------------------------------------------
    def generator(self, seed: int) -> torch.Generator:
        """A CPU generator: the same seed gives the same noise on every backend (see DESIGN).

        This is the ``reference`` stream's source; the ``philox`` stream (:attr:`random_stream`) is
        keyed by the same seed (``generator(seed).initial_seed()``) and needs no generator object.
        """
        return torch.Generator("cpu").manual_seed(int(seed))

    # ---- dtypes -----------------------------------------------------------------------------
    def preferred_dtype(self) -> torch.dtype:
        return torch.bfloat16

    def resolve_dtype(self, spec: str | torch.dtype | None) -> torch.dtype:
        """Map ``auto``/a name/a dtype to a dtype this backend computes in, or raise DtypeError."""
        if spec is None or spec == "auto":
            return self.preferred_dtype()
        if isinstance(spec, torch.dtype):
            dtype = spec
        else:
            key = str(spec).lower().removeprefix("torch.")
            if key not in DTYPES:
                raise DtypeError(
                    f"Unknown dtype '{spec}'; use one of auto, float32, bfloat16, float16."
                )
            dtype = DTYPES[key]
        if dtype not in self.supported_dtypes:
            names = ", ".join(dtype_name(d) for d in self.supported_dtypes)
            raise DtypeError(f"dtype {dtype_name(dtype)} is not supported on {self.name}; use one of {names}.")
        return dtype

    # ---- environment presets ------------------------------------------------------------------
    def env_presets(self) -> list[EnvPreset]:
        return []

    def env_var_names(self) -> tuple[str, ...]:
        """Every variable that changes a run on this device: the presets, device visibility, the extras.

        The environment fingerprint records these when set, so the names live with the backend
        that knows them rather than in a second list.
        """
        visible = (self.visible_devices_env,) if self.visible_devices_env else ()
        return (*(p.name for p in self.env_presets()), *visible, *self.extra_env_vars)

    def opt_in_choices(self, asked: Sequence[str]) -> dict[str, str]:
        """``--preset NAME`` / ``NAME=VALUE`` -> {name: value}: the opt-in presets a user asked for.

        An opt-in preset trades precision for speed (``ACL_PRECISION_MODE`` on the NPU), so it is never
        applied unless named; a name that is not an opt-in preset of this backend is an InputError.
        """
        known = {p.name: p for p in self.env_presets() if p.opt_in}
        out: dict[str, str] = {}
        for item in asked:
            name, sep, value = str(item).partition("=")
            name = name.strip()
            if name not in known:
                have = ", ".join(known) or "none"
                raise InputError(f"--preset {item}: not an opt-in preset of the {self.name} backend (its "
                                 f"opt-in presets: {have}); 'difforge doctor' lists every backend's.")
            if sep and not value.strip():
                raise InputError(f"--preset {item}: give a value after '=', or the name alone for "
                                 f"{known[name].value}.")
            out[name] = value.strip() if sep else known[name].value
        return out

    def apply_env_presets(self, opt_in: bool = False, asked: Mapping[str, str] | None = None) -> dict[str, str]:
        """Set recommended env vars the user has not set; returns (and remembers) what was applied.

        Opt-in presets apply only when ``opt_in`` or when named in ``asked`` (:meth:`opt_in_choices`,
        whose value then replaces the preset's); a variable the user exported always wins.
        """
        asked = dict(asked or {})
        for preset in self.env_presets():
            if preset.opt_in and not (opt_in or preset.name in asked):
                continue
            if preset.name in os.environ:
                continue
            value = asked.get(preset.name, preset.value)
            os.environ[preset.name] = value
            self.applied_presets[preset.name] = value
        return dict(self.applied_presets)

    # ---- kernels and compilers: chosen here, once, for every model --------------------------------
    def has_fused(self, op: str) -> bool:
        return op in self.fused_ops

    def fused_kernel(self, op: str) -> Any | None:
        """The vendor kernel implementing ``op`` (a name in :data:`difforge.ops.OP_NAMES`) on this device,
        or None when the portable PyTorch path is used.  Only the NPU backend has any."""
        return None

    def sdpa_note(self) -> str:
        """Why plain SDPA is still the fast attention here ("" when nothing needs saying)."""
        return "SDPA picks flash/efficient kernels itself" if self.has_fused("attention") else ""

    def diffusers_attention(self, dtype: torch.dtype, allow_fused: bool = True) -> tuple[str, str]:
        """The diffusers attention backend for ``dtype`` and a note on why: ``("native", "")`` = SDPA.

        Overridden by a backend whose vendor kernel diffusers can dispatch to (the NPU's).
        """
        return "native", ""

    def compile_policy(self) -> CompilePolicy:
        """How ``--compile`` compiles on this device, decided on first use and kept for the backend's life."""
        if self._compile_policy is None:
            self._compile_policy = compile_policy(self.name)
        return self._compile_policy

    def sdpa_kernels(self) -> list[str]:
        """The SDPA kernels torch may pick on this device, where torch exposes switches for them ([] elsewhere)."""
        return []

    # ---- introspection --------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What the RunRecord and `difforge doctor` show about this backend."""
        return {
            "backend": self.name,
            "device": str(self),  # str(self): the NPU names its device without building a torch.device
            "device_name": self.device_name(),
            "device_count": self.device_count(),
            "total_memory_bytes": self.total_memory_bytes(),
            "fused_ops": sorted(self.fused_ops),
            "random_stream": self.random_stream,  # the default; a run's own is in its adaptations
            "env_presets_applied": dict(self.applied_presets),
        }
