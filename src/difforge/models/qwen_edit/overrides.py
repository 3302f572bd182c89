"""Swap single operators of one loaded transformer for other implementations.

Validation needs to ask "does this kernel change the result?" one operator at a time, e.g. run the
same pipeline with the NPU fused RMSNorm versus the PyTorch reference.  An override is installed on
the modules of *one* transformer instance (instance-level ``forward`` / attention processor), never
by patching diffusers or torch globally, so two pipelines in one process stay independent.

Supported names and the signatures the replacement callables must have:

* ``"rms_norm"``: ``fn(hidden_states, weight_or_None, eps) -> Tensor`` for every diffusers
  ``RMSNorm`` in the transformer (``txt_norm`` and the q/k norms); the module's bias, if any, is
  added afterwards.
* ``"attention"``: ``fn(query, key, value) -> Tensor`` with ``[batch, sequence, heads, head_dim]``
  tensors in and out, for the joint text+image attention of every block.  At batch size 1 (the
  only size the edit pipelines run) every text token is valid, so there is no mask; if a caller
  does pass a text mask, it is handed over as ``attn_mask=`` (``[batch, 1, 1, sequence]`` bool).

Both signatures are those of :mod:`difforge.ops` (``norm.rms_norm``, ``attention.sdpa_attention``),
so the same callables serve both model families.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

OVERRIDABLE_OPS = ("rms_norm", "attention")

RmsNormFn = Callable[[torch.Tensor, torch.Tensor | None, float], torch.Tensor]
AttentionFn = Callable[..., torch.Tensor]


def reference_rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The PyTorch RMSNorm with diffusers' dtype rules (statistics in fp32, half weights win)."""
    dtype = hidden_states.dtype
    variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
    out = hidden_states * torch.rsqrt(variance + eps)
    if weight is None:
        return out.to(dtype)
    if weight.dtype in (torch.float16, torch.bfloat16):
        out = out.to(weight.dtype)
    return out * weight


def reference_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v on ``[B, L, heads, d]`` tensors, as diffusers' 'native' backend computes it."""
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask).transpose(1, 2)


def _install_rms_norm(model: nn.Module, fn: RmsNormFn) -> int:
    from diffusers.models.normalization import RMSNorm

    def forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        out = fn(hidden_states, self.weight, self.eps)
        return out + self.bias if self.bias is not None else out

    count = 0
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.forward = types.MethodType(forward, module)
            count += 1
    return count


class OverridableQwenAttnProcessor:
    """Joint text+image attention of a Qwen-Image block with the attention kernel supplied by the caller.

    Same computation as diffusers' ``QwenDoubleStreamAttnProcessor2_0``: per-stream q/k/v projections,
    q/k RMSNorm, complex RoPE, one attention over [text, image], per-stream output projections.
    """

    def __init__(self, attention: AttentionFn) -> None:
        self.attention = attention

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_hidden_states_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

        head_dim = attn.inner_dim // attn.heads

        def heads(x: torch.Tensor) -> torch.Tensor:  # (B, S, H*D) -> (B, S, H, D)
            return x.unflatten(-1, (-1, head_dim))

        img_q = heads(attn.to_q(hidden_states))
        img_k = heads(attn.to_k(hidden_states))
        img_v = heads(attn.to_v(hidden_states))
        txt_q = heads(attn.add_q_proj(encoder_hidden_states))
        txt_k = heads(attn.add_k_proj(encoder_hidden_states))
        txt_v = heads(attn.add_v_proj(encoder_hidden_states))
        if attn.norm_q is not None:
            img_q = attn.norm_q(img_q)
        if attn.norm_k is not None:
            img_k = attn.norm_k(img_k)
        if attn.norm_added_q is not None:
            txt_q = attn.norm_added_q(txt_q)
        if attn.norm_added_k is not None:
            txt_k = attn.norm_added_k(txt_k)
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img_q = apply_rotary_emb_qwen(img_q, img_freqs, use_real=False)
            img_k = apply_rotary_emb_qwen(img_k, img_freqs, use_real=False)
            txt_q = apply_rotary_emb_qwen(txt_q, txt_freqs, use_real=False)
            txt_k = apply_rotary_emb_qwen(txt_k, txt_freqs, use_real=False)

        mask = None
        if encoder_hidden_states_mask is not None:
            image_mask = torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
            mask = torch.cat([encoder_hidden_states_mask.bool(), image_mask], dim=1)[:, None, None, :]
        # [B, L, heads, d], text tokens first.
        q = torch.cat([txt_q, img_q], dim=1)
        k = torch.cat([txt_k, img_k], dim=1)
        v = torch.cat([txt_v, img_v], dim=1)
        joint = self.attention(q, k, v) if mask is None else self.attention(q, k, v, attn_mask=mask)
        joint = joint.flatten(2, 3).to(q.dtype)

        seq_txt = encoder_hidden_states.shape[1]
        img_out = attn.to_out[0](joint[:, seq_txt:].contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        txt_out = attn.to_add_out(joint[:, :seq_txt].contiguous())
        return img_out, txt_out


def _install_attention(model: nn.Module, fn: AttentionFn) -> int:
    processor = OverridableQwenAttnProcessor(fn)
    count = 0
    for block in getattr(model, "transformer_blocks", []):
        block.attn.set_processor(processor)
        count += 1
    return count


def install_overrides(model: nn.Module, overrides: dict[str, Callable] | None) -> dict[str, int]:
    """Install each override on ``model``; returns how many modules each one replaced."""
    from ...errors import DifforgeError

    installed: dict[str, int] = {}
    for name, fn in (overrides or {}).items():
        if name not in OVERRIDABLE_OPS:
            raise DifforgeError(f"Unknown operator override '{name}'; Qwen-Image-Edit supports {', '.join(OVERRIDABLE_OPS)}.")
        if not callable(fn):
            raise DifforgeError(f"Operator override '{name}' must be a callable.")
        installed[name] = _install_rms_norm(model, fn) if name == "rms_norm" else _install_attention(model, fn)
    return installed
