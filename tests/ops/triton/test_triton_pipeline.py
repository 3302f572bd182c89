"""tiny-ursa end to end with the fused sampler and rate (as a CUDA run binds them), under the interpreter: the
Philox stream's pinned tokens come out, and every fused kernel ran."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from difforge.config import RunConfig
from difforge.devices import CPUBackend
from difforge.devices.cuda import TritonKernel
from difforge.models.tiny import ensure_tiny
from difforge.models.ursa import URSAPipeline
from difforge.models.ursa.call import PHILOX_RNG
from difforge.runtime.record import RunRecord

from .conftest import interpreted

#: tests/models/ursa/test_philox_stream.py's pinned tokens of this run on the torch draws.
PINNED = [46, 13, 7, 46, 32, 33, 23, 23, 32, 2, 13, 23, 2, 38, 2, 46]


def test_tiny_ursa_with_the_fused_sampler_gives_the_pinned_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    ts: ModuleType = interpreted("triton_sampler")
    plain_policy = CPUBackend.fused_kernel
    monkeypatch.setattr(  # the CPU stands in for a CUDA device offering the sampler kernels
        CPUBackend, "fused_kernel",
        lambda self, op: TritonKernel(op) if op in ("sampler", "rate") else plain_policy(self, op),
    )
    launches: list[str] = []
    for name in ("_inverse_cdf_kernel", "_uniform_kernel", "_metric_rate_kernel"):

        class Spy:
            def __init__(self, kernel: object, name: str) -> None:
                self.kernel, self.name = kernel, name

            def __getitem__(self, grid: object):  # type: ignore[no-untyped-def]
                launches.append(self.name)
                return self.kernel[grid]  # type: ignore[index]

        monkeypatch.setattr(ts, name, Spy(getattr(ts, name), name))
    folder = ensure_tiny("tiny-ursa")
    load_record = RunRecord("generate")
    pipe = URSAPipeline.from_pretrained(folder, CPUBackend(), torch.float32, RunConfig(model=str(folder)), load_record)
    assert pipe.scheduler.path.kernels is ts.KERNELS  # type: ignore[union-attr]
    chosen = {a.what: a.choice for a in load_record.adaptations}
    assert chosen["sampler"] == "triton philox inverse-cdf" and chosen["rate"] == "triton metric rate"
    pipe(RunConfig(model="t", quiet=True, prompt="a red cat", height=64, width=64, steps=6, seed=3, fast=[PHILOX_RNG]),
         RunRecord("generate"))
    assert pipe.last_tokens is not None and pipe.last_tokens.flatten().tolist() == PINNED
    # steps 1-4 draw x1, rate, uniforms and the jump; step 5 x1 only (step 0 is reused: t = 0 moves nothing)
    assert launches.count("_inverse_cdf_kernel") == 9 and launches.count("_metric_rate_kernel") == 4
    assert launches.count("_uniform_kernel") == 4
