"""URSA on the portable Philox stream (CPU float32): pinned integer draws, call styles, chunks, its two samplers,
distinct counters per draw, eager = compiled."""

from __future__ import annotations

import pytest
import torch

from difforge.config import RunConfig
from difforge.devices import CPUBackend
from difforge.devices.compile import compile_policy
from difforge.models.ursa import URSAPipeline
from difforge.models.ursa.call import PHILOX_RNG
from difforge.models.ursa.sampling import (
    DEVICE_CHUNK,
    DRAW_INIT,
    DRAW_JUMP,
    DRAW_JUMP_U,
    DRAW_X1,
    GUMBEL_MAX,
    INVERSE_CDF,
    PHILOX_SAMPLERS,
    Draws,
    PhiloxDraws,
    sampler_block,
)
from difforge.runtime import philox
from difforge.runtime.philox import philox_words
from difforge.runtime.record import RunRecord
from tests.dispatch import LOWERED_REASON, dispatch_lowered

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
    """Token ids of a CPU float32 run, pinned: what any device must give for this seed up to near-boundary draws.

    The default sampler is inverse-CDF; the Gumbel-max sampler still gives the ids pinned before it was the
    default (the same stream, another categorical sampler)."""
    assert tiny_pipe.philox_sampler == INVERSE_CDF
    got, record = _tokens(tiny_pipe, fast=[PHILOX_RNG])
    assert got.tolist() == [46, 13, 7, 46, 32, 33, 23, 23, 32, 2, 13, 23, 2, 38, 2, 46]
    assert record.extra["ursa"]["random_stream"] == "philox"
    stream = next(a for a in record.adaptations if a.what == "random stream")
    assert "inverse-cdf sampling" in stream.detail
    reference, _ = _tokens(tiny_pipe)
    assert not torch.equal(got, reference)  # the CPU's default is the reference's stream
    tiny_pipe.philox_sampler = GUMBEL_MAX
    try:
        gumbel, _ = _tokens(tiny_pipe, fast=[PHILOX_RNG])
    finally:
        tiny_pipe.philox_sampler = INVERSE_CDF
    assert gumbel.tolist() == [19, 19, 22, 2, 2, 36, 23, 18, 45, 54, 46, 2, 33, 36, 32, 23]


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


@pytest.mark.parametrize("sampler", PHILOX_SAMPLERS)
def test_host_and_device_policies_give_the_same_step(tiny_pipe: URSAPipeline, sampler: str) -> None:
    """The CPU's small blocks and jumping-rows-only draw, and an accelerator's large blocks and all-rows draw,
    give the same tokens: a row's draw is addressed by its index."""
    z, x = _step_inputs(tiny_pipe)
    steps = 8
    host_ph = PhiloxDraws(9, CPU, chunk=16, sparse=True, sampler=sampler)
    device_ph = PhiloxDraws(9, CPU, chunk=DEVICE_CHUNK, sampler=sampler)
    for i in (1, 4, steps - 1):
        host = tiny_pipe.scheduler.step(z.clone(), i, steps, x, Draws(philox=host_ph))
        device = tiny_pipe.scheduler.step(z.clone(), i, steps, x, Draws(philox=device_ph))
        assert torch.equal(host, device)
        assert i == steps - 1 or 0 < int((host != x).sum()) < x.numel()  # some tokens jumped, not all
    none_jump = tiny_pipe.scheduler.step(z.clone(), 0, steps, x, Draws(philox=host_ph))
    assert torch.equal(none_jump, x)  # t = 0: the rate is 0, no row to draw


def test_every_draw_of_a_run_has_its_own_counter_words(tiny_pipe: URSAPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counter words 2 and 3 (step, draw) of every Philox grid a run computes: the initial codes (0, DRAW_INIT),
    then per step (i, DRAW_X1), (i, DRAW_JUMP_U), (i, DRAW_JUMP) - never one pair twice, so no two draws
    share a number (the final step draws x1 only; reuse-first-forward skips step 0)."""
    seen: list[tuple[int, int]] = []
    grid = philox.grid_words

    def spy(rows, ncols, c2, c3, *rest, **kw):  # type: ignore[no-untyped-def]
        seen.append((int(c2), int(c3)))
        return grid(rows, ncols, c2, c3, *rest, **kw)

    monkeypatch.setattr(philox, "grid_words", spy)
    _tokens(tiny_pipe, fast=[PHILOX_RNG])
    jump_steps = [(i, d) for i in range(1, 5) for d in (DRAW_X1, DRAW_JUMP_U, DRAW_JUMP)]
    assert seen == [(0, DRAW_INIT), *jump_steps, (5, DRAW_X1)]
    assert len(set(seen)) == len(seen)


@pytest.mark.slow
@pytest.mark.parametrize("sampler", PHILOX_SAMPLERS)
@pytest.mark.skipif(not compile_policy("cpu").available, reason=f"no CPU compile here: {compile_policy('cpu').detail}")
@pytest.mark.skipif(dispatch_lowered(), reason=LOWERED_REASON)
def test_tiny_ursa_step_eager_equals_compiled(tiny_pipe: URSAPipeline, sampler: str) -> None:
    """The sampler block compiled by the CPU's policy (Inductor) gives the eager block's tokens, every step kind."""
    compiled = CPUBackend().compile_policy().compile(sampler_block(sampler))
    assert compiled is not None
    z, x = _step_inputs(tiny_pipe, seed=1)
    steps = 8
    for i in (1, 5, steps - 1):  # jump steps and the final (x1-only) step
        eager = tiny_pipe.scheduler.step(z.clone(), i, steps, x, Draws(philox=PhiloxDraws(4, CPU, sampler=sampler)))
        fused = tiny_pipe.scheduler.step(
            z.clone(), i, steps, x, Draws(philox=PhiloxDraws(4, CPU, block_fn=compiled, sampler=sampler)))
        assert torch.equal(eager, fused), i


@pytest.mark.slow
@pytest.mark.skipif(not compile_policy("cpu").available, reason=f"no CPU compile here: {compile_policy('cpu').detail}")
@pytest.mark.skipif(dispatch_lowered(), reason=LOWERED_REASON)
def test_tiny_ursa_run_on_the_philox_stream_eager_equals_compiled(tiny_pipe: URSAPipeline) -> None:
    """A whole tiny-ursa call with cfg.compile (decoder layers and the inverse-CDF sampler compiled by Inductor)
    gives the eager call's tokens: compiled logits move by float noise only, far from any draw's boundary here."""
    eager, _ = _tokens(tiny_pipe, fast=[PHILOX_RNG])
    try:
        fused, record = _tokens(tiny_pipe, fast=[PHILOX_RNG], compile=True)
    finally:
        tiny_pipe.set_compile(False)
    assert torch.equal(eager, fused)
    stream = next(a for a in record.adaptations if a.what == "random stream")
    assert stream.choice == "philox4x32-10 on cpu (sampler compiled)"


def test_an_unknown_sampler_is_refused() -> None:
    with pytest.raises(ValueError, match="inverse-cdf, gumbel-max"):
        PhiloxDraws(0, CPU, sampler="box-muller")


def test_the_memory_estimate_counts_the_philox_blocks() -> None:
    """The inverse-CDF draw's small temporaries (rows x (K / block + block)), or Gumbel-max's eager blocks
    (2**22 counters on an accelerator), join the sampler's temporaries; the reference stream adds none."""
    from difforge.models.ursa.config import URSATransformerConfig, VQConfig
    from difforge.models.ursa.memory import (
        INVERSE_CDF_BYTES_PER_ENTRY,
        PHILOX_BLOCK_BYTES_PER_COUNTER,
        activation_parts,
    )

    tcfg, vcfg = URSATransformerConfig(), VQConfig()
    plain = activation_parts(tcfg, vcfg, (1, 32, 32), 1, True, torch.bfloat16)
    blocks = activation_parts(tcfg, vcfg, (1, 32, 32), 1, True, torch.bfloat16, philox_chunk=DEVICE_CHUNK)
    gumbel = activation_parts(tcfg, vcfg, (1, 32, 32), 1, True, torch.bfloat16, philox_chunk=DEVICE_CHUNK,
                              philox_sampler=GUMBEL_MAX)
    assert "philox_blocks" not in plain
    assert blocks["philox_blocks"] == INVERSE_CDF_BYTES_PER_ENTRY * 1024 * (64000 // 256 + 256) < 2**23
    assert gumbel["philox_blocks"] == PHILOX_BLOCK_BYTES_PER_COUNTER * DEVICE_CHUNK == 384 * 2**20
    for parts in (blocks, gumbel):
        assert parts["scheduler_temporaries"] == plain["scheduler_temporaries"] + parts["philox_blocks"]
        assert parts["denoise_peak"] >= plain["denoise_peak"]
