"""Performance switches: every exact one leaves tokens unchanged; the approximate ones are labelled.

CPU float32, two models: tiny-ursa and a second random config (3 layers, non-grouped heads, a
96-code book) with CFG and a guidance_trunc that is crossed mid-run.
"""

from __future__ import annotations

import pytest
import torch
from benchmarks.bench_ursa import Size, _small, build_pipeline
from torch.utils._python_dispatch import TorchDispatchMode

from difforge.config import RunConfig
from difforge.devices import CPUBackend
from difforge.devices.compile import compile_policy
from difforge.errors import InputError
from difforge.models.ursa import URSAPipeline
from difforge.models.ursa.call import EXACT_OPTIMISATIONS, FAST_OPTIMISATIONS, PHILOX_RNG
from difforge.models.ursa.rope import positions
from difforge.models.ursa.sampling import Draws, PhiloxDraws, categorical, uniform
from difforge.runtime.record import RunRecord

from .conftest import load

OTHER = Size("other", _small(128, 256, 2, 2, 3, 96), res=64, steps=6)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small models: a second thread only adds contention on a shared CI core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def other_pipe() -> URSAPipeline:
    return build_pipeline(OTHER, CPUBackend(), torch.float32, seed=4)


def tokens(pipe: URSAPipeline, steps: int, trunc: float, seed: int, **kw) -> tuple[torch.Tensor, RunRecord]:
    """Denoised tokens of a fixed random prompt pair through the pipeline's own loop."""
    cfg = RunConfig(model="t", quiet=True, guidance=7, guidance_trunc=trunc, **kw)
    gen = torch.Generator().manual_seed(100 + seed)
    cond, uncond = torch.randint(0, 200, (2, 320), generator=gen).chunk(2)
    record = RunRecord("generate")
    x = pipe.generate_tokens(cond, uncond, (1, 4, 4), steps, 7, trunc, torch.Generator().manual_seed(seed),
                             pipe.optimisations(cfg), record=record)
    return x, record


@pytest.mark.parametrize("which", ["tiny", "other"])
@pytest.mark.parametrize("off", [*EXACT_OPTIMISATIONS, "all"])
def test_exact_optimisation_keeps_tokens(which: str, off: str, tiny_pipe: URSAPipeline, other_pipe) -> None:
    pipe = tiny_pipe if which == "tiny" else other_pipe
    disable = list(EXACT_OPTIMISATIONS) if off == "all" else [off]
    on, rec_on = tokens(pipe, 6, 0.5, seed=3)  # t crosses 0.5 at step 3: guided then unguided steps
    got, rec_off = tokens(pipe, 6, 0.5, seed=3, disable=disable)
    assert torch.equal(on, got)
    assert rec_on.extra["ursa"]["guided_steps"] == 3
    if off in ("reuse-first-forward", "all"):  # the switch really changed what ran
        assert (rec_on.extra["ursa"]["forwards"], rec_off.extra["ursa"]["forwards"]) == (5, 6)


def test_exact_optimisations_keep_tokens_on_the_philox_stream(other_pipe: URSAPipeline) -> None:
    """Every exact switch off at once, on the portable stream: the same tokens (steps 0 and 1 share a forward
    with nothing to advance, the other switches compute the same numbers)."""
    exact = [n for n in EXACT_OPTIMISATIONS if n != PHILOX_RNG]
    on, rec_on = tokens(other_pipe, 6, 0.5, seed=3, fast=[PHILOX_RNG])
    off, rec_off = tokens(other_pipe, 6, 0.5, seed=3, fast=[PHILOX_RNG], disable=exact)
    assert torch.equal(on, off)
    assert rec_on.extra["ursa"]["random_stream"] == rec_off.extra["ursa"]["random_stream"] == "philox"
    assert (rec_on.extra["ursa"]["forwards"], rec_off.extra["ursa"]["forwards"]) == (5, 6)


def test_whole_call_records_each_switch(tiny_pipe: URSAPipeline) -> None:
    record = RunRecord("generate")
    tiny_pipe(RunConfig(model="t", quiet=True, height=64, width=64, steps=2, disable=["rope-cache"]), record)
    adapt = {a.what: a for a in record.adaptations}
    assert adapt["rope table"].choice.startswith("built every forward") and adapt["rope table"].exact
    assert adapt["lm_head rows"].choice == "sampler rows only"
    assert "host draws" not in adapt  # pinning only matters for accelerator copies
    assert "compile" not in adapt
    stream = adapt["random stream"]  # always recorded; the CPU's default is the reference's stream
    assert stream.choice.startswith("reference") and stream.exact and "cpu backend's default" in stream.detail
    assert record.extra["ursa"]["random_stream"] == "reference"
    with pytest.raises(InputError, match="philox-rng"):
        tiny_pipe(RunConfig(model="t", quiet=True, height=64, width=64, steps=2, fast=["device-rgn"]), RunRecord("g"))


def test_rope_table_passed_in_equals_rebuilt(other_pipe: URSAPipeline) -> None:
    t = other_pipe.transformer
    pos = positions((1, 4, 4), 320)
    ids = torch.randint(0, t.config.vocab_size, (2, pos.shape[0]), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(t(ids, pos, rope=t.rope(pos)), t(ids, pos))


def test_pinned_draws_give_the_same_numbers() -> None:
    a = uniform((3, 5), torch.float32, torch.device("cpu"), Draws(torch.Generator().manual_seed(1), pin=True))
    b = uniform((3, 5), torch.float32, torch.device("cpu"), torch.Generator().manual_seed(1))
    p = torch.rand(6, 9)
    c = categorical(p, Draws(torch.Generator().manual_seed(2), pin=True))
    assert torch.equal(a, b) and torch.equal(c, categorical(p, torch.Generator().manual_seed(2)))


class _OpLog(TorchDispatchMode):
    """Names every aten op; boolean-mask indexing (a data-dependent shape) is tagged ``[mask]``."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func)
        index = args[1] if name.startswith("aten.index") and len(args) > 1 else None
        if isinstance(index, list | tuple) and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
            name += "[mask]"
        self.ops.append(name)
        return func(*args, **(kwargs or {}))


def test_philox_jump_step_has_no_data_dependent_shape_nor_host_sync(other_pipe: URSAPipeline) -> None:
    """The reference stream's jump step indexes by a boolean mask (a host sync); the Philox stream's does not,
    and it never reads a value back to the host (no ``.item()``, no ``nonzero``)."""
    sched, k = other_pipe.scheduler, other_pipe.scheduler.codebook_size
    z, x = torch.randn(1, 16, k) * 3, torch.randint(0, k, (1, 16), generator=torch.Generator().manual_seed(0))
    with _OpLog() as default:
        sched.step(z.clone(), 3, 8, x, torch.Generator().manual_seed(0))
    ph = PhiloxDraws(0, torch.device("cpu"))
    with _OpLog() as device:
        out = sched.step(z.clone(), 3, 8, x, Draws(philox=ph))
    assert "aten.index.Tensor[mask]" in default.ops and "aten.index_put_.default[mask]" in default.ops
    assert not any("[mask]" in op or "nonzero" in op or "_local_scalar_dense" in op for op in device.ops)
    assert "aten.where.self" in device.ops
    # inverse-CDF: x1 from the logits' float32 softmax, cumulative sums, no argmax (no noise per code)
    assert "aten._softmax.default" in device.ops and "aten.cumsum.default" in device.ops
    assert not any("argmax" in op or "multinomial" in op or "exponential" in op for op in device.ops)
    assert out.shape == x.shape and int(out.max()) < k


def test_philox_stream_is_labelled_reproducible_and_keeps_reuse_first_exact(other_pipe: URSAPipeline) -> None:
    a, rec = tokens(other_pipe, 6, 0.9, seed=5, fast=[PHILOX_RNG])
    b, _ = tokens(other_pipe, 6, 0.9, seed=5, fast=["device-rng"])  # the retired name selects the same stream
    c, rec_c = tokens(other_pipe, 6, 0.9, seed=5, fast=[PHILOX_RNG], disable=["reuse-first-forward"])
    default, _ = tokens(other_pipe, 6, 0.9, seed=5)
    other_seed, _ = tokens(other_pipe, 6, 0.9, seed=6, fast=[PHILOX_RNG])
    assert torch.equal(a, b) and torch.equal(a, c)  # nothing to advance at step 0: the same draws
    assert rec.extra["ursa"]["forwards"] == 5 and rec_c.extra["ursa"]["forwards"] == 6
    assert not torch.equal(a, default)  # another random stream: not the CPU reference's tokens
    assert not torch.equal(a, other_seed)
    assert PHILOX_RNG in FAST_OPTIMISATIONS and PHILOX_RNG in EXACT_OPTIMISATIONS
    record = RunRecord("generate")
    other_pipe._record_flags(other_pipe.optimisations(RunConfig(model="t", fast=[PHILOX_RNG])), record)
    stream = next(x for x in record.adaptations if x.what == "random stream")
    assert stream.exact and stream.choice == "philox4x32-10 on cpu" and "named by the run" in stream.detail


def test_the_stream_switch_given_both_ways_is_refused(other_pipe: URSAPipeline) -> None:
    with pytest.raises(InputError, match="both in --fast and --disable|in both --fast and --disable"):
        other_pipe.optimisations(RunConfig(model="t", fast=["device-rng"], disable=[PHILOX_RNG]))
    flags = other_pipe.optimisations(RunConfig(model="t", disable=[PHILOX_RNG]))
    assert flags.random_stream == "reference" and flags.stream_named


def test_compile_policy_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = compile_policy("cuda")
    assert cuda.available and cuda.mode is None and cuda.backend == "inductor"
    npu = compile_policy("npu")  # no torchair here: eager, with the reason
    assert not npu.available and "torchair" in npu.detail
    monkeypatch.setattr("shutil.which", lambda name: None)
    cpu = compile_policy("cpu")
    assert not cpu.available and "C++ compiler" in cpu.detail


@pytest.mark.skipif(not compile_policy("cpu").available, reason=f"no CPU compile here: {compile_policy('cpu').detail}")
def test_set_compile_installs_and_removes_the_layer_function(tiny_ursa) -> None:
    pipe, _ = load(tiny_ursa)
    record = RunRecord("generate")
    policy = pipe.set_compile(True)  # installs, does not run
    assert pipe.transformer.layers_compiled and policy is pipe.compile_policy
    pipe._record_flags(pipe.optimisations(RunConfig(model="t", compile=True)), record)
    adapt = next(a for a in record.adaptations if a.what == "compile")
    assert adapt.choice.startswith("inductor") and not adapt.exact
    pipe.set_compile(False)
    assert not pipe.transformer.layers_compiled and pipe.compile_policy is None


def test_recording_the_flags_never_compiles(tiny_ursa) -> None:
    """``_record_flags`` only writes adaptations: with cfg.compile asked for it neither compiles nor says so."""
    pipe, _ = load(tiny_ursa)
    record = RunRecord("generate")
    pipe._record_flags(pipe.optimisations(RunConfig(model="t", compile=True)), record)
    assert not pipe.transformer.layers_compiled and pipe.compile_policy is None
    assert "compile" not in {a.what for a in record.adaptations}
    assert {"lm_head rows", "first forward", "rope table"} <= {a.what for a in record.adaptations}


def test_each_call_switches_compile_once(tiny_ursa, monkeypatch: pytest.MonkeyPatch) -> None:
    """``set_compile`` runs exactly once per call, with cfg.compile; the reference's call asks for eager."""
    pipe, _ = load(tiny_ursa)
    asked: list[bool] = []
    eager = pipe.set_compile

    def spy(enabled: bool):  # type: ignore[no-untyped-def]
        asked.append(enabled)
        return eager(False)  # record the request, stay eager (compiling here would cost minutes)

    monkeypatch.setattr(pipe, "set_compile", spy)
    pipe(RunConfig(model="t", quiet=True, height=32, width=32, steps=2, compile=True), RunRecord("generate"))
    pipe(RunConfig(model="t", quiet=True, height=32, width=32, steps=2), RunRecord("generate"))
    pipe(prompt="x", height=32, width=32, num_inference_steps=2, output_type="latent")
    assert asked == [True, False, False]


def test_optimisations_are_one_frozen_value(tiny_pipe: URSAPipeline) -> None:
    import dataclasses

    flags = tiny_pipe.optimisations(RunConfig(model="t", disable=["rope-cache"], fast=["unguided-tail"]))
    assert (flags.lm_head_slice, flags.reuse_first, flags.rope_cache, flags.unguided_tail) == (True, True, False, True)
    assert not flags.pinned_draws  # the CPU backend has no pinned host copies
    assert flags.random_stream == "reference" and not flags.philox and not flags.stream_named  # the CPU's default
    with pytest.raises(dataclasses.FrozenInstanceError):
        flags.rope_cache = True  # type: ignore[misc]
