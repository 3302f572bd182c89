"""Environment fingerprint: what software and hardware a run happened on.

Kept in the runtime layer (not the report) because every RunRecord carries it; reports only read it.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..devices import Backend

PACKAGES = ("torch", "torch_npu", "torchair", "diffusers", "transformers", "accelerate", "safetensors", "tokenizers")
#: Environment variables that change how a run behaves on some backend; recorded when set.
ENV_VARS = (
    "PYTORCH_NPU_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TASK_QUEUE_ENABLE",
    "CPU_AFFINITY_CONF",
    "ACL_PRECISION_MODE",
    "HCCL_OP_EXPANSION_MODE",
    "ASCEND_RT_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "PYTORCH_ENABLE_MPS_FALLBACK",
)


def package_version(name: str) -> str | None:
    for dist in (name, name.replace("_", "-")):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def git_revision() -> str | None:
    """The difforge checkout's commit (with '+dirty'), or None when installed from a wheel."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (rev + ("+dirty" if dirty else "")) if rev else None


def environment_fingerprint(backend: Backend | None = None) -> dict[str, Any]:
    """Versions, platform, relevant env vars and (optionally) the device under use."""
    import torch

    from .. import __version__

    info: dict[str, Any] = {
        "difforge": __version__,
        "difforge_git": git_revision(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "packages": {name: package_version(name) for name in PACKAGES},
        "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
    }
    if backend is not None:
        info["device"] = backend.describe()
    return info
