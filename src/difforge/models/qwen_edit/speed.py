"""Apply a :class:`~.loop.SpeedOptions` to a loaded transformer and write each choice to the RunRecord.

Everything here acts on one transformer instance (processor objects, an instance-level
``pos_embed.forward``, diffusers cache hooks, regional compile), never on diffusers globally, so
two pipelines in one process stay independent.  The order matters: the processor must be in place
before the attention backend is chosen, because diffusers' ``set_attention_backend`` writes the
backend onto whatever processors the blocks hold at that moment.
"""

from __future__ import annotations

from typing import Any

import torch

from ...devices import Backend
from ...runtime.record import RunRecord
from .attention import install_processor, install_real_rope
from .loop import SpeedOptions


def install_exact(transformer: torch.nn.Module, options: SpeedOptions, record: RunRecord,
                  processor_installed: bool = False) -> None:
    """difforge's processor (unless an override already put one in), real RoPE, and the CFG record."""
    if options.needs_processor and not processor_installed:
        install_processor(transformer)
    if options.real_rope and install_real_rope(transformer):
        record.adapt(
            "rope", "real-valued RoPE: (cos, sin) float32 tables cached on the device",
            detail="same rotation as diffusers' complex64 product, float rounding only; disable with 'real-rope'",
        )
    else:
        record.adapt(
            "rope", "diffusers complex64 RoPE (torch.polar / view_as_complex)",
            detail="QwenImage's rotary embedding as shipped; devices without complex kernels need a real-valued form",
        )
    if options.batched_cfg:
        record.adapt(
            "cfg", "one batch-2 transformer call per step (prompt + negative prompt)",
            detail="shorter text padded once per run; each row attends only to its own text, unmasked;"
            " equals two batch-1 calls within float rounding; disable with 'batched-cfg'",
        )
    else:
        record.adapt("cfg", "two batch-1 transformer calls per step (diffusers' true CFG)")
    record.adapt(
        "denoise loop", "no host syncs, static shapes",
        detail="timesteps stay on the device, texts padded once per run; a step_hook's CPU copies are the only syncs",
    )


def install_fast(transformer: Any, options: SpeedOptions, record: RunRecord) -> None:
    """Opt-in approximate step caches (diffusers hooks; spec §4.4 lists the ones that work here)."""
    if options.first_block_cache is not None and options.taylorseer is not None:
        from ...errors import InputError

        raise InputError("--fast first-block-cache and taylorseer cannot be combined; choose one.")
    if options.first_block_cache is not None:
        from diffusers.hooks import FirstBlockCacheConfig

        transformer.enable_cache(FirstBlockCacheConfig(threshold=options.first_block_cache))
        record.adapt(
            "step cache", f"First-Block-Cache (threshold {options.first_block_cache:g})", exact=False,
            detail="diffusers FirstBlockCacheConfig: later blocks are skipped when block 0's residual barely changes",
        )
    elif options.taylorseer is not None:
        from diffusers.hooks import TaylorSeerCacheConfig

        transformer.enable_cache(TaylorSeerCacheConfig(cache_interval=options.taylorseer))
        record.adapt(
            "step cache", f"TaylorSeer (refresh every {options.taylorseer} steps)", exact=False,
            detail="diffusers TaylorSeerCacheConfig: block outputs predicted by a Taylor expansion between refreshes",
        )


def install_compile(transformer: Any, options: SpeedOptions, backend: Backend, record: RunRecord) -> None:
    """Regional ``torch.compile`` of the repeated blocks when ``cfg.compile`` (Inductor; needs a C++ compiler on CPU)."""
    if not options.compile:
        return
    transformer.compile_repeated_blocks(dynamic=False)
    record.adapt(
        "compile", "torch.compile of each transformer block (diffusers compile_repeated_blocks, dynamic=False)",
        detail=f"compiled lazily on the first step on {backend.device.type}; Inductor fusions change float rounding only",
    )
