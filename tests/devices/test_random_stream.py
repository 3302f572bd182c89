"""The random stream is device policy: Philox on every accelerator, the reference's CPU stream on the CPU.

The NPU is reached through the torch_npu stand-in (tests/standin); CUDA, XPU and MPS backends are
built without their devices (the policy is a class attribute, asked before any tensor exists).
"""

from __future__ import annotations

import copy

import pytest

from difforge.config import RunConfig
from difforge.devices import BACKENDS, PHILOX_STREAM, RANDOM_STREAMS, REFERENCE_STREAM, get_backend
from difforge.models.ursa.call import PHILOX_RNG, random_stream
from difforge.runtime.record import RunRecord


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_default_stream_per_backend(name: str) -> None:
    want = REFERENCE_STREAM if name == "cpu" else PHILOX_STREAM
    assert BACKENDS[name].random_stream == want and want in RANDOM_STREAMS
    backend = BACKENDS[name]()
    assert random_stream(backend.random_stream, [], []) == want
    # the switch names either stream on any device; --fast device-rng is the retired name of the first
    assert random_stream(backend.random_stream, [], [PHILOX_RNG]) == PHILOX_STREAM
    assert random_stream(backend.random_stream, [], ["device-rng"]) == PHILOX_STREAM
    assert random_stream(backend.random_stream, [PHILOX_RNG], []) == REFERENCE_STREAM
    if name == "cpu":  # the others' describe() asks their (absent) devices
        assert backend.describe()["random_stream"] == want  # what doctor and every RunRecord's backend show


def test_the_names_that_put_a_reference_on_the_same_stream() -> None:
    """What validate needs to compare a device run with a CPU reference: the reference drawing the same numbers."""
    from difforge.models.registry import same_stream_names

    assert same_stream_names("ursa", PHILOX_STREAM, [], []) == ([], [PHILOX_RNG])  # an accelerator's default
    assert same_stream_names("ursa", PHILOX_STREAM, [PHILOX_RNG], []) == ([PHILOX_RNG], [])
    assert same_stream_names("ursa", REFERENCE_STREAM, [], ["device-rng"]) == ([], [PHILOX_RNG])
    assert same_stream_names("ursa", REFERENCE_STREAM, [], []) == ([PHILOX_RNG], [])
    assert same_stream_names("qwen-edit", PHILOX_STREAM, [], []) == ([], [])


def test_the_npu_standin_draws_on_the_device_by_default(npu_standin, clean_npu_env) -> None:
    backend = get_backend("npu")
    assert type(backend).__name__ == "NPUBackend" and backend.random_stream == PHILOX_STREAM
    assert backend.describe()["random_stream"] == PHILOX_STREAM
    assert get_backend("auto").random_stream == PHILOX_STREAM  # auto picks the NPU first


def test_an_ursa_call_on_the_npu_records_philox_by_default(tiny_npu_pipe) -> None:
    pipe = tiny_npu_pipe
    flags = pipe.optimisations(RunConfig(model="t"))
    assert flags.philox and not flags.stream_named and flags.pinned_draws
    record = RunRecord("generate")
    pipe._record_flags(flags, record)
    stream = next(a for a in record.adaptations if a.what == "random stream")
    assert stream.exact and stream.choice.startswith("philox4x32-10") and "npu backend's default" in stream.detail
    assert "inverse-cdf sampling" in stream.detail  # the categorical sampler every device shares
    assert "host draws" not in {a.what for a in record.adaptations}  # nothing is drawn on the host
    named = pipe.optimisations(RunConfig(model="t", disable=[PHILOX_RNG]))
    assert named.random_stream == REFERENCE_STREAM and named.stream_named
    record = RunRecord("generate")
    pipe._record_flags(named, record)
    stream = next(a for a in record.adaptations if a.what == "random stream")
    assert stream.choice.startswith("reference") and "one host sync per step" in stream.detail
    assert next(a for a in record.adaptations if a.what == "host draws").choice.startswith("pinned memory")


@pytest.fixture
def tiny_npu_pipe(npu_standin, clean_npu_env):  # type: ignore[no-untyped-def]
    """tiny-ursa's CPU pipeline with its backend swapped for the stand-in NPU (only the policy is asked)."""
    from difforge.devices import CPUBackend
    from difforge.models.tiny import ensure_tiny
    from difforge.models.ursa import URSAPipeline

    folder = ensure_tiny("tiny-ursa")
    pipe = copy.copy(URSAPipeline.from_pretrained(folder, CPUBackend(), None, RunConfig(model=str(folder))))
    pipe.backend = get_backend("npu")
    return pipe
