"""difforge's joint attention for Qwen-Image blocks: real-valued RoPE and per-row text lengths.

diffusers' ``QwenDoubleStreamAttnProcessor2_0`` is correct but has two properties difforge wants
to change without copying or patching diffusers:

* **complex64 RoPE.**  ``QwenEmbedRope`` builds its tables with ``torch.polar`` and the processor
  rotates q/k with ``view_as_complex``.  Devices without complex kernels (Ascend sends them to
  AICPU, spec gotcha 7) pay for that in every block.  :func:`install_real_rope` makes the
  transformer's ``pos_embed`` return the same tables as real ``(cos, sin)`` stacks, computed once
  per shape on the host and cached on the device, and :func:`apply_rope` rotates with real
  multiply-adds.  The rotation is the same arithmetic as the complex product, so the result
  equals diffusers' within float rounding (tested).
* **one batch, two text lengths.**  True CFG runs the prompt and the negative prompt, whose text
  lengths differ.  Batching them means padding the shorter text.  Passing a padding mask would push
  CUDA SDPA off flash/cuDNN onto a masked kernel, and diffusers' ``_native_npu`` path would host-sync
  (``torch.all(mask)``) and materialise a ``[B, 1, Sq, Skv]`` mask in every block.  Instead the
  loop passes the valid text lengths as Python ints (``attention_kwargs={"text_lengths": ...}``)
  and this processor runs the attention once per row over exactly that row's valid keys
  (``text[:n_b] + image``), unmasked, so every backend keeps its fastest kernel and each row sees
  the same keys as a separate batch-1 call.  The projections, MLPs and modulation still run as
  one batch.  Padded text rows get a zero attention output; they are never read by valid tokens.

The attention kernel itself is diffusers' ``dispatch_attention_fn`` with whatever backend
``set_attention_backend`` chose (``native`` SDPA, ``_native_npu`` ...), or a caller's override
function (``op_overrides={"attention": fn}``, see :mod:`.overrides`).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

AttentionFn = Callable[..., torch.Tensor]
#: How many (shape, device) RoPE tables the real-valued pos_embed keeps (a run uses one).
ROPE_CACHE_SIZE = 8


def real_rope_table(freqs: torch.Tensor) -> torch.Tensor:
    """A complex ``[S, D/2]`` rotation table as a real ``[2, S, 1, D/2]`` float32 ``(cos, sin)`` stack.

    The singleton axis broadcasts over heads, so :func:`apply_rope` needs no reshaping per block.
    """
    pair = torch.view_as_real(freqs.to(torch.complex64))  # [S, D/2, 2]
    return pair.permute(2, 0, 1).unsqueeze(2).contiguous()


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, S, H, D]`` (interleaved pairs) by a complex table or a real ``(cos, sin)`` stack.

    Complex tables go through diffusers' own ``apply_rotary_emb_qwen`` (the reference path); real
    stacks compute ``(x0·cos − x1·sin, x0·sin + x1·cos)`` in float32, the complex product written out.
    """
    if freqs.is_complex():
        from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

        return apply_rotary_emb_qwen(x, freqs, use_real=False)
    cos, sin = freqs[0], freqs[1]  # [S, 1, D/2] each
    pairs = x.float().unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


def _freeze(value: Any) -> Any:
    """img_shapes (nested lists of tuples) as a hashable cache key."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def install_real_rope(transformer: nn.Module) -> bool:
    """Make ``transformer.pos_embed`` return real ``(cos, sin)`` tables, cached per shape and device.

    The complex tables are still built by diffusers' ``QwenEmbedRope``, but on the host and once per
    (image shapes, text length, device); the device only ever sees float32.  Returns False when the
    model has no ``pos_embed`` of the expected kind (nothing is changed then).
    """
    pos_embed = getattr(transformer, "pos_embed", None)
    if pos_embed is None or getattr(pos_embed, "_difforge_real_rope", False):
        return pos_embed is not None
    original = pos_embed.forward
    cache: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(
        self: nn.Module,
        video_fhw: Any,
        device: torch.device | None = None,
        max_txt_seq_len: int | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = (_freeze(video_fhw), None if max_txt_seq_len is None else int(max_txt_seq_len), str(device))
        tables = cache.get(key)
        if tables is None:
            img, txt = original(video_fhw, device=torch.device("cpu"), max_txt_seq_len=max_txt_seq_len)
            tables = (real_rope_table(img).to(device), real_rope_table(txt).to(device))
            if len(cache) >= ROPE_CACHE_SIZE:
                cache.pop(next(iter(cache)))
            cache[key] = tables
        return tables

    pos_embed.forward = types.MethodType(forward, pos_embed)
    pos_embed._difforge_real_rope = True
    return True


def remove_real_rope(transformer: nn.Module) -> None:
    """Undo :func:`install_real_rope` (the class's complex ``forward`` becomes visible again)."""
    pos_embed = getattr(transformer, "pos_embed", None)
    if pos_embed is not None and getattr(pos_embed, "_difforge_real_rope", False):
        del pos_embed.forward
        del pos_embed._difforge_real_rope


class QwenJointAttnProcessor:
    """Joint text+image attention of a Qwen-Image block (same computation as diffusers' processor).

    Per-stream q/k/v projections, q/k RMSNorm, RoPE (complex or real tables, see :func:`apply_rope`),
    one attention over ``[text, image]``, per-stream output projections.  ``text_lengths`` (one int
    per batch row, from ``attention_kwargs``) restricts each row's keys to its valid text prefix.
    ``_attention_backend`` / ``_parallel_config`` are the attributes diffusers'
    ``set_attention_backend`` writes, so backend selection works exactly as for its own processor.
    """

    _attention_backend: Any = None
    _parallel_config: Any = None

    def __init__(self, attention: AttentionFn | None = None) -> None:
        self.attention = attention

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if self.attention is not None:
            return self.attention(q, k, v) if mask is None else self.attention(q, k, v, attn_mask=mask)
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        return dispatch_attention_fn(
            q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_hidden_states_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        text_lengths: tuple[int, ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if attention_mask is not None:
            raise ValueError("QwenJointAttnProcessor builds its own mask; pass encoder_hidden_states_mask instead.")
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
            img_q, img_k = apply_rope(img_q, img_freqs), apply_rope(img_k, img_freqs)
            txt_q, txt_k = apply_rope(txt_q, txt_freqs), apply_rope(txt_k, txt_freqs)

        seq_txt = encoder_hidden_states.shape[1]
        ragged = text_lengths is not None and any(int(n) != seq_txt for n in text_lengths)
        if not ragged:
            mask = None
            if encoder_hidden_states_mask is not None:
                image_mask = torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
                mask = torch.cat([encoder_hidden_states_mask.bool(), image_mask], dim=1)[:, None, None, :]
            joint = self._attend(
                torch.cat([txt_q, img_q], dim=1), torch.cat([txt_k, img_k], dim=1), torch.cat([txt_v, img_v], dim=1), mask
            ).flatten(2, 3).to(img_q.dtype)
            txt_attn, img_attn = joint[:, :seq_txt], joint[:, seq_txt:]
        else:
            if len(text_lengths) != hidden_states.shape[0]:
                raise ValueError(f"text_lengths has {len(text_lengths)} entries for a batch of {hidden_states.shape[0]}.")
            txt_rows, img_rows = [], []
            for b, n in enumerate(int(n) for n in text_lengths):
                row = slice(b, b + 1)
                out = self._attend(
                    torch.cat([txt_q[row, :n], img_q[row]], dim=1),
                    torch.cat([txt_k[row, :n], img_k[row]], dim=1),
                    torch.cat([txt_v[row, :n], img_v[row]], dim=1),
                    None,
                ).flatten(2, 3).to(img_q.dtype)
                img_rows.append(out[:, n:])
                txt_rows.append(torch.nn.functional.pad(out[:, :n], (0, 0, 0, seq_txt - n)))
            txt_attn, img_attn = torch.cat(txt_rows), torch.cat(img_rows)

        img_out = attn.to_out[0](img_attn.contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        txt_out = attn.to_add_out(txt_attn.contiguous())
        return img_out, txt_out


def install_processor(transformer: nn.Module, attention: AttentionFn | None = None) -> int:
    """Give every block of ``transformer`` one shared :class:`QwenJointAttnProcessor`; returns the count.

    Call before ``set_attention_backend`` (which writes the chosen backend onto the processors).
    """
    processor = QwenJointAttnProcessor(attention)
    count = 0
    for block in getattr(transformer, "transformer_blocks", []):
        block.attn.set_processor(processor)
        count += 1
    return count
