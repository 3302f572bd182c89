"""Qwen-Image-Edit family (Edit, Edit-2509, Edit-2511 and FP8 re-packs) served through diffusers.

``__all__`` is the family's public seam: what callers outside ``difforge.models`` (the benchmarks and
scripts, ``tests/test_architecture.py`` checks them) may use; the modules behind it are internals (the
probe, handed out by the registry, is the other seam).
"""

from __future__ import annotations

from .attention import install_processor, install_real_rope
from .compat import apply_processor_shim
from .fp8 import Fp8FileInfo, Fp8Linear, inspect_transformer_file, load_transformer_file, module_weight_bytes
from .loop import Denoiser, Prepared, SpeedOptions, denoise, schedule
from .pipeline import DEFAULT_STEPS, QwenEditPipeline
from .settings import EditSettings
from .speed import install_compile
from .tiny import SCHEDULER_CONFIG, build_tiny_fp8_transformer, build_tiny_qwen_edit

__all__ = [
    "DEFAULT_STEPS",
    "SCHEDULER_CONFIG",
    "Denoiser",
    "EditSettings",
    "Fp8FileInfo",
    "Fp8Linear",
    "Prepared",
    "QwenEditPipeline",
    "SpeedOptions",
    "apply_processor_shim",
    "build_tiny_fp8_transformer",
    "build_tiny_qwen_edit",
    "denoise",
    "inspect_transformer_file",
    "install_compile",
    "install_processor",
    "install_real_rope",
    "load_transformer_file",
    "module_weight_bytes",
    "schedule",
]
