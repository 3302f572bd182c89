"""URSA on the portable Philox stream (CPU float32): pinned integer draws, call styles, chunks, eager = compiled."""

from __future__ import annotations

import pytest
import torch

from difforge.config import RunConfig
from difforge.devices import CPUBackend
from difforge.devices.compile import compile_policy
from difforge.models.ursa import URSAPipeline
from difforge.models.ursa.call import PHILOX_RNG
from difforge.models.ursa.sampling import DEVICE_CHUNK, Draws, PhiloxDraws
from difforge.runtime.philox import gumbel_argmax_block, philox_words
from difforge.runtime.record import RunRecord

CPU = torch.device("cpu")


def test_initial_codes_are_pinned_integers() -> None:
    """Integer draws: the same on every CPU and device (no float is involved), so pinned exactly.

    Code ``n`` of sample ``b`` is ``(word * K) >> 32`` of word ``n % 4`` of counter ``(n // 4, b, 0, 0)`` under
    the key ``(seed mod 2**32, seed >> 32)`` (checked against :func:`philox_words` on Python ints).
    """
    codes = PhiloxDraws(3, CPU).codes((2, 8), 64)
    assert codes.tolist() == [[52, 7, 41, 48, 17, 35, 14, 38], [26, 47, 24, 40, 48, 36, 45, 37]]
    assert codes[1, 5] == (philox_words(1, 1, 0, 0, 3, 0)[1] * 64) >> 32
    assert PhiloxDraws(3, CPU).codes((1, 8), 64).tolist() == codes[:1].tolist()  # sample 0 keeps its codes
    assert PhiloxDraws(2**63 - 1, CPU).codes((1, 4), 64000).tolist() == [[12725, 36980, 62230, 3389]]


def _tokens(pipe: URSAPipeline, **kw) -> tuple[torch.Tensor, RunRecord]:
    record = RunRecord("generate")
    pipe(RunConfig(model="t", quiet=True, prompt="a red cat", height=64, width=64, steps=6, seed=3, **kw), record)
    assert pipe.last_tokens is not None
    return pipe.last_tokens.flatten(), record


def test_tiny_ursa_tokens_on_the_philox_stream(tiny_pipe: URSAPipeline) -> None:
    """Token ids of a CPU float32 run, pinned: what any device must give for this seed up to near-tied logits."""
    got, record = _tokens(tiny_pipe, fast=[PHILOX_RNG])
    assert got.tolist() == [19, 19, 22, 2, 2, 36, 23, 18, 45, 54, 46, 2, 33, 36, 32, 23]
    assert record.extra["ursa"]["random_stream"] == "philox"
    reference, _ = _tokens(tiny_pipe)
    assert not torch.equal(got, reference)  # the CPU's default is the reference's stream


def test_both_call_styles_key_the_stream_by_the_seed(tiny_pipe: URSAPipeline) -> None:
    """``pipe(cfg)`` keys by cfg.seed, the reference-style call by its generator's seed: the same tokens."""
    ours, _ = _tokens(tiny_pipe, fast=[PHILOX_RNG])
    out = tiny_pipe(prompt="a red cat", height=64, width=64, num_inference_steps=6,
                    generator=torch.Generator().manual_seed(3), fast=(PHILOX_RNG,), output_type="latent")
    assert torch.equal(out.frames.flatten(), ours)


def _step_inputs(pipe: URSAPipeline, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    k = pipe.scheduler.codebook_size
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 16, k, generator=gen) * 3, torch.randint(0, k, (2, 16), generator=gen)


def test_host_and_device_policies_give_the_same_step(tiny_pipe: URSAPipeline) -> None:
    """The CPU's small blocks and jumping-rows-only draw, and an accelerator's large blocks and all-rows draw,
    give the same tokens: a row's noise is addressed by its index."""
    z, x = _step_inputs(tiny_pipe)
    steps = 8
    for i in (1, 4, steps - 1):
        host = tiny_pipe.scheduler.step(z.clone(), i, steps, x, Draws(philox=PhiloxDraws(9, CPU, chunk=16, sparse=True)))
        device = tiny_pipe.scheduler.step(z.clone(), i, steps, x, Draws(philox=PhiloxDraws(9, CPU, chunk=DEVICE_CHUNK)))
        assert torch.equal(host, device)
        assert i == steps - 1 or 0 < int((host != x).sum()) < x.numel()  # some tokens jumped, not all
    none_jump = tiny_pipe.scheduler.step(z.clone(), 0, steps, x, Draws(philox=PhiloxDraws(9, CPU, sparse=True)))
    assert torch.equal(none_jump, x)  # t = 0: the rate is 0, no row to draw


@pytest.mark.slow
@pytest.mark.skipif(not compile_policy("cpu").available, reason=f"no CPU compile here: {compile_policy('cpu').detail}")
def test_tiny_ursa_step_eager_equals_compiled(tiny_pipe: URSAPipeline) -> None:
    """The Gumbel-max block compiled by the CPU's policy (Inductor) gives the eager block's tokens, every step kind."""
    from functools import partial

    compiled = CPUBackend().compile_policy().compile(partial(gumbel_argmax_block, inplace=False))
    assert compiled is not None
    z, x = _step_inputs(tiny_pipe, seed=1)
    steps = 8
    for i in (1, 5, steps - 1):  # jump steps and the final (x1-only) step
        eager = tiny_pipe.scheduler.step(z.clone(), i, steps, x, Draws(philox=PhiloxDraws(4, CPU)))
        fused = tiny_pipe.scheduler.step(z.clone(), i, steps, x, Draws(philox=PhiloxDraws(4, CPU, block_fn=compiled)))
        assert torch.equal(eager, fused), i


def test_the_memory_estimate_counts_the_philox_blocks() -> None:
    """An accelerator's eager blocks (2**22 counters) join the sampler's temporaries; the reference stream adds none."""
    from difforge.models.ursa.config import URSATransformerConfig, VQConfig
    from difforge.models.ursa.memory import PHILOX_BLOCK_BYTES_PER_COUNTER, activation_parts

    tcfg, vcfg = URSATransformerConfig(), VQConfig()
    plain = activation_parts(tcfg, vcfg, (1, 32, 32), 1, True, torch.bfloat16)
    blocks = activation_parts(tcfg, vcfg, (1, 32, 32), 1, True, torch.bfloat16, philox_chunk=DEVICE_CHUNK)
    assert "philox_blocks" not in plain
    assert blocks["philox_blocks"] == PHILOX_BLOCK_BYTES_PER_COUNTER * DEVICE_CHUNK == 384 * 2**20
    assert blocks["scheduler_temporaries"] == plain["scheduler_temporaries"] + blocks["philox_blocks"]
    assert blocks["denoise_peak"] >= plain["denoise_peak"]
