"""URSAProbe: what validation asks of URSA, against the pipeline's own run in one process (CPU, float32)."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
import torch

from difforge.config import RunConfig
from difforge.errors import InputError
from difforge.models.probing import Probe
from difforge.models.ursa import URSAPipeline
from difforge.models.ursa.call import ReferenceArgs
from difforge.models.ursa.probe import NEGATIVE, PROMPTS, URSAProbe
from difforge.runtime.record import RunRecord

MOVED = ("forward_step", "transformer_blocks", "component_inputs", "run_component", "flops_per_step")


def recorded(pipe: URSAPipeline, cfg: RunConfig) -> dict[int, tuple[dict, dict]]:
    """Every step's hook arguments of one ``pipe(cfg)`` run."""
    seen: dict[int, tuple[dict, dict]] = {}
    pipe(cfg, RunRecord("generate"), step_hook=lambda i, a, b: seen.__setitem__(i, (a, b)))
    return seen


def test_the_probe_is_the_protocol(tiny_pipe: URSAPipeline) -> None:
    probe = URSAProbe(tiny_pipe)
    members = [n for n in vars(Probe) if not n.startswith("_")] + list(Probe.__annotations__)
    assert all(hasattr(probe, name) for name in members), [n for n in members if not hasattr(probe, n)]
    assert (probe.family, probe.takes_images, probe.pipeline) == ("ursa", False, tiny_pipe)
    assert probe.default_prompts == PROMPTS and len(PROMPTS) == 3 and isinstance(PROMPTS, tuple)
    assert probe.negative_prompt == NEGATIVE and NEGATIVE.startswith("worst quality")
    assert probe.dtype == torch.float32 and probe.size_multiple == tiny_pipe.spatial_stride == 16


def test_the_pipeline_keeps_no_validation_hooks() -> None:
    assert not [name for name in MOVED if hasattr(URSAPipeline, name)]


@pytest.mark.parametrize("guidance", [7.0, 1.0])
def test_forward_step_is_the_pipelines_step_bit_for_bit(tiny_pipe: URSAPipeline, guidance: float) -> None:
    """Teacher-forced on the run's own tokens, every step's logits equal the run's (max abs diff 0).

    Step 0 of the metric path moves no token, so its sampled tokens must equal the run's too, whatever
    stream draws them; later steps draw from the Philox stream, not this run's reference stream.
    """
    cfg = RunConfig(model="tiny-ursa", quiet=True, prompt="a red cat", negative_prompt="blurry", height=64, width=48,
                    steps=5, guidance=guidance, guidance_trunc=0.5, seed=9)
    seen = recorded(tiny_pipe, cfg)
    probe = URSAProbe(tiny_pipe)
    for i, (before, after) in sorted(seen.items()):
        out = probe.forward_step(cfg, i, before)
        assert out["logits"].dtype == after["logits"].dtype == torch.float32
        assert torch.equal(out["logits"], after["logits"]), i
    first = probe.forward_step(cfg, 0, seen[0][0])
    assert torch.equal(first["tokens"], seen[0][1]["tokens"]) and torch.equal(first["tokens"], seen[0][0]["tokens"])
    with pytest.raises(InputError, match="tokens per row"):
        probe.forward_step(cfg, 0, {"tokens": seen[0][0]["tokens"][:, :-1]})


def test_component_inputs_are_seeded_and_run_through_the_pipeline(tiny_pipe: URSAPipeline) -> None:
    cfg = RunConfig(model="tiny-ursa", prompt="a cat", height=32, width=64, seed=4)
    probe = URSAProbe(tiny_pipe)
    a, b = probe.component_inputs(cfg), probe.component_inputs(cfg)
    assert all(torch.equal(a[c][k], b[c][k]) for c in a for k in a[c])
    want = torch.randint(0, 64, (1, 1, 2, 4), generator=torch.Generator().manual_seed(4))
    assert torch.equal(a["vae_decode"]["codes"], want)
    ids, pos = a["transformer"]["ids"], a["transformer"]["positions"]
    with torch.no_grad():  # the sliced lm_head gives the full forward's sampler rows, bit for bit
        full = tiny_pipe.transformer(ids, pos)[:, -9:-1]
    assert torch.equal(probe.run_component("transformer", a["transformer"]), full)
    with pytest.raises(InputError, match="Unknown URSA component"):
        probe.run_component("text_encoder", {})


def test_operator_cases_on_the_cpu_equal_their_reference(tiny_pipe: URSAPipeline) -> None:
    """float32 on the CPU with the portable ops: device, reference and floor are the same computation."""
    cfg = RunConfig(model="tiny-ursa", prompt="a cat", height=32, width=32, steps=4, seed=1)
    tokens = torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(0))
    original = tiny_pipe.transformer.ops
    cases = URSAProbe(tiny_pipe).operator_cases(torch.device("cpu"), cfg, {"tokens": tokens}, [])
    assert tiny_pipe.transformer.ops is original  # the recorder is taken off again
    assert [c.op for c in cases] == ["rms_norm/hidden", "rms_norm/head", "swiglu", "rotary", "attention"]
    for case in cases:
        assert case.exact and case.impl != "?", case.op
        assert case.floor is not None and torch.equal(case.dut, case.ref) and torch.equal(case.floor, case.ref), case.op
    assert "interleaved" in cases[3].note and cases[4].shape == "2x325x2x128, 2x325x1x128, 2x325x1x128"


def test_both_call_styles_give_the_same_tokens_and_frames(tiny_pipe: URSAPipeline) -> None:
    """``pipe(cfg)`` with seed s and ``pipe(prompt=..., generator=manual_seed(s))`` run the same stages."""
    kw = dict(prompt=["a red cat", "the sun"], negative_prompt=["blurry", "ugly"], height=32, width=48, steps=4,
              guidance=5.0, guidance_trunc=0.5)
    for seed in (0, 11):
        tiny_pipe(RunConfig(model="tiny-ursa", quiet=True, seed=seed, **kw), RunRecord("generate"))
        tokens, frames = tiny_pipe.last_tokens, tiny_pipe.last_frames
        ref = dict(prompt=kw["prompt"], negative_prompt=kw["negative_prompt"], height=32, width=48,
                   num_inference_steps=4, guidance_scale=5.0, guidance_trunc=0.5)
        out = tiny_pipe(**ref, generator=torch.Generator().manual_seed(seed), output_type="np")
        assert torch.equal(tiny_pipe.last_tokens, tokens) and np.array_equal(out.frames, frames[:, 0])
        latent = tiny_pipe.generate(**ref, generator=torch.Generator().manual_seed(seed), output_type="latent")
        assert torch.equal(latent.frames, tokens)


def test_every_cpu_generator_comes_from_the_backend(tiny_pipe: URSAPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[int] = []
    make = tiny_pipe.backend.generator

    def spy(seed: int) -> torch.Generator:
        seeds.append(int(seed))
        return make(seed)

    monkeypatch.setattr(tiny_pipe.backend, "generator", spy)
    cfg = RunConfig(model="tiny-ursa", quiet=True, prompt="x", height=32, width=32, steps=2, seed=3)
    seen = recorded(tiny_pipe, cfg)
    probe = URSAProbe(tiny_pipe)
    probe.forward_step(cfg, 1, seen[1][0])
    probe.component_inputs(cfg)
    assert seeds == [3, 3, 3]  # the run; the teacher-forced step's Philox key (the run's seed); the components


def test_call_reads_in_numbered_stages() -> None:
    source = inspect.getsource(URSAPipeline.__call__)
    stages = ["# 1. check inputs", "# 2. encode prompts", "# 3. prepare tokens", "# 4. denoise", "# 5. decode"]
    at = [source.find(s) for s in stages]
    assert -1 not in at and at == sorted(at), dict(zip(stages, at, strict=True))


def test_reference_arguments_are_checked_like_a_run_config(tiny_pipe: URSAPipeline) -> None:
    from difforge.errors import StepsError

    with pytest.raises(StepsError, match="at least 2"):  # RunConfig.validate, the one place for the rule
        tiny_pipe(prompt="x", height=32, width=32, num_inference_steps=1)
    with pytest.raises(TypeError):
        tiny_pipe(prompt="x", colour="red")
    assert ReferenceArgs().run_config().steps == URSAPipeline.num_steps(RunConfig(model="x")) == 25


# ---- the sampler step alone (issue 25) ----------------------------------------------------------------
PHILOX_CFG = RunConfig(model="tiny-ursa", quiet=True, prompt="a red cat", height=64, width=64, steps=4, seed=7,
                       fast=["philox-rng"])


def test_a_philox_run_is_replayed_token_for_token(tiny_pipe: URSAPipeline) -> None:
    """forward_step draws from the run's own Philox words (key: the seed; counter: the step), so teacher-forced
    on a Philox run's tokens it reproduces every step's tokens exactly - on any device the same words."""
    seen = recorded(tiny_pipe, PHILOX_CFG)
    probe = URSAProbe(tiny_pipe)
    assert probe.portable_stream(PHILOX_CFG) and not probe.portable_stream(dataclasses.replace(PHILOX_CFG, fast=[]))
    for i, (before, after) in sorted(seen.items()):
        assert torch.equal(probe.forward_step(PHILOX_CFG, i, before)["tokens"], after["tokens"]), i


def test_the_sampler_step_is_the_schedulers_step(tiny_pipe: URSAPipeline) -> None:
    """Given a step's own logits, sampler_step draws the tokens forward_step drew (natively: bit for bit);
    its internals are the scheduler's rates and jump probabilities, finite and in range."""
    seen = recorded(tiny_pipe, PHILOX_CFG)
    probe = URSAProbe(tiny_pipe)
    for i, (before, _after) in sorted(seen.items()):
        step = probe.forward_step(PHILOX_CFG, i, before)
        alone = probe.sampler_step(PHILOX_CFG, i, before, step["logits"])
        assert torch.equal(alone["tokens"], step["tokens"]), i
        if i == PHILOX_CFG.steps - 1:  # the last step only draws the targets
            assert set(alone) == {"x1", "tokens"} and torch.equal(alone["x1"], alone["tokens"])
            continue
        assert alone["jump_prob"].shape == (1, 16) and alone["rate"].shape == (16, 64)
        assert bool(((alone["jump_prob"] >= 0) & (alone["jump_prob"] <= 1)).all())
        assert bool((alone["rate"] >= 0).all()) and bool(torch.isfinite(alone["rate"]).all())
        # float32 pipeline: the emulated path (float16 codebook terms on float32 kernels) is the native one
        # up to those terms' rounding
        emulated = probe.sampler_step(PHILOX_CFG, i, before, step["logits"], emulate=torch.float32)
        torch.testing.assert_close(emulated["jump_prob"], alone["jump_prob"], rtol=2e-2, atol=1e-4)


def test_given_targets_decide_the_rates(tiny_pipe: URSAPipeline) -> None:
    """``x1`` given: the rates are computed for those targets (the reference's), the draws stay this side's."""
    seen = recorded(tiny_pipe, PHILOX_CFG)
    before, after = seen[1]
    probe = URSAProbe(tiny_pipe)
    own = probe.sampler_step(PHILOX_CFG, 1, before, after["logits"])
    other = (own["x1"] + 1) % tiny_pipe.scheduler.codebook_size
    forced = probe.sampler_step(PHILOX_CFG, 1, before, after["logits"], x1=other)
    assert torch.equal(forced["x1"], own["x1"]) and torch.equal(forced["tokens"], own["tokens"])
    assert not torch.equal(forced["rate"], own["rate"])
    again = probe.sampler_step(PHILOX_CFG, 1, before, after["logits"], x1=own["x1"])
    assert torch.equal(again["rate"], own["rate"]) and torch.equal(again["jump_prob"], own["jump_prob"])
