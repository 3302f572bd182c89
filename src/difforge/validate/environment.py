"""Environment fingerprint of a validation: the runtime fingerprint plus both devices, the
driver/CANN versions, the backend's env presets and a hash of the full validation config."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from ..devices import Backend
from ..runtime.environment import environment_fingerprint, package_version


def config_hash(obj: Any) -> str:
    """sha256 of the canonical JSON of the full validation configuration."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint(dut: Backend, reference: Backend, config: dict[str, Any]) -> dict[str, Any]:
    """Everything needed to tell whether two reports come from the same setup."""
    info = environment_fingerprint(dut)
    dut_info = info.pop("device", None) or dut.describe()
    packages = dict(info.get("packages", {}))
    for extra in ("torchmetrics", "numpy", "pillow"):
        packages.setdefault(extra, package_version(extra))
    packages["python"] = info.get("python")
    packages["difforge"] = info.get("difforge")
    info["packages"] = packages
    info["device_under_test"] = dut_info
    info["reference_device"] = reference.describe()
    info["driver"] = {
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "cann": dut_info.get("cann"),
        "torch_npu": dut_info.get("torch_npu"),
    }
    info["env_presets"] = {
        "applied": dict(dut.applied_presets),
        "recommended": [
            {"name": p.name, "value": p.value, "why": p.why, "opt_in": p.opt_in} for p in dut.env_presets()
        ],
    }
    info["config_hash"] = config_hash(config)
    return info
