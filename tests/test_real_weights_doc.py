"""docs/real-weights.md §5 (the 20B port's memory and time budget) stays the code's arithmetic (issue 28.4).

The tables are recomputed from the estimators (parameters counted on the meta device from the
published configs) and from ``torch.utils.flop_counter`` on meta copies, as validate's
``flops_per_step`` counts them: a change of the estimator, of a loader's held dtype or of the FLOP count
fails here until the page is updated.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import difforge.models.qwen_edit.memory as qmem
from difforge.models.qwen_edit.probe import count_forward_flops
from difforge.models.ursa.config import URSATransformerConfig, VQConfig
from difforge.models.ursa.memory import activation_parts, transformer_parameters, vae_parameters
from difforge.models.ursa.rope import positions
from difforge.models.ursa.transformer import URSATransformer
from difforge.ops import plain_ops
from difforge.runtime.meta import on_meta
from tests.models.qwen_edit.test_memory_estimate import (
    REAL_TRANSFORMER,
    REAL_VAE,
    _real_header,
    full_size_report,
    real_text_config,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "real-weights.md"
GB = 1e9
#: URSA-1.7B-IBQ1024 (spec ursa.md: the Qwen3-1.7B shape, 131072 image codes, its IBQ VAE).
URSA_T = URSATransformerConfig(lm_head_size=131072, vocab_size=151669 + 131072)
URSA_V = VQConfig(block_out_channels=(256, 256, 512, 512, 1024), layers_per_block=4, latent_channels=256,
                  num_vq_embeddings=131072, vq_embed_dim=256, attn_down_block=True, attn_up_block=True)


def table(marker: str) -> list[list[str]]:
    """The data rows of the Markdown table right after ``<!-- marker: ... -->`` in the page."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"<!-- {marker}:"))
    rows = []
    for line in lines[start + 3:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    assert rows, marker
    return rows


def _num(cell: str) -> float:
    return float(cell.replace(",", "")) if cell != "-" else 0.0


def _qwen_weights(dtype: torch.dtype, fp8: bool) -> qmem.Weights:
    return qmem.weights_for(REAL_TRANSFORMER, real_text_config(), REAL_VAE, dtype, _real_header() if fp8 else None)


def _ursa_weights(dtype: torch.dtype) -> tuple[float, float]:
    size = torch.empty(0, dtype=dtype).element_size()
    return transformer_parameters(URSA_T) * size, vae_parameters(URSA_V) * size


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@pytest.fixture(scope="module")
def weights() -> dict[tuple[str, str], tuple[float, float, float]]:
    """(model row name, held-as) -> (transformer, text encoder, VAE) bytes, from the estimators."""
    out = {}
    for name, fp8 in (("Qwen-Image-Edit-2511", False), ("Qwen-Image-Edit-2511 + FP8 file", True)):
        for held, dtype in DTYPES.items():
            w = _qwen_weights(dtype, fp8)
            out[(name, held)] = (w.transformer, w.text_encoder, w.vae)
    for held, dtype in DTYPES.items():
        t, v = _ursa_weights(dtype)
        out[("URSA-1.7B-IBQ1024", held)] = (t, 0.0, v)
    return out


def test_the_weights_table_is_the_estimators(weights) -> None:
    rows = table("weights-table")
    assert {(r[0], r[1]) for r in rows} == set(weights)
    for model, held, t, te, v, total in rows:
        want = weights[(model, held)]
        for cell, value in zip((t, te, v), want, strict=True):
            assert abs(_num(cell) - value / GB) <= 0.006, (model, held, cell, value / GB)
        assert abs(_num(total) - sum(want) / GB) <= 0.011, (model, held, total)


def _largest_phase_fp32(model: str) -> float:
    """The estimator's largest activation phase of one float32 run at 1024² (bytes)."""
    if model.startswith("URSA"):
        parts = activation_parts(URSA_T, URSA_V, (1, 64, 64), 1, True, torch.float32)
        return max(v for k, v in parts.items() if k.endswith("_peak"))
    report = full_size_report(dtype=torch.float32, plus=True, fp8="FP8" in model)
    return max(report[k] for k in qmem.PHASES)


def test_the_reference_machine_holds_the_dtype_copy_and_two_float32_copies(weights) -> None:
    """validate/golden.py make_golden: dtype copy, reference and emulated floor are alive at once."""
    for model, copy, ref, floor, together, with_act in table("golden-table"):
        assert abs(_num(copy) - sum(weights[(model, "bfloat16")]) / GB) <= 0.011, model
        assert abs(_num(ref) - sum(weights[(model, "float32")]) / GB) <= 0.011, model
        assert ref == floor  # the emulated floor is a second float32 copy of the same weights
        assert math.isclose(_num(together), _num(copy) + _num(ref) + _num(floor), abs_tol=0.011), model
        assert abs(_num(with_act) - (_num(together) + _largest_phase_fp32(model) / GB)) <= 0.06, model


def test_the_device_plans_are_the_estimators() -> None:
    text = DOC.read_text(encoding="utf-8")
    for label, fp8 in (("| bfloat16 |", False), ("| bfloat16 + FP8 file |", True)):
        line = next(x for x in text.splitlines() if x.startswith(label) and "GB |" in x)
        cells = [_num(c.replace("GB", "").strip()) for c in line.strip("|").split("|")[1:]]
        report = full_size_report(fp8=fp8, plus=True)
        assert cells == pytest.approx([report[p] / GB for p in ("none", "before-decode", "model", "sequential")],
                                      abs=0.06), label


def _ursa_flops(side: int) -> float:
    latent = (1, side // 16, side // 16)
    n_img, text_len, rows = math.prod(latent), 320, 2
    length = text_len + 1 + n_img
    with on_meta():
        model = URSATransformer(URSA_T, plain_ops())
        ids = torch.zeros(rows, length, dtype=torch.int64)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(ids, positions(latent, text_len).to("meta"), logits_slice=slice(length - n_img - 1, length - 1))
    return counter.get_total_flops()


def test_the_per_step_flops_are_the_flop_counters() -> None:
    rows = table("flops-table")
    assert len(rows) == 3
    qwen = 2 * count_forward_flops({**REAL_TRANSFORMER, "zero_cond_t": True}, [[(1, 64, 64), (1, 64, 64)]], 227)
    counted = {"Qwen": qwen, "1024": _ursa_flops(1024), "512": _ursa_flops(512)}
    for name, tokens, tflop, cpu, _h200 in rows:
        key = "Qwen" if name.startswith("Qwen") else ("1024" if "1024²" in name else "512")
        assert abs(_num(tflop) - counted[key] / 1e12) <= 0.06, (name, counted[key] / 1e12)
        seconds = _num(cpu.removesuffix(" s"))  # the stated 2 TFLOP/s assumption, applied
        assert abs(seconds - counted[key] / 2e12) <= max(0.06, 0.01 * seconds), name
        assert int(tokens.replace(",", "")) > 0
