"""Validate's first-divergent-layer localisation against the block where a planted fault first fires.

The expected block comes from :mod:`tests.validate.localisation` (the fault's own firing count under
block hooks, never validate's numbers); validate runs through the real CLI inside the fault
(:mod:`tests.validate.fault_cli`), as ``scripts/fault_sweep.py`` runs it.  One fault per tiny model, each
chosen so that the answer is not trivially "the first listed block" or the old cosine-only rule's:

* tiny-ursa ``rope_sin_sign``: fires between ``model.embed_tokens`` and ``model.layers.0`` (the rotary
  table is cast to bf16 there), so ``model.layers.0`` must be named, not the embedding;
* tiny-qwen-edit ``linear_noise``: fires in the input projections before ``transformer_blocks.0``; that
  block's output cosine stays above 0.999 (3 % multiplicative noise) while its rel-L2 is ~8x the floor's,
  so only the floor rule on rel-L2 (not the old cosine gate) names it.

Cost: two quick validations (32x32, 2 steps, ``--rounds 1 --warmup 0``) run side by side in the
background on one thread each while this process makes one clean bf16 run + one replay per model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from difforge.validate.steps import StepTrace, localise

from . import faults
from .localisation import (
    WHERE_AFTER,
    WHERE_BEFORE,
    WHERE_BLOCK,
    WHERE_NEVER,
    WHERE_OUTSIDE,
    Replay,
    expected_block,
    first_fire,
    prepare,
)

ROOT = Path(__file__).resolve().parents[2]


# ---- the expected-block function on a toy transformer ---------------------------------------------
class _Block(nn.Module):
    def __init__(self, act: Any) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.lin(x))


class _Toy(nn.Module):
    """embedding (before block 0) | block 0 (linear, silu) | layer_norm | block 1 (linear, gelu) |
    block 2 (linear, silu) | group_norm (after the last block)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.blocks = nn.ModuleList([_Block(F.silu), _Block(F.gelu), _Block(F.silu)])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.blocks[0](self.embed(ids))
        x = F.layer_norm(x, (8,))
        x = self.blocks[2](self.blocks[1](x))
        return F.group_norm(x.transpose(1, 2), 2).transpose(1, 2)


class _ToyProbe:
    """A probe of the toy: ``forward_step`` runs a softmax before the transformer, a matmul after it."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = _Toy().to(torch.bfloat16)

    def modules(self) -> dict[str, nn.Module]:
        return {"transformer": self.model}

    def transformer_blocks(self) -> list[tuple[str, nn.Module]]:
        return [(f"blocks.{i}", b) for i, b in enumerate(self.model.blocks)]

    def forward_step(self, cfg: Any, i: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        weights = torch.softmax(inputs["w"].to(torch.bfloat16), -1)
        weights = torch.cat([weights, weights])[:8]  # a cat_swap fire that changes nothing
        out = self.model(inputs["ids"])
        return {"logits": (out @ weights).float()}


def _toy_replay() -> Replay:
    trace = StepTrace()
    trace.hook(0, {"ids": torch.tensor([[1, 2, 3, 4]]), "w": torch.randn(8, 8)}, {})
    probe = _ToyProbe()
    return Replay("toy", probe, None, trace, [n for n, _ in probe.transformer_blocks()])  # type: ignore[arg-type]


@pytest.mark.parametrize(("fault", "where", "block", "expected", "sits"), [
    ("embedding_shift", WHERE_BEFORE, "blocks.0", "blocks.0", True),  # before the first block
    ("linear_noise", WHERE_BLOCK, "blocks.0", "blocks.0", True),  # inside the first block
    ("layer_norm_offset", WHERE_BEFORE, "blocks.1", "blocks.1", True),  # between blocks 0 and 1
    ("gelu_relu", WHERE_BLOCK, "blocks.1", "blocks.1", True),  # only block 1 calls gelu
    ("group_norm_offset", WHERE_AFTER, None, None, True),  # after the last block, still in the transformer
    ("softmax_temp", WHERE_OUTSIDE, None, None, False),  # before the transformer is entered
    ("matmul_noise", WHERE_OUTSIDE, None, None, False),  # after it returned
    ("conv_no_bias", WHERE_NEVER, None, None, False),
    ("cat_swap", WHERE_NEVER, None, None, False),  # fired once, but swapping cat([w, w]) changes nothing
])
def test_expected_block_of_a_toy_transformer(fault: str, where: str, block: str | None, expected: str | None,
                                             sits: bool) -> None:
    ff = expected_block(fault, _toy_replay())
    assert (ff.where, ff.block, ff.expected, ff.sits_in_transformer) == (where, block, expected, sits), ff
    if fault == "gelu_relu":
        assert ff.per_block == {"blocks.0": 0, "blocks.1": 1, "blocks.2": 0}
    if sits:
        assert ff.fired_in_transformer > 0
    if fault == "cat_swap":
        assert (ff.fired, ff.effective) == (1, 0)
    assert ff.to_dict()["expected"] == expected


def test_first_fire_ignores_fires_before_the_replay() -> None:
    """A Fault instance reused after other calls is reset: only the replay's own calls count."""
    fault = faults.get("gelu_relu")
    assert fault is not None
    with fault:
        F.gelu(torch.ones(3, dtype=torch.bfloat16))
    assert fault.fired == 1
    ff = first_fire(fault, _toy_replay())
    assert ff.fired == 1 and ff.block == "blocks.1"


# ---- localise's judging: the floor rule per block ---------------------------------------------------
class _NoisyBlock(nn.Module):
    """``tanh``-ish block whose output gets a fixed relative noise (rounding stand-in) and a scale."""

    def __init__(self, k: int, noise: float, seed: int, scale: float) -> None:
        super().__init__()
        self.k, self.noise, self.seed, self.scale = k, noise, seed, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.tanh(x * (1.0 + 0.1 * self.k)) + 0.5 * x
        if self.noise:
            gen = torch.Generator().manual_seed(self.seed * 100 + self.k)
            out = out * (1 + self.noise * torch.randn(out.shape, generator=gen))
        return out * self.scale


class _Pipe:
    """Three blocks; ``scale_at`` multiplies that block's output by 1.05 (a cosine of exactly 1)."""

    def __init__(self, noise: float = 0.0, seed: int = 0, scale_at: int | None = None) -> None:
        self.blocks = [(f"b{k}", _NoisyBlock(k, noise, seed, 1.05 if k == scale_at else 1.0)) for k in range(3)]

    def transformer_blocks(self) -> list[tuple[str, nn.Module]]:
        return self.blocks

    def forward_step(self, cfg: Any, step: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        x = inputs["x"]
        for _, block in self.blocks:
            x = block(x)
        return {"noise_pred": x}


def test_localise_names_a_scaled_block_by_its_error_over_the_floor() -> None:
    """A block scaled by 1.05 keeps cosine 1 (the old cosine gate never named it); its rel-L2 is ~15x
    the floor's, so the floor rule names it - and not the clean block before it; a device as noisy as
    the floor names nothing."""
    inputs = {"x": torch.linspace(-2, 2, 4096)}
    ref, floor = _Pipe(), _Pipe(noise=0.003, seed=1)
    loc = localise(_Pipe(noise=0.003, seed=2, scale_at=1), ref, None, 0, inputs, floor=floor)  # type: ignore[arg-type]
    assert loc["first_divergent"] == "b1", loc["blocks"]
    b0, b1 = loc["blocks"][0], loc["blocks"][1]
    assert b1["cosine"] > 0.9999 and b1["ratio"] > 5 and b1["verdict"] == "FAIL"
    assert b0["verdict"] == "PASS" and not b0["divergent"]
    clean = localise(_Pipe(noise=0.003, seed=2), ref, None, 0, inputs, floor=floor)  # type: ignore[arg-type]
    assert clean["first_divergent"] is None and clean["after_blocks"]
    assert all(b["verdict"] == "PASS" for b in clean["blocks"])


# ---- validate names the expected block (through the real CLI) --------------------------------------
CASES = [("tiny-ursa", "rope_sin_sign"), ("tiny-qwen-edit", "linear_noise")]
#: Small and short (both faults FAIL the step rung at step 0 at this size too, as in the sweep's 64x64/4 steps).
SIZE, STEPS = 32, 2


def _start(model: str, fault: str, out: Path) -> subprocess.Popen[str]:
    """One quick validation inside ``fault``, in the background on one thread (both run side by side while
    this process measures the expected blocks: on 2 cores the whole file stays well under 90 s)."""
    cmd = [sys.executable, "-m", "tests.validate.fault_cli", fault, "--", "validate", "--model", model,
           "--device", "cpu", "--dtype", "bfloat16", "--quick", "--height", str(SIZE), "--width", str(SIZE),
           "--steps", str(STEPS), "--seed", "0", "--rounds", "1", "--warmup", "0", "--quiet", "--no-speed-table",
           "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def validations(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], tuple[Any, Path]]]:
    base = tmp_path_factory.mktemp("localisation")
    started = {case: (_start(*case, base / "__".join(case)), base / "__".join(case)) for case in CASES}
    yield started
    for proc, _ in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("model", "fault"), CASES)
def test_validate_names_the_block_the_fault_fires_in(model: str, fault: str,
                                                     validations: dict[tuple[str, str], tuple[Any, Path]]) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the two validations hold the cores
    try:
        ff = expected_block(fault, prepare(model, seed=0, height=SIZE, width=SIZE, steps=STEPS))
    finally:
        torch.set_num_threads(threads)
    assert ff.sits_in_transformer and ff.expected is not None, ff
    proc, out = validations[(model, fault)]
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, log
    step = json.loads((out / "report.json").read_text())["rungs"]["step"]
    loc = step["data"]["localisation"]
    assert loc is not None, step["summary"]
    assert loc["first_divergent"] == ff.expected, (ff, loc["blocks"])
    assert ff.expected in step["summary"]
