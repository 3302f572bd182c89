"""``difforge doctor``: what a user checks first when a run will not start or runs slowly.

It answers, in one screen: which devices difforge can see (per backend, with name, count and memory),
which versions of the stack are installed (torch, torch_npu, CANN, diffusers ...), which environment
presets a run would apply and which the user already set, which attention and compile backends
exist, and -- one line each -- what is missing and how to fix it.

Nothing heavy is imported at module import: ``difforge doctor --help`` must stay instant, and
importing torch_npu has side effects, so every probe imports what it needs inside its function.
Every probe is wrapped so one broken component is reported rather than crashing the report.

Doctor keeps no second copy of what other modules know: each backend describes its devices and
presets and answers for its fused kernels and compile policy (torchair is the NPU's), the package list
is the environment fingerprint's, the C++ compilers are the compile policy's and the CANN paths the
NPU backend's.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .runtime.environment import OPTIONAL_PACKAGES, PACKAGES, package_version
from .version import __version__

T = TypeVar("T")

#: Optional attention kernels: (report name, importable module, what it is).
OPTIONAL_ATTENTION = (
    ("flash_attn", "flash_attn", "FlashAttention-2 (CUDA)"),
    ("xformers", "xformers", "xFormers memory-efficient attention"),
    ("sageattention", "sageattention", "SageAttention (quantised QK)"),
)
#: The torch release that added ``torch.nn.attention.flex_attention``.
FLEX_ATTENTION_TORCH = "2.5"


# ---- collecting ---------------------------------------------------------------------------------------
def collect_doctor() -> dict[str, Any]:
    """Probe this machine; returns a JSON-serialisable dict (``difforge doctor --json`` prints it)."""
    info: dict[str, Any] = {
        "difforge": __version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
        },
    }
    from .devices.npu import cann_version

    info["packages"] = _packages()
    info["torch_npu"] = _torch_npu_info()
    info["cann"] = _safe(cann_version)
    info["backends"] = _backends()
    info["auto"] = _auto_choice(info["backends"])
    info["env_presets"] = _env_presets(info["backends"])
    info["attention"] = _attention(info)
    info["diffusers_attention_backends"] = _safe(_diffusers_attention_backends)
    info["compile"] = _compile(info)
    info["processors"] = _processors()
    info["missing"] = _missing(info)
    return info


def _safe(fn: Callable[[], T], default: Any = None) -> T | Any:
    try:
        return fn()
    except Exception:
        return default


def _packages() -> dict[str, str | None]:
    versions = {name: package_version(name) for name in PACKAGES}
    torch_version = _safe(lambda: __import__("torch").__version__)
    if torch_version:
        versions["torch"] = torch_version
    return versions


def _torch_npu_info() -> dict[str, Any]:
    """Installed? importable? which version? the test stand-in? (from the module when it imports)."""
    from .devices.npu import torch_npu_import_error, torch_npu_module

    mod = torch_npu_module()
    version = getattr(mod, "__version__", None) or package_version("torch_npu")
    return {
        "importable": mod is not None,
        "version": None if version is None else str(version),
        "error": None if mod is not None else torch_npu_import_error(),
        "standin": bool(getattr(mod, "__standin__", False)),
    }


def _backends() -> list[dict[str, Any]]:
    """Every backend in auto order, with its devices as each describes itself; a failing probe says why."""
    from .devices import AUTO_ORDER, BACKENDS, get_backend

    out = []
    for name in AUTO_ORDER:
        cls = BACKENDS[name]
        entry: dict[str, Any] = {"name": name, "available": False, "count": 0, "devices": [], "error": None}
        try:
            entry["available"] = bool(cls.is_available())
            entry["count"] = int(cls.device_count()) if entry["available"] else 0
            for i in range(entry["count"]):
                backend = get_backend(f"{name}:{i}")
                about = _safe(backend.describe, {})
                entry["devices"].append(
                    {
                        "index": i,
                        "device": str(backend),
                        "name": about.get("device_name"),
                        "total_memory_bytes": about.get("total_memory_bytes"),
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
            # Backend.apply_env_presets' rule: the user's value wins, an opt-in preset waits to be asked for
            if user_value is not None:
                status = "set by user"
            elif preset.opt_in:
                status = f"opt-in: --preset {preset.name}"
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

    from .devices import BACKENDS
    from .devices.npu import FUSED_KERNELS

    sdpa_detail = "torch.nn.functional.scaled_dot_product_attention"
    for entry in info["backends"]:
        kernels = _safe(BACKENDS[entry["name"]]().sdpa_kernels, []) if entry["available"] else []
        if kernels:
            sdpa_detail += f"; {entry['name'].upper()} kernels enabled: " + ", ".join(kernels)
    rows: list[dict[str, Any]] = [
        {
            "name": "sdpa",
            "available": hasattr(torch.nn.functional, "scaled_dot_product_attention"),
            "detail": sdpa_detail,
        }
    ]

    flex_ok = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
    flex_detail = "torch.nn.attention.flex_attention" if flex_ok else f"needs torch >= {FLEX_ATTENTION_TORCH}"
    rows.append({"name": "flex_attention", "available": flex_ok, "detail": flex_detail})

    kernel_name, npu_kernel = FUSED_KERNELS["attention"], None
    if info["torch_npu"]["importable"]:  # the backend's answer: the kernel it would use
        npu_kernel = _safe(lambda: BACKENDS["npu"]().fused_kernel("attention"))
    rows.append(
        {
            "name": kernel_name,
            "available": npu_kernel is not None,
            "detail": f"torch_npu.{kernel_name}" if npu_kernel is not None else "needs torch_npu",
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

    from .devices import BACKENDS
    from .devices.compile import cpp_compiler

    # torchair is the NPU's compiler: the NPU backend's compile policy says whether it loads (and why
    # not).  Only asked when torch_npu imports, since torchair cannot import without it.
    npu = _safe(lambda: BACKENDS["npu"]().compile_policy()) if info["torch_npu"]["importable"] else None
    return {
        "torch_compile": hasattr(torch, "compile"),
        "dynamo_backends": _safe(lambda: sorted(__import__("torch._dynamo", fromlist=["x"]).list_backends())),
        "torchair": {"available": bool(npu and npu.available), "detail": npu.detail if npu else None},
        "triton": importlib.util.find_spec("triton") is not None,
        "cpp_compiler": cpp_compiler(),
    }


def _torchvision() -> tuple[str | None, str | None]:
    """(version, import error) of torchvision; (None, None) when it is not installed.

    transformers decides by ``find_spec`` and the version alone, so a torchvision that is installed
    but does not import beside this torch (a wheel built for another torch) still switches its
    processors to the torchvision branch - and then fails; doctor imports it to tell the two apart.
    """
    if importlib.util.find_spec("torchvision") is None:
        return None, None
    version = package_version("torchvision")
    try:
        import torchvision

        return version or str(getattr(torchvision, "__version__", "?")), None
    except Exception as exc:  # a torch/torchvision mismatch raises RuntimeError or ImportError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return version or "?", f"{type(exc).__name__}: {first}"


def _processors() -> dict[str, Any]:
    """How transformers will load Qwen-Image-Edit's ``Qwen2VLProcessor`` here.

    With torchvision installed transformers also builds the processor's video processor and reads
    ``processor/video_preprocessor_config.json`` (the published folders have it); without it difforge
    drops the unused video slot.  A folder that loads on a CPU box without torchvision can therefore
    fail on a CUDA machine with it (the 2026-12-04 H200 run): doctor says which case this machine is.
    """
    from .models.qwen_edit.folder import VIDEO_PROCESSOR_FILE, processor_builds_video

    version, error = _torchvision()
    builds_video = _safe(processor_builds_video)
    if version is None:
        note = (f"torchvision not installed: Qwen2-VL processors load without a video processor here; a folder"
                f" lacking processor/{VIDEO_PROCESSOR_FILE} loads here but not where torchvision is installed")
    else:
        note = (f"torchvision {version} installed: transformers' Qwen2-VL processor (Qwen-Image-Edit) also builds"
                f" a video processor, so a model folder's processor/ needs {VIDEO_PROCESSOR_FILE}")
    return {"torchvision": version, "torchvision_error": error, "qwen2vl_builds_video": builds_video, "note": note}


def _missing(info: dict[str, Any]) -> list[str]:
    """One actionable line per missing piece."""
    from .devices.compile import CPP_COMPILERS
    from .devices.npu import CANN_HOME_VARS, CANN_SET_ENV, NPUBackend

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
                f"torch_npu: {npu['error']} -- NPU backend unavailable (source {CANN_SET_ENV} "
                f"and check that torch-npu matches torch {major_minor})"
            )
    else:
        npu_entry = next(b for b in info["backends"] if b["name"] == "npu")
        if not npu_entry["available"]:
            lines.append(
                "NPU: torch_npu imports but sees no device -- check `npu-smi info` and "
                f"{NPUBackend.visible_devices_env}"
            )
    if not info["cann"] and not (npu["importable"] and npu["standin"]):
        lines.append(f"CANN: not found ({CANN_HOME_VARS[0]} unset) -- source {CANN_SET_ENV}")
    if not any(b["available"] for b in info["backends"] if b["name"] != "cpu"):
        lines.append("accelerator: none found -- difforge will run on the CPU in float32 (slow but exact)")
    for name in (p for p in PACKAGES if p not in OPTIONAL_PACKAGES):
        if not info["packages"].get(name):
            lines.append(f"{name}: not installed -- pip install {name}")
    flex = next(a for a in info["attention"] if a["name"] == "flex_attention")
    if not flex["available"]:
        lines.append(
            f"flex_attention: unavailable with torch {torch_version} -- upgrade torch to >= {FLEX_ATTENTION_TORCH}"
        )
    comp = info["compile"]
    if not comp["cpp_compiler"]:
        lines.append(
            "C++ compiler: not found -- torch.compile (inductor) on the CPU needs one of "
            f"{', '.join(CPP_COMPILERS)}; install build-essential, or run without --compile"
        )
    if npu["importable"] and not comp["torchair"]["available"]:
        lines.append("torchair: not importable -- torch.compile on the NPU falls back to eager")
    proc = info["processors"]
    if proc["torchvision_error"]:
        lines.append(
            f"torchvision: {proc['torchvision']} is installed but does not import ({proc['torchvision_error']}) --"
            " transformers still takes its torchvision branch and Qwen-Image-Edit's processor fails to load;"
            " install the torchvision built for this torch, or uninstall it"
        )
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

    section("Processors")
    proc = info["processors"]
    tv = proc["torchvision"] or "not installed"
    if proc["torchvision_error"]:
        tv += f" (does not import: {proc['torchvision_error']})"
    video = {True: "yes", False: "no", None: "unknown (transformers did not answer)"}[proc["qwen2vl_builds_video"]]
    table([["torchvision", tv], ["Qwen2-VL video processor", video]])
    out.append(f"  {proc['note']}")

    section("Missing")
    if info["missing"]:
        out.extend(f"  - {line}" for line in info["missing"])
    else:
        out.append("  nothing")
    return "\n".join(out).lstrip("\n") + "\n"


def _gib(nbytes: int | None) -> str:
    return f"{nbytes / 1024**3:.1f} GiB" if nbytes else ""
