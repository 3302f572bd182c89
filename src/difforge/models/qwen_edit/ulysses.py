"""``--parallel ulysses=N`` for Qwen-Image-Edit: diffusers' own context parallelism (Ulysses attention).

diffusers ships the whole of it: the transformer's ``_cp_plan`` (split ``hidden_states`` /
``encoder_hidden_states`` along the sequence before the first block, the RoPE tables after
``pos_embed``, gather after ``proj_out``), the sharding hooks (``diffusers.hooks.context_parallel``)
and the Ulysses attention (``attention_dispatch``: all-to-all of q/k/v to whole sequences of this
rank's heads, attention, all-to-all back), reached through the ``_parallel_config`` that
difforge's processor passes to ``dispatch_attention_fn`` like diffusers' own.  difforge adds no
collective of its own to the forward.

What difforge does differently from ``ModelMixin.enable_parallelism`` (diffusers 0.42.1), and why:

* **the entry.** ``enable_parallelism`` first computes ``rank % torch.accelerator.device_count()``
  (``_resolve_parallel_config``), a ``ZeroDivisionError`` on a CPU-only torch (no accelerator),
  before it looks at any mesh it is given, so on the CPU it cannot be called at all.  :func:`enable`
  does the same steps with the run's own device and mesh: ``ContextParallelConfig`` +
  ``ParallelConfig.setup``, the processors' ``_parallel_config``, ``apply_context_parallel`` with
  the model's plan; the same on every device;
* **``ulysses_anything``**: Qwen's text length is whatever the prompt gives and tiny-qwen-edit has 3
  heads; the plain mode asserts that sequence and heads divide by N, the "anything" mode splits
  unevenly (``tensor_split``) and pads heads;
* **difforge's real-valued RoPE** returns ``[2, S, 1, D/2]`` tables where the plan expects ``[S, D/2]``
  complex ones: the plan's ``pos_embed`` entry splits dimension 1 of the 4-d tables instead (the
  plan is diffusers' ``cp_plan`` argument, data).
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import InputError

#: What :func:`enable` leaves on the transformer: (ranks, real-rope tables) it was split for.
MARK = "_difforge_ulysses"


def split_for(transformer: torch.nn.Module) -> tuple[int, bool] | None:
    """(ranks, real rope) the transformer's context parallelism was enabled with, or None."""
    return getattr(transformer, MARK, None)


def _real_rope(transformer: torch.nn.Module) -> bool:
    return bool(getattr(getattr(transformer, "pos_embed", None), "_difforge_real_rope", False))


def check(transformer: torch.nn.Module, world: int, options: Any) -> None:
    """The one-line refusals, before any collective: the same answer on every rank."""
    if options.compile:
        raise InputError(f"--parallel ulysses={world} and --compile do not go together for Qwen-Image-Edit (the "
                         "regional compile would trace diffusers' all-to-alls inside each block); drop --compile.")
    if options.first_block_cache is not None or options.taylorseer is not None:
        raise InputError(f"--parallel ulysses={world} and --fast first-block-cache/taylorseer do not go together: "
                         "each rank would decide from its own part of the sequence whether to skip a step.")
    heads = int(transformer.config.num_attention_heads)
    if world > heads:
        raise InputError(f"--parallel ulysses={world}: the transformer has {heads} attention heads, fewer than "
                         f"{world} ranks; use at most {heads}.")
    blocks = getattr(transformer, "transformer_blocks", [])
    for block in blocks[:1]:
        proc = block.attn.processor
        if getattr(proc, "attention", None) is not None or not hasattr(proc, "_parallel_config"):
            raise InputError(f"--parallel ulysses={world} runs diffusers' Ulysses attention; an attention override "
                             f"({type(proc).__name__}) replaces it. Run without the override.")
        from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

        name = proc._attention_backend
        name = _AttentionBackendRegistry.get_active_backend()[0] if name is None else AttentionBackendName(name)
        if not _AttentionBackendRegistry._is_context_parallel_available(name):
            raise InputError(f"--parallel ulysses={world}: diffusers' attention backend '{name.value}' has no context "
                             "parallelism; use --disable npu-attention (SDPA).")


def enable(transformer: torch.nn.Module, group: Any) -> str:
    """Split ``transformer`` over ``group``'s ranks with diffusers' context parallelism (once); its description."""
    world = group.world_size
    real = _real_rope(transformer)
    done = split_for(transformer)
    if done is not None:
        if done != (world, real):
            raise InputError("This Qwen-Image-Edit pipeline was split for another --parallel ulysses layout; reload it.")
        return describe(world, group.dist_backend)
    from diffusers.hooks.context_parallel import apply_context_parallel
    from diffusers.models._modeling_parallel import (
        ContextParallelConfig,
        ContextParallelInput,
        ParallelConfig,
    )
    from torch.distributed.device_mesh import init_device_mesh

    device = group.backend.device
    mesh = init_device_mesh(device.type, (1, world), mesh_dim_names=("ring", "ulysses"))
    cp = ContextParallelConfig(ulysses_degree=world, ulysses_anything=True, mesh=mesh)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(group.rank, world, device, mesh=mesh)
    plan = dict(transformer._cp_plan)
    if real:  # difforge's (cos, sin) stacks [2, S, 1, D/2]: the sequence is dimension 1
        table = ContextParallelInput(split_dim=1, expected_dims=4, split_output=True)
        plan["pos_embed"] = {0: table, 1: table}
    for block in transformer.transformer_blocks:
        block.attn.processor._parallel_config = config
    transformer._parallel_config = config  # as enable_parallelism records it (it refuses a second call)
    apply_context_parallel(transformer, cp, plan)
    setattr(transformer, MARK, (world, real))
    return describe(world, group.dist_backend)


def describe(world: int, dist_backend: str) -> str:
    return (f"ulysses: diffusers context parallelism over {world} ranks (ulysses_anything: uneven text/image "
            f"split, heads padded to a multiple of {world}; {dist_backend} all-to-all in every block)")
