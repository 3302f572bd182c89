"""Compile every difforge Triton kernel for an H100/H200 (sm_90) with the wheel's own ptxas: no GPU needed.

Run by test_triton_compile.py in a fresh interpreter *without* ``TRITON_INTERPRET`` (this directory's
conftest switches the interpreter on, and an interpreted kernel cannot be compiled).  Prints one JSON
object: kernel name -> counts of the PTX instructions the exactness claims rest on.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from difforge.ops import triton_kernels as tk
from difforge.ops import triton_sampler as ts

TARGET = GPUTarget("cuda", 90, 32)
#: The instructions counted: float32 arithmetic with its rounding suffix, the special functions, uint32 products.
PATTERN = re.compile(r"\b((?:fma|mul|add|sub|div)\.[a-z0-9.]*f32|rsqrt\.[a-z.0-9]*|ex2\.[a-z.0-9]*|mul\.hi\.u32|cvt\.rn\.bf16\.f32)\b")

KERNELS = {
    "rms_norm": (tk._rms_norm_kernel,
                 {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "rows": "i32", "cols": "i32", "inv_cols": "fp32",
                  "eps": "fp32", "ROWS": "constexpr", "COLS": "constexpr", "PRECISE": "constexpr"},
                 {"ROWS": 2, "COLS": 2048, "PRECISE": True}),
    "swiglu": (tk._swiglu_kernel,
               {"g_ptr": "*bf16", "u_ptr": "*bf16", "y_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr", "PRECISE": "constexpr"},
               {"BLOCK": 1024, "PRECISE": True}),
    "rotary": (tk._rotary_kernel,
               {"x_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "y_ptr": "*fp32", "rows": "i32", "seq": "i32",
                "heads": "i32", "half": "i32", "ROWS": "constexpr", "HALF": "constexpr", "PRECISE": "constexpr"},
               {"ROWS": 64, "HALF": 64, "PRECISE": True}),
    "inverse_cdf_logits": (ts._inverse_cdf_kernel,
                           {"x_ptr": "*fp16", "rows_ptr": "*i64", "out_ptr": "*i64", "k": "i32", "stride": "i32",
                            "c2": "i64", "c3": "i64", "k0": "i64", "k1": "i64", "LOGITS": "constexpr", "SIZE": "constexpr",
                            "BLOCKS": "constexpr", "CHUNK": "constexpr", "COLS": "constexpr", "PRECISE": "constexpr"},
                           {"LOGITS": True, "SIZE": 256, "BLOCKS": 256, "CHUNK": 2048, "COLS": 16, "PRECISE": True}),
    "metric_rate": (ts._metric_rate_kernel,
                    {"e_ptr": "*fp16", "sq_ptr": "*fp16", "d0_ptr": "*fp16", "sumsq_ptr": "*fp16", "w_ptr": "*fp16",
                     "v_ptr": "*bf16", "n_rows": "i32", "k": "i32", "neg_beta": "fp32", "d_beta": "fp32",
                     "D": "constexpr", "ROWS": "constexpr", "CHUNK": "constexpr", "PRECISE": "constexpr"},
                    {"D": 8, "ROWS": 4, "CHUNK": 512, "PRECISE": True}),
    "uniform": (ts._uniform_kernel,
                {"out_ptr": "*fp32", "n": "i64", "cols": "i32", "c2": "i64", "c3": "i64", "k0": "i64", "k1": "i64",
                 "BLOCK": "constexpr"},
                {"BLOCK": 1024}),
}


def main() -> None:
    out = {}
    for name, (fn, signature, constexprs) in KERNELS.items():
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=TARGET,
                                  options={"enable_fp_fusion": False})
        out[name] = dict(Counter(PATTERN.findall(compiled.asm["ptx"])))
        out[name]["cubin_bytes"] = len(compiled.asm["cubin"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
