"""A catalogue of porting faults, each planted in ONE torch function, for low-precision tensors only.

Why this exists: a port passport that passes broken ports is worse than none (issue 10).  To know
which broken ports ``difforge validate`` catches, the project needs bugs that look like the ones a
broken NPU kernel makes — a bias dropped, a norm's epsilon wrong, an activation swapped — planted
*outside* difforge, so the measurement does not depend on validate's internals or on difforge's own
override hooks (``op_overrides`` only reaches the ops difforge wraps; most kernels a port swaps are
plain ``torch.nn.functional`` calls inside diffusers / transformers modules).

Each :class:`Fault` is a :class:`torch.overrides.TorchFunctionMode`: entered around a whole process
(see :mod:`tests.validate.fault_cli`), it changes the result of one torch function, and only when that
call computes in bfloat16/float16.  A float32 call is never touched, so the CPU float32 reference and
any floor validate builds on float32 kernels stay clean, exactly as a broken device kernel would leave
the reference machine alone.  Every fault is deterministic (the "noise" faults draw from a generator
re-seeded per call), so the determinism rung cannot catch it by accident, and each counts how often it
fired: a fault that never fires on a model is "not reached", not "missed".

Which faults can fire where was checked by logging every torch function the tiny models call in
bfloat16 on the CPU (``tiny-ursa`` generate, ``tiny-qwen-edit`` edit): URSA's transformer computes
RMSNorm statistics and RoPE in float32 and casts back (``difforge.ops``), its VAE decodes in the run
dtype through ``conv2d``/``group_norm``/``silu``/``interpolate``; Qwen-Image-Edit's transformer runs
``linear``/``layer_norm``/``gelu`` (tanh)/SDPA in bf16, its VAE ``conv3d``/``conv2d`` in bf16 but its
RMS norms and upsampling in float32 (diffusers upcasts them).  ``FIRES_ON`` records where each fault
found; the tests and the sweep measure it again on every run.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

LOW_PRECISION = (torch.bfloat16, torch.float16)
#: Seed of the per-call generator the noise faults draw from (same pattern every call of a shape).
NOISE_SEED = 20240610
#: Relative size of the multiplicative noise of ``linear_noise`` / ``matmul_noise``.
NOISE_REL = 0.03
#: Returned by an injector when a call is not the fault's case (the call then runs untouched).
SKIP: Any = object()

Injector = Callable[["Fault", Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
Follower = Callable[["Fault", Callable[..., Any], tuple[Any, ...], Any], list[torch.Tensor]]


# ---- helpers ---------------------------------------------------------------------------------------
def floating_tensors(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    """Every floating tensor among the call's arguments (one level into lists/tuples, as torch.cat takes)."""
    found: list[torch.Tensor] = []

    def visit(value: Any, depth: int = 0) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                found.append(value)
        elif isinstance(value, list | tuple) and depth == 0:
            for item in value:
                visit(item, 1)

    for a in args:
        visit(a)
    for a in kwargs.values():
        visit(a)
    return found


def all_low(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """The call computes in low precision: it has floating tensor inputs and all are bf16/fp16."""
    fl = floating_tensors(args, kwargs)
    return bool(fl) and all(t.dtype in LOW_PRECISION for t in fl)


def is_low(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in LOW_PRECISION


def bind(signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
    """The call's arguments by name, defaults filled in (``signature`` is the Python function's)."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


def noise_like(out: torch.Tensor) -> torch.Tensor:
    """``1 + NOISE_REL * N(0, 1)`` of ``out``'s shape, the same numbers on every call of that shape."""
    gen = torch.Generator().manual_seed(NOISE_SEED)
    n = torch.randn(tuple(out.shape), generator=gen, dtype=torch.float32)
    return (1.0 + NOISE_REL * n).to(device=out.device, dtype=out.dtype)


def _optional(*names: str) -> tuple[Callable[..., Any], ...]:
    """torch callables by dotted name, skipping those this torch lacks (F.rms_norm is torch >= 2.4)."""
    out: list[Callable[..., Any]] = []
    for name in names:
        obj: Any = torch
        for part in name.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            out.append(obj)
    return tuple(out)


# ---- the mode ---------------------------------------------------------------------------------------
class Fault(TorchFunctionMode):
    """One planted fault: ``inject`` replaces the result of a call to one of ``targets``.

    ``inject(fault, func, args, kwargs)`` returns the faulted result, or :data:`SKIP` when the call is
    not the fault's case (float32 inputs, no bias to drop, ...); ``fired`` counts the faulted calls.
    ``observe`` lists functions whose calls are never changed but shown to ``follow(fault, func, args,
    out)``, which returns the output tensors to remember in ``memo`` (by id, weakly): for faults that
    must know where a tensor came from.  ``dry`` computes every faulted result
    and counts it but returns the clean one: a survey of where a fault would fire, without its effect.
    Instances are reusable; :meth:`fresh` gives an independent copy with its own count.
    """

    def __init__(self, name: str, what: str, targets: tuple[Callable[..., Any], ...], inject: Injector,
                 family: str, observe: tuple[Callable[..., Any], ...] = (), follow: Follower | None = None,
                 dry: bool = False) -> None:
        super().__init__()
        self.dry = dry
        self.follow = follow
        self.name = name
        self.what = what
        self.family = family
        self.targets = frozenset(targets)
        self.observe = frozenset(observe)
        self.inject = inject
        self.fired = 0
        #: id -> tensor, for faults that follow a tensor from one call to the next (weak: never keeps memory).
        self.memo: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    def fresh(self, dry: bool = False) -> Fault:
        return Fault(self.name, self.what, tuple(self.targets), self.inject, self.family, tuple(self.observe),
                     self.follow, dry)

    def remembered(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and self.memo.get(id(t)) is t

    def reset(self) -> None:
        self.fired = 0
        self.memo = weakref.WeakValueDictionary()

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in self.observe and self.follow is not None:
            out = func(*args, **kwargs)
            for t in self.follow(self, func, args, out):
                self.memo[id(t)] = t
            return out
        if func in self.targets:
            out = self.inject(self, func, args, kwargs)
            if out is not SKIP:
                self.fired += 1
                if not self.dry:
                    return out
        return func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Fault({self.name!r}, fired={self.fired})"


# ---- injectors --------------------------------------------------------------------------------------
def _linear_noise(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not all_low(args, kwargs):
        return SKIP
    out = func(*args, **kwargs)
    return out * noise_like(out)


def _drop_bias(position: int) -> Injector:
    """Call ``func`` with its bias (positional ``position`` or ``bias=``) set to None, when it has one."""

    def inject(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not all_low(args, kwargs):
            return SKIP
        if "bias" in kwargs:
            if kwargs["bias"] is None:
                return SKIP
            return func(*args, **{**kwargs, "bias": None})
        if len(args) <= position or args[position] is None:
            return SKIP
        return func(*args[:position], None, *args[position + 1:], **kwargs)

    return inject


def _add_offset(offset: float) -> Injector:
    def inject(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not all_low(args, kwargs):
            return SKIP
        return func(*args, **kwargs) + offset

    return inject


_GROUP_NORM = inspect.signature(F.group_norm)


def _group_norm_eps(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not all_low(args, kwargs):
        return SKIP
    b = bind(_GROUP_NORM, args, kwargs)
    b.arguments["eps"] = 0.1
    return func(*b.args, **b.kwargs)


_ROW_MULS = (torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.mul)


def _rms_norm_scale(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """RMSNorm's normalisation factor x1.05: ``F.rms_norm`` if a model calls it, else the multiply of a
    bf16/fp16 activation ``[..., D]`` by its per-row factor ``[..., 1]`` (how difforge's and diffusers'
    RMSNorms apply ``rsqrt(mean(x^2) + eps)``, computed in float32 and so not reachable itself)."""
    if func in _ROW_MULS:
        if len(args) != 2 or kwargs:
            return SKIP
        a, b = args
        for x, f in ((a, b), (b, a)):
            if (is_low(x) and isinstance(f, torch.Tensor) and f.is_floating_point() and x.dim() >= 2
                    and x.shape[-1] > 1 and tuple(f.shape) == (*x.shape[:-1], 1)):
                return func(x, f * 1.05) if x is a else func(f * 1.05, x)
        return SKIP
    if not all_low(args, kwargs):
        return SKIP
    return func(*args, **kwargs) * 1.05


def _silu_slope(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0] if args else kwargs.get("input")
    if not is_low(x):
        return SKIP
    out = x * torch.sigmoid(1.25 * x)
    inplace = args[1] if len(args) > 1 else kwargs.get("inplace", False)
    return x.copy_(out) if inplace else out


_GELU_ARGS = ("input", "approximate")


def _gelu_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[torch.Tensor, str]:
    named = dict(zip(_GELU_ARGS, args, strict=False))
    named.update(kwargs)
    return named["input"], named.get("approximate", "none")


def _gelu_approx(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, approx = _gelu_args(args, kwargs)
    if not is_low(x):
        return SKIP
    return func(x, approximate="none" if approx == "tanh" else "tanh")


def _gelu_relu(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, _ = _gelu_args(args, kwargs)
    if not is_low(x):
        return SKIP
    return F.relu(x)


def _softmax_temp(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args or not is_low(args[0]):
        return SKIP
    return func(args[0] / 1.1, *args[1:], **kwargs)


def _sdpa_offset(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not all_low(args, kwargs):
        return SKIP
    out = func(*args, **kwargs)
    return out + 0.05 * out.float().std().to(out.dtype)


def _sdpa_scale(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Softmax scale 1/d instead of 1/sqrt(d): a kernel handed the wrong ``scale`` argument."""
    if not all_low(args, kwargs) or kwargs.get("scale") is not None:
        return SKIP
    q = args[0] if args else kwargs["query"]
    return func(*args, **{**kwargs, "scale": 1.0 / q.shape[-1]})


_EMBEDDING = inspect.signature(F.embedding)


def _embedding_shift(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    b = bind(_EMBEDDING, args, kwargs)
    weight = b.arguments["weight"]
    if not is_low(weight):
        return SKIP
    b.arguments["input"] = (b.arguments["input"] + 1).clamp(max=weight.shape[0] - 1)
    return func(*b.args, **b.kwargs)


_INTERPOLATE = inspect.signature(F.interpolate)
_LINEAR_MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}


def _interpolate_mode(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    b = bind(_INTERPOLATE, args, kwargs)
    x = b.arguments["input"]
    if not is_low(x) or x.dim() not in _LINEAR_MODES:
        return SKIP
    if b.arguments["mode"] in ("nearest", "nearest-exact"):
        b.arguments["mode"] = _LINEAR_MODES[x.dim()]
    elif b.arguments["mode"] in _LINEAR_MODES.values():
        b.arguments["mode"] = "nearest"
        b.arguments["align_corners"] = None
    else:
        return SKIP
    return func(*b.args, **b.kwargs)


def _cat_swap(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``cat((a, b))`` -> ``cat((b, a))`` for exactly two bf16/fp16 tensors of one shape (so shapes hold)."""
    tensors = args[0] if args else kwargs.get("tensors")
    if not isinstance(tensors, list | tuple) or len(tensors) != 2:
        return SKIP
    a, b = tensors
    if not (is_low(a) and is_low(b)) or a.shape != b.shape:
        return SKIP
    rest = {k: v for k, v in kwargs.items() if k != "tensors"}
    return func([b, a], *args[1:], **rest)


_SINES = (torch.sin, torch.Tensor.sin)
_SCALAR_MULS = (torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__)
_SPLITS = (torch.Tensor.split, torch.split, torch.Tensor.chunk, torch.chunk)
_CATS = _optional("cat", "concat", "concatenate")
_CASTS = (torch.Tensor.to, torch.Tensor.type_as, torch.Tensor.half, torch.Tensor.bfloat16)


def _sine_tables(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], out: Any) -> list[torch.Tensor]:
    """Follow a ``sin`` output through what rotary tables undergo before the cast: a scalar scale
    (transformers' ``attention_scaling``), split / chunk / indexing and a cat of table pieces only (the
    multimodal-RoPE recomposition).  A cat with anything else (a timestep embedding's ``[sin, cos]``)
    ends the trail, so sinusoidal embeddings other than rotary tables are not touched."""
    if func in _SINES:
        return [out] if isinstance(out, torch.Tensor) else []
    if func in _SCALAR_MULS and len(args) == 2:
        a, b = args
        if (fault.remembered(a) and isinstance(b, int | float)) or (fault.remembered(b) and isinstance(a, int | float)):
            return [out]
        return []
    if func in _SPLITS or func is torch.Tensor.__getitem__:
        if args and fault.remembered(args[0]):
            return [t for t in (out if isinstance(out, list | tuple) else (out,)) if isinstance(t, torch.Tensor)]
        return []
    if func in _CATS and args and isinstance(args[0], list | tuple) and args[0]:
        return [out] if all(fault.remembered(t) for t in args[0]) else []
    return []


def _rope_sin_sign(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A rotary table's sine negated as it enters bf16/fp16 (rotation by -theta).

    RoPE itself runs in float32 in both tiny models' denoisers (difforge and diffusers upcast it), so
    the fault sits where the device takes a sine table over: the ``.to(bf16/fp16)`` cast of a tensor
    that ``sin`` produced (followed by :func:`_sine_tables`).  Only the cast is changed, and only when
    it lands in low precision; a float32 run's ``.to(float32)`` is never touched.
    """
    src = args[0] if args else None
    if not fault.remembered(src) or is_low(src):
        return SKIP
    out = func(*args, **kwargs)
    if not is_low(out):
        return SKIP  # not a cast into bf16/fp16 (the call is simply run again, untouched)
    return -out


def _matmul_noise(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not all_low(args, kwargs):
        return SKIP
    out = func(*args, **kwargs)
    return out * noise_like(out)


# ---- the catalogue ----------------------------------------------------------------------------------
LINEAR = (F.linear,)
CONVS = _optional("conv1d", "conv2d", "conv3d")
SOFTMAXES = (F.softmax, torch.softmax, torch.Tensor.softmax)
MATMULS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm)


@dataclass(frozen=True)
class _Spec:
    name: str
    family: str
    what: str
    targets: tuple[Callable[..., Any], ...]
    inject: Injector
    observe: tuple[Callable[..., Any], ...] = ()
    follow: Follower | None = None


_SPECS = (
    _Spec("linear_noise", "linear", f"F.linear output x (1 + {NOISE_REL:g} N(0,1)), fixed-seed noise per shape",
          LINEAR, _linear_noise),
    _Spec("linear_no_bias", "linear", "F.linear with its bias dropped", LINEAR, _drop_bias(2)),
    _Spec("conv_no_bias", "convolution", "conv1d/conv2d/conv3d with the bias dropped", CONVS, _drop_bias(2)),
    _Spec("layer_norm_offset", "layernorm", "F.layer_norm output + 0.1", (F.layer_norm,), _add_offset(0.1)),
    _Spec("group_norm_eps", "groupnorm", "F.group_norm with eps 0.1 (the wrong argument read as eps)",
          (F.group_norm,), _group_norm_eps),
    _Spec("group_norm_offset", "groupnorm", "F.group_norm output + 0.1", (F.group_norm,), _add_offset(0.1)),
    _Spec("rms_norm_scale", "rmsnorm", "RMSNorm factor x1.05 (F.rms_norm, or the x[...,D] * factor[...,1] "
          "multiply of a bf16/fp16 activation)", (*_optional("nn.functional.rms_norm"), *_ROW_MULS),
          _rms_norm_scale),
    _Spec("silu_slope", "activation", "F.silu(x) -> x * sigmoid(1.25 x)", (F.silu,), _silu_slope),
    _Spec("gelu_approx", "activation", "F.gelu approximation swapped (exact <-> tanh)", (F.gelu,), _gelu_approx),
    _Spec("gelu_relu", "activation", "F.gelu replaced by ReLU", (F.gelu,), _gelu_relu),
    _Spec("softmax_temp", "softmax", "softmax of logits / 1.1 (temperature 1.1)", SOFTMAXES, _softmax_temp),
    _Spec("sdpa_offset", "attention", "scaled_dot_product_attention output + 0.05 * its std",
          (F.scaled_dot_product_attention,), _sdpa_offset),
    _Spec("sdpa_scale", "attention", "scaled_dot_product_attention with scale 1/d instead of 1/sqrt(d)",
          (F.scaled_dot_product_attention,), _sdpa_scale),
    _Spec("embedding_shift", "embedding", "F.embedding looks up ids + 1 (clipped) when the table is bf16/fp16",
          (F.embedding,), _embedding_shift),
    _Spec("interpolate_mode", "interpolate", "F.interpolate mode nearest <-> (bi/tri)linear", (F.interpolate,),
          _interpolate_mode),
    _Spec("cat_swap", "concat", "torch.cat of exactly two same-shape bf16/fp16 tensors in swapped order",
          _CATS, _cat_swap),
    _Spec("matmul_noise", "matmul", f"matmul/bmm output x (1 + {NOISE_REL:g} N(0,1)), fixed-seed noise per shape",
          MATMULS, _matmul_noise),
    _Spec("rope_sin_sign", "rope", "rotary sine table negated where it is cast to bf16/fp16 (rotation by -theta)",
          _CASTS, _rope_sin_sign, observe=(*_SINES, *_SCALAR_MULS, *_SPLITS, torch.Tensor.__getitem__, *_CATS),
          follow=_sine_tables),
)

# ==== URSA sampler / scheduler faults (issue 25, helper H2) ============================================
# Faults in the low-precision math of URSA's discrete sampler (models/ursa/scheduler.py): the codebook
# distance, the jump rates' softmax and the jump probability.  None of it is the transformer, so before
# the step rung judged the sampler step on its own (issue 25) only the operator rung's traced replay could
# see them.  On tiny-ursa these functions run in bf16/fp16 only inside the sampler (the transformer calls
# SDPA and F.linear), so each fires there alone.
_EXPS = (torch.exp, torch.Tensor.exp, torch.Tensor.exp_)


def _exp_base2(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``exp(x)`` computed as ``2**x``: a fast exponential that drops the ``log2(e)`` factor."""
    x = args[0] if args else kwargs.get("input")
    if not is_low(x) or kwargs.get("out") is not None:
        return SKIP
    out = torch.exp2(x)
    return x.copy_(out) if func is torch.Tensor.exp_ else out


def _softmax_dim(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A softmax asked over the last dim that normalises over the one before it (a kernel that assumes
    another layout)."""
    x = args[0] if args else kwargs.get("input")
    if not is_low(x) or x.dim() < 2:
        return SKIP
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim not in (-1, x.dim() - 1):
        return SKIP
    rest = {k: v for k, v in kwargs.items() if k not in ("input", "dim")}
    return func(x, -2, *args[2:], **rest)


def _matmul_half_k(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``a @ b`` over only the first half of the inner dimension (a tiled kernel that skips its last K tile)."""
    if kwargs or len(args) != 2 or not all_low(args, {}):
        return SKIP
    a, b = args
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] < 2:
        return SKIP
    k = a.shape[-1] // 2
    return func(a[..., :k], b[..., :k, :])


_NORMALIZE = inspect.signature(F.normalize)


def _normalize_dim(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """F.normalize over dim 0 instead of the dim asked (the reduction axis dropped)."""
    b = bind(_NORMALIZE, args, kwargs)
    x = b.arguments["input"]
    if not is_low(x) or x.dim() < 2 or b.arguments["dim"] in (0, -x.dim()) or b.arguments["out"] is not None:
        return SKIP
    b.arguments["dim"] = 0
    return func(*b.args, **b.kwargs)


URSA_SAMPLER_SPECS = (
    _Spec("exp_base2", "sampler", "exp(x) computed as 2**x in bf16/fp16 (URSA's jump probability 1 - exp(-dt*rate))",
          _EXPS, _exp_base2),
    _Spec("softmax_dim", "sampler", "softmax asked over the last dim normalises over the one before it "
          "(URSA's jump rates and target draw)", SOFTMAXES, _softmax_dim),
    _Spec("matmul_half_k", "sampler", "matmul/bmm over only the first half of the inner dimension "
          "(URSA's codebook distance e @ 2E^T)", MATMULS, _matmul_half_k),
    _Spec("normalize_dim", "sampler", "F.normalize over dim 0 instead of the dim asked (URSA's codebook "
          "and target embeddings)", (F.normalize,), _normalize_dim),
)
# ==== end of the URSA sampler block =====================================================================

# ==== Post-network faults (issue 25, helper H3) =======================================================
# Faults in what a Qwen-Image-Edit step computes after the transformer's output, in bf16/fp16: the true-CFG
# combine (models/qwen_edit/loop.py combine_cfg), the scheduler's Euler update (diffusers'
# FlowMatchEulerDiscreteScheduler.step: ``sample.float() + dt * model_output``, the product in the model's
# dtype) and the unpacking of the latents before the VAE (diffusers' _unpack_latents).  A call survey of a
# tiny-qwen-edit bf16 edit found these calls there and nowhere else (the only same-shape low-precision
# subtraction is CFG's, the packing permutes the other way); each fault fires on them alone.  A fault in the
# CFG *norm* rescale (the norm over the wrong dim) was tried and left out: tiny-qwen-edit's two branches
# are so alike that the rescale factor is 1 within 1 % over either dim (the step rung's ``post guided`` row
# measured it at 2.75x the floor at worst, clean 1.00x: a WARN inside bf16 rounding, not a fault this model
# can show; on a trained model with distinct branches it would be gross).
_SUBS = (*_optional("sub", "subtract"), torch.Tensor.sub, torch.Tensor.__sub__)


def _sub_swap(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``a - b`` of two same-shape bf16/fp16 tensors computed as ``b - a`` (a binary kernel that takes its
    operands in the wrong order): in Qwen's true CFG the guidance direction ``cond - uncond`` reversed."""
    if kwargs or len(args) != 2:
        return SKIP
    a, b = args
    if not (is_low(a) and is_low(b)) or a.shape != b.shape:
        return SKIP
    return func(b, a)


_SCALE_MULS = (torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.mul)


def _euler_step_scale(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A 0-d float32 step size times a bf16/fp16 tensor (computed in bf16/fp16: a 0-d tensor does not
    promote) comes out 1.1x: the Euler update ``dt * velocity`` of a kernel that reads its scalar from the
    wrong sigma slot (a 10 % longer step)."""
    if kwargs or len(args) != 2:
        return SKIP
    a, b = args
    for s, x in ((a, b), (b, a)):
        if (isinstance(s, torch.Tensor) and s.dim() == 0 and s.dtype == torch.float32 and is_low(x)
                and x.dim() >= 2):
            return func(a * 1.1, b) if s is a else func(a, b * 1.1)
    return SKIP


_PERMUTES = (torch.Tensor.permute, torch.permute)
#: The permutation of diffusers' _unpack_latents (``[B, H/2, W/2, C, 2, 2]`` -> ``[B, C, H/2, 2, W/2, 2]``).
_UNPACK = (0, 3, 1, 4, 2, 5)


def _unpack_transpose(fault: Fault, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The latents' unpack permutation with the 2x2 patch's two axes exchanged (every patch transposed):
    a transpose kernel handed the last two axes in the wrong order."""
    x = args[0] if args else kwargs.get("input")
    dims: Any = args[1:] if len(args) > 1 else kwargs.get("dims", ())
    if len(dims) == 1 and isinstance(dims[0], list | tuple):
        dims = dims[0]
    if not is_low(x) or x.dim() != 6 or tuple(dims) != _UNPACK:
        return SKIP
    return func(x, (0, 3, 1, 5, 2, 4))


POST_NETWORK_SPECS = (
    _Spec("cfg_sub_swap", "post-network", "a - b of two same-shape bf16/fp16 tensors computed as b - a (Qwen's "
          "true-CFG direction cond - uncond)", _SUBS, _sub_swap),
    _Spec("euler_step_scale", "post-network", "0-d float32 scalar x bf16/fp16 tensor comes out 1.1x (the Euler "
          "update dt * velocity)", _SCALE_MULS, _euler_step_scale),
    _Spec("unpack_transpose", "post-network", "the latents' unpack permute (0,3,1,4,2,5) of a bf16/fp16 tensor "
          "with the 2x2 patch axes exchanged", _PERMUTES, _unpack_transpose),
)
# ==== end of the post-network block ====================================================================

#: Every fault by name (shared instances: call :meth:`Fault.fresh` for an independent count).
FAULTS: dict[str, Fault] = {s.name: Fault(s.name, s.what, s.targets, s.inject, s.family, s.observe, s.follow)
                            for s in (*_SPECS, *URSA_SAMPLER_SPECS, *POST_NETWORK_SPECS)}

#: Where each fault fires on the tiny models (bf16 on the CPU), from the call survey and the sweep's
#: measured ``fired`` counts (the survey's 2-step generate never reached URSA's scheduler matmul;
#: validate's 4-step runs do).  Informative only: the sweep reports ``fired`` per run.
FIRES_ON: dict[str, tuple[str, ...]] = {
    "linear_noise": ("tiny-ursa", "tiny-qwen-edit"),
    "linear_no_bias": ("tiny-qwen-edit",),
    "conv_no_bias": ("tiny-ursa", "tiny-qwen-edit"),
    "layer_norm_offset": ("tiny-qwen-edit",),
    "group_norm_eps": ("tiny-ursa",),
    "group_norm_offset": ("tiny-ursa",),
    "rms_norm_scale": ("tiny-ursa", "tiny-qwen-edit"),
    "silu_slope": ("tiny-ursa", "tiny-qwen-edit"),
    "gelu_approx": ("tiny-qwen-edit",),
    "gelu_relu": ("tiny-qwen-edit",),
    "softmax_temp": ("tiny-ursa",),
    "sdpa_offset": ("tiny-ursa", "tiny-qwen-edit"),
    "sdpa_scale": ("tiny-ursa", "tiny-qwen-edit"),
    "embedding_shift": ("tiny-ursa", "tiny-qwen-edit"),
    "interpolate_mode": ("tiny-ursa",),
    "cat_swap": ("tiny-qwen-edit",),
    "matmul_noise": ("tiny-ursa",),  # the scheduler's bf16 codebook distance (e @ emb), not the transformer
    "rope_sin_sign": ("tiny-ursa", "tiny-qwen-edit"),
    # URSA sampler block: measured with the step rung's sampler check (issue 25)
    "exp_base2": ("tiny-ursa",),
    "softmax_dim": ("tiny-ursa",),
    "matmul_half_k": ("tiny-ursa",),
    "normalize_dim": ("tiny-ursa",),
    # post-network block: measured with the step rung's post-network rows (issue 25)
    "cfg_sub_swap": ("tiny-qwen-edit",),
    "euler_step_scale": ("tiny-qwen-edit",),
    "unpack_transpose": ("tiny-qwen-edit",),
}


def get(name: str, dry: bool = False) -> Fault | None:
    """A fresh :class:`Fault` by name (``dry``: count only); ``none`` is no fault (None).  KeyError
    names the known ones."""
    if name == "none":
        return None
    if name not in FAULTS:
        raise KeyError(f"unknown fault {name!r}; known: none, {', '.join(FAULTS)}")
    return FAULTS[name].fresh(dry)


def names() -> Iterator[str]:
    yield from FAULTS


__all__ = ["FAULTS", "FIRES_ON", "LOW_PRECISION", "SKIP", "Fault", "get", "names"]
