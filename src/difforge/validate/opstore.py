"""The operator rung's traced calls, stored in a capture bundle and replayed on another machine.

:mod:`.tracing` keeps, per component and op type, a bounded set of calls: CPU copies of each call's
(reduced) inputs, the device's output on the same part, and the function that recomputes that part.
Inputs and outputs are tensors and plain values, so they go into the bundle as they are; the
function is a closure and cannot be stored.  It is rebuilt here from what names it - the op type,
whether the call was kept whole (then the traced torch function, found by its name in
:data:`~.tracing.TABLE`) - so the judge replays with :func:`.tracing.replay` exactly as validate
does in one process.  ``tests/validate/test_capture.py`` checks, on every call the tiny models
trace, that the rebuilt function gives the live one's result bit for bit.

Values a bundle cannot hold (a dtype is stored by name; anything else unknown) make the call
*skipped* at capture time, with the reason, exactly like a call no reduction fits: a coverage gap
the operator rung reports, never a silent pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor
from torch.overrides import resolve_name

from ..devices import DTYPES, dtype_name
from .tracing import TABLE, Call, Capture, _run_layer_norm, _run_rms_norm, _sdpa_floor

#: ``Call.how`` of a call kept as it came (tracing's ``_full``): replayed by the traced function itself.
WHOLE = "whole call"
_POINTWISE: dict[str, Callable[..., Tensor]] = {
    "silu": F.silu, "gelu": F.gelu, "relu": F.relu, "mish": F.mish, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
}
_CONVS = {"conv1d": F.conv1d, "conv2d": F.conv2d, "conv3d": F.conv3d}


def _conv(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    return lambda x, w, b, stride, dilation, groups: fn(x, w, b, stride, 0, dilation, groups)


def _pointwise(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    return lambda x, **kw: fn(x, **kw)


#: op type -> the function that recomputes a reduced call (tracing's planners build the same ones).
_RUNS: dict[str, Callable[..., Tensor]] = {
    "linear": lambda x, w, b: F.linear(x, w, b),
    "matmul": lambda x, y: torch.matmul(x, y),
    "softmax": lambda x: torch.softmax(x, -1),
    "normalize": lambda x, p, eps: F.normalize(x, p=p, dim=-1, eps=eps),
    "layer_norm": _run_layer_norm,
    "rms_norm": _run_rms_norm,
    "group_norm": lambda x, groups, w, b, eps: F.group_norm(x, groups, w, b, eps),
    "embedding": lambda ids, w: F.embedding(ids, w),
    "interpolate": lambda x, **kw: F.interpolate(x, **kw),
    "scaled_dot_product_attention":
        lambda q, k, v, mask, scale: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale),
    **{op: _conv(fn) for op, fn in _CONVS.items()},
    **{op: _pointwise(fn) for op, fn in _POINTWISE.items()},
}
_FLOOR_RUNS: dict[str, Callable[..., Tensor]] = {"scaled_dot_product_attention": _sdpa_floor}


def label(func: Any, op: str) -> str:
    """The name a traced function is reported (and stored) under; tracing's own spelling."""
    return (resolve_name(func) or op).replace("torch.nn.functional.", "F.")


_BY_LABEL: dict[str, Any] = {label(func, entry.op): func for func, entry in TABLE.items()}


class Unstorable(TypeError):
    """A call argument a bundle cannot hold."""


def _encode(value: Any) -> Any:
    """Call arguments as nested tensors and JSON values (a dtype by name)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, torch.dtype):
        return {"__dtype__": dtype_name(value)}
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_encode(v) for v in value) if type(value) in (list, tuple) else tuple(
            _encode(v) for v in value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise Unstorable(f"a {type(value).__name__} argument cannot be stored in a capture")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__dtype__"}:
            return DTYPES[value["__dtype__"]]
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_decode(v) for v in value)
    return value


def runner(op: str, func: str, how: str) -> tuple[Callable[..., Tensor], Callable[..., Tensor] | None]:
    """(run, floor_run) of a stored call: what tracing's plan for it held."""
    if how == WHOLE:
        fn = _BY_LABEL.get(func)
        if fn is None:
            raise KeyError(f"a whole {op} call of {func}, which this difforge does not trace")
        return (lambda args, kwargs: fn(*args, **kwargs)), None
    if op not in _RUNS:
        raise KeyError(f"op type {op}, which this difforge does not trace")
    return _RUNS[op], _FLOOR_RUNS.get(op)


def _index32(index: Tensor | None) -> Tensor | None:
    """An output sample's indices as int32 when they fit (half the bytes, the same values; read back as int64)."""
    if index is None or index.numel() == 0 or int(index.max()) >= 2**31:
        return index
    return index.to(torch.int32)


def store_capture(cap: Capture) -> dict[str, Any]:
    """One component's capture as nested tensors and JSON values (for :meth:`.bundle.BundleWriter.put`)."""
    calls: list[dict[str, Any]] = []
    skipped = {op: list(reasons) for op, reasons in cap.skipped.items()}
    for op, kept in cap.calls.items():
        for c in kept:
            try:
                args = _encode(c.args)
            except Unstorable as exc:
                skipped.setdefault(op, []).append(f"call {c.index}: {exc}")
                continue
            calls.append({"op": c.op, "func": c.func, "index": c.index, "where": c.where, "shape": c.shape,
                          "how": c.how, "args": args, "out": c.out, "out_index": _index32(c.out_index)})
    return {"component": cap.component, "seen": dict(cap.seen), "skipped": skipped, "calls": calls}


def load_capture(stored: dict[str, Any]) -> Capture:
    """A stored capture back as tracing's :class:`~.tracing.Capture`, each call ready for ``replay``."""
    cap = Capture(str(stored["component"]), seen=Counter({str(k): int(v) for k, v in stored["seen"].items()}),
                  skipped={str(k): list(v) for k, v in stored["skipped"].items()})
    for c in stored["calls"]:
        run, floor_run = runner(c["op"], c["func"], c["how"])
        call = Call(c["op"], c["func"], int(c["index"]), c["where"], c["shape"], c["how"], _decode(c["args"]), run,
                    c["out"], None if c["out_index"] is None else c["out_index"].long(), floor_run)
        cap.calls.setdefault(call.op, []).append(call)
    return cap


__all__ = ["label", "load_capture", "runner", "store_capture"]
