"""An emulated low-precision floor: what the device's dtype alone costs, computed without its kernels.

The noise floor answers "how far from the float32 reference would a *correct* port at this dtype be?".
Computing it with the device's own low-precision kernels (the old same-device floor) makes every
ratio 1 on a CPU-only machine and lets a broken kernel vouch for itself.  Here the floor is the
reference's float32 networks made to behave like the device's: each submodule's weights are rounded
to the dtype the device holds that submodule in, and its outputs are rounded to that dtype on the way
out (forward hooks), so rounding enters where the device's does while every kernel stays the
reference's float32 one.  A fault in a bf16/fp16 kernel can therefore never appear in the floor.

The dtype map is read from the device-under-test pipeline itself (per submodule, from its own
parameters; parameter-less modules inherit their parent's), so parts a port keeps in float32 (a VAE
decoder, a norm) are emulated in float32 - not rounded more coarsely than the device rounds them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..models.probing import map_tensors

LOW_PRECISION = (torch.bfloat16, torch.float16)


def module_dtypes(root: nn.Module, default: torch.dtype) -> dict[str, torch.dtype]:
    """Qualified submodule name -> the floating dtype its own parameters are held in (inherited if none)."""
    out: dict[str, torch.dtype] = {}
    for name, module in root.named_modules():
        own = next((p.dtype for p in module.parameters(recurse=False) if p.is_floating_point()), None)
        if own is None:
            parent = name.rpartition(".")[0] if name else None
            own = out.get(parent, default) if parent is not None else default
        out[name] = own
    return out


def _round(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with every float32/float64 tensor in it rounded to ``dtype`` (and kept in its own dtype)."""
    return map_tensors(value, lambda t: t.to(dtype).to(t.dtype)
                       if t.is_floating_point() and t.dtype not in LOW_PRECISION else t)


class EmulatedPrecision:
    """float32 ``networks`` made to round like the device's ``dtypes`` (see the module docstring)."""

    def __init__(self, networks: dict[str, nn.Module], dtypes: dict[str, dict[str, torch.dtype]]) -> None:
        self.networks = networks
        self.dtypes = dtypes
        self.rounded: list[str] = []
        with torch.no_grad():
            for name, root in networks.items():
                plan = dtypes.get(name, {})
                for sub, module in root.named_modules():
                    target = plan.get(sub)
                    if target not in LOW_PRECISION:
                        continue
                    for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                        if tensor.is_floating_point() and tensor.dtype not in LOW_PRECISION:
                            tensor.copy_(tensor.to(target).to(tensor.dtype))
                    self.rounded.append(f"{name}.{sub}" if sub else name)

    @property
    def emulated_dtypes(self) -> list[str]:
        """The low-precision dtypes the floor emulates (for its label)."""
        found = {str(d).removeprefix("torch.") for plan in self.dtypes.values() for d in plan.values()
                 if d in LOW_PRECISION}
        return sorted(found)

    @contextmanager
    def active(self) -> Iterator[None]:
        """While inside, every rounded submodule's floating outputs are rounded to its device dtype."""
        handles = []
        for name, root in self.networks.items():
            plan = self.dtypes.get(name, {})
            for sub, module in root.named_modules():
                target = plan.get(sub)
                if target in LOW_PRECISION:
                    handles.append(module.register_forward_hook(
                        lambda _m, _a, out, t=target: _round(out, t)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()


class InPrecision:
    """A probe whose every method call runs inside an :class:`EmulatedPrecision` context."""

    def __init__(self, probe: Any, emulation: EmulatedPrecision) -> None:
        self._probe = probe
        self._emulation = emulation

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._probe, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._emulation.active():
                return attr(*args, **kwargs)

        return call


def emulate(floor_probe: Any, dut_probe: Any) -> EmulatedPrecision:
    """Round ``floor_probe``'s networks (a fresh float32 load) to the device-under-test's dtype map."""
    dut_modules = dut_probe.modules()
    floor_modules = floor_probe.modules()
    dtypes = {name: module_dtypes(dut_modules[name], dut_probe.dtype) for name in floor_modules
              if name in dut_modules}
    return EmulatedPrecision(floor_modules, dtypes)


__all__ = ["EmulatedPrecision", "InPrecision", "emulate", "module_dtypes"]
