"""Operator coverage by tracing: every op type the model runs, captured from a real forward.

A hand list of operator cases covers what its author thought of; a port breaks where nobody looked
(a conv kernel of the VAE, a GELU of the text encoder).  Here a :class:`torch.overrides.TorchFunctionMode`
watches a real forward of the device under test - the teacher-forced step and every component the
probe can run alone - and keeps the calls of a fixed table of torch functions (:data:`OP_TYPES`):
linear and matmul, convolutions, the norms, the activations, softmax, attention, embedding and
interpolation.  Each kept call is replayed on the CPU from CPU copies of its own inputs:

* the **reference** is the same torch function on the inputs upcast to float32;
* the **floor** is an *emulated* low-precision run: the float32 CPU kernel on the inputs rounded to
  the dtype the op ran at on the device, its output rounded to that dtype, and for the ops whose real
  kernels round an intermediate (:data:`FLOOR_RUNS`: attention's probabilities, a convolution before
  its bias add, a group norm's statistics) that intermediate rounded too.  It never touches the
  device's low-precision kernels (not even the CPU's bf16 ones), so a broken kernel cannot vouch for
  itself: the floor is what a correct kernel at that dtype may give.

The op's dtype is the dtype of the output it produced on the device, so an op a port runs in float32
inside a bf16 model is held to the float32 rule, not forgiven at bf16.

**Bounds** (memory and time, so a 20B model on an NPU can run this): per component and op type at
most :attr:`Caps.calls` calls are kept - the first :attr:`Caps.first` and, of the calls numbered
2, 4, 8, 16 ..., the last :attr:`Caps.spread` (so they spread across the layers without knowing the
count in advance, and only ~log2(N) calls are ever copied).  A kept call holds at most
:attr:`Caps.call_bytes` of CPU copies: large calls are *reduced* to a sub-call that recomputes a part
of the output exactly (rows of a linear with a subset of its output features, rows of a norm or
softmax, groups of a group norm, heads and query rows of attention, an output window of a
convolution with the input window it reads, channels of an interpolation, a fixed index set of a
pointwise op), and at most :attr:`Caps.outputs` output elements are compared (a fixed index set).
So kept memory is at most ``calls * call_bytes`` (64 MiB) per op type while one component is
captured (components are captured, replayed and freed one after the other), and only ~log2(N) calls
per op type are ever copied off the device.  Time: a reduced linear, matmul, convolution or
attention recomputes at most :attr:`Caps.outputs` output elements, so a replay costs at most
``2 * outputs * (reduction length)`` FLOPs - a few GFLOP for a 20B transformer's shapes (K = 12288:
1.6 GFLOP; attention over 16k keys: ~4 GFLOP), twice for attention (its floor is a second run);
norms, softmax and pointwise ops are bounded by their kept inputs.  Only a call kept whole (a
transposed convolution, or a layout no reduction knows) is bounded by its inputs' size alone.  A
call that cannot be kept within the cap is counted as skipped, with the reason.

Fused kernels that do not go through these torch functions (a ``torch_npu`` RMSNorm, a fused rotary)
are invisible here; the family probe's own operator cases cover them.  Compiled regions run eagerly
while capturing (``torch.compiler.set_stance("force_eager")``), so the traced kernels are the eager
ones; the step and component rungs judge the compiled graph.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.overrides import TorchFunctionMode, resolve_name

from ..config import RunConfig

#: Tensor types whose calls are kept (a subclass - a quantised or sharded weight - may not copy faithfully).
_PLAIN = (Tensor, nn.Parameter)
#: The one step the operator rung traces (teacher-forced on the reference's recorded inputs).
STEP_COMPONENT = "step 0"


@dataclass(frozen=True)
class Caps:
    """How much of a forward is kept (see the module docstring)."""

    first: int = 2
    spread: int = 2
    call_bytes: int = 16 * 2**20
    outputs: int = 2**16

    @property
    def calls(self) -> int:
        """Calls kept per component and op type."""
        return self.first + self.spread

    @property
    def op_bytes(self) -> int:
        """Bytes of CPU copies kept per component and op type, at most."""
        return self.calls * self.call_bytes


CAPS = Caps()


# ---- small helpers -------------------------------------------------------------------------------------
def _pick(n: int, k: int) -> Tensor:
    """A fixed, sorted set of ``min(n, k)`` distinct indices into ``range(n)`` (a few fewer when ``n`` is
    huge): half evenly spread, the first and last included, half from a fixed-seed draw (so a period in
    the layout cannot alias the sample)."""
    if k >= n:
        return torch.arange(n)
    half = max(1, k // 2)
    even = torch.arange(half) * (n - 1) // (half - 1) if half > 1 else torch.zeros(1, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    if n <= 2**20:
        perm = torch.randperm(n, generator=gen)
        free = torch.ones(n, dtype=torch.bool)
        free[even] = False
        drawn = perm[free[perm]][: k - even.numel()]
    else:  # no n-sized permutation: k << n, so the few repeats the draw has are dropped
        drawn = torch.randint(n, (k - even.numel(),), generator=gen)
    return torch.cat((even, drawn)).unique()


def _cpu(t: Tensor) -> Tensor:
    """A CPU copy in the tensor's own dtype (exact: no rounding happens here)."""
    return t.detach().to("cpu", copy=True)


def _rows(t: Tensor, idx: Tensor, tail: int = 1) -> Tensor:
    """Rows ``idx`` of ``t`` over its leading dims (all but the last ``tail``): ``[k, *t.shape[-tail:]]``."""
    lead = t.shape[: t.dim() - tail]
    if not lead:
        return t.unsqueeze(0)
    return t[_on(torch.unravel_index(idx, lead), t.device)]


def _flat(t: Tensor, idx: Tensor) -> Tensor:
    """Elements ``idx`` of ``t`` in flat (row-major) order, without copying the whole tensor."""
    if t.dim() == 0:
        return t.reshape(1)
    if t.is_contiguous():
        return t.reshape(-1)[idx.to(t.device)]
    return t[_on(torch.unravel_index(idx, t.shape), t.device)]


def _on(coords: tuple[Tensor, ...], device: torch.device) -> tuple[Tensor, ...]:
    """Index tensors computed on the CPU, moved to the device of the tensor they index."""
    return tuple(c.to(device) for c in coords)


def _tuple(v: Any, n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    return tuple(int(x) for x in v)


def _map(value: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """``value`` with ``fn`` applied to every tensor in it (tuples, lists and dicts walked)."""
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, tuple | list):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def _tensors(value: Any) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(value))


def _shape(t: Any) -> str:
    return "x".join(str(s) for s in t.shape) if isinstance(t, Tensor) else type(t).__name__


def _bind(args: tuple, kwargs: dict, names: tuple[str, ...], defaults: dict[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    out.update(zip(names, args, strict=False))
    out.update(kwargs)
    return out


# ---- one reduced call ---------------------------------------------------------------------------------
@dataclass
class _Plan:
    """A reduced call: CPU copies of its inputs, how to cut the same part out of the device's output,
    and the function that recomputes that part from the copies."""

    args: dict[str, Any]
    take: Callable[[Tensor], Tensor]
    run: Callable[..., Tensor]
    how: str
    #: The floor's own float32 emulation, for ops whose every correct low-precision kernel rounds an
    #: intermediate too (attention); called with the rounded inputs and ``dtype``.  None: ``run``.
    floor_run: Callable[..., Tensor] | None = None


Planner = Callable[[dict[str, Any], int, Caps], "_Plan | None"]


def _pointwise(fn: Callable[..., Tensor], static: tuple[str, ...] = ()) -> Planner:
    """Elementwise ops: a fixed index set of the input and the same elements of the output."""

    def plan(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
        x = a["input"]
        n = x.numel()
        idx = _pick(n, min(n, caps.outputs, budget))
        extra = {k: a[k] for k in static}
        return _Plan({"x": _cpu(_flat(x, idx)), **extra}, lambda out: _flat(out, idx),
                     lambda x, **kw: fn(x, **kw), f"{idx.numel()} of {n} elements")

    return plan


def _plan_linear(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
    x, w, b = a["input"], a["weight"], a.get("bias")
    if w.dim() != 2 or x.dim() == 0:
        return None
    out_f, in_f = w.shape
    n_rows = x.numel() // in_f
    r = min(n_rows, 128)
    c = min(out_f, max(1, caps.outputs // max(1, r)))
    while (r + c) * in_f + c + r * c > budget:
        if r == 1 and c == 1:
            return None
        if r >= c:
            r = max(1, r // 2)
        else:
            c = max(1, c // 2)
    ri, ci = _pick(n_rows, r), _pick(out_f, c)
    cid = ci.to(w.device)
    args = {"x": _cpu(_rows(x, ri)), "w": _cpu(w.index_select(0, cid)),
            "b": _cpu(b.index_select(0, cid)) if b is not None else None}
    return _Plan(args, lambda out: _rows(out, ri).index_select(1, cid.to(out.device)),
                 lambda x, w, b: F.linear(x, w, b), f"{ri.numel()} of {n_rows} rows x {ci.numel()} of {out_f} outputs")


def _plan_matmul(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
    x, y = a["input"], a["other"]
    if x.dim() < 2 or y.dim() < 2:
        return None
    lead = torch.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    m, k, n = x.shape[-2], x.shape[-1], y.shape[-1]
    nb_total = math.prod(lead)
    nb = min(nb_total, 4)
    r, c = min(m, 128), min(n, max(1, caps.outputs // (nb * min(m, 128))))
    while nb * ((r + c) * k + r * c) > budget:
        if nb > 1:
            nb //= 2
        elif r == 1 and c == 1:
            return None
        elif r >= c:
            r = max(1, r // 2)
        else:
            c = max(1, c // 2)
    bi, ri, ci = _pick(nb_total, nb), _pick(m, r), _pick(n, c)
    coords = torch.unravel_index(bi, lead) if lead else ()

    def at(t: Tensor) -> Tensor:
        """``t``'s matrices at the chosen batch indices (broadcast dims read index 0): ``[nb, ., .]``."""
        pad = len(lead) - (t.dim() - 2)
        if not lead:
            return t.unsqueeze(0)
        idx = tuple(torch.zeros_like(cd) if (i < pad or t.shape[i - pad] == 1) else cd
                    for i, cd in enumerate(coords))[pad:]
        return t[tuple(i.to(t.device) for i in idx)] if idx else t.unsqueeze(0).expand(len(bi), *t.shape)

    def take(out: Tensor) -> Tensor:
        return at(out).index_select(1, ri.to(out.device)).index_select(2, ci.to(out.device))

    args = {"x": _cpu(at(x).index_select(1, ri.to(x.device))), "y": _cpu(at(y).index_select(2, ci.to(y.device)))}
    return _Plan(args, take, lambda x, y: torch.matmul(x, y),
                 f"{len(bi)} of {nb_total} matrices, {len(ri)} of {m} rows x {len(ci)} of {n} columns")


def _plan_rowwise(a: dict[str, Any], budget: int, caps: Caps, dim: int, tail_args: dict[str, Any],
                  run: Callable[..., Tensor]) -> _Plan | None:
    """Ops whose output row (along ``dim``) depends on that input row only: softmax, normalize."""
    x = a["input"]
    if x.dim() == 0:
        return None
    xm = x.movedim(dim, -1)
    d = xm.shape[-1]
    n_rows = xm.numel() // max(1, d)
    r = min(n_rows, 256, budget // max(1, 2 * d))
    if r < 1:
        return None
    ri = _pick(n_rows, r)
    return _Plan({"x": _cpu(_rows(xm, ri)), **tail_args}, lambda out: _rows(out.movedim(dim, -1), ri), run,
                 f"{ri.numel()} of {n_rows} rows of {d}")


def _softmax_dim(a: dict[str, Any]) -> int:
    dim = a.get("dim")
    if dim is None:  # torch's legacy implicit dim (torch.nn.functional._get_softmax_dim)
        nd = a["input"].dim()
        return 0 if nd in (0, 1, 3) else 1
    return int(dim)


def _plan_softmax(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
    # The requested output dtype only sets the output's precision, which the floor's rounding covers.
    return _plan_rowwise(a, budget, caps, _softmax_dim(a), {}, lambda x: torch.softmax(x, -1))


def _plan_normalize(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
    if a.get("out") is not None or not isinstance(a.get("dim", 1), int):
        return None
    p, eps = a.get("p", 2.0), a.get("eps", 1e-12)
    return _plan_rowwise(a, budget, caps, int(a.get("dim", 1)), {"p": p, "eps": eps},
                         lambda x, p, eps: F.normalize(x, p=p, dim=-1, eps=eps))


def _run_layer_norm(x: Tensor, w: Tensor | None, b: Tensor | None, shape: tuple, eps: float | None) -> Tensor:
    return F.layer_norm(x, shape, w, b, 1e-5 if eps is None else eps)


def _run_rms_norm(x: Tensor, w: Tensor | None, shape: tuple, eps: float | None) -> Tensor:
    return F.rms_norm(x, shape, w, eps)


def _plan_norm(kind: str) -> Planner:
    """layer_norm / rms_norm: rows over the leading dims, the normalised shape whole."""

    def plan(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
        x, shape = a["input"], tuple(a["normalized_shape"])
        d = math.prod(shape)
        if x.dim() < len(shape) or d == 0:
            return None
        n_rows = x.numel() // d
        r = min(n_rows, 256, (budget - 2 * d) // (2 * d))
        if r < 1:
            return None
        ri = _pick(n_rows, r)
        w, b = a.get("weight"), a.get("bias")
        args: dict[str, Any] = {"x": _cpu(_rows(x, ri, len(shape))), "w": _cpu(w) if w is not None else None,
                                "shape": shape, "eps": a.get("eps")}
        if kind == "layer_norm":
            args["b"] = _cpu(b) if b is not None else None
        run = _run_layer_norm if kind == "layer_norm" else _run_rms_norm
        return _Plan(args, lambda out: _rows(out, ri, len(shape)), run, f"{ri.numel()} of {n_rows} rows of {d}")

    return plan


def _plan_group_norm(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
    x, g = a["input"], int(a["num_groups"])
    if x.dim() < 2 or x.shape[1] % g:
        return None
    n, c = x.shape[0], x.shape[1]
    cg, spatial = c // g, x.shape[2:]
    block = cg * math.prod(spatial)
    k = min(n * g, 16, budget // max(1, 2 * block))
    if k < 1:
        return None
    pi = _pick(n * g, k)
    ni, gi = torch.unravel_index(pi, (n, g))
    w, b = a.get("weight"), a.get("bias")

    def blocks(t: Tensor) -> Tensor:
        """Groups (n_i, g_i) of ``t`` as the channels of one sample: group norm with k groups recomputes them."""
        tt = t.reshape(n, g, cg, *spatial)[ni.to(t.device), gi.to(t.device)]
        return tt.reshape(1, len(pi) * cg, *spatial)

    def params(p: Tensor | None) -> Tensor | None:
        return _cpu(p.reshape(g, cg)[gi.to(p.device)].reshape(-1)) if p is not None else None

    args = {"x": _cpu(blocks(x)), "groups": len(pi), "w": params(w), "b": params(b), "eps": a.get("eps", 1e-5)}
    return _Plan(args, blocks, lambda x, groups, w, b, eps: F.group_norm(x, groups, w, b, eps),
                 f"{len(pi)} of {n * g} (sample, group) blocks of {block}")


def _plan_embedding(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
    ids, w = a["input"], a["weight"]
    if a.get("max_norm") is not None or w.dim() != 2:  # max_norm rewrites the weight in place
        return None
    d = w.shape[1]
    r = min(ids.numel(), 256, budget // max(1, 2 * d + 2))
    if r < 1:
        return None
    pos = _pick(ids.numel(), r)
    chosen = _flat(ids, pos)
    uniq, inv = torch.unique(chosen, return_inverse=True)
    args = {"ids": _cpu(inv), "w": _cpu(w.index_select(0, uniq.to(w.device)))}
    return _Plan(args, lambda out: _rows(out, pos, 1), lambda ids, w: F.embedding(ids, w),
                 f"{pos.numel()} of {ids.numel()} ids")


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _plan_conv(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
    """An output window at the origin (so the padded border is in it), the input window it reads
    (zero padding made explicit), a subset of the output channels when groups == 1."""
    x, w, b = a["input"], a["weight"], a.get("bias")
    nd = w.dim() - 2
    if x.dim() != nd + 2 or nd not in _CONV:
        return None
    groups = int(a.get("groups", 1))
    stride, dil = _tuple(a.get("stride", 1), nd), _tuple(a.get("dilation", 1), nd)
    ks, size = tuple(w.shape[2:]), tuple(x.shape[2:])
    padding = a.get("padding", 0)
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nd
        else:  # "same": torch puts the extra element on the right
            pads = [(dd * (k - 1) // 2, dd * (k - 1) - dd * (k - 1) // 2) for dd, k in zip(dil, ks, strict=True)]
    else:
        pads = [(p, p) for p in _tuple(padding, nd)]
    outs = [(s + lo + hi - dd * (k - 1) - 1) // st + 1
            for s, (lo, hi), dd, k, st in zip(size, pads, dil, ks, stride, strict=True)]
    if min(outs) < 1:
        return None
    c_out, c_in_g, c_in = w.shape[0], w.shape[1], x.shape[1]
    n_co = min(c_out, 32) if groups == 1 else c_out
    t = list(outs)

    def spans(t: list[int]) -> list[int]:
        return [(td - 1) * st + dd * (k - 1) + 1 for td, st, dd, k in zip(t, stride, dil, ks, strict=True)]

    def cost(t: list[int], n_co: int) -> tuple[int, int]:
        out = n_co * math.prod(t)
        return c_in * math.prod(spans(t)) + n_co * c_in_g * math.prod(ks) + n_co + out, out

    while True:
        total, out = cost(t, n_co)
        if total <= budget and out <= caps.outputs:
            break
        if max(t) > 1:
            i = max(range(nd), key=lambda j: t[j])
            t[i] = max(1, t[i] // 2)
        elif groups == 1 and n_co > 1:
            n_co //= 2
        else:
            return None
    co = _pick(c_out, n_co)
    cod = co.to(w.device)
    lo_pad, hi_pad, cuts = [], [], []
    for s, (lo, _), span in zip(size, pads, spans(t), strict=True):
        start, stop = -lo, -lo + span
        a0, a1 = max(0, start), min(s, stop)
        cuts.append(slice(a0, a1))
        lo_pad.append(a0 - start)
        hi_pad.append(stop - a1)
    crop = _cpu(x[(slice(0, 1), slice(None), *cuts)])
    flat_pads = [p for lo, hi in zip(reversed(lo_pad), reversed(hi_pad), strict=True) for p in (lo, hi)]
    crop = F.pad(crop, flat_pads) if any(flat_pads) else crop
    window = tuple(slice(0, td) for td in t)
    args = {"x": crop, "w": _cpu(w.index_select(0, cod)) if groups == 1 else _cpu(w),
            "b": (_cpu(b.index_select(0, cod)) if groups == 1 else _cpu(b)) if b is not None else None,
            "stride": stride, "dilation": dil, "groups": groups}

    def take(out: Tensor) -> Tensor:
        o = out[(slice(0, 1), slice(None), *window)]
        return o.index_select(1, cod.to(out.device)) if groups == 1 else o

    conv = _CONV[nd]
    return _Plan(args, take, lambda x, w, b, stride, dilation, groups: conv(x, w, b, stride, 0, dilation, groups),
                 f"sample 0, {len(co)} of {c_out} channels, window {'x'.join(map(str, t))} of {'x'.join(map(str, outs))}")


def _plan_interpolate(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
    x = a["input"]
    if x.dim() < 3:
        return None
    n, c, spatial = x.shape[0], x.shape[1], x.shape[2:]
    per = math.prod(spatial)
    k = min(n * c, 16, budget // max(1, per))
    if k < 1:
        return None
    pi = _pick(n * c, k)
    ni, ci = torch.unravel_index(pi, (n, c))
    opts = {key: a.get(key) for key in ("size", "scale_factor", "mode", "align_corners", "recompute_scale_factor",
                                        "antialias")}
    opts["mode"] = opts["mode"] or "nearest"
    opts["antialias"] = bool(opts["antialias"])

    def chans(t: Tensor) -> Tensor:
        return t[ni.to(t.device), ci.to(t.device)].unsqueeze(0)

    return _Plan({"x": _cpu(chans(x)), **opts}, chans, lambda x, **kw: F.interpolate(x, **kw),
                 f"{len(pi)} of {n * c} (sample, channel) planes")


def _plan_sdpa(a: dict[str, Any], budget: int, caps: Caps) -> _Plan | None:
    """Heads (spread over batch x heads) and query rows; every key and value of a chosen head."""
    q, k, v, mask = a["query"], a["key"], a["value"], a.get("attn_mask")
    if float(a.get("dropout_p", 0.0)) > 0 or q.dim() < 3 or k.dim() != q.dim() or v.dim() != q.dim():
        return None
    lead = tuple(q.shape[:-2])
    ln, e = q.shape[-2], q.shape[-1]
    s, ev = k.shape[-2], v.shape[-1]
    for i, (qd, kd) in enumerate(zip(lead, k.shape[:-2], strict=True)):
        gqa = bool(a.get("enable_gqa")) and i == len(lead) - 1 and qd % kd == 0
        if kd not in (qd, 1) and not gqa:
            return None
    heads = math.prod(lead)
    nh = min(heads, 4)
    r = min(ln, max(1, caps.outputs // (nh * ev)))

    def cost(nh: int, r: int) -> int:
        m = r * s if mask is not None or a.get("is_causal") else 0
        return nh * (r * e + s * (e + ev) + m + r * ev)

    while cost(nh, r) > budget:
        if nh > 1:
            nh //= 2
        elif r > 1:
            r //= 2
        else:
            return None
    hi, ri = _pick(heads, nh), _pick(ln, r)
    coords = torch.unravel_index(hi, lead)

    def at(t: Tensor, rows: bool) -> Tensor:
        """``t`` at the chosen heads (dims of size 1 broadcast, grouped KV heads mapped): ``[nh, ., .]``."""
        pad = len(lead) - (t.dim() - 2)
        idx = []
        for i, cd in enumerate(coords):
            if i < pad:
                continue
            size = t.shape[i - pad]
            idx.append(torch.zeros_like(cd) if size == 1 else cd // (lead[i] // size))
        out = t[tuple(i.to(t.device) for i in idx)] if idx else t.expand(len(hi), *t.shape[-2:])
        return out.index_select(1, ri.to(t.device)) if rows and out.shape[1] != 1 else out

    m = None
    if mask is not None:
        m = _cpu(at(mask, rows=True))
    elif a.get("is_causal"):  # top-left aligned, as torch defines it: key j is seen by query i when j <= i
        m = (torch.arange(s)[None, :] <= ri[:, None]).unsqueeze(0)
    args = {"q": _cpu(at(q, True)), "k": _cpu(at(k, False)), "v": _cpu(at(v, False)), "mask": m,
            "scale": a.get("scale")}
    return _Plan(args, lambda out: at(out, True),
                 lambda q, k, v, mask, scale: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale),
                 f"{len(hi)} of {heads} heads x {len(ri)} of {ln} queries, all {s} keys", _sdpa_floor)


def _sdpa_floor(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None,
                dtype: torch.dtype) -> Tensor:
    """Attention as a correct low-precision flash kernel computes it, in float32 arithmetic.

    Every flash-style kernel (FlashAttention-2, PyTorch's CPU kernel, the NPU's fused one) rounds the
    unnormalised probabilities ``exp(s - max)`` to the input dtype before they multiply V (the second
    matmul runs on the low-precision units) while the row sums stay float32.  Rounding only the
    output would make the floor tighter than any correct kernel (a 10-20x max-rel outlier on a clean
    CPU run), so this one rounding is emulated too.  Rows with every key masked give 0, like torch.
    """
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    total = p.sum(-1, keepdim=True)
    out = p.to(dtype).to(torch.float32) @ v
    return torch.where(total > 0, out / total.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(out))


def _conv_floor(x: Tensor, w: Tensor, b: Tensor | None, stride: tuple, dilation: tuple, groups: int,
                dtype: torch.dtype) -> Tensor:
    """A convolution as PyTorch's CUDA (cuDNN) path and unfused NPU graphs compute it: the convolution
    rounded to the dtype, then the bias added as its own elementwise op (rounded again by the caller).

    Where the bias cancels the convolution (outputs near 0), the first rounding - at the scale of the
    convolution, not of the output - is the whole error: on an H200 a clean bf16 ``post_quant_conv``
    (1x1, with bias) showed max rel 0.091 and 44 small-value errors in 8192, bit for bit what this
    emulation gives on the same call, and 0 / 0.004 with a single rounding.
    """
    y = _CONV[w.dim() - 2](x, w, None, stride, 0, dilation, groups).to(dtype).to(torch.float32)
    return y if b is None else y + b.reshape((1, -1) + (1,) * (x.dim() - 2))


def _group_norm_floor(x: Tensor, groups: int, w: Tensor | None, b: Tensor | None, eps: float,
                      dtype: torch.dtype) -> Tensor:
    """Group norm as PyTorch's kernels compute it at a low-precision dtype: the per-group mean and rstd
    are stored in the input's dtype (``native_group_norm`` returns them so) and the affine
    ``(x - mean) * rstd * w + b`` is built from the rounded statistics in float32.

    A rounded mean shifts a whole group by up to half an ulp of the mean times the scale, which the
    shift ``b`` then cancels to near 0 for some elements: the H200's clean bf16 group norm reached max
    rel 1.05 and 161 small-value errors in 65536, where one output rounding gives 0.004 and 0.
    """
    n, c = x.shape[0], x.shape[1]
    xs = x.reshape(n, groups, -1)
    mean = xs.mean(-1, keepdim=True)
    rstd = torch.rsqrt(xs.var(-1, unbiased=False, keepdim=True) + eps)
    mean, rstd = mean.to(dtype).to(torch.float32), rstd.to(dtype).to(torch.float32)
    y = ((xs - mean) * rstd).reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    if w is not None:
        y = y * w.reshape(shape)
    return y if b is None else y + b.reshape(shape)


#: Op type -> the floor's emulation when every correct low-precision kernel of it rounds an intermediate
#: (called with the inputs rounded to the op's dtype and ``dtype``; the caller rounds the output).  An op
#: not listed is one float32 kernel and one rounding.  Used for reduced calls (never a whole call).
FLOOR_RUNS: dict[str, Callable[..., Tensor]] = {
    "scaled_dot_product_attention": _sdpa_floor,
    "conv1d": _conv_floor, "conv2d": _conv_floor, "conv3d": _conv_floor,
    "group_norm": _group_norm_floor,
}


def _full(func: Callable[..., Tensor], args: tuple, kwargs: dict) -> _Plan:
    """The whole call, kept as it came (used when it fits the cap and no reduction applies)."""
    kept = {"args": _map(tuple(args), _cpu), "kwargs": _map(dict(kwargs), _cpu)}
    return _Plan(kept, lambda out: out, lambda args, kwargs: func(*args, **kwargs), "whole call")


@dataclass(frozen=True)
class _Entry:
    op: str
    names: tuple[str, ...]
    defaults: dict[str, Any]
    plan: Planner | None


def _table() -> dict[Any, _Entry]:
    """torch function -> op type and how its calls are reduced (one entry per spelling a model may use)."""
    act = ("input",)
    t: dict[Any, _Entry] = {
        F.linear: _Entry("linear", ("input", "weight", "bias"), {}, _plan_linear),
        F.layer_norm: _Entry("layer_norm", ("input", "normalized_shape", "weight", "bias", "eps"), {},
                             _plan_norm("layer_norm")),
        torch.layer_norm: _Entry("layer_norm", ("input", "normalized_shape", "weight", "bias", "eps"), {},
                                 _plan_norm("layer_norm")),
        F.rms_norm: _Entry("rms_norm", ("input", "normalized_shape", "weight", "eps"), {}, _plan_norm("rms_norm")),
        torch.rms_norm: _Entry("rms_norm", ("input", "normalized_shape", "weight", "eps"), {}, _plan_norm("rms_norm")),
        F.group_norm: _Entry("group_norm", ("input", "num_groups", "weight", "bias", "eps"), {}, _plan_group_norm),
        torch.group_norm: _Entry("group_norm", ("input", "num_groups", "weight", "bias", "eps"), {},
                                 _plan_group_norm),
        F.normalize: _Entry("normalize", ("input", "p", "dim", "eps", "out"), {}, _plan_normalize),
        F.silu: _Entry("silu", act, {}, _pointwise(F.silu)),
        F.gelu: _Entry("gelu", act + ("approximate",), {"approximate": "none"},
                       _pointwise(F.gelu, ("approximate",))),
        F.relu: _Entry("relu", act, {}, _pointwise(F.relu)),
        torch.relu: _Entry("relu", act, {}, _pointwise(F.relu)),
        F.mish: _Entry("mish", act, {}, _pointwise(F.mish)),
        torch.sigmoid: _Entry("sigmoid", act, {}, _pointwise(torch.sigmoid)),
        F.sigmoid: _Entry("sigmoid", act, {}, _pointwise(torch.sigmoid)),
        Tensor.sigmoid: _Entry("sigmoid", act, {}, _pointwise(torch.sigmoid)),
        torch.tanh: _Entry("tanh", act, {}, _pointwise(torch.tanh)),
        F.tanh: _Entry("tanh", act, {}, _pointwise(torch.tanh)),
        Tensor.tanh: _Entry("tanh", act, {}, _pointwise(torch.tanh)),
        F.softmax: _Entry("softmax", ("input", "dim", "_stacklevel", "dtype"), {}, _plan_softmax),
        torch.softmax: _Entry("softmax", ("input", "dim", "dtype"), {}, _plan_softmax),
        Tensor.softmax: _Entry("softmax", ("input", "dim", "dtype"), {}, _plan_softmax),
        F.scaled_dot_product_attention: _Entry(
            "scaled_dot_product_attention",
            ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"), {}, _plan_sdpa),
        F.embedding: _Entry("embedding", ("input", "weight", "padding_idx", "max_norm"), {}, _plan_embedding),
        F.interpolate: _Entry("interpolate", ("input", "size", "scale_factor", "mode", "align_corners",
                                              "recompute_scale_factor", "antialias"), {}, _plan_interpolate),
        torch.matmul: _Entry("matmul", ("input", "other"), {}, _plan_matmul),
        Tensor.matmul: _Entry("matmul", ("input", "other"), {}, _plan_matmul),
        Tensor.__matmul__: _Entry("matmul", ("input", "other"), {}, _plan_matmul),
        torch.mm: _Entry("matmul", ("input", "other"), {}, _plan_matmul),
        torch.bmm: _Entry("matmul", ("input", "other"), {}, _plan_matmul),
    }
    conv_names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    for nd, fn in _CONV.items():
        t[fn] = _Entry(f"conv{nd}d", conv_names, {}, _plan_conv)
    for fn in (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d):
        t[fn] = _Entry(fn.__name__, ("input", "weight", "bias"), {}, None)
    return t


#: The traced torch functions and their op types (a report row each).
TABLE: dict[Any, _Entry] = _table()
#: Every op type the tracer knows, in table order.
OP_TYPES: tuple[str, ...] = tuple(dict.fromkeys(e.op for e in TABLE.values()))


# ---- capture -------------------------------------------------------------------------------------------
@dataclass
class Call:
    """One kept call: CPU copies of its (reduced) inputs, the device's output on the same part."""

    op: str
    func: str
    index: int  # the call's number among this op type's calls in its component (0-based)
    where: str  # the innermost named module it ran in
    shape: str  # shapes of the original call's tensors
    how: str  # what was kept of it
    args: dict[str, Any]
    run: Callable[..., Tensor]
    out: Tensor  # the device's output on the kept part (its dtype), sampled by out_index
    out_index: Tensor | None
    floor_run: Callable[..., Tensor] | None = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the op ran at on the device (its output's)."""
        return self.out.dtype

    @property
    def nbytes(self) -> int:
        return _nbytes(self.args) + _nbytes(self.out) + _nbytes(self.out_index)


@dataclass
class Capture:
    """What one forward (a component) ran: kept calls per op type, call counts, skips."""

    component: str
    calls: dict[str, list[Call]] = field(default_factory=dict)
    seen: Counter[str] = field(default_factory=Counter)
    skipped: dict[str, list[str]] = field(default_factory=dict)

    def kept_bytes(self) -> dict[str, int]:
        return {op: sum(c.nbytes for c in calls) for op, calls in self.calls.items()}


class OpTracer(TorchFunctionMode):
    """Keeps bounded copies of the table's calls while active (see the module docstring)."""

    def __init__(self, component: str, names: dict[int, str] | None = None, caps: Caps = CAPS) -> None:
        super().__init__()
        self.caps = caps
        self.capture = Capture(component)
        self._names = names or {}
        self._stack: list[nn.Module] = []

    # module path: a stack pushed/popped by global module hooks while tracing
    def _push(self, module: nn.Module, _args: Any) -> None:
        self._stack.append(module)

    def _pop(self, module: nn.Module, _args: Any, _out: Any) -> None:
        while self._stack:
            if self._stack.pop() is module:
                break

    def where(self) -> str:
        for m in reversed(self._stack):
            name = self._names.get(id(m))
            if name is not None:
                return name
        return type(self._stack[-1]).__name__ if self._stack else ""

    def _wanted(self, n: int) -> bool:
        return n < self.caps.first or (n & (n - 1) == 0 and self.caps.spread > 0)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        entry = TABLE.get(func)
        if entry is None:
            return func(*args, **kwargs)
        tensors = list(_tensors((args, kwargs)))
        if (not any(t.is_floating_point() for t in tensors)
                or any(type(t) not in _PLAIN or t.is_meta for t in tensors)):
            return func(*args, **kwargs)
        cap = self.capture
        n = cap.seen[entry.op]
        cap.seen[entry.op] += 1
        if not self._wanted(n):
            return func(*args, **kwargs)
        bound = _bind(args, kwargs, entry.names, entry.defaults)
        itemsize = max(t.element_size() for t in tensors)
        # Elements the reduced inputs may hold, counted at the call's widest element (int64 ids of an
        # embedding count 8 bytes); room is left for the sampled output and its int64 index.
        budget = max(0, self.caps.call_bytes - self.caps.outputs * 12) // itemsize
        plan = None
        why = ""
        try:
            plan = entry.plan(bound, budget, self.caps) if entry.plan is not None else None
            if plan is None and sum(t.numel() for t in tensors) <= budget:
                plan = _full(func, args, kwargs)
        except Exception as exc:  # a layout the reduction does not know: counted, not fatal to the model
            why = f"call {n}: {type(exc).__name__}: {exc}"[:200]
        if plan is None:
            cap.skipped.setdefault(entry.op, []).append(why or f"call {n}: no reduction fits {self.caps.call_bytes} B")
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if isinstance(out, Tensor) and out.is_floating_point():
            self._keep(entry, func, n, tensors, plan, out)
        return out

    def _keep(self, entry: _Entry, func: Any, n: int, tensors: list[Tensor], plan: _Plan, out: Tensor) -> None:
        part = plan.take(out)
        index = None
        if part.numel() > self.caps.outputs:
            index = _pick(part.numel(), self.caps.outputs)
            part = _flat(part, index)
        label = (resolve_name(func) or entry.op).replace("torch.nn.functional.", "F.")
        call = Call(entry.op, label, n, self.where(), ", ".join(_shape(t) for t in tensors), plan.how, plan.args,
                    plan.run, _cpu(part), index, plan.floor_run)
        cap = self.capture
        if call.nbytes > self.caps.call_bytes:  # the bound is a promise: a reduction that overshoots is dropped
            cap.skipped.setdefault(entry.op, []).append(f"call {n}: kept {call.nbytes} B > {self.caps.call_bytes} B")
            return
        kept = cap.calls.setdefault(entry.op, [])
        kept.append(call)
        spread = [c for c in kept if c.index >= self.caps.first]
        if len(spread) > self.caps.spread:
            kept.remove(spread[0])

    def __enter__(self) -> OpTracer:
        self._exits = ExitStack()
        if hasattr(torch.compiler, "set_stance"):  # torch >= 2.6; older ones run what they compiled
            self._exits.enter_context(torch.compiler.set_stance("force_eager"))
        self._exits.enter_context(_module.register_module_forward_pre_hook(self._push))
        self._exits.enter_context(_module.register_module_forward_hook(self._pop, always_call=True))
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._exits.close()


def module_names(probe: Any) -> dict[int, str]:
    """id(module) -> qualified name for every module of the probe's networks (``probe.modules()``)."""
    roots = probe.modules() if callable(getattr(probe, "modules", None)) else {}
    names: dict[int, str] = {}
    for root_name, root in roots.items():
        for name, module in root.named_modules(prefix=root_name):
            names.setdefault(id(module), name)
    return names


def capture(component: str, fn: Callable[[], Any], names: dict[int, str] | None = None,
            caps: Caps = CAPS) -> Capture:
    """Run ``fn`` (one forward of the device under test) under an :class:`OpTracer`."""
    tracer = OpTracer(component, names, caps)
    with tracer:
        fn()
    return tracer.capture


def probe_captures(probe: Any, cfg: RunConfig, inputs: dict[str, Tensor], caps: Caps = CAPS) -> Iterator[Capture]:
    """The captures of the device under test: step 0 (teacher-forced on ``inputs``), then every component
    of ``probe.component_inputs(cfg)``; one at a time, so the caller can replay and free each."""
    names = module_names(probe)
    yield capture(STEP_COMPONENT, lambda: probe.forward_step(cfg, 0, inputs), names, caps)
    try:
        components = probe.component_inputs(cfg)
    except NotImplementedError:
        components = {}
    for name, kw in components.items():
        yield capture(name, lambda name=name, kw=kw: probe.run_component(name, kw), names, caps)


# ---- replay --------------------------------------------------------------------------------------------
def _up(t: Tensor) -> Tensor:
    return t.to(torch.float32) if t.is_floating_point() else t


@torch.no_grad()
def replay(call: Call) -> tuple[Tensor, Tensor]:
    """(reference, floor) of ``call`` on the CPU in float32, cut like ``call.out``.

    Reference: the float32 CPU kernel on the inputs upcast to float32.  Floor: the same float32
    kernel on the inputs rounded to the op's dtype, the output rounded to it - an emulation that uses
    no low-precision kernel of any device - with the intermediates real kernels round rounded too
    (:data:`FLOOR_RUNS`: attention's probabilities, a convolution before its bias, a group norm's
    statistics).
    """
    dt = call.dtype
    up = _map(call.args, _up)
    ref = call.run(**up).float()
    rounded = _map(up, lambda t: t.to(dt).to(torch.float32) if t.is_floating_point() else t)
    floor_run = call.floor_run or (FLOOR_RUNS.get(call.op) if call.how != "whole call" else None)
    if floor_run is not None and dt != torch.float32:
        floor = floor_run(**rounded, dtype=dt).float()
    else:
        same = all(torch.equal(a, b) for a, b in zip(_tensors(up), _tensors(rounded), strict=True))
        floor = ref if same else call.run(**rounded).float()
    floor = floor.to(dt).to(torch.float32)
    if call.out_index is not None:
        ref, floor = _flat(ref, call.out_index), _flat(floor, call.out_index)
    return ref, floor


__all__ = ["CAPS", "FLOOR_RUNS", "OP_TYPES", "STEP_COMPONENT", "TABLE", "Call", "Capture", "Caps", "OpTracer", "capture",
           "module_names", "probe_captures", "replay"]
