"""Apply a :class:`~.loop.SpeedOptions` to a loaded transformer and write each choice to the RunRecord.

Everything here acts on one transformer instance (processor objects, an instance-level
``pos_embed.forward``, diffusers cache hooks, regional compile), never on diffusers globally, so
two pipelines in one process stay independent.  The order matters: the processor must be in place
before the attention backend is chosen, because diffusers' ``set_attention_backend`` writes the
backend onto whatever processors the blocks hold at that moment.

The exact options and the step caches can be switched on a loaded transformer (each run of a
reused pipeline asks for its own); ``compile`` is fixed at load (see ``QwenEditPipeline``).
"""

from __future__ import annotations

from typing import Any

import torch

from ...devices import Backend, CompilePolicy
from ...devices.compile import use_compile_caches
from ...runtime.hashes import difforge_home
from ...runtime.record import RunRecord
from .attention import install_processor, install_real_rope, remove_real_rope
from .loop import SpeedOptions, uses_difforge_processor

#: The record entries a run may change on a loaded pipeline; the others are fixed at load.
RUN_SWITCHABLE = ("rope", "cfg", "denoise loop", "step cache", "attention", "offload", "vae", "vae convs")


def forget(record: RunRecord, what: str) -> None:
    """Drop ``what`` from ``record`` (an option the run switched off is no longer in force)."""
    record.adaptations = [a for a in record.adaptations if a.what != what]


def restore_diffusers_processor(transformer: torch.nn.Module) -> None:
    """Give every block diffusers' own ``QwenDoubleStreamAttnProcessor2_0`` back (one per block, as built)."""
    from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

    for block in getattr(transformer, "transformer_blocks", []):
        block.attn.set_processor(QwenDoubleStreamAttnProcessor2_0())


def install_exact(transformer: torch.nn.Module, options: SpeedOptions, record: RunRecord,
                  processor_installed: bool = False) -> bool:
    """difforge's processor or diffusers' (unless an override owns it), real or complex RoPE, the CFG record.

    Idempotent, and reversible on a loaded transformer.  Returns True when the blocks' processors
    were replaced, so the attention backend has to be chosen again.
    """
    replaced = False
    if not processor_installed:
        has = uses_difforge_processor(transformer)
        if options.needs_processor and not has:
            install_processor(transformer)
            replaced = True
        elif not options.needs_processor and has:
            restore_diffusers_processor(transformer)
            replaced = True
    if options.real_rope and install_real_rope(transformer):
        record.adapt(
            "rope", "real-valued RoPE: (cos, sin) float32 tables cached on the device",
            detail="same rotation as diffusers' complex64 product, float rounding only; disable with 'real-rope'",
        )
    else:
        remove_real_rope(transformer)
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
    return replaced


def install_vae_convs(vae: torch.nn.Module, options: SpeedOptions, record: RunRecord) -> None:
    """The VAE's causal convs as 2-D convs on single pictures (:mod:`.vae_convs`), or diffusers' 3-D form."""
    from . import vae_convs

    count = vae_convs.install(vae, options.vae_2d)
    if options.vae_2d:
        record.adapt(
            "vae convs", f"2-D convolutions on single pictures ({count} causal convs)",
            detail="a one-frame causal conv3d is the conv2d of its last temporal tap: the same products in another"
            " order, float rounding only (2.5-5x faster VAE on a CPU); disable with 'vae-2d'",
        )
    else:
        record.adapt("vae convs", "diffusers' causal 3-D convolutions")


def record_loop(options: SpeedOptions, record: RunRecord) -> None:
    """What the denoise loop synchronises on: nothing, unless an option adds a sync."""
    if options.first_block_cache is not None:
        record.adapt(
            "denoise loop", "static shapes; a host sync in each transformer call (first-block-cache)",
            detail="diffusers' First-Block-Cache reads block 0's residual change with .item() (every call after the"
            " first) to decide whether to skip the other blocks; nothing else syncs except a step_hook's CPU copies",
        )
        return
    record.adapt(
        "denoise loop", "no host syncs, static shapes",
        detail="timesteps stay on the device, texts padded once per run; a step_hook's CPU copies are the only syncs",
    )


def install_fast(transformer: Any, options: SpeedOptions, record: RunRecord, current: SpeedOptions | None = None) -> None:
    """Opt-in approximate step caches (diffusers hooks; spec §4.4 lists the ones that work here).

    ``current`` is what the transformer runs with now (None: freshly loaded, no cache); a cache that
    differs from it is removed with diffusers' ``disable_cache`` before the new one is enabled.
    """
    wanted = (options.first_block_cache, options.taylorseer)
    if current is None or (current.first_block_cache, current.taylorseer) != wanted:
        if getattr(transformer, "is_cache_enabled", False):
            transformer.disable_cache()
        if options.first_block_cache is not None:
            from diffusers.hooks import FirstBlockCacheConfig

            transformer.enable_cache(FirstBlockCacheConfig(threshold=options.first_block_cache))
        elif options.taylorseer is not None:
            from diffusers.hooks import TaylorSeerCacheConfig

            transformer.enable_cache(TaylorSeerCacheConfig(cache_interval=options.taylorseer))
    if options.first_block_cache is not None:
        record.adapt(
            "step cache", f"First-Block-Cache (threshold {options.first_block_cache:g})", exact=False,
            detail="diffusers FirstBlockCacheConfig: later blocks are skipped when block 0's residual barely changes",
        )
    elif options.taylorseer is not None:
        record.adapt(
            "step cache", f"TaylorSeer (refresh every {options.taylorseer} steps)", exact=False,
            detail="diffusers TaylorSeerCacheConfig: block outputs predicted by a Taylor expansion between refreshes",
        )
    else:
        forget(record, "step cache")
    record_loop(options, record)


def install_compile(transformer: Any, options: SpeedOptions, backend: Backend, record: RunRecord) -> CompilePolicy | None:
    """Regional ``torch.compile`` of the repeated blocks when ``cfg.compile``, per the device's compile policy.

    :meth:`difforge.devices.Backend.compile_policy` picks the backend (Inductor, torchair on an NPU) and
    mode; a device without a usable compiler (an NPU without torchair, a CPU without a C++ compiler)
    stays eager and the record says why.  The compile caches live under ``DIFFORGE_HOME``
    (:func:`~difforge.devices.compile.use_compile_caches`).  Only on request: the automatic choice is URSA's.
    """
    if not options.compile:
        return None
    policy = backend.compile_policy()
    if not policy.available:
        record.adapt("compile", "eager (compile requested)", detail=policy.detail)
        return policy
    use_compile_caches(difforge_home())  # before Inductor first reads its cache folder
    transformer.compile_repeated_blocks(**policy.torch_compile_kwargs())
    record.adapt(
        "compile", f"{policy.label}: regional (each transformer block, diffusers compile_repeated_blocks)",
        exact=False,
        detail=f"{policy.detail}; compiled lazily on the first step; exact within floating-point noise, not bit for bit",
    )
    return policy
