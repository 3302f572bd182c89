"""What ``difforge validate`` asks of URSA: teacher-forced steps, components, FLOPs and op capture.

:class:`URSAProbe` wraps a loaded :class:`~.pipeline.URSAPipeline` and uses only its public
attributes, so the pipeline keeps no validation code and validation holds no URSA code.  It sits at
the top of the family (nothing in ``models/ursa`` imports it); the registry imports it lazily.

Operators are captured by wrapping the transformer's :class:`~difforge.ops.OpSet` for one
teacher-forced step, then replayed through the portable ops in float32 on the CPU (the reference)
and at the device's dtype on the reference device (the floor).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any, ClassVar

import torch
from PIL import Image
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from ...config import RunConfig
from ...devices import PHILOX_STREAM
from ...errors import InputError
from ...ops import OpSet, plain_ops
from ...runtime.meta import on_meta
from ..families import URSA
from ..probing import LowPrecisionOnFloat32, OpCase, cosine, detach, emulated, moved, shapes, upcast
from .call import DEFAULT_STEPS, EXACT_OPTIMISATIONS, FAST_OPTIMISATIONS, PHILOX_RNG, cpu_copy, random_stream
from .pipeline import URSAPipeline
from .rope import positions
from .sampling import DEVICE_CHUNK, DRAW_X1, HOST_CHUNK, Draws, PhiloxDraws
from .transformer import URSATransformer

#: The sample prompts of the URSA port report (seeds/000, sections 3.4 and 6.2).
PROMPTS = (
    "The bear, calm and still, gazes upward as if lost in contemplation of the cosmos.",
    "A serene mountain lake reflecting the aurora borealis at twilight.",
    "A futuristic cityscape with neon lights and flying vehicles at night.",
)
NEGATIVE = "worst quality, low quality, inconsistent motion, static, still, blurry, jittery, distorted, ugly"


#: Rows (tokens) of the jump rates ``[rows, K]`` :meth:`URSAProbe.sampler_step` returns, evenly spread: a
#: 512x512 run's rates are 1024 x 64000 floats per side, and 256 rows of them judge the rate math as well.
RATE_ROWS = 256



# ---- operator capture ---------------------------------------------------------------------------
def _rotate_half_layout(t: Tensor) -> Tensor:
    """Interleaved pairs (a0, b0, a1, b1 ...) -> rotate-half layout (a0, a1 ..., b0, b1 ...)."""
    return torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)


def _match_layout(dut: Tensor, ref: Tensor, floor: Tensor) -> tuple[str, Tensor, Tensor]:
    """Fused rotary kernels may return the rotate-half layout (same attention, permuted head dim).
    Compare in whichever of the two layouts the device output is closer to; a wrong pairing is far
    from both."""
    half = _rotate_half_layout(ref)
    if cosine(dut, half) > cosine(dut, ref):
        return "rotate-half", half, _rotate_half_layout(floor)
    return "interleaved", ref, floor


class _Recorder:
    """Wraps OpSet callables to keep the first call(s) of each op: inputs and output."""

    def __init__(self, ops: OpSet, head_dim: int) -> None:
        self.ops = ops
        self.head_dim = head_dim
        self.calls: dict[str, list[tuple[tuple, Any]]] = {}

    def _keep(self, key: str, args: tuple, out: Any, limit: int = 1) -> None:
        lst = self.calls.setdefault(key, [])
        if len(lst) < limit:
            lst.append((tuple(detach(a) for a in args), detach(out)))

    def wrapped(self) -> OpSet:
        ops = self.ops

        def rms_norm(x, w, eps):  # type: ignore[no-untyped-def]
            out = ops.rms_norm(x, w, eps)
            self._keep("rms_norm/head" if x.shape[-1] == self.head_dim else "rms_norm/hidden", (x, w, eps), out)
            return out

        def swiglu(g, u):  # type: ignore[no-untyped-def]
            out = ops.swiglu(g, u)
            self._keep("swiglu", (g, u), out)
            return out

        def rope_table(cos, sin):  # type: ignore[no-untyped-def]
            self._keep("rope_table", (cos, sin), None)
            return ops.rope_table(cos, sin)

        def rotary(x, table):  # type: ignore[no-untyped-def]
            out = ops.rotary(x, table)
            self._keep("rotary", (x,), out, limit=2)  # q then k of the first layer
            return out

        def attention(q, k, v):  # type: ignore[no-untyped-def]
            out = ops.attention(q, k, v)
            self._keep("attention", (q, k, v), out)
            return out

        changes: dict[str, Any] = {"rms_norm": rms_norm, "swiglu": swiglu, "rope_table": rope_table,
                                   "rotary": rotary, "attention": attention}
        if ops.swiglu_packed is not None:
            def swiglu_packed(gu):  # type: ignore[no-untyped-def]
                out = ops.swiglu_packed(gu)
                self._keep("swiglu", tuple(gu.chunk(2, dim=-1)), out)
                return out

            changes["swiglu_packed"] = swiglu_packed
        return dataclasses.replace(ops, **changes)


# ---- the probe ----------------------------------------------------------------------------------
class URSAProbe:
    """:class:`~difforge.models.probing.Probe` for URSA: every method runs on the pipeline's device and dtype."""

    family: ClassVar[str] = URSA
    takes_images: ClassVar[bool] = False
    default_prompts: ClassVar[tuple[str, ...]] = PROMPTS
    negative_prompt: ClassVar[str | None] = NEGATIVE
    default_steps: ClassVar[int] = DEFAULT_STEPS
    exact_optimisations: ClassVar[tuple[str, ...]] = EXACT_OPTIMISATIONS
    #: philox-rng is in both lists as the stream switch; it is exact in distribution, so not an approximate row
    approximate_optimisations: ClassVar[tuple[str, ...]] = tuple(n for n in FAST_OPTIMISATIONS if n != PHILOX_RNG)

    def __init__(self, pipeline: URSAPipeline) -> None:
        self.pipeline = pipeline

    @property
    def dtype(self) -> torch.dtype:
        return self.pipeline.dtype

    @property
    def size_multiple(self) -> int:
        """--height/--width must be positive multiples of the VAE's spatial stride."""
        return self.pipeline.spatial_stride

    def portable_stream(self, cfg: RunConfig) -> bool:
        """A run of ``cfg`` draws from the Philox stream (the same numbers on every device), not the
        reference's CPU stream: then its final tokens can be compared token by token."""
        pipe = self.pipeline
        return random_stream(pipe.backend.random_stream, cfg.disable, cfg.fast) == PHILOX_STREAM

    def draws(self, cfg: RunConfig, device: torch.device | None = None) -> Draws:
        """The portable Philox stream of a run of ``cfg.seed`` (as the pipeline keys it), on ``device`` (default
        the pipeline's, with its compiled sampler block when it has one).

        Every teacher-forced step draws from it whatever stream the run itself used: its words are
        addressed by (seed, step, draw, position), so every side - device, reference, floor - gets the
        same numbers on any device.  The reference stream would not do: on an accelerator its categorical
        is ``argmax(p / q)`` over host exponentials drawn in the run dtype, on the CPU a multinomial, so
        a clean bf16 step "disagreed" on 68 % of its sampled tokens on an H200.
        """
        pipe = self.pipeline
        own = device is None or torch.device(device) == torch.device(pipe.device)
        dev = torch.device(pipe.device if device is None else device)
        fn = pipe.sampler_fns.get(pipe.philox_sampler) if own else None
        host = dev.type == "cpu"
        chunk = DEVICE_CHUNK if fn is not None or not host else HOST_CHUNK
        seed = pipe.backend.generator(cfg.seed).initial_seed()
        return Draws(philox=PhiloxDraws(seed, dev, chunk, fn, sparse=host and fn is None, sampler=pipe.philox_sampler))

    @torch.no_grad()
    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """Teacher-forced step ``i``: guided logits and sampled tokens for the given current tokens.

        The tokens are drawn from the Philox stream of :meth:`draws`, so both sides of a comparison draw
        the same numbers on any device.
        """
        pipe = self.pipeline
        latent_shape = pipe.latent_shape(cfg)
        steps = pipe.num_steps(cfg)
        pipe.place_transformer(pipe.device)
        x = inputs["tokens"].to(pipe.device, torch.int64)
        n_img = math.prod(latent_shape)
        if x.shape[-1] != n_img:
            raise InputError(f"forward_step got {x.shape[-1]} tokens per row; this size needs {n_img}.")
        cond, uncond = pipe.encode_prompts(cfg.prompt, cfg.negative_prompt)
        if cond.shape[0] != x.shape[0]:
            cond, uncond = cond.expand(x.shape[0], -1), uncond.expand(x.shape[0], -1)
        guided = cfg.guidance > 1
        ids = pipe.image_ids(cond, uncond, x, guided)
        pos = positions(latent_shape, cond.shape[1]).to(pipe.device)
        raw = pipe.forward_logits(ids, pos, n_img, pipe.optimisations(cfg).lm_head_slice)
        t = pipe.scheduler.t(i, steps)
        z = pipe.guide(raw, cfg.guidance if t < cfg.guidance_trunc else 1) if guided else raw
        logits = cpu_copy(z, torch.float32)  # the scheduler overwrites z
        new = pipe.scheduler.step(z, i, steps, x, self.draws(cfg))
        return {"logits": logits, "tokens": new.cpu()}

    @torch.no_grad()
    def sampler_step(self, cfg: RunConfig, i: int, inputs: dict[str, Tensor], logits: Tensor,
                     emulate: torch.dtype | None = None, x1: Tensor | None = None) -> dict[str, Tensor]:
        """The scheduler's step ``i`` alone, teacher-forced: given guided ``logits`` (the reference's, float32)
        and the current ``inputs["tokens"]``, what this pipeline's sampler computes from them.

        ``emulate`` None: on the pipeline's device with the logits held in its dtype, as a run holds them -
        the device under test's own kernels.  ``emulate`` a dtype: on the host with the logits held in that
        dtype and every bfloat16/float16 computation (the run-dtype distance buffer, the float16 codebook
        terms) done by float32 kernels rounded where the low-precision kernel rounds
        (:class:`~difforge.models.probing.LowPrecisionOnFloat32`): the reference (``float32``) and the
        emulated floor (the device's dtype), which then share no low-precision kernel with the device.

        Returns CPU tensors: ``x1`` (the target codes drawn from ``softmax(logits)``) and ``tokens`` (the
        step's result, by the scheduler's own :meth:`~.scheduler.DFMScheduler.step`); before the last step
        also ``jump_prob`` ``[B, N]`` (each token's probability of leaving its code) and ``rate`` (the jump
        rates to every other code, ``[rows, K]`` for at most :data:`RATE_ROWS` evenly spread tokens).  All
        draws come from the Philox stream of :meth:`draws`.  ``x1`` given (the reference's draw): the rates
        and jump probabilities are computed for those targets, so they compare the scheduler's arithmetic
        alone - one target drawn differently (a near-boundary draw on bf16 logits) would otherwise change a
        whole row of rates; the returned ``x1`` and ``tokens`` are still this side's own draws.
        """
        pipe = self.pipeline
        steps = pipe.num_steps(cfg)
        sched = pipe.scheduler
        if emulate is None:
            device, dtype, mode = torch.device(pipe.device), pipe.dtype, nullcontext()
        else:
            device, dtype = torch.device("cpu"), emulate
            mode = LowPrecisionOnFloat32(torch.bfloat16, torch.float16)
            if torch.device(pipe.device).type != "cpu":
                sched = copy.copy(sched)
                sched.path = sched.path.to(device)
        draws = self.draws(cfg, device)
        ph = draws.philox
        assert ph is not None
        x = inputs["tokens"].to(device, torch.int64)
        z = logits.detach().to(device, dtype, copy=True)
        with mode:
            own = ph.categorical_logits(z, i, DRAW_X1)
            out = {"x1": own.cpu()}
            if i < steps - 1:
                target = own if x1 is None else x1.to(device, torch.int64)
                v = sched.path.rate(z.clone(), x, target, sched.t(i, steps))
                jump = sched.jump_probability(v, x, i, steps)
                flat = v.flatten(0, -2)
                keep = torch.linspace(0, flat.shape[0] - 1, min(flat.shape[0], RATE_ROWS)).round().long()
                out["jump_prob"] = cpu_copy(jump, torch.float32)
                out["rate"] = cpu_copy(flat[keep.to(flat.device)], torch.float32)
            out["tokens"] = sched.step(z, i, steps, x, draws).cpu()
        return out

    def decode_tokens(self, cfg: RunConfig, tokens: Tensor) -> list[Image.Image]:
        """The pictures this pipeline's VAE makes of a run's final ``tokens`` ``[B, N]``, as a run returns them
        (one per frame): the trajectory rung compares the device's pictures with the reference's decode of the
        device's own tokens, so the decode path is judged apart from which tokens were drawn."""
        pipe = self.pipeline
        pipe.place_vae(pipe.device)
        frames = pipe.decode_tokens(tokens.reshape(-1, *pipe.latent_shape(cfg)).to(torch.int64))
        return [Image.fromarray(f) for f in frames.reshape(-1, *frames.shape[2:])]

    def modules(self) -> dict[str, nn.Module]:
        return {"transformer": self.pipeline.transformer, "vae": self.pipeline.vae}

    def transformer_blocks(self) -> list[tuple[str, nn.Module]]:
        model = self.pipeline.transformer
        blocks: list[tuple[str, nn.Module]] = [("model.embed_tokens", model.model.embed_tokens)]
        blocks += [(f"model.layers.{i}", layer) for i, layer in enumerate(model.model.layers)]
        blocks += [("model.norm", model.model.norm), ("lm_head", model.lm_head)]
        return blocks

    def component_inputs(self, cfg: RunConfig) -> dict[str, dict[str, Tensor]]:
        """Deterministic CPU inputs (seeded by cfg.seed) for :meth:`run_component`."""
        pipe = self.pipeline
        latent_shape = pipe.latent_shape(cfg)
        codes = torch.randint(0, pipe.scheduler.codebook_size, (1, *latent_shape), generator=pipe.backend.generator(cfg.seed))
        cond, uncond = pipe.encode_prompts(cfg.prompt, None)
        return {
            "transformer": {"ids": pipe.image_ids(cond, uncond, codes.flatten(1), guided=False),
                            "positions": positions(latent_shape, cond.shape[1])},
            "vae_decode": {"codes": codes},
        }

    def run_component(self, name: str, inputs: dict[str, Tensor]) -> Tensor:
        """``transformer``: logits of the sampler's rows ``[B, N, K]``; ``vae_decode``: pixels in [-1, 1]."""
        pipe = self.pipeline
        with torch.no_grad():
            if name == "transformer":
                pipe.place_transformer(pipe.device)
                ids, pos = inputs["ids"].to(pipe.device), inputs["positions"].to(pipe.device)
                n_img = ids.shape[1] - pipe.tokenizer.max_length - 1
                return pipe.forward_logits(ids, pos, n_img, True).float().cpu()
            if name == "vae_decode":
                pipe.place_vae(pipe.device)
                return pipe.vae.decode(inputs["codes"].to(pipe.device)).float().cpu()
        raise InputError(f"Unknown URSA component '{name}'; use 'transformer' or 'vae_decode'.")

    def flops_per_step(self, cfg: RunConfig) -> dict[str, Any]:
        """FLOPs of one denoising forward, counted once on the meta device."""
        pipe = self.pipeline
        latent_shape = pipe.latent_shape(cfg)
        n_img = math.prod(latent_shape)
        text_len = pipe.tokenizer.max_length
        length = text_len + 1 + n_img
        rows = 2 if cfg.guidance > 1 else 1
        with on_meta():
            model = URSATransformer(pipe.transformer.config, pipe.transformer.ops)
            ids = torch.zeros(rows, length, dtype=torch.int64)
        pos = positions(latent_shape, text_len).to("meta")
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(ids, pos, logits_slice=slice(length - n_img - 1, length - 1))
        return {"forwards_per_step": 1, "tokens_per_forward": rows * length, "flops_per_step": int(counter.get_total_flops())}

    def operator_cases(self, ref_device: torch.device, cfg: RunConfig, inputs: dict[str, Tensor],
                       adaptations: Sequence[Any]) -> list[OpCase]:
        """The ops of step 0 on ``inputs`` (captured from the transformer's OpSet), each with its fp32 CPU
        reference and its floor (the portable op emulated at the device's dtype on float32 CPU kernels,
        :func:`~difforge.models.probing.emulated`, so it never shares the device's kernels).

        The op choices come from the OpSet itself, so ``adaptations`` is not needed here.
        """
        transformer = self.pipeline.transformer
        original = transformer.ops
        recorder = _Recorder(original, transformer.config.head_dim)
        transformer.set_ops(recorder.wrapped())
        try:
            self.forward_step(cfg, 0, inputs)
        finally:
            transformer.set_ops(original)
        plain = plain_ops()
        choices = dict(original.choices)
        calls = recorder.calls
        dt = self.dtype

        def floor_of(fn: Any, *args: Any) -> Tensor:
            return emulated(fn, dt, *args)

        def up_args(args: tuple) -> tuple:
            return tuple(upcast(a) if isinstance(a, Tensor) else a for a in args)

        def impl(op: str) -> tuple[str, bool]:
            ch = choices.get(op)
            return (ch.name, ch.exact) if ch else ("?", True)

        cases: list[OpCase] = []
        for key in ("rms_norm/hidden", "rms_norm/head"):
            if key in calls:
                (x, w, eps), out = calls[key][0]
                cases.append(OpCase(key, *impl("rms_norm"), shapes(x, w), upcast(out),
                                    plain.rms_norm(*up_args((x, w, eps))), floor_of(plain.rms_norm, x, w, eps)))
        if "swiglu" in calls:
            (g, u), out = calls["swiglu"][0]
            cases.append(OpCase("swiglu", *impl("swiglu"), shapes(g, u), upcast(out),
                                plain.swiglu(upcast(g), upcast(u)), floor_of(plain.swiglu, g, u)))
        if "rotary" in calls and "rope_table" in calls:
            (q,), q_rot = calls["rotary"][0]
            (cos, sin), _ = calls["rope_table"][0]
            ref = plain.rotary(upcast(q), plain.rope_table(upcast(cos), upcast(sin)))
            flo = emulated(lambda qq, cc, ss: plain.rotary(qq, plain.rope_table(cc, ss)), dt, q, cos, sin)
            layout, ref, flo = _match_layout(upcast(q_rot), ref, flo)
            cases.append(OpCase("rotary", *impl("rotary"), shapes(q), upcast(q_rot), ref, flo,
                                note=f"output layout {layout} (the reference is compared in the same layout)"))
        if "attention" in calls:
            (q, k, v), out = calls["attention"][0]
            # Attention's floor stays the portable kernel at the device's dtype: rounding only its output
            # is stricter than any bf16 kernel (they round the probabilities too); the traced operator
            # rung judges attention against a floor that also emulates that rounding.
            floor = plain.attention(*(moved(t, ref_device, dt) for t in (q, k, v)))
            cases.append(OpCase("attention", *impl("attention"), shapes(q, k, v), upcast(out),
                                plain.attention(upcast(q), upcast(k), upcast(v)), floor))
        return cases
