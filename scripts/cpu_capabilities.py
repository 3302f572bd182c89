"""Print the ATEN_CPU_CAPABILITY values the parity tests also run under, besides the native one.

Why: a float pin that holds for one kernel family only (AVX-512, AVX2, the portable path) must not land,
so CI reruns the parity files with each lower capability this CPU can execute.  Asking for one the CPU
lacks kills the process with an illegal instruction, so only capabilities below or equal to torch's own
choice are printed; on aarch64 (Ascend hosts) that is the portable ``default`` path.
"""

from __future__ import annotations

import torch

# torch's x86 kernel families, lowest first; every other architecture has only "default" below native.
X86_LADDER = ["default", "avx2", "avx512"]


def lower_capabilities(native: str) -> list[str]:
    """Capabilities other than ``native`` that this CPU can run, lowest first."""
    native = native.lower()
    if native in X86_LADDER:
        return X86_LADDER[: X86_LADDER.index(native)]
    return [] if native == "default" else ["default"]


def main() -> None:
    print(" ".join(lower_capabilities(torch.backends.cpu.get_cpu_capability())))


if __name__ == "__main__":
    main()
