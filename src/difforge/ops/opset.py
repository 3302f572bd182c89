"""OpSet: the implementation of every portable op a model uses, chosen once at load time.

A model instance holds its own OpSet (never module-level state), so two models in one process can
run different implementations side by side - validation loads a reference and a device under test
together, and may inject a deliberately broken op into one of them through ``overrides``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from . import activation, attention, norm, rotary

if TYPE_CHECKING:
    from ..devices import Backend
    from ..runtime.record import RunRecord

OP_NAMES = ("rms_norm", "swiglu", "rotary", "attention")


@dataclass(frozen=True)
class OpChoice:
    """What implements one op, and whether it is bit-identical to the plain PyTorch path."""

    name: str
    exact: bool
    detail: str = ""


@dataclass(frozen=True)
class OpSet:
    """Callables for one model instance.

    ``rms_norm(x, weight, eps)``; ``swiglu(gate, up)``; ``swiglu_packed(gate_up)`` is set when the
    backend's kernel wants the concatenated ``[gate, up]`` projection (the model then packs its two
    weights into one at load time); ``rope_table(cos, sin)`` prepares per-forward tables that
    ``rotary(x, table)`` consumes; ``attention(q, k, v)`` takes and returns ``[B, L, heads, d]``.
    ``index_dtype`` is the integer dtype ids are cast to before any embedding lookup.
    """

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    swiglu: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    rope_table: Callable[[torch.Tensor, torch.Tensor], Any]
    rotary: Callable[[torch.Tensor, Any], torch.Tensor]
    attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    swiglu_packed: Callable[[torch.Tensor], torch.Tensor] | None = None
    index_dtype: torch.dtype = torch.int64
    choices: Mapping[str, OpChoice] = field(default_factory=dict)

    def names(self) -> dict[str, str]:
        return {k: v.name for k, v in self.choices.items()}

    def record_to(self, record: RunRecord) -> None:
        """Log each op's implementation as an adaptation of the run."""
        for what, choice in self.choices.items():
            record.adapt(what, choice.name, exact=choice.exact, detail=choice.detail)


def plain_ops() -> OpSet:
    """The portable reference implementation: what a CPU float32 run uses."""
    return OpSet(
        rms_norm=norm.rms_norm,
        swiglu=activation.swiglu,
        rope_table=rotary.rope_table,
        rotary=rotary.apply_rotary,
        attention=attention.sdpa_attention,
        choices={
            "rms_norm": OpChoice("torch (fp32 rsqrt factor)", True),
            "swiglu": OpChoice("torch (fp32 g*u/(1+exp(-g)))", True),
            "rotary": OpChoice("torch (interleaved pairs)", True),
            "attention": OpChoice("sdpa", True, "torch.nn.functional.scaled_dot_product_attention, no mask"),
            "index_dtype": OpChoice("int64", True, "ids cast to int64 before embedding lookups"),
        },
    )


def select_ops(backend: Backend, overrides: Mapping[str, Callable[..., Any]] | None = None) -> OpSet:
    """Pick each op's implementation for ``backend``: its fused kernel where it offers one, else plain.

    Which kernels exist is the backend's answer (:meth:`~difforge.devices.Backend.fused_kernel`): a
    torch_npu function (wrapped by :mod:`.npu`) or a :class:`~difforge.devices.cuda.TritonKernel` (bound
    to :mod:`.triton_kernels`); this function only binds them to the plain signatures.  ``overrides`` maps an op name (``rms_norm``,
    ``swiglu``, ``rotary``, ``attention``) to a callable with the *plain* signature; it wins over every
    other choice and is recorded as inexact.
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(OP_NAMES))
    if unknown:
        raise ValueError(f"Unknown op override(s) {', '.join(unknown)}; known ops are {', '.join(OP_NAMES)}.")
    base = plain_ops()
    ops: dict[str, Any] = {
        "rms_norm": base.rms_norm,
        "swiglu": base.swiglu,
        "swiglu_packed": None,
        "rope_table": base.rope_table,
        "rotary": base.rotary,
        "attention": base.attention,
    }
    choices = dict(base.choices)

    from ..devices.cuda import TritonKernel
    from . import npu as npu_ops

    triton_ops = [op for op in ("rms_norm", "swiglu", "rotary") if isinstance(backend.fused_kernel(op), TritonKernel)]
    if triton_ops:  # imported only here: triton is heavy, and absent off Linux
        from . import triton_kernels

        for op in triton_ops:
            ops[op] = triton_kernels.KERNELS[op]  # swiglu stays unpacked: a packed GEMM would change the products
            choices[op] = OpChoice(f"triton {op}", triton_kernels.EXACT[op], triton_kernels.DETAIL[op])
    if isinstance(backend.fused_kernel("sampler"), TritonKernel):  # bound by URSA's PhiloxDraws; recorded here
        choices["sampler"] = OpChoice(
            "triton philox inverse-cdf", False,
            "on the Philox stream: one launch a draw; the torch draw's codes but where a uniform is within float32 "
            "rounding of a cumulative-sum boundary",
        )
    if isinstance(backend.fused_kernel("rate"), TritonKernel):  # bound by URSA's MetricPath.to; recorded here
        choices["rate"] = OpChoice(
            "triton metric rate", False,
            "metric path: the jump rates in one launch, each op rounded as the torch path; the codebook product "
            "summed in float32 in order and the softmax in Triton's order (an ulp of the logits dtype)",
        )

    if "rms_norm" not in triton_ops and (kernel := backend.fused_kernel("rms_norm")) is not None:
        ops["rms_norm"] = npu_ops.make_rms_norm(kernel)
        choices["rms_norm"] = OpChoice("torch_npu.npu_rms_norm", False, "fused kernel; rounding differs from fp32-rsqrt path")
    if "swiglu" not in triton_ops and (kernel := backend.fused_kernel("swiglu")) is not None:
        ops["swiglu"] = npu_ops.make_swiglu(kernel)
        ops["swiglu_packed"] = npu_ops.make_swiglu_packed(kernel)
        choices["swiglu"] = OpChoice("torch_npu.npu_swiglu", False, "on a packed [gate, up] weight built at load time")
    if "rotary" not in triton_ops and (kernel := backend.fused_kernel("rotary")) is not None:
        ops["rope_table"] = npu_ops.rope_table
        ops["rotary"] = npu_ops.make_rotary(kernel)
        choices["rotary"] = OpChoice("torch_npu.npu_rotary_mul", False, "rotate-half layout (same attention, other reduction order)")
    if (kernel := backend.fused_kernel("attention")) is not None:
        ops["attention"] = npu_ops.make_attention(kernel)
        choices["attention"] = OpChoice("torch_npu.npu_fusion_attention", False, "BSND layout, GQA native, no mask")
    elif note := backend.sdpa_note():
        choices["attention"] = OpChoice("sdpa", True, f"{backend.name}: {note}")

    for name, fn in overrides.items():
        label = f"override:{getattr(fn, '__qualname__', type(fn).__name__)}"
        if name == "swiglu":
            ops["swiglu"], ops["swiglu_packed"] = fn, None
        elif name == "rotary":
            ops["rope_table"], ops["rotary"] = rotary.rope_table, fn
        else:
            ops[name] = fn
        choices[name] = OpChoice(label, False, "injected by the caller")

    return OpSet(index_dtype=torch.int64, choices=choices, **ops)
