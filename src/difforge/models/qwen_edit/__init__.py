"""Qwen-Image-Edit family (Edit, Edit-2509, Edit-2511 and FP8 re-packs) served through diffusers."""

from __future__ import annotations

from .compat import apply_processor_shim
from .fp8 import Fp8FileInfo, Fp8Linear, inspect_transformer_file, load_transformer_file
from .pipeline import DEFAULT_STEPS, QwenEditPipeline
from .settings import EditSettings
from .tiny import build_tiny_fp8_transformer, build_tiny_qwen_edit

__all__ = [
    "DEFAULT_STEPS",
    "EditSettings",
    "Fp8FileInfo",
    "Fp8Linear",
    "QwenEditPipeline",
    "apply_processor_shim",
    "build_tiny_fp8_transformer",
    "build_tiny_qwen_edit",
    "inspect_transformer_file",
    "load_transformer_file",
]
