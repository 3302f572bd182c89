"""CPU backend: always present; the float32 reference device.

Nothing here comes from ``torch.accelerator``: the CPU is not an accelerator to torch, the host has no
caching allocator to sync or empty, and what a run can still allocate is the host's free memory
under the process's cgroup limit, read below.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import ClassVar

import psutil
import torch

from .base import REFERENCE_STREAM, Backend

#: A cgroup memory limit at or above this is "no limit" (v1 reports 2**63 rounded down to a page).
_UNLIMITED = 1 << 60


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2, no limit) -> None


def _stat_value(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except (OSError, UnicodeDecodeError):
        pass
    return 0


def meminfo_available(proc: Path = Path("/proc")) -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` (Linux on any architecture), in bytes."""
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                fields = line.split()
                return int(fields[1]) * 1024 if fields[-1] == "kB" else int(fields[1])
    except (OSError, UnicodeDecodeError, ValueError, IndexError):
        pass
    return None


def cgroup_available(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What the process's memory cgroup still allows (limit - usage + reclaimable file cache), or None.

    A container's limit is invisible in ``/proc/meminfo`` (that file describes the whole host), so a
    job limited to 8 GiB on a 128 GiB machine would otherwise be told it has 120 GiB.  cgroup v2
    (``memory.max``) and v1 (``memory/memory.limit_in_bytes``) are both read.
    """
    for limit_file, usage_file, stat_file, inactive in (
        (root / "memory.max", root / "memory.current", root / "memory.stat", "inactive_file"),
        (
            root / "memory" / "memory.limit_in_bytes",
            root / "memory" / "memory.usage_in_bytes",
            root / "memory" / "memory.stat",
            "total_inactive_file",
        ),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is None or usage is None or limit >= _UNLIMITED:
            continue
        return max(0, limit - max(0, usage - _stat_value(stat_file, inactive)))
    return None


def host_available_memory() -> int | None:
    """Bytes the host can still give this process: MemAvailable, capped by a cgroup limit.

    Falls back to psutil (macOS, Windows) and then to ``os.sysconf`` free pages (an underestimate:
    it leaves out the reclaimable page cache).
    """
    found = meminfo_available()
    if found is None:
        try:
            found = int(psutil.virtual_memory().available)
        except Exception:
            found = None
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            found = None
    limited = cgroup_available()
    if limited is not None:
        found = limited if found is None else min(found, limited)
    return found


class CPUBackend(Backend):
    name: ClassVar[str] = "cpu"
    is_host: ClassVar[bool] = True
    # float16 is refused on the CPU: many CPU kernels lack half support or emulate it very slowly;
    # bfloat16 is the reduced-precision dtype to test a port's numerics on a CPU-only machine.
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16)
    # The float32 reference device: it keeps the reference's own CPU stream, so its tokens are the
    # reference's bit for bit; ``--fast philox-rng`` gives the tokens an accelerator draws instead.
    random_stream: ClassVar[str] = REFERENCE_STREAM

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def device_count(cls) -> int:
        return 1  # the host is one device to torch; torch.accelerator never describes it

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def device_name(self) -> str:
        import platform

        return platform.processor() or platform.machine() or "cpu"

    def total_memory_bytes(self) -> int | None:
        return int(psutil.virtual_memory().total)

    def available_memory_bytes(self) -> int | None:
        return host_available_memory()

    def synchronize(self) -> None:
        return None

    def reset_peak_memory(self) -> None:
        return None

    def peak_memory_bytes(self) -> int | None:
        # Host memory is tracked separately (peak RSS) by the phase timer.
        return None

    def memory_allocated_bytes(self) -> int | None:
        return None

    def empty_cache(self) -> None:
        return None

    def preferred_dtype(self) -> torch.dtype:
        # bf16/fp16 matmuls on CPU are slow and lossy; float32 is the reference dtype.
        return torch.float32


@functools.cache
def fused_sdpa_low_precision_ok() -> bool:
    """Whether torch's fused CPU attention kernel can run bf16/fp16 in this process.

    On a CPU with AMX tiles (Sapphire Rapids and later), torch 2.13's flash kernel takes its AMX path
    from the hardware, but the packing it calls checks the *dispatch* level: with
    ``ATEN_CPU_CAPABILITY`` set below avx512 (how the parity tests pin kernels, and how a user may) every
    bf16 call raises "pack_vnni2 is only supported when avx512 is supported".  Seen on an Intel Xeon
    with AMX under ``ATEN_CPU_CAPABILITY=default``; where False, attention runs SDPA's math kernel.
    """
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return not amx or torch.backends.cpu.get_cpu_capability() == "AVX512"
