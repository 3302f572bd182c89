"""Environment fingerprint: what software and hardware a run happened on.

Kept in the runtime layer (not the report) because every RunRecord carries it; reports only read it.
The package list is also what ``difforge doctor`` shows; the environment variables recorded are the
backends' own (each names its presets and device-visibility variable) plus the host's.
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

from ..version import __version__

if TYPE_CHECKING:
    from ..devices import Backend

#: The stack a run depends on: recorded in every fingerprint and listed by ``difforge doctor``.
PACKAGES = ("torch", "torch_npu", "torchair", "diffusers", "transformers", "accelerate", "safetensors", "tokenizers")
#: Packages only some devices need (the NPU stack); every other one in PACKAGES is required.
OPTIONAL_PACKAGES = ("torch_npu", "torchair")
#: Variables that change a run on any device (read by torch's CPU runtime); the device-specific ones
#: are the backends' (:meth:`~difforge.devices.Backend.env_var_names`).
HOST_ENV_VARS = ("OMP_NUM_THREADS",)


def recorded_env_vars() -> tuple[str, ...]:
    """Every environment variable a fingerprint records when set: each backend's, then the host's."""
    from ..devices import BACKENDS

    names = [name for cls in BACKENDS.values() for name in cls().env_var_names()]
    return tuple(dict.fromkeys([*names, *HOST_ENV_VARS]))


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

    info: dict[str, Any] = {
        "difforge": __version__,
        "difforge_git": git_revision(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "packages": {name: package_version(name) for name in PACKAGES},
        "env": {k: os.environ[k] for k in recorded_env_vars() if k in os.environ},
    }
    if backend is not None:
        info["device"] = backend.describe()
    return info
