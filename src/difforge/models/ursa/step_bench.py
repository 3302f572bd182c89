"""Time URSA's sampler + scheduler step on the Philox stream alone, at a run's token count (issue 27's <= 1 ms goal).

The benchmark harness times whole runs; this isolates the step after the transformer: the x1 draw from
the logits, the metric path's rate, the jump uniforms and the jump draw (:meth:`DFMScheduler.step`).  It
builds a random float16 codebook and logits of the asked shape (the default is URSA-1.7B at 512^2: 1024
tokens, 64000 codes), synchronises the device around every timed call and reports medians, and counts
the torch operators one step dispatches (each one kernel launch on an accelerator: the figure that
bounds an eager step there, measurable on any machine).

    python -m difforge.models.ursa.step_bench --device cuda --dtype float16          # fused where offered
    python -m difforge.models.ursa.step_bench --device cuda --dtype float16 --torch  # the torch draws
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...devices import BACKENDS
from .config import SchedulerConfig
from .sampling import DRAW_JUMP, DRAW_X1, Draws, PhiloxDraws
from .scheduler import DFMScheduler

#: URSA-1.7B's scheduler settings and codebook width (as benchmarks/bench_ursa.py builds it).
SCHEDULER = SchedulerConfig(alpha=0.9, c=3.0, shift=1.0, eps=1e-5)
CODEBOOK_DIM = 8


class _OpCounter(TorchDispatchMode):
    """Counts the aten operators dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def _median_ms(fn: Callable[[], Any], prepare: Callable[[], Any], sync: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        prepare()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def time_step(
    device: str | torch.device = "cuda", dtype: torch.dtype = torch.float16, tokens: int = 1024,
    codebook: int = 64000, repeats: int = 10, fused: bool | None = None, step: int = 5, steps: int = 25,
) -> dict[str, Any]:
    """Median milliseconds of one non-final step and of its parts, and the operators one step dispatches.

    ``fused``: :class:`PhiloxDraws`'s switch (None: the device's backend decides; False: the torch draws).
    Returns ``step_ms``, ``x1_draw_ms``, ``jump_uniform_ms``, ``jump_draw_ms``, ``ops_per_step`` (aten
    operators; a fused draw adds one Triton launch each, three a step), ``fused`` (what was used) and the shape.
    """
    dev = torch.device(device)
    backend = BACKENDS[dev.type](index=dev.index)
    gen = torch.Generator().manual_seed(0)
    scheduler = DFMScheduler(SCHEDULER, torch.randn(codebook, CODEBOOK_DIM, generator=gen).half()).to(dev)
    source = (torch.randn(1, tokens, codebook, generator=gen) * 3).to(device=dev, dtype=dtype)
    x = torch.randint(0, codebook, (1, tokens), generator=gen).to(dev)
    ph = PhiloxDraws(7, dev, fused=fused, sparse=backend.is_host)
    draws = Draws(philox=ph)
    logits = torch.empty_like(source)

    def refill() -> None:
        logits.copy_(source)  # the step overwrites its logits

    def one_step() -> torch.Tensor:
        return scheduler.step(logits, step, steps, x, draws)

    refill()
    one_step()  # warm-up: first launches, any kernel compile
    result: dict[str, Any] = {"device": str(dev), "dtype": str(dtype).removeprefix("torch."), "tokens": tokens,
                              "codebook": codebook, "fused": ph.kernels is not None}
    result["step_ms"] = _median_ms(one_step, refill, backend.synchronize, repeats)
    result["x1_draw_ms"] = _median_ms(lambda: ph.categorical_logits(source, step, DRAW_X1), lambda: None,
                                      backend.synchronize, repeats)
    result["jump_uniform_ms"] = _median_ms(lambda: ph.uniform((1, tokens), step), lambda: None,
                                           backend.synchronize, repeats)
    weights = source[0].float().exp_().to(dtype)  # non-negative rates of the jump draw's shape and dtype
    result["jump_draw_ms"] = _median_ms(lambda: ph.categorical_weights(weights, step, DRAW_JUMP), lambda: None,
                                        backend.synchronize, repeats)
    refill()
    with _OpCounter() as counter:
        one_step()
    result["ops_per_step"] = counter.count
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--tokens", type=int, default=1024, help="tokens per image (1024 at 512^2, 4096 at 1024^2)")
    p.add_argument("--codebook", type=int, default=64000)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--torch", action="store_true", help="the torch draws even where a fused sampler is offered")
    args = p.parse_args(argv)
    print(json.dumps(time_step(args.device, getattr(torch, args.dtype), args.tokens, args.codebook, args.repeats,
                               fused=False if args.torch else None)))


if __name__ == "__main__":
    main()
