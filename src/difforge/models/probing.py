"""What validation may ask of a model family: the probe protocol and the operator case it returns.

``difforge validate`` judges any family through a probe (``models/<family>/probe.py``) wrapped around a
loaded pipeline, so validate/ holds no family-specific code and finds no module by class name.  The
probe owns how to run one teacher-forced forward step, which components have their own inputs, how
many FLOPs a step costs, and where each operator is captured from a real forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor, nn

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


def emulated(fn: Any, dtype: torch.dtype, *args: Any) -> Tensor:
    """An op's floor without the device's kernels: the float32 CPU kernel on inputs rounded to ``dtype``,
    the output rounded to ``dtype`` (a bf16/fp16 kernel on the same device would share a broken kernel)."""
    out = fn(*(rounded(a, dtype) if isinstance(a, Tensor) else a for a in args))
    return rounded(out, dtype)


def shapes(*ts: Tensor) -> str:
    return ", ".join("x".join(str(s) for s in t.shape) for t in ts)
