"""Portable building blocks for the native models, each with a plain PyTorch path and a fused path.

Use :func:`select_ops` once when a model is loaded and keep the returned :class:`OpSet` on the model.
"""

from .activation import swiglu, swiglu_packed
from .attention import sdpa_attention
from .norm import rms_norm
from .opset import OP_NAMES, OpChoice, OpSet, plain_ops, select_ops
from .rotary import apply_rotary, rope_table

__all__ = [
    "OP_NAMES",
    "OpChoice",
    "OpSet",
    "apply_rotary",
    "plain_ops",
    "rms_norm",
    "rope_table",
    "sdpa_attention",
    "select_ops",
    "swiglu",
    "swiglu_packed",
]
