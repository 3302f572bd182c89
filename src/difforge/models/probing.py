"""What validation may ask of a model family: the probe protocol and the operator case it returns.

``difforge validate`` judges any family through a probe (``models/<family>/probe.py``) wrapped around a
loaded pipeline, so validate/ holds no family-specific code and finds no module by class name.  The
probe owns how to run one teacher-forced forward step, which components have their own inputs, how
many FLOPs a step costs, and where each operator is captured from a real forward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..config import RunConfig


@dataclass
class OpCase:
    """One op as it ran on the device, with the reference (fp32 CPU) and floor outputs for it."""

    op: str
    impl: str
    exact: bool
    shape: str
    dut: Tensor
    ref: Tensor
    floor: Tensor | None
    note: str = ""


class Probe(Protocol):
    """The hooks validation uses; every method works on the wrapped pipeline's device and dtype."""

    family: ClassVar[str]
    #: Whether the family edits input pictures (validate then needs --image or a synthetic picture).
    takes_images: ClassVar[bool]
    #: Prompts validate uses when the user gives no --prompts file.
    default_prompts: ClassVar[tuple[str, ...]]
    #: The negative prompt validate's runs use (None: the family's own default).
    negative_prompt: ClassVar[str | None]
    #: Denoising steps of a run that gives no --steps (the family's default).
    default_steps: ClassVar[int]
    #: The family's exact optimisations a call can switch off (``--disable``): all off is the baseline row
    #: of the report's performance table.
    exact_optimisations: ClassVar[tuple[str, ...]]
    #: The family's approximate optimisations (``--fast``), each timed as its own performance row.
    approximate_optimisations: ClassVar[tuple[str, ...]]

    pipeline: Any

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def size_multiple(self) -> int:
        """--height/--width must be positive multiples of this."""
        ...

    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """Step ``i`` of the sampler on recorded ``inputs`` (teacher forcing): the step's outputs."""
        ...

    def transformer_blocks(self) -> list[tuple[str, nn.Module]]: ...

    def modules(self) -> dict[str, nn.Module]:
        """The pipeline's top-level networks by name (text encoder, transformer, VAE ...): what an
        emulated low-precision floor rounds and hooks."""
        ...

    def component_inputs(self, cfg: RunConfig) -> dict[str, dict[str, Tensor]]:
        """Per component (text encoder, transformer, VAE ...), inputs it can be run on alone."""
        ...

    def run_component(self, name: str, inputs: dict[str, Tensor]) -> Tensor: ...

    def flops_per_step(self, cfg: RunConfig) -> dict[str, Any]: ...

    def operator_cases(self, ref_device: torch.device, cfg: RunConfig, inputs: dict[str, Tensor],
                       adaptations: Sequence[Any]) -> list[OpCase]:
        """The ops of one forward step on ``inputs``, each with its fp32 CPU reference and floor output."""
        ...

    # ---- optional: validation asks with ``getattr`` and does without them ---------------------------
    def sampler_step(self, cfg: RunConfig, i: int, inputs: dict[str, Tensor], logits: Tensor,
                     emulate: torch.dtype | None = None, x1: Tensor | None = None) -> dict[str, Tensor]:
        """A discrete sampler's step ``i`` alone on given ``logits`` (the reference's) and recorded ``inputs``,
        with the same draws on every side: its continuous internals and the tokens it draws.  ``emulate``: run
        on the host with the logits held in that dtype and every low-precision op on float32 kernels (the
        reference and an emulated floor); None: natively on the pipeline's device.  ``x1``: the draw the
        internals are computed for (the reference's), so they compare arithmetic, not draws.  A family whose step is
        all network (Qwen's velocity) has none: the step rung then judges the network output alone."""
        raise NotImplementedError

    def decode_tokens(self, cfg: RunConfig, tokens: Tensor) -> list[Any]:
        """A discrete model's pictures (PIL images) of a run's final ``tokens``, as the run returns them: the
        trajectory rung judges the device's pictures against the reference's decode of the same tokens."""
        raise NotImplementedError

    def portable_stream(self, cfg: RunConfig) -> bool:
        """Whether a run of ``cfg`` draws from a stream that gives every device the same numbers, so its
        discrete outputs can be compared one by one (default: the family has none to compare)."""
        return False


def detach(t: Any) -> Any:
    """A clone that outlives the forward it was captured from (non-tensors pass through)."""
    return t.detach().clone() if isinstance(t, Tensor) else t


def upcast(t: Tensor) -> Tensor:
    """``t`` as float32 on the CPU: what the reference implementation runs on."""
    return t.detach().to("cpu", torch.float32)


def moved(t: Tensor, device: torch.device, dtype: torch.dtype) -> Tensor:
    """``t`` on ``device``, floating tensors cast to ``dtype`` (ids keep their integer dtype)."""
    return t.detach().to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)


def rounded(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` as float32 on the CPU after a round trip through ``dtype`` (ids and ints untouched)."""
    t = t.detach().to("cpu")
    return t.to(dtype).to(torch.float32) if t.is_floating_point() else t


class LowPrecisionOnFloat32(TorchFunctionMode):
    """Run an op with ``dtype`` semantics on float32 kernels: every torch call whose floating tensor
    inputs are all ``dtype`` computes in float32 and rounds its result to ``dtype``; calls that mix in
    float32 (an op's deliberate float32 statistics) compute and stay in float32; dtype conversions run
    as they are.  So each intermediate is rounded exactly where a ``dtype`` kernel would round it, but
    no ``dtype`` kernel runs - the floor a broken bf16/fp16 kernel cannot share.

    ``more``: further low-precision dtypes emulated the same way, for code that computes in two of them
    (URSA's sampler holds its distance buffer in the run dtype and its codebook in float16).  A call
    whose inputs are all among them rounds to their promoted dtype, as torch's own kernel would return
    (bfloat16 with float16 promotes to float32: no rounding); a result written through ``out=`` or in
    place is rounded by the copy into the caller's tensor, which is what the real kernel's store does.
    """

    CONVERSIONS = frozenset({torch.Tensor.to, torch.Tensor.float, torch.Tensor.double, torch.Tensor.half,
                             torch.Tensor.bfloat16, torch.Tensor.type, torch.Tensor.type_as})
    #: The same conversions by name: a tool that wraps torch's functions (msprobe's dump replaces
    #: ``Tensor.to`` with a wrapper of that name) hands the mode its wrapper, which must convert too.
    CONVERSION_NAMES = frozenset({"to", "float", "double", "half", "bfloat16", "type", "type_as"})

    #: Calls that compute nothing (attribute reads, indexing, copies into place, Python protocol hooks).
    AS_THEY_ARE = frozenset({"__get__", "__set__", "__getitem__", "__setitem__", "__repr__", "__format__",
                             "__len__", "__bool__", "__index__", "__int__", "__float__", "__iter__", "__hash__",
                             "copy_", "size", "dim", "numel", "is_floating_point", "element_size", "stride"})

    def __init__(self, dtype: torch.dtype, *more: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.dtypes = frozenset((dtype, *more))

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func in self.CONVERSIONS or name in self.CONVERSION_NAMES or name in self.AS_THEY_ARE:
            return func(*args, **kwargs)  # conversions, attribute reads (``t.dtype``), indexing: exact
        target = kwargs.get("out")
        inputs = {k: v for k, v in kwargs.items() if k != "out"} if isinstance(target, Tensor) else kwargs
        floats = [t for t in _tensors((args, inputs)) if t.is_floating_point()]
        if not floats or any(t.dtype not in self.dtypes for t in floats):
            return func(*args, **kwargs)
        result = floats[0].dtype
        for t in floats[1:]:
            result = torch.promote_types(result, t.dtype)
        asked = inputs.get("dtype")
        if isinstance(asked, torch.dtype) and asked.is_floating_point:  # softmax(x, dtype=float32): as asked
            result = asked
        out = func(*map_tensors(args, _up), **map_tensors(inputs, _up))
        out = map_tensors(out, lambda t: t.to(result) if t.is_floating_point() else t)
        if isinstance(target, Tensor):  # out=: the kernel stores into the caller's tensor (rounding to its dtype)
            target.copy_(out)
            return target
        if name.endswith("_") and args and isinstance(args[0], Tensor):  # in place: write into the original
            args[0].copy_(out)
            return args[0]
        return out


def _tensors(obj: Any) -> list[Tensor]:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, list | tuple):
        return [t for x in obj for t in _tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x)]
    return []


def map_tensors(obj: Any, fn: Any) -> Any:
    """``obj`` with ``fn`` applied to every tensor in it (tuples, lists, dicts; a diffusers/transformers
    ModelOutput is updated in place so its attribute access survives)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if hasattr(obj, "to_tuple") and hasattr(obj, "keys"):
        for key in list(obj.keys()):
            obj[key] = map_tensors(obj[key], fn)
        return obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(x, fn) for x in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(map_tensors(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _up(t: Tensor) -> Tensor:
    return t.float() if t.is_floating_point() else t


def emulated(fn: Any, dtype: torch.dtype, *args: Any) -> Tensor:
    """An op's floor without the device's kernels: ``fn`` on CPU copies of its inputs in ``dtype``, run
    under :class:`LowPrecisionOnFloat32` (float32 kernels, every intermediate rounded where a ``dtype``
    kernel rounds it); returned as float32."""
    low = [a.detach().to("cpu", dtype) if isinstance(a, Tensor) and a.is_floating_point()
           else (a.detach().to("cpu") if isinstance(a, Tensor) else a) for a in args]
    with LowPrecisionOnFloat32(dtype):
        out = fn(*low)
    return out.detach().to(torch.float32)


def cosine(a: Tensor, b: Tensor) -> float:
    """Cosine similarity of the flattened tensors in float64; 1.0 when both are all-zero."""
    x, y = a.detach().to("cpu", torch.float64).reshape(-1), b.detach().to("cpu", torch.float64).reshape(-1)
    nx, ny = float(x.norm()), float(y.norm())
    if nx == 0.0 and ny == 0.0:
        return 1.0
    if nx == 0.0 or ny == 0.0 or not (math.isfinite(nx) and math.isfinite(ny)):
        return 0.0 if math.isfinite(nx) and math.isfinite(ny) else float("nan")
    return float(torch.dot(x, y) / (nx * ny))


def shapes(*ts: Tensor) -> str:
    return ", ".join("x".join(str(s) for s in t.shape) for t in ts)
