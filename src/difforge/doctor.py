"""``difforge doctor``: what a user checks first when a run will not start or runs slowly.

It answers, in one screen: which devices difforge can see (per backend, with name, count and memory),
which versions of the stack are installed (torch, torch_npu, CANN, diffusers ...), which environment
presets a run would apply and which the user already set, which attention and compile backends
exist, and -- one line each -- what is missing and how to fix it.

Nothing heavy is imported at module import: ``difforge doctor --help`` must stay instant, and
importing torch_npu has side effects, so every probe imports what it needs inside its function.
Every probe is wrapped so one broken component is reported rather than crashing the report.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

PACKAGES = ("torch", "torch_npu", "diffusers", "transformers", "accelerate", "safetensors")
#: Optional attention kernels: (report name, importable module, what it is).
OPTIONAL_ATTENTION = (
    ("flash_attn", "flash_attn", "FlashAttention-2 (CUDA)"),
    ("xformers", "xformers", "xFormers memory-efficient attention"),
    ("sageattention", "sageattention", "SageAttention (quantised QK)"),
)
CPP_COMPILERS = ("g++", "c++", "clang++")


# ---- collecting ---------------------------------------------------------------------------------------
def collect_doctor() -> dict[str, Any]:
    """Probe this machine; returns a JSON-serialisable dict (``difforge doctor --json`` prints it)."""
    info: dict[str, Any] = {
        "difforge": _difforge_version(),
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
        },
    }
    info["packages"] = _packages()
    info["torch_npu"] = _torch_npu_info()
    info["cann"] = _safe(_cann)
    info["backends"] = _backends()
    info["auto"] = _auto_choice(info["backends"])
    info["env_presets"] = _env_presets(info["backends"])
    info["attention"] = _attention(info)
    info["diffusers_attention_backends"] = _safe(_diffusers_attention_backends)
    info["compile"] = _compile(info)
    info["missing"] = _missing(info)
    return info


def _safe(fn: Callable[[], T], default: Any = None) -> T | Any:
    try:
        return fn()
    except Exception:
        return default


def _difforge_version() -> str:
    from . import __version__

    return __version__


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _packages() -> dict[str, str | None]:
    versions = {name: _dist_version(name) for name in PACKAGES}
    torch_version = _safe(lambda: __import__("torch").__version__)
    if torch_version:
        versions["torch"] = torch_version
    return versions


def _torch_npu_info() -> dict[str, Any]:
    """Installed? importable? which version? the test stand-in? (from the module when it imports)."""
    from .devices.npu import torch_npu_import_error, torch_npu_module

    mod = torch_npu_module()
    if mod is None:
        error = torch_npu_import_error()
        return {
            "importable": False,
            "version": _dist_version("torch_npu"),
            "error": error,
            "standin": False,
        }
    return {
        "importable": True,
        "version": str(getattr(mod, "__version__", None) or _dist_version("torch_npu")),
        "error": None,
        "standin": bool(getattr(mod, "__standin__", False)),
    }


def _cann() -> str | None:
    from .devices.npu import cann_version

    return cann_version()


def _backends() -> list[dict[str, Any]]:
    """Every backend in auto order, with its devices; a backend whose probe fails says why."""
    from .devices import AUTO_ORDER, BACKENDS

    out = []
    for name in AUTO_ORDER:
        cls = BACKENDS[name]
        entry: dict[str, Any] = {"name": name, "available": False, "count": 0, "devices": [], "error": None}
        try:
            entry["available"] = bool(cls.is_available())
            entry["count"] = int(cls.device_count()) if entry["available"] else 0
            for i in range(entry["count"]):
                backend = cls(index=None if name in ("cpu", "mps") else i)
                entry["devices"].append(
                    {
                        "index": i,
                        "device": str(backend),
                        "name": _safe(backend.device_name),
                        "total_memory_bytes": _safe(backend.total_memory_bytes),
                    }
                )
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
        out.append(entry)
    return out


def _auto_choice(backends: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``--device auto --dtype auto`` would pick here."""
    from .devices import BACKENDS
    from .devices.base import dtype_name

    for entry in backends:
        if entry["available"]:
            backend = BACKENDS[entry["name"]]()
            return {
                "backend": entry["name"],
                "dtype": _safe(lambda b=backend: dtype_name(b.preferred_dtype())),
            }
    return {"backend": "cpu", "dtype": "float32"}


def _env_presets(backends: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each backend's presets, and for each whether the user set it (their value wins) or difforge would."""
    from .devices import BACKENDS

    available = {entry["name"] for entry in backends if entry["available"]}
    rows = []
    for name, cls in BACKENDS.items():
        for preset in cls().env_presets():
            user_value = os.environ.get(preset.name)
            if user_value is not None:
                status = "set by user"
            elif preset.opt_in:
                status = "opt-in (not applied by default)"
            else:
                status = "would apply"
            rows.append(
                {
                    "backend": name,
                    "backend_available": name in available,
                    "name": preset.name,
                    "value": preset.value,
                    "user_value": user_value,
                    "opt_in": preset.opt_in,
                    "status": status,
                    "why": preset.why,
                }
            )
    return rows


def _attention(info: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    rows: list[dict[str, Any]] = []
    sdpa_detail = "torch.nn.functional.scaled_dot_product_attention"
    cuda = torch.backends.cuda
    if torch.cuda.is_available():
        flags = {
            "flash": cuda.flash_sdp_enabled(),
            "mem_efficient": cuda.mem_efficient_sdp_enabled(),
            "cudnn": _safe(cuda.cudnn_sdp_enabled, False),
            "math": cuda.math_sdp_enabled(),
        }
        sdpa_detail += "; CUDA kernels enabled: " + ", ".join(k for k, on in flags.items() if on)
    rows.append(
        {
            "name": "sdpa",
            "available": hasattr(torch.nn.functional, "scaled_dot_product_attention"),
            "detail": sdpa_detail,
        }
    )

    flex_ok = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
    rows.append(
        {
            "name": "flex_attention",
            "available": flex_ok,
            "detail": "torch.nn.attention.flex_attention" if flex_ok else "needs torch >= 2.5",
        }
    )

    from .devices.npu import torch_npu_module

    mod = torch_npu_module() if info["torch_npu"]["importable"] else None
    npu_fa = mod is not None and hasattr(mod, "npu_fusion_attention")
    rows.append(
        {
            "name": "npu_fusion_attention",
            "available": npu_fa,
            "detail": "torch_npu.npu_fusion_attention" if npu_fa else "needs torch_npu",
        }
    )

    for name, module, what in OPTIONAL_ATTENTION:
        found = _safe(lambda m=module: importlib.util.find_spec(m) is not None, False)
        rows.append({"name": name, "available": found, "detail": what if found else f"{what}: not installed"})
    return rows


def _diffusers_attention_backends() -> list[str] | None:
    """Names diffusers' attention dispatcher knows (``AttentionBackendName``), when diffusers has one."""
    if importlib.util.find_spec("diffusers") is None:
        return None
    from diffusers.models.attention_dispatch import AttentionBackendName

    return [b.value for b in AttentionBackendName]


def _compile(info: dict[str, Any]) -> dict[str, Any]:
    import torch

    dynamo = _safe(lambda: sorted(__import__("torch._dynamo", fromlist=["list_backends"]).list_backends()))
    torchair = _torchair(info)
    compiler = next((path for path in map(shutil.which, CPP_COMPILERS) if path), None)
    return {
        "torch_compile": hasattr(torch, "compile"),
        "dynamo_backends": dynamo,
        "torchair": torchair,
        "triton": importlib.util.find_spec("triton") is not None,
        "cpp_compiler": compiler,
    }


def _torchair(info: dict[str, Any]) -> dict[str, Any]:
    """torchair (the NPU graph compiler): a standalone package, or bundled in torch_npu as ``torch_npu.dynamo``."""
    if _safe(lambda: importlib.util.find_spec("torchair") is not None, False):
        return {"available": True, "detail": "torchair"}
    if info["torch_npu"]["importable"] and not info["torch_npu"]["standin"]:
        bundled = _safe(lambda: importlib.util.find_spec("torch_npu.dynamo.torchair") is not None, False)
        if bundled:
            return {"available": True, "detail": "torch_npu.dynamo.torchair (bundled)"}
    return {"available": False, "detail": None}


def _missing(info: dict[str, Any]) -> list[str]:
    """One actionable line per missing piece."""
    lines: list[str] = []
    torch_version = info["packages"].get("torch") or "?"
    major_minor = ".".join(torch_version.split("+")[0].split(".")[:2])
    npu = info["torch_npu"]
    if not npu["importable"]:
        if npu["error"] == "not installed":
            lines.append(
                f"torch_npu: not installed -- NPU backend unavailable (pip install torch-npu matching torch "
                f"{major_minor}, e.g. 'torch-npu=={major_minor}.*', and source CANN's set_env.sh)"
            )
        else:
            lines.append(
                f"torch_npu: {npu['error']} -- NPU backend unavailable (source "
                "/usr/local/Ascend/ascend-toolkit/set_env.sh and check that torch-npu matches torch "
                f"{major_minor})"
            )
    else:
        npu_entry = next(b for b in info["backends"] if b["name"] == "npu")
        if not npu_entry["available"]:
            lines.append(
                "NPU: torch_npu imports but sees no device -- check `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES"
            )
    if not info["cann"] and not (npu["importable"] and npu["standin"]):
        lines.append(
            "CANN: not found (ASCEND_HOME_PATH unset) -- source /usr/local/Ascend/ascend-toolkit/set_env.sh"
        )
    if not any(b["available"] for b in info["backends"] if b["name"] != "cpu"):
        lines.append("accelerator: none found -- difforge will run on the CPU in float32 (slow but exact)")
    for name in ("torch", "diffusers", "transformers", "accelerate", "safetensors"):
        if not info["packages"].get(name):
            lines.append(f"{name}: not installed -- pip install {name}")
    flex = next(a for a in info["attention"] if a["name"] == "flex_attention")
    if not flex["available"]:
        lines.append(f"flex_attention: unavailable with torch {torch_version} -- upgrade torch to >= 2.5")
    comp = info["compile"]
    if not comp["cpp_compiler"]:
        lines.append(
            "C++ compiler: not found -- torch.compile (inductor) on the CPU needs g++; "
            "install build-essential, or run without --compile"
        )
    if npu["importable"] and not comp["torchair"]["available"]:
        lines.append("torchair: not importable -- torch.compile on the NPU falls back to eager")
    return lines


# ---- rendering ------------------------------------------------------------------------------------------
def render_doctor(info: dict[str, Any]) -> str:
    """Plain-text report (no colour codes: safe to paste into an issue)."""
    out: list[str] = []

    def section(title: str) -> None:
        out.append("")
        out.append(title)
        out.append("-" * len(title))

    def table(rows: list[list[str]]) -> None:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            out.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())

    out.append(f"difforge {info['difforge']} doctor")
    os_info = info["os"]
    out.append(f"Python {info['python']['version']} on {os_info['platform']} ({os_info['cpu_count']} CPUs)")

    section("Devices")
    rows = [["backend", "available", "count", "devices"]]
    for b in info["backends"]:
        devices = "; ".join(
            f"{d['device']} {d['name'] or '?'} {_gib(d['total_memory_bytes'])}".strip() for d in b["devices"]
        )
        rows.append(
            [b["name"], "yes" if b["available"] else "no", str(b["count"]), devices or (b["error"] or "-")]
        )
    table(rows)
    auto = info["auto"]
    out.append(f"  --device auto -> {auto['backend']}, --dtype auto -> {auto['dtype']}")

    section("Versions")
    npu = info["torch_npu"]
    rows = []
    for name, version in info["packages"].items():
        text = version or "not installed"
        if name == "torch_npu":
            if npu["standin"]:
                text = f"{npu['version']} (TEST STAND-IN, not the real library)"
            elif not npu["importable"] and npu["error"] != "not installed":
                text = f"{version or '?'} ({npu['error']})"
        rows.append([name, text])
    rows.append(["CANN", info["cann"] or "not found"])
    table(rows)

    section("Environment presets")
    rows = [["backend", "variable", "recommended", "status"]]
    for p in info["env_presets"]:
        status = p["status"] + (f" ({p['user_value']})" if p["user_value"] is not None else "")
        rows.append(
            [p["backend"] + ("" if p["backend_available"] else " (absent)"), p["name"], p["value"], status]
        )
    table(rows)

    section("Attention")
    table([[a["name"], "yes" if a["available"] else "no", a["detail"] or ""] for a in info["attention"]])
    if info["diffusers_attention_backends"]:
        out.append("  diffusers dispatcher knows: " + ", ".join(info["diffusers_attention_backends"]))

    section("Compile")
    comp = info["compile"]
    table(
        [
            ["torch.compile backends", ", ".join(comp["dynamo_backends"] or []) or "unknown"],
            ["torchair", comp["torchair"]["detail"] if comp["torchair"]["available"] else "not importable"],
            ["triton", "yes" if comp["triton"] else "no"],
            ["C++ compiler", comp["cpp_compiler"] or "not found"],
        ]
    )

    section("Missing")
    if info["missing"]:
        out.extend(f"  - {line}" for line in info["missing"])
    else:
        out.append("  nothing")
    return "\n".join(out).lstrip("\n") + "\n"


def _gib(nbytes: int | None) -> str:
    return f"{nbytes / 1024**3:.1f} GiB" if nbytes else ""
