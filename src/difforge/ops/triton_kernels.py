"""Triton kernels for the hot elementwise ops on CUDA, each the plain path's formula in one launch.

Why: the eager URSA step on an H200 was launch-bound (52 ms/step against the reference's 40.6): the
plain rms_norm is eight kernels (float, square, mean, add, rsqrt, cast, two multiplies), swiglu seven
and rotary about ten, repeated for every layer.  Each kernel here reads its inputs once and writes
its output once.

Exactness, op by op (what :data:`EXACT` records; the tests pin it under ``TRITON_INTERPRET=1``):

* ``rotary`` - products and one add/sub per output in float32 (half inputs upcast, as the plain path),
  compiled with ``enable_fp_fusion=False`` so no multiply-add is contracted: IEEE multiplies and adds
  are correctly rounded, so the result is bitwise the plain path's on any device.
* ``swiglu`` - ``g*u / (1 + exp(-g))`` in float32 with libdevice's ``expf`` (the function CUDA's own
  ``expf`` is, which torch's eager kernel calls) and a round-to-nearest division (``div_rn``; Triton's
  ``/`` is an approximate division): bitwise the eager CUDA formula.  Under the interpreter numpy's
  ``exp`` stands in for ``expf``, so a CPU check is to a stated tolerance (1 ulp of the output dtype).
* ``rms_norm`` - the same order as the plain path (float32 squares, mean, ``+ eps``, rsqrt, the factor
  cast to the activation dtype *before* the multiplies), but the sum of squares is Triton's tree
  reduction, not torch's: the float32 factor can differ in its last bits, which moves the cast factor
  by one ulp of the activation dtype when it lies at a rounding boundary.  Labelled approximate.

Inside a ``torch.compile`` region (``--compile``'s decoder layer) each op traces the plain formula
instead: Inductor fuses those itself (the H200's 18.1 ms/step compiled came from that), where an opaque
kernel launch would only split its graph.

The module imports triton at the top: import it only where a backend offered these kernels
(:func:`difforge.ops.select_ops` does, lazily), or in tests with ``TRITON_INTERPRET=1`` set before the
import (triton decides at decoration time whether a kernel is compiled or interpreted).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .rotary import RopeTable

#: Whether this process runs kernels through Triton's interpreter (CPU tensors, numpy maths): the libdevice
#: functions have no interpreter form, so the kernels take tl's own there (see the module docstring).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
#: Dtypes the kernels take; anything else runs the plain path.
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Ops whose kernel is bitwise the plain path's (on the device; see the module docstring), by op name.
EXACT = {"rotary": True, "swiglu": True, "rms_norm": False}
#: What each op's record says about its exactness.
DETAIL = {
    "rotary": "one kernel: float32 products and add/sub, no FMA contraction (bitwise the plain path)",
    "swiglu": "one kernel: float32 g*u/(1+expf(-g)) with libdevice expf and IEEE division (bitwise the eager CUDA formula)",
    "rms_norm": "one kernel: the plain path's order, but the sum of squares in Triton's reduction order "
                "(the cast factor may differ by one ulp of the activation dtype)",
}
#: Elements per program (rows x columns) the 2-D kernels aim for.
_TILE = 4096
#: Triton's compile option that keeps ``a*b + c`` as two rounded ops, like eager torch.
_NO_FMA = {"enable_fp_fusion": False}


def _compiling() -> bool:
    """Whether torch.compile is tracing this call (then the plain formula is traced; see the module docstring)."""
    return torch.compiler.is_compiling()


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def _rows_per_program(cols_pow2: int, rows: int) -> int:
    return max(1, min(_pow2(rows), _TILE // cols_pow2))


@triton.jit
def _cast(y, dtype: tl.constexpr, PRECISE: tl.constexpr):
    """float32 ``y`` rounded to ``dtype`` to nearest-even, as torch's casts round.

    The GPU's conversion instructions do that; the interpreter's float32 -> bfloat16 cast truncates, so
    there the rounding is spelled out on the bits (finite values; the kernels make no NaN of their own).
    """
    if PRECISE or dtype != tl.bfloat16:
        return y.to(dtype)
    else:
        bits = y.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


# ----------------------------------------------------------------------------------------------- rms_norm
@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, rows, cols, inv_cols, eps,
                     ROWS: tl.constexpr, COLS: tl.constexpr, PRECISE: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, COLS)[None, :]
    mask = (r < rows) & (c < cols)
    x = tl.load(x_ptr + r * cols + c, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    mean = tl.sum(xf * xf, axis=1)[:, None] * inv_cols
    if PRECISE:  # noqa: SIM108 (a constexpr branch: the other one is never compiled)
        factor = libdevice.rsqrt(mean + eps)
    else:
        factor = tl.math.rsqrt(mean + eps)
    factor = _cast(factor, x.dtype, PRECISE).to(tl.float32)  # the factor rounded to the activation dtype first
    y = _cast(xf * factor, x.dtype, PRECISE).to(tl.float32)
    w = tl.load(w_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
    tl.store(y_ptr + r * cols + c, _cast(y * w, y_ptr.dtype.element_ty, PRECISE), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`difforge.ops.norm.rms_norm` in one kernel: ``x * rsqrt(mean(x_f32^2) + eps).to(x.dtype) * weight``."""
    if x.dtype not in FLOAT_DTYPES or weight.dtype not in FLOAT_DTYPES or x.numel() == 0 or _compiling():
        from .norm import rms_norm as plain

        return plain(x, weight, eps)
    cols = x.shape[-1]
    x2 = x.contiguous().view(-1, cols)
    rows = x2.shape[0]
    out = torch.empty(x.shape, dtype=torch.result_type(x, weight), device=x.device)
    col_block = _pow2(cols)
    per = _rows_per_program(col_block, rows)
    # torch's CUDA mean multiplies the sum by 1/cols (exact for URSA's power-of-two widths)
    _rms_norm_kernel[(triton.cdiv(rows, per),)](
        x2, weight.contiguous(), out, rows, cols, 1.0 / cols, float(eps),
        ROWS=per, COLS=col_block, PRECISE=not INTERPRETED, **_NO_FMA,
    )
    return out


# ------------------------------------------------------------------------------------------------- swiglu
@triton.jit
def _swiglu_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr, PRECISE: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    g = tl.load(g_ptr + i, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + i, mask=mask, other=0.0).to(tl.float32)
    if PRECISE:  # noqa: SIM108 (a constexpr branch: the other one is never compiled)
        e = libdevice.exp(-g)
    else:
        e = tl.exp(-g)
    y = tl.math.div_rn(g * u, 1.0 + e)
    tl.store(y_ptr + i, _cast(y, y_ptr.dtype.element_ty, PRECISE), mask=mask)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:func:`difforge.ops.activation.swiglu` in one kernel: ``g*u / (1 + exp(-g))`` in float32, in gate's dtype."""
    if gate.shape != up.shape or gate.dtype not in FLOAT_DTYPES or up.dtype not in FLOAT_DTYPES or _compiling():
        from .activation import swiglu as plain

        return plain(gate, up)
    g, u = gate.contiguous(), up.contiguous()
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n = g.numel()
    if n:
        block = 1024
        _swiglu_kernel[(triton.cdiv(n, block),)](g, u, out, n, BLOCK=block, PRECISE=not INTERPRETED, **_NO_FMA)
    return out


# ------------------------------------------------------------------------------------------------- rotary
@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, rows, seq, heads, half,
                   ROWS: tl.constexpr, HALF: tl.constexpr, PRECISE: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]  # row = ((b * seq) + l) * heads + h
    c = tl.arange(0, HALF)[None, :]
    mask = (r < rows) & (c < half)
    pos = (r // heads) % seq
    base = r.to(tl.int64) * (2 * half)
    x1 = tl.load(x_ptr + base + c, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + half + c, mask=mask, other=0.0).to(tl.float32)
    cs = tl.load(cos_ptr + pos * half + c, mask=mask, other=0.0).to(tl.float32)
    sn = tl.load(sin_ptr + pos * half + c, mask=mask, other=0.0).to(tl.float32)
    a = x1 * cs - x2 * sn
    b = x1 * sn + x2 * cs
    ty = y_ptr.dtype.element_ty
    tl.store(y_ptr + base + 2 * c, _cast(a, ty, PRECISE), mask=mask)  # interleaved: a0, b0, a1, b1 ...
    tl.store(y_ptr + base + 2 * c + 1, _cast(b, ty, PRECISE), mask=mask)


def apply_rotary(x: torch.Tensor, table: RopeTable) -> torch.Tensor:
    """:func:`difforge.ops.rotary.apply_rotary` in one kernel, on the plain path's ``(cos, sin)`` table.

    Every case is float32 maths on upcast values, as the plain path's (half ``x`` is upcast with its
    tables; float32 ``x`` promotes half tables), rounded once to ``x``'s dtype.  Shapes this kernel does
    not index (anything but ``x [B, L, heads, d]`` with tables ``[L, 1, d/2]``) take the plain path.
    """
    cos, sin = table
    if x.dim() != 4 or x.dtype not in FLOAT_DTYPES or cos.dtype not in FLOAT_DTYPES or sin.dtype not in FLOAT_DTYPES \
            or x.shape[-1] % 2 or cos.shape != (x.shape[1], 1, x.shape[-1] // 2) or sin.shape != cos.shape \
            or _compiling():
        from .rotary import apply_rotary as plain

        return plain(x, table)
    b, seq, heads, d = x.shape
    half = d // 2
    xc = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = b * seq * heads
    if rows:
        half_block = _pow2(half)
        per = _rows_per_program(half_block, rows)
        _rotary_kernel[(triton.cdiv(rows, per),)](
            xc, cos.contiguous(), sin.contiguous(), out, rows, seq, heads, half,
            ROWS=per, HALF=half_block, PRECISE=not INTERPRETED, **_NO_FMA,
        )
    return out


#: The kernel of each op, by :data:`difforge.ops.OP_NAMES` name, with the plain signatures.
KERNELS: dict[str, Callable[..., torch.Tensor]] = {"rms_norm": rms_norm, "swiglu": swiglu, "rotary": apply_rotary}
