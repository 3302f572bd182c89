"""The URSA transformer: a Qwen3 decoder run bidirectionally over [text | bov | image tokens].

Module and parameter names equal the checkpoint's keys (``model.layers.0.self_attn.q_proj.weight``
...), so loading is a strict ``load_state_dict``.  All device-specific maths goes through the
:class:`~difforge.ops.OpSet` the instance holds, chosen once when the model is loaded.

Operation order follows the reference where it decides rounding: residual adds happen on the
sub-layer output, q/k are normalised per head before the rotation, attention has no mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ...ops import OpSet, plain_ops
from .config import URSATransformerConfig
from .rope import cos_sin
from .ulysses import SequenceShard


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, ops: list[OpSet]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self._ops = ops  # shared one-element list: the owning model swaps its OpSet in one place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._ops[0].rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: URSATransformerConfig, ops: list[OpSet]) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, ops)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, ops)
        self._ops = ops
        #: ``--parallel ulysses=N``, during a sharded forward: x holds this rank's rows (see :mod:`.ulysses`)
        self.shard: SequenceShard | None = None

    def forward(self, x: torch.Tensor, rope: object) -> torch.Tensor:
        ops = self._ops[0]
        q = self.q_norm(self.q_proj(x).unflatten(-1, (-1, self.head_dim)))
        k = self.k_norm(self.k_proj(x).unflatten(-1, (-1, self.head_dim)))
        v = self.v_proj(x).unflatten(-1, (-1, self.head_dim))
        q, k = ops.rotary(q, rope), ops.rotary(k, rope)
        shard = self.shard
        if shard is not None:  # every row of this rank's heads, attention, back to this rank's rows
            q, k, v = shard.to_heads(q, k, v)
            return self.o_proj(shard.to_rows(ops.attention(q, k, v)).flatten(2))
        return self.o_proj(ops.attention(q, k, v).flatten(2))


class MLP(nn.Module):
    """SwiGLU MLP.  With a packed-input kernel the gate/up weights become views of one buffer."""

    def __init__(self, cfg: URSATransformerConfig, ops: list[OpSet]) -> None:
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self._ops = ops
        self.gate_up: torch.Tensor | None = None

    def pack(self, enable: bool) -> None:
        """Build (or drop) the ``[gate; up]`` weight; the two parameters stay, as views of it."""
        if not enable:
            if self.gate_up is not None:
                self.gate_proj.weight = nn.Parameter(self.gate_proj.weight.detach().clone(), requires_grad=False)
                self.up_proj.weight = nn.Parameter(self.up_proj.weight.detach().clone(), requires_grad=False)
            self.gate_up = None
            return
        packed = torch.cat([self.gate_proj.weight.detach(), self.up_proj.weight.detach()])
        self._tie(packed)

    def _tie(self, packed: torch.Tensor) -> None:
        n = packed.shape[0] // 2
        self.gate_up = packed
        self.gate_proj.weight = nn.Parameter(packed[:n], requires_grad=False)
        self.up_proj.weight = nn.Parameter(packed[n:], requires_grad=False)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # .to()/.cpu() would copy the two views separately and double the memory; move the packed
        # buffer once and re-derive the views instead.
        if self.gate_up is None:
            return super()._apply(fn, recurse)
        packed = fn(self.gate_up)
        self.gate_proj.weight = nn.Parameter(torch.empty(0), requires_grad=False)
        self.up_proj.weight = nn.Parameter(torch.empty(0), requires_grad=False)
        super()._apply(fn, recurse)
        self._tie(packed)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = self._ops[0]
        if self.gate_up is not None and ops.swiglu_packed is not None:
            return self.down_proj(ops.swiglu_packed(F.linear(x, self.gate_up)))
        return self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: URSATransformerConfig, ops: list[OpSet]) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, ops)
        self.mlp = MLP(cfg, ops)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)

    def forward(self, x: torch.Tensor, rope: object) -> torch.Tensor:
        x = self.self_attn(self.input_layernorm(x), rope).add_(x)
        return self.mlp(self.post_attention_layernorm(x)).add_(x)


class Backbone(nn.Module):
    """``model.*``: embeddings, decoder layers, final norm."""

    def __init__(self, cfg: URSATransformerConfig, ops: list[OpSet]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, ops) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)


def run_layer(layer: nn.Module, x: torch.Tensor, rope: object) -> torch.Tensor:
    """One decoder layer as a free function: the unit a regional compile traces once for all layers."""
    return layer(x, rope)


class URSATransformer(nn.Module):
    """Qwen3 backbone + codebook ``lm_head``.

    ``forward(ids [B, L], positions [L, 3], logits_slice=None, rope=None)`` returns ``[B, L', K]``
    logits, where ``logits_slice`` (a ``slice`` over the sequence) restricts ``lm_head`` to the rows a
    caller uses and ``rope`` is a table from :meth:`rope` made once per size (recomputed when None).
    """

    def __init__(self, cfg: URSATransformerConfig, ops: OpSet | None = None) -> None:
        super().__init__()
        self.config = cfg
        self._ops = [ops or plain_ops()]
        self.model = Backbone(cfg, self._ops)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.lm_head_size, bias=False)
        # Regional compile: one compiled callable shared by every decoder layer (the layers differ only
        # in their weights, which the compiled graph takes as inputs), so 28 layers compile once.
        self._layer_fn: Callable[[nn.Module, torch.Tensor, object], torch.Tensor] = run_layer

    def set_layer_fn(self, fn: Callable[[nn.Module, torch.Tensor, object], torch.Tensor] | None) -> None:
        """Install a compiled :func:`run_layer` (``None`` restores eager)."""
        self._layer_fn = fn or run_layer

    @property
    def layers_compiled(self) -> bool:
        return self._layer_fn is not run_layer

    @property
    def ops(self) -> OpSet:
        return self._ops[0]

    def set_ops(self, ops: OpSet) -> None:
        """Install an OpSet (and pack the MLP weights if its SwiGLU kernel wants them packed)."""
        self._ops[0] = ops
        for layer in self.model.layers:
            layer.mlp.pack(ops.swiglu_packed is not None)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def rope(self, pos: torch.Tensor, dtype: torch.dtype | None = None) -> object:
        """The OpSet's rotary table for positions ``[L, 3]``, on the weights' device, in ``dtype``."""
        device = self.model.embed_tokens.weight.device
        cos, sin = cos_sin(pos.to(device), self.config.head_dim, self.config.rope_theta, dtype or self.dtype)
        return self.ops.rope_table(cos, sin)

    def hidden_states(self, ids: torch.Tensor, pos: torch.Tensor, rope: object | None = None) -> torch.Tensor:
        x = self.model.embed_tokens(ids.to(self.ops.index_dtype))
        if rope is None:
            rope = self.rope(pos, x.dtype)
        for layer in self.model.layers:
            x = self._layer_fn(layer, x, rope)
        return self.model.norm(x)

    def _sharded_states(self, ids: torch.Tensor, pos: torch.Tensor, shard: SequenceShard) -> torch.Tensor:
        """:meth:`hidden_states` of this rank's stretch of positions, gathered: ``[B, L, hidden]`` on every rank."""
        lo, hi = shard.bounds
        x = self.model.embed_tokens(ids[:, lo:hi].to(self.ops.index_dtype))
        rope = shard.rope if shard.rope is not None else self.rope(pos[lo:hi], x.dtype)
        attention = [layer.self_attn for layer in self.model.layers]
        for a in attention:
            a.shard = shard
        try:
            for layer in self.model.layers:
                x = self._layer_fn(layer, x, rope)
        finally:
            for a in attention:
                a.shard = None
        return shard.gather_rows(self.model.norm(x))

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, logits_slice: slice | None = None, rope: object | None = None,
        shard: SequenceShard | None = None,
    ) -> torch.Tensor:
        x = self.hidden_states(ids, positions, rope) if shard is None else self._sharded_states(ids, positions, shard)
        if logits_slice is not None:
            x = x[:, logits_slice]
        return self.lm_head(x)
