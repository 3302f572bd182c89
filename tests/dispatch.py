"""Whether this test process runs torch's CPU kernels below the host's own level (``ATEN_CPU_CAPABILITY``)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import torch


@functools.cache
def native_cpu_capability() -> str:
    """The level torch picks on this host when nothing lowers it (asked in a fresh process without the variable)."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip()


def dispatch_lowered() -> bool:
    """True when eager kernels run below the host's level.  Inductor generates code for the host's ISA
    whatever the variable says, so compiled and eager are no longer the same machine's arithmetic and a
    bit-for-bit comparison of them claims what the project never promises (seen: avx2 on an AVX-512 host)."""
    return "ATEN_CPU_CAPABILITY" in os.environ and torch.backends.cpu.get_cpu_capability() != native_cpu_capability()


LOWERED_REASON = "ATEN_CPU_CAPABILITY lowers eager kernels below the host ISA Inductor compiles for"
