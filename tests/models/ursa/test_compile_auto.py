"""URSA's compile switch: asked, never unasked on the CPU, and chosen by the rent-or-buy rule on an accelerator."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from difforge.config import RunConfig
from difforge.devices.compile import (
    AUTO_SAVED_SHARE,
    COLD_COMPILE_S,
    WARM_COMPILE_S,
    CompilePolicy,
    compile_policy,
)
from difforge.models.ursa.pipeline import URSAPipeline
from difforge.runtime.record import RunRecord

from .conftest import load

CFG = {"model": "t", "quiet": True, "height": 64, "width": 64, "steps": 2}


@pytest.fixture
def pipe(tiny_ursa: Path) -> URSAPipeline:
    return load(tiny_ursa)[0]


def test_cpu_runs_count_their_eager_steps_and_never_compile_unasked(pipe: URSAPipeline) -> None:
    for n in (1, 2):
        record = RunRecord("generate")
        pipe(RunConfig(**CFG), record)
        assert pipe.compile_policy is None and not pipe.transformer.layers_compiled
        assert "compile" not in {a.what for a in record.adaptations}
        call = pipe.check_inputs(RunConfig(**CFG), RunRecord("generate"))
        step_s, done = pipe.eager_steps[pipe.compile_key(call)]
        assert done == 2 * n and step_s > 0
        choice = pipe.choose_compile(call)
        assert not choice.compile and "never chosen unasked on cpu" in choice.reason


def test_the_key_names_what_a_compiled_graph_is_specialised_to(pipe: URSAPipeline) -> None:
    one = pipe.compile_key(pipe.check_inputs(RunConfig(**CFG), RunRecord("g")))
    wider = pipe.compile_key(pipe.check_inputs(RunConfig(**{**CFG, "width": 128}), RunRecord("g")))
    unguided = pipe.compile_key(pipe.check_inputs(RunConfig(**CFG, guidance=1.0), RunRecord("g")))
    assert len({one, wider, unguided}) == 3 and "float32" in one and "cpu" in one


def test_an_accelerator_compiles_once_eager_has_lost_the_compile_cost(
    pipe: URSAPipeline, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Pretend CUDA (the choice only; nothing runs there): eager until the measured steps pay for the compile."""
    monkeypatch.setenv("DIFFORGE_HOME", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # restored by monkeypatch
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(pipe, "device", torch.device("cuda"))
    monkeypatch.setattr(pipe.backend, "compile_policy", lambda: CompilePolicy("cuda", True, "inductor", None,
                                                                               "inductor", "default mode"))
    call = pipe.check_inputs(RunConfig(**{**CFG, "steps": 25}), RunRecord("generate"))
    first = pipe.choose_compile(call)
    assert not first.compile and "no eager step measured" in first.reason
    key, step_s = pipe.compile_key(call), 0.05
    cold_steps = int(COLD_COMPILE_S / (step_s * AUTO_SAVED_SHARE["cuda"]))
    pipe.eager_steps[key] = (step_s, cold_steps - 100)
    assert not pipe.choose_compile(call).compile
    pipe.eager_steps[key] = (step_s, cold_steps)
    assert pipe.choose_compile(call).compile
    # with this model already in the caches (a marker from an earlier process), far fewer steps are enough
    warm_steps = int(WARM_COMPILE_S / (step_s * AUTO_SAVED_SHARE["cuda"]))
    pipe.eager_steps[key] = (step_s, warm_steps)
    assert not pipe.choose_compile(call).compile
    pipe.compile_caches().mark(key, 20.0)
    assert (tmp_path / "compile" / "compiled").is_dir()
    chosen = pipe.choose_compile(call)
    assert chosen.compile and "warm cache" in chosen.reason
    record = RunRecord("generate")
    pipe._record_compile(chosen, record)  # nothing compiled yet: the record says eager, with the rule's numbers
    entry = next(a for a in record.adaptations if a.what == "compile")
    assert entry.choice == "eager (auto)" and "warm cache" in entry.detail


def test_asked_for_compile_is_always_chosen(pipe: URSAPipeline) -> None:
    call = pipe.check_inputs(RunConfig(**CFG, compile=True), RunRecord("generate"))
    assert pipe.choose_compile(call).compile


def test_a_call_without_compile_after_a_compiled_one_runs_eager_on_the_cpu(pipe: URSAPipeline) -> None:
    """On the CPU only --compile compiles: a reused pipeline goes back to eager for a call that does not ask."""
    pipe.set_compile(True)  # as an earlier --compile call left it (installs, compiles nothing yet)
    call = pipe.check_inputs(RunConfig(**CFG), RunRecord("generate"))
    choice = pipe.choose_compile(call)
    assert not choice.compile and "never chosen unasked on cpu" in choice.reason
    pipe.set_compile(choice.compile)
    assert pipe.compile_policy is None and not pipe.transformer.layers_compiled


@pytest.mark.skipif(not compile_policy("cpu").available, reason=f"no CPU compile here: {compile_policy('cpu').detail}")
def test_an_unknown_compile_mode_only_stops_a_run_that_compiles(pipe: URSAPipeline, monkeypatch) -> None:
    """DIFFORGE_COMPILE_MODE is read when a compile is decided: a CPU run without --compile never reads it."""
    from difforge.errors import DifforgeError

    monkeypatch.setenv("DIFFORGE_COMPILE_MODE", "fastest")
    pipe.backend = type(pipe.backend)()  # a fresh backend: no policy decided yet
    record = RunRecord("generate")
    pipe(RunConfig(**CFG), record)
    assert record.step_times_s
    with pytest.raises(DifforgeError, match="DIFFORGE_COMPILE_MODE"):
        pipe(RunConfig(**CFG, compile=True), RunRecord("generate"))
