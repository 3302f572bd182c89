"""Shared benchmark plumbing: timing with warm-up, FLOP counting, ratios, table + JSON output.

Benchmarks never assert speed; they print ratios against a baseline measured in the same process.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass
class BenchResult:
    name: str
    ms_per_step: float
    ms_min: float
    ms_max: float
    forwards_per_step: int
    tokens_per_forward: int
    flops_per_step: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    peak_memory_bytes: int | None = None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def sync(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def time_steps(step: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> list[float]:
    """Wall time (ms) of ``iters`` calls after ``warmup`` untimed ones, synchronising around each."""
    for _ in range(warmup):
        step()
    sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append((time.perf_counter() - t0) * 1000.0)
    return times


def count_flops(fn: Callable[[], Any]) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def peak_tflops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Dense peak for this device and compute dtype, from the same sourced table `difforge validate` uses."""
    if device.type == "cpu":
        return None
    from difforge.validate.bench import find_peak

    mod = getattr(torch, device.type, None)
    name = mod.get_device_name(device) if mod is not None and hasattr(mod, "get_device_name") else ""
    found = find_peak(name, dtype)
    return found[1] if found else None


def make_result(
    name: str,
    times_ms: list[float],
    device: torch.device,
    forwards: int,
    tokens: int,
    flops: float | None,
    dtype: torch.dtype = torch.bfloat16,
    **kw: Any,
) -> BenchResult:
    med = statistics.median(times_ms)
    tflops = flops / (med / 1000.0) / 1e12 if flops else None
    peak = peak_tflops(device, dtype)
    return BenchResult(
        name=name,
        ms_per_step=med,
        ms_min=min(times_ms),
        ms_max=max(times_ms),
        forwards_per_step=forwards,
        tokens_per_forward=tokens,
        flops_per_step=flops,
        tflops=tflops,
        mfu=(tflops / peak) if (tflops and peak) else None,
        **kw,
    )


def print_table(title: str, results: list[BenchResult], baseline: str) -> None:
    base = next((r for r in results if r.name == baseline), None)
    print(f"\n{title}")
    hdr = f"{'variant':<34}{'ms/step':>10}{'min':>9}{'max':>9}{'fwd/step':>9}{'tokens':>8}{'TFLOP/s':>9}{'MFU':>7}{'peak MiB':>10}{'vs base':>9}"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        ratio = base.ms_per_step / r.ms_per_step if base else float("nan")
        mem = f"{r.peak_memory_bytes / 2**20:.0f}" if r.peak_memory_bytes else "-"
        tf = f"{r.tflops:.3f}" if r.tflops is not None else "-"
        mfu = f"{100 * r.mfu:.1f}%" if r.mfu is not None else "-"
        print(
            f"{r.name:<34}{r.ms_per_step:>10.2f}{r.ms_min:>9.2f}{r.ms_max:>9.2f}{r.forwards_per_step:>9}"
            f"{r.tokens_per_forward:>8}{tf:>9}{mfu:>7}{mem:>10}{ratio:>8.2f}x"
        )


def write_json(path: str | Path | None, payload: dict[str, Any]) -> None:
    if not path:
        return
    def conv(o: Any) -> Any:
        return asdict(o) if isinstance(o, BenchResult) else str(o)
    Path(path).write_text(json.dumps(payload, indent=2, default=conv) + "\n")
