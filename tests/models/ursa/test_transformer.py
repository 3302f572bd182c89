"""Transformer: shapes, 3-D RoPE, next-token slice, config traps, strict loading, op sets per instance."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from difforge.devices import CPUBackend, NPUBackend
from difforge.errors import CheckpointError
from difforge.models.ursa import URSATransformer, URSATransformerConfig
from difforge.models.ursa.loader import URSACheckpoint, load_strict
from difforge.models.ursa.rope import cos_sin, inv_freq, positions, slot_axes
from difforge.ops import select_ops

CFG = URSATransformerConfig(
    hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
    vocab_size=100 + 16, lm_vocab_size=100, lm_head_size=16, bov_token_id=90,
)


def small_model(seed: int = 0) -> URSATransformer:
    torch.manual_seed(seed)
    model = URSATransformer(CFG).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def test_positions_text_bov_and_grid() -> None:
    pos = positions((2, 3, 4), text_len=5)
    assert pos.shape == (5 + 1 + 24, 3) and pos.dtype == torch.int64
    assert pos[:5].tolist() == [[p, p, p] for p in range(5)]
    assert pos[5].tolist() == [5, 5, 5]
    expected = [[6 + t, h, w] for t in range(2) for h in range(3) for w in range(4)]  # t-major
    assert pos[6:].tolist() == expected


def test_slot_axes_for_head_dim_128() -> None:
    axes = slot_axes(128).tolist()
    assert len(axes) == 64
    assert axes[:48] == [i % 3 for i in range(48)]
    assert axes[48:] == [1 + (i % 2) for i in range(16)]


def test_cos_sin_reads_the_assigned_axis() -> None:
    pos = torch.tensor([[7, 2, 5]])
    cos, _ = cos_sin(pos, 128, 1e6, torch.float32)
    freq = inv_freq(128, 1e6)
    for i in (0, 1, 2, 47, 48, 49, 63):
        axis = i % 3 if i < 48 else 1 + (i - 48) % 2
        assert cos[0, i] == torch.cos(pos[0, axis].float() * freq[i])
    torch.testing.assert_close(freq, torch.tensor([1e6 ** (-2 * i / 128) for i in range(64)]), rtol=1e-6, atol=0)


def test_forward_shapes_and_logits_slice() -> None:
    model = small_model()
    ids = torch.randint(0, CFG.vocab_size, (2, 11))
    pos = positions((1, 2, 2), text_len=6)
    full = model(ids, pos)
    assert full.shape == (2, 11, CFG.lm_head_size)
    sl = slice(11 - 4 - 1, 11 - 1)  # bov .. second-to-last image token: logits for image tokens 0..3
    torch.testing.assert_close(model(ids, pos, logits_slice=sl), full[:, sl], rtol=0, atol=0)
    q_out = model.model.layers[0].self_attn.q_proj.out_features
    assert q_out == CFG.num_attention_heads * 128  # head_dim 128 whatever the hidden size


def test_attention_is_bidirectional() -> None:
    model = small_model()
    ids = torch.randint(0, CFG.vocab_size, (1, 11))
    pos = positions((1, 2, 2), text_len=6)
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % CFG.vocab_size
    with torch.no_grad():
        a, b = model.hidden_states(ids, pos), model.hidden_states(changed, pos)
    assert not torch.allclose(a[0, 0], b[0, 0])  # the first text slot sees the last image token


def test_config_ignores_head_dim_and_eps_like_the_reference() -> None:
    cfg = URSATransformerConfig.from_dict({**CFG.to_dict(), "head_dim": 64, "rms_norm_eps": 1e-5, "_class_name": "x"})
    assert cfg.head_dim == 128 and cfg.rms_norm_eps == 1e-6
    assert cfg.ignored_keys == ("head_dim", "rms_norm_eps")
    with pytest.raises(CheckpointError, match="multiple of num_key_value_heads"):
        URSATransformerConfig.from_dict({**CFG.to_dict(), "num_key_value_heads": 3})


def test_state_dict_keys_are_the_checkpoint_names() -> None:
    keys = set(small_model().state_dict())
    for name in ("model.embed_tokens.weight", "model.layers.1.self_attn.q_norm.weight",
                 "model.layers.0.mlp.gate_proj.weight", "model.norm.weight", "lm_head.weight"):
        assert name in keys
    assert not any(k.endswith("bias") for k in keys)


def test_strict_loading_names_the_first_bad_key() -> None:
    state = small_model().state_dict()
    with torch.device("meta"):
        target = URSATransformer(CFG)
    missing = dict(state)
    missing.pop("model.layers.0.mlp.up_proj.weight")
    with pytest.raises(CheckpointError, match="lacks weight 'model.layers.0.mlp.up_proj.weight'"):
        load_strict(target, missing, "transformer")
    with pytest.raises(CheckpointError, match="unexpected weight 'extra.weight'"):
        load_strict(target, {**state, "extra.weight": torch.zeros(1)}, "transformer")
    bad = {**state, "lm_head.weight": torch.zeros(3, 32)}
    with pytest.raises(CheckpointError, match="'lm_head.weight' has shape"):
        load_strict(target, bad, "transformer")
    load_strict(target, state, "transformer")
    assert torch.equal(target.lm_head.weight, state["lm_head.weight"])


def test_tiny_checkpoint_loads_strictly(tiny_ursa: Path) -> None:
    model = URSACheckpoint.read_configs(tiny_ursa).load_transformer()
    assert model.config.head_dim == 128 and len(model.model.layers) == 2


def test_two_models_hold_different_ops() -> None:
    a, b = small_model(), small_model()
    ids = torch.randint(0, CFG.vocab_size, (1, 11))
    pos = positions((1, 2, 2), text_len=6)
    b.set_ops(select_ops(CPUBackend(), {"swiglu": lambda g, u: g * 0}))
    with torch.no_grad():
        assert not torch.allclose(a(ids, pos), b(ids, pos))
        b.set_ops(select_ops(CPUBackend()))
        assert torch.equal(a(ids, pos), b(ids, pos))


def test_npu_opset_forward_matches_plain_and_packs_gate_up(npu_standin) -> None:
    plain, fused = small_model(), small_model()
    fused.set_ops(select_ops(NPUBackend()))
    mlp = fused.model.layers[0].mlp
    assert mlp.gate_up is not None and mlp.gate_proj.weight.data_ptr() == mlp.gate_up.data_ptr()
    assert set(fused.state_dict()) == set(plain.state_dict())  # packing keeps checkpoint names
    ids = torch.randint(0, CFG.vocab_size, (2, 11))
    pos = positions((1, 2, 2), text_len=6)
    with torch.no_grad():
        torch.testing.assert_close(fused(ids, pos), plain(ids, pos), rtol=1e-4, atol=1e-4)
    fused.to(torch.float64)  # moving keeps the views tied to the packed buffer
    assert mlp.gate_up.dtype == torch.float64 and mlp.up_proj.weight.data_ptr() == mlp.gate_up[CFG.intermediate_size:].data_ptr()


def test_meta_device_full_size_build() -> None:
    with torch.device("meta"):
        model = URSATransformer(URSATransformerConfig())
    n = sum(p.numel() for p in model.parameters())
    assert math.isclose(n, 1.98e9, rel_tol=0.02)
