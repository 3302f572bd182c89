"""The rules: one entry each in :data:`RULES`, with its id, severity per target, why and fix.

Each rule is a small function registered with :func:`rule` for the node types it looks at; the
walker (:mod:`difforge.scan.walker`) calls it once per such node with the context it keeps (import
time, ``try``/``if`` guards, CUDA-only branches, comparisons, aliases, dtype flow).  A rule reports
with ``walker.report(rule_id, node, detail)``; the detail says what was found, the table's ``why``
says why it breaks or is slow on the target, and ``fix`` what to change (or what difforge does
natively instead).

Noise is the enemy of a port checklist, so rules stay quiet where the code already copes: code under
``if torch.cuda.is_available():`` (or ``x.type == "cuda"``) only runs on CUDA and is left to the one
device-detection finding of its function (DF103); imports guarded by ``try/except ImportError`` or an
availability ``if`` are fallbacks, not breakages; strings in comparisons, docstrings, dictionary keys
and lists of choices are not hard-coded devices.

A ``severity`` of None for a target switches the rule off there (a default Inductor ``torch.compile``
is fine on the CPU).  ``--target`` picks the column; the default target is the NPU.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .flow import FLOAT, FORWARD
from .result import TARGETS
from .walker import Finish, Hook, Scope, Walker, is_cuda_fstring, is_cuda_string

#: How the target is named in the "why" sentences.
TARGET_NAMES = {"npu": "the Ascend NPU", "mps": "Apple MPS", "xpu": "Intel XPU", "cpu": "the CPU"}


@dataclass(frozen=True)
class Rule:
    """A rule's fixed text and where the walker calls it."""

    id: str
    title: str
    severity: Mapping[str, str | None]
    why: str
    fix: str
    hooks: Mapping[type, Hook]
    finish: Finish | None = None
    why_by_target: Mapping[str, str] = field(default_factory=dict)

    def severity_for(self, target: str) -> str | None:
        return self.severity.get(target)

    def why_for(self, target: str) -> str:
        return self.why_by_target.get(target, self.why).format(device=TARGET_NAMES[target])


RULES: dict[str, Rule] = {}


def sev(default: str | None = None, **per_target: str | None) -> dict[str, str | None]:
    """Severity per target: ``default`` everywhere, ``per_target`` where it differs."""
    out = dict.fromkeys(TARGETS, default)
    out.update(per_target)
    return out


def rule(rule_id: str, title: str, *, severity: Mapping[str, str | None], why: str, fix: str,
         on: Iterable[type], finish: Finish | None = None,
         why_by_target: Mapping[str, str] | None = None) -> Callable[[Hook], Hook]:
    """Register the decorated hook as rule ``rule_id`` for the node types ``on`` (the one place per rule)."""

    def register(fn: Hook) -> Hook:
        if rule_id in RULES:
            raise ValueError(f"rule {rule_id} registered twice")
        RULES[rule_id] = Rule(rule_id, title, severity, why, fix, dict.fromkeys(on, fn), finish,
                              dict(why_by_target or {}))
        return fn

    return register


def hooks_for(target: str) -> tuple[dict[type, list[Hook]], list[Finish]]:
    """The walker's dispatch table for ``target``: rules switched off there are never called."""
    hooks: dict[type, list[Hook]] = {}
    finishers: list[Finish] = []
    for r in RULES.values():
        if r.severity_for(target) is None:
            continue
        for node_type, fn in r.hooks.items():
            hooks.setdefault(node_type, []).append(fn)
        if r.finish is not None:
            finishers.append(r.finish)
    return hooks, finishers


# ---- helpers ----------------------------------------------------------------------------------------
def _method(node: ast.Call) -> str | None:
    return node.func.attr if isinstance(node.func, ast.Attribute) else None


def _receiver_is_torch(node: ast.Call, w: Walker) -> bool:
    return isinstance(node.func, ast.Attribute) and w.dotted(node.func.value) == "torch"


def _kwarg(node: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in node.keywords if k.arg == name), None)


def _in_literal_table(w: Walker, node: ast.AST) -> bool:
    """Part of a dict, or of a list/tuple/set of several items: a table of choices, not a use."""
    parent = w.parent
    if isinstance(parent, ast.Dict):
        return True
    return isinstance(parent, ast.List | ast.Tuple | ast.Set) and len(parent.elts) > 1


# ---- DF101 import-time CUDA code ----------------------------------------------------------------------
#: torch.cuda calls that are safe anywhere (they answer "no CUDA here" instead of raising).
_CUDA_QUERIES = frozenset({"torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.is_initialized"})


@rule("DF101", "CUDA-only code at import time",
      severity=sev("error"),
      why="it runs when the module is imported, so on {device} the import itself fails and nothing of the "
          "model loads",
      fix="move it into the function that needs it, behind a device check or a try/except with a plain-torch "
          "fallback; difforge's native ports take fused kernels from Backend.fused_kernel(op) (torch_npu's "
          "npu_swiglu / npu_rms_norm on the NPU) and fall back to plain torch",
      on=(ast.Call,))
def import_time_cuda(node: ast.Call, name: str | None, w: Walker) -> None:
    if not w.import_time or w.cuda_guard or w.in_try:
        return
    if name and name.startswith("torch.cuda.") and not name.startswith("torch.cuda.amp.") \
            and name not in _CUDA_QUERIES:
        w.report("DF101", node, f"`{name}(...)` at import time")
        w.consume(node)
    elif _method(node) == "cuda" and not _receiver_is_torch(node, w):
        w.report("DF101", node, "`.cuda()` at import time")
        w.consume(node)


# ---- DF102 .cuda() ------------------------------------------------------------------------------------
@rule("DF102", "`.cuda()` call",
      severity=sev("warning"),
      why="`.cuda()` moves to CUDA only: on {device} it raises (no CUDA device) unless torch_npu's "
          "transfer_to_npu rewrites it at run time",
      fix="use `.to(device)` with the device chosen once by the caller; difforge parses --device once into a "
          "Backend and passes backend.device down",
      on=(ast.Call,))
def dot_cuda(node: ast.Call, name: str | None, w: Walker) -> None:
    if _method(node) != "cuda" or w.cuda_guard or w.is_consumed(node) or _receiver_is_torch(node, w):
        return
    receiver = node.func.value  # type: ignore[attr-defined]
    if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
        return  # an override forwarding .cuda() (nn.Module subclasses): the caller's choice
    w.report("DF102", node, "`.cuda()`")


# ---- DF103 device detection that knows only some backends -----------------------------------------------
_DETECT_CALLS = {
    "torch.cuda.is_available": "cuda", "torch.cuda.device_count": "cuda",
    "torch.backends.mps.is_available": "mps", "torch.backends.mps.is_built": "mps", "torch.mps.is_available": "mps",
    "torch.xpu.is_available": "xpu", "torch.npu.is_available": "npu",
}
_DEVICE_NAMES = frozenset({"cuda", "mps", "xpu", "npu", "cpu", "hpu", "mlu", "musa", "meta"})
#: Words that show a function knows the target (or asks torch which accelerator there is).
_KNOWS_TARGET = {"npu": ("npu", "ascend", "accelerator"), "xpu": ("xpu", "accelerator"),
                 "mps": ("mps", "accelerator"), "cpu": ()}


def _device_literals(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        value = node.value.split(":", 1)[0]
        return {value} if value in _DEVICE_NAMES else set()
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        out: set[str] = set()
        for e in node.elts:
            out |= _device_literals(e)
        return out
    return set()


def _mentions(scope_node: ast.AST, words: tuple[str, ...]) -> bool:
    for sub in ast.walk(scope_node):
        text = None
        if isinstance(sub, ast.Name):
            text = sub.id
        elif isinstance(sub, ast.Attribute):
            text = sub.attr
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            text = sub.value
        elif isinstance(sub, ast.alias | ast.FunctionDef):
            text = sub.name
        if text is not None:
            low = text.lower()
            if any(word in low for word in words):
                return True
    return False


def _detection_done(scope: Scope, w: Walker) -> None:
    found: list[tuple[ast.AST, set[str]]] | None = scope.state.get("DF103")
    if not found or scope.state.get("cuda_required"):
        return
    known: set[str] = set().union(*(names for _, names in found))
    if not known - {"mps", "cpu"}:
        return  # an MPS check alone works around an MPS quirk; it does not pick the device
    if scope.state.get("cuda_named"):
        return  # a CUDA helper by name (get_torch_cuda_device_capability, CUDABackend): CUDA-only by design
    if w.target in known or _mentions(scope.node, _KNOWS_TARGET[w.target]):
        return
    where = "function" if isinstance(scope.node, ast.FunctionDef | ast.AsyncFunctionDef) else "module"
    shown = ", ".join(sorted(known - {"cpu"}))
    w.report("DF103", found[0][0], f"device detection in this {where} knows only {shown} (and the CPU)")


@rule("DF103", "device detection that knows only some backends",
      severity=sev("warning", cpu=None),
      why="the device is picked from a fixed list without {device}, so there the code silently falls back to "
          "the CPU (or skips the accelerator's branch) instead of using the accelerator",
      fix="ask torch.accelerator.current_accelerator() (torch >= 2.6) or add the target's branch "
          "(torch.npu.is_available() after `import torch_npu`); difforge resolves --device auto once, in "
          "difforge.devices, for every backend",
      on=(ast.Call, ast.Compare), finish=_detection_done)
def device_detection(node: ast.AST, name: str | None, w: Walker) -> None:
    names: set[str] = set()
    if isinstance(node, ast.Call):
        kind = _DETECT_CALLS.get(name or "")
        if kind is None:
            return
        names = {kind}
    elif isinstance(node, ast.Compare):
        for op, right in zip(node.ops, node.comparators, strict=False):
            if isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot):
                lits = _device_literals(right) | _device_literals(node.left)
                if "cuda" in lits:
                    names |= lits
            elif isinstance(op, ast.In | ast.NotIn):
                lits = _device_literals(right)
                if "cuda" in lits:
                    names |= lits
        if not names:
            return
    chain = [*w.stack[-4:], node]
    for outer, inner in zip(chain, chain[1:], strict=False):
        if isinstance(outer, ast.Call) and isinstance(outer.func, ast.Attribute) \
                and outer.func.attr in ("skipUnless", "skipIf", "skipif"):
            return  # a test's skip condition, not the code's device choice
        if isinstance(outer, ast.If) and inner is outer.test and isinstance(outer.body[0], ast.Raise):
            return  # ``if <device test>: raise ...`` validates an input; it does not pick the device
    w.scope.state.setdefault("DF103", []).append((node, names))


# ---- DF104 kernel libraries without a fallback ---------------------------------------------------------
_KERNEL_LIBS = {
    "flash_attn": "FlashAttention (CUDA kernels)", "flash_attn_interface": "FlashAttention-3 (CUDA kernels)",
    "xformers": "xFormers (CUDA kernels)", "triton": "Triton (GPU kernels written for NVIDIA)",
    "apex": "NVIDIA Apex (CUDA extensions)", "sageattention": "SageAttention (CUDA kernels)",
}


@rule("DF104", "kernel library imported without a fallback",
      severity=sev("error"),
      why="the library ships CUDA kernels only: on {device} it is not installed (or has no kernels), so the "
          "import raises and takes the module with it",
      fix="import it in `try: ... except ImportError:` and keep a plain-torch path (F.scaled_dot_product_attention "
          "for attention; on the NPU torch_npu's npu_fusion_attention, which difforge's ops pick through "
          "Backend.fused_kernel)",
      on=(ast.Import, ast.ImportFrom))
def kernel_import(node: ast.Import | ast.ImportFrom, name: str | None, w: Walker) -> None:
    if isinstance(node, ast.ImportFrom):
        if node.level or not node.module:
            return
        modules = [node.module]
    else:
        modules = [a.name for a in node.names]
    for module in modules:
        top = module.split(".", 1)[0]
        if top not in _KERNEL_LIBS:
            continue
        if w.caught("ImportError", "ModuleNotFoundError") or w.conditional:
            return  # a guarded import is the fallback this rule asks for
        at_import = w.scope.node.__class__ is ast.Module
        severity = "error" if at_import else "warning"
        if top == "triton" and w.target == "xpu":
            severity = "info"  # Intel's Triton backend runs Triton kernels on XPU
        where = "at import time" if at_import else "in a function, unguarded"
        w.report("DF104", node, f"`import {module}` ({_KERNEL_LIBS[top]}) {where}", severity)
        return


# ---- DF105 float64 / DF106 complex ---------------------------------------------------------------------
_FLOAT64 = frozenset({"torch.float64", "torch.double", "torch.DoubleTensor"})
_COMPLEX = frozenset({"torch.complex64", "torch.complex128", "torch.complex32", "torch.cfloat", "torch.cdouble",
                      "torch.chalf", "torch.view_as_complex", "torch.view_as_real", "torch.polar", "torch.complex"})


#: Tensor factories: with no ``device=`` (or ``device="cpu"``) they build on the host.
_FACTORY_NAMES = frozenset(f"torch.{n}" for n in ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange",
                                                  "linspace", "logspace", "rand", "randn"))


def _target_handled(w: Walker) -> bool:
    """Inside a branch whose test names the target (``torch.float32 if is_npu else torch.float64``)."""
    return bool(_KNOWS_TARGET[w.target]) and w.branch_mentions(_KNOWS_TARGET[w.target])


def _dtype_chosen_per_device(w: Walker) -> bool:
    """An argument of a per-device dtype helper (diffusers' ``maybe_adjust_dtype_for_device(dtype, device)``)."""
    for outer in w.stack[-4:]:
        if isinstance(outer, ast.Call) and len(outer.args) + len(outer.keywords) >= 2:
            callee = w.dotted(outer.func) or ""
            if "dtype" in callee.rsplit(".", 1)[-1].lower():
                return True
    return False


def _host_factory(w: Walker) -> bool:
    """``dtype=`` of a torch factory that builds on the host (no ``device=``, or ``device="cpu"``)."""
    if len(w.stack) < 2 or not isinstance(w.stack[-1], ast.keyword) or w.stack[-1].arg != "dtype":
        return False
    call = w.stack[-2]
    if not isinstance(call, ast.Call) or w.dotted(call.func) not in _FACTORY_NAMES:
        return False
    device = _kwarg(call, "device")
    return device is None or (isinstance(device, ast.Constant) and device.value == "cpu")


def _host_move(w: Walker) -> bool:
    """An argument of ``x.to("cpu", torch.float64)`` / ``.to(device="cpu", ...)``: the float64 copy is on the host."""
    call = w.stack[-1] if w.stack else None
    if isinstance(call, ast.keyword) and len(w.stack) > 1:
        call = w.stack[-2]
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "to"):
        return False
    device = _kwarg(call, "device")
    places = [*call.args, *([device] if device is not None else [])]
    return any(isinstance(a, ast.Constant) and a.value == "cpu" for a in places)


def _on_host(node: ast.AST) -> bool:
    """A method chain through ``.cpu()`` (``x.cpu().double()``): the work stays on the host."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "cpu":
            return True
        node = node.func.value
    return False


@rule("DF105", "float64 tensors or ops",
      severity=sev("warning", mps="error", cpu=None),
      why="float64 has no kernels on {device}'s compute units",
      why_by_target={
          "npu": "Ascend's AI cores have no float64: float64 ops run on the AICPU (slow, a host round trip per "
                 "op) and some have no kernel at all",
          "mps": "MPS has no float64: making or moving such a tensor raises",
          "xpu": "many Intel GPUs (Arc, Flex) have no native float64: it is emulated (slow) or raises"},
      fix="compute in float32 on the device (keep float64 to CPU-side tables, then move the float32 result); "
          "difforge's native RoPE and schedule tables are float32",
      on=(ast.Attribute, ast.Call))
def float64_use(node: ast.AST, name: str | None, w: Walker) -> None:
    if w.compare_depth:
        return
    if isinstance(node, ast.Call):
        if _method(node) != "double" or node.args or _receiver_is_torch(node, w):
            return
        if _on_host(node.func.value) or _target_handled(w):  # type: ignore[attr-defined]
            return
        w.report("DF105", node, "`.double()`")
        return
    if name not in _FLOAT64 or _in_literal_table(w, node):
        return
    if _host_factory(w) or _host_move(w) or _dtype_chosen_per_device(w) or _target_handled(w):
        return
    w.report("DF105", node, f"`{name}`")


@rule("DF106", "complex tensors or ops (complex RoPE)",
      severity=sev("info", npu="error", mps="warning"),
      why="complex numbers work on {device}, but complex RoPE is slower than its real cos/sin form and is the "
          "first thing to break on an accelerator",
      why_by_target={
          "npu": "Ascend has no complex kernels on the AI cores: complex ops fall back to the AICPU or fail "
                 "(not implemented for ComplexFloat)",
          "mps": "MPS supports complex tensors only partly (macOS 14+, not every op)"},
      fix="write RoPE with real cos/sin tables (rotate-half pairing); difforge's Qwen-Image port swaps in a "
          "real RoPE (real-rope) and its ops.rotary uses torch_npu's npu_rotary_mul on the NPU",
      on=(ast.Attribute,))
def complex_use(node: ast.Attribute, name: str | None, w: Walker) -> None:
    if name in _COMPLEX and not w.compare_depth and not _in_literal_table(w, node) and not _target_handled(w):
        w.report("DF106", node, f"`{name}`")


# ---- DF107 CUDA generators -----------------------------------------------------------------------------
def _is_cuda_device_expr(node: ast.AST | None, w: Walker) -> bool:
    if node is None:
        return False
    if isinstance(node, ast.Constant):
        return is_cuda_string(node.value)
    if is_cuda_fstring(node):
        return True
    if isinstance(node, ast.Call) and w.dotted(node.func) == "torch.device" and node.args:
        return _is_cuda_device_expr(node.args[0], w)
    return False


@rule("DF107", "random generator on the CUDA device",
      severity=sev("error"),
      why="a CUDA generator cannot be made on {device} (no CUDA device), and CUDA's random stream exists only "
          "there: the same seed gives other noise on every other device",
      fix="draw the noise from a CPU generator, torch.Generator(\"cpu\").manual_seed(seed), and move it to the "
          "device (the same picture on every device); difforge's Backend.generator(seed) is that rule",
      on=(ast.Call,))
def cuda_generator(node: ast.Call, name: str | None, w: Walker) -> None:
    if name != "torch.Generator":
        return
    device = _kwarg(node, "device") or (node.args[0] if node.args else None)
    if _is_cuda_device_expr(device, w):
        w.report("DF107", node, "`torch.Generator` on CUDA")
        w.consume(device)  # type: ignore[arg-type]


# ---- DF108 torch.compile without a backend --------------------------------------------------------------
def _chooses_backend(call: ast.Call) -> bool:
    return any(k.arg == "backend" or k.arg is None for k in call.keywords)


@rule("DF108", "torch.compile with the default backend",
      severity=sev(None, npu="warning", mps="warning"),
      why="the default backend, Inductor, has no code generator for {device}",
      why_by_target={
          "npu": "the default backend, Inductor, has no Ascend code generator: on the NPU the compile fails or "
                 "runs eager; torchair is the NPU's graph backend",
          "mps": "Inductor's MPS code generator is still experimental (torch >= 2.6): many graphs fall back or "
                 "fail"},
      fix="choose the backend per device: torch.compile(fn, backend=torchair.get_npu_backend(...)) on the NPU, "
          "Inductor elsewhere; difforge's Backend.compile_policy() makes that choice (--compile)",
      on=(ast.Call, ast.Attribute))
def default_compile(node: ast.AST, name: str | None, w: Walker) -> None:
    if name != "torch.compile":
        return
    if isinstance(node, ast.Call):
        if not _chooses_backend(node):
            w.report("DF108", node, "`torch.compile(...)` without backend=")
        return
    parent = w.parent
    if isinstance(parent, ast.Call) and (parent.func is node or _chooses_backend(parent)):
        return  # the call itself (judged above), or handed to a wrapper that passes backend=
    how = "used as a decorator" if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef) else "passed as a value"
    w.report("DF108", node, f"`torch.compile` {how} (default backend)")


# ---- DF109 / DF110 floating indices --------------------------------------------------------------------
#: Free index functions: position and keyword of the index argument.
_INDEX_FUNCS = {"torch.index_select": (2, "index"), "torch.gather": (2, "index"), "torch.take": (1, "index"),
                "torch.take_along_dim": (1, "indices"), "torch.nn.functional.embedding": (0, "input"),
                "torch.embedding": (1, "indices"), "torch.scatter": (2, "index"),
                "torch.scatter_add": (2, "index"), "torch.index_add": (2, "index")}
#: Tensor index methods: position and keyword of the index argument.
_INDEX_METHODS = {"index_select": (1, "index"), "gather": (1, "index"), "take": (0, "index"),
                  "take_along_dim": (0, "indices"), "scatter": (1, "index"), "scatter_": (1, "index"),
                  "scatter_add": (1, "index"), "scatter_add_": (1, "index"), "index_add": (1, "index"),
                  "index_add_": (1, "index"), "index_copy": (1, "index"), "index_fill": (1, "index")}


def _index_argument(node: ast.Call, name: str | None, w: Walker) -> tuple[ast.expr, str] | None:
    """The index argument of an embedding / index op call, and how the op is named in the message."""
    spec = _INDEX_FUNCS.get(name or "")
    label = name
    if spec is None and isinstance(node.func, ast.Attribute):
        func = node.func
        if isinstance(func.value, ast.Name) and func.value.id == "self" and func.attr in w.embeddings:
            spec, label = (0, "input"), f"self.{func.attr} (nn.Embedding)"
        elif (name or "").split(".", 1)[0] != "torch" and func.attr in _INDEX_METHODS:
            spec, label = _INDEX_METHODS[func.attr], f".{func.attr}"
    if spec is None:
        return None
    pos, kw = spec
    arg = _kwarg(node, kw)
    if arg is None and len(node.args) > pos:
        arg = node.args[pos]
    return (arg, label or "index") if arg is not None else None


def _subscript_indices(node: ast.Subscript) -> list[ast.expr]:
    sl = node.slice
    items = sl.elts if isinstance(sl, ast.Tuple) else [sl]
    return [i for i in items if not isinstance(i, ast.Slice | ast.Constant)]


_INDEX_WHY = ("embedding and index kernels take int32/int64 indices only (Ascend's aclnnEmbedding: DT_INT32/"
              "DT_INT64), so a floating index raises; float16 cannot even hold indices above 2048 exactly")
_INDEX_FIX = ("cast right before the lookup, `.long()` or `.to(torch.int32)`; difforge's native URSA decoder casts "
              "codebook ids to its index dtype before nn.Embedding")


def _index_hits(node: ast.AST, name: str | None, w: Walker, wanted: str) -> list[tuple[ast.expr, str]]:
    flow = w.scope.flow
    if isinstance(node, ast.Call):
        found = _index_argument(node, name, w)
        if found is None:
            return []
        return [found] if flow.kind(found[0]) == wanted else []
    if isinstance(node, ast.Subscript):
        return [(i, "a subscript") for i in _subscript_indices(node) if flow.kind(i) == wanted]
    return []


def _describe(expr: ast.expr) -> str:
    text = ast.unparse(expr)
    return text if len(text) <= 40 else text[:37] + "..."


@rule("DF109", "index built in a floating dtype",
      severity=sev("error"), why=_INDEX_WHY, fix=_INDEX_FIX, on=(ast.Call, ast.Subscript))
def float_index(node: ast.AST, name: str | None, w: Walker) -> None:
    for expr, label in _index_hits(node, name, w, FLOAT):
        w.report("DF109", node, f"`{_describe(expr)}` is a floating tensor here and indexes {label}")


@rule("DF110", "index taken from the module's forward without a cast",
      severity=sev("warning"),
      why="the index comes out of the module's own forward, which returns the module's compute dtype (float16 "
          "in the URSA reference's quantizers); Ascend's embedding takes int32/int64 only and rejects it",
      fix=_INDEX_FIX, on=(ast.Call, ast.Subscript))
def forward_index(node: ast.AST, name: str | None, w: Walker) -> None:
    for expr, label in _index_hits(node, name, w, FORWARD):
        w.report("DF110", node, f"`{_describe(expr)}` indexes {label} without an integer cast")


# ---- DF111 hard-coded device strings -------------------------------------------------------------------
#: Calls whose string arguments are text, not a device (``s.startswith("cuda")``, ``getattr(torch, "cuda")``).
_TEXT_CALLS = frozenset({"startswith", "endswith", "replace", "split", "find", "index", "count", "get", "pop",
                         "getattr", "hasattr", "setattr", "join", "format", "strip", "lstrip", "rstrip"})


_LABEL_NAMES = frozenset({"name", "type", "kind", "backend", "platform"})


def _is_label(assign: ast.Assign | ast.AnnAssign) -> bool:
    targets = assign.targets if isinstance(assign, ast.Assign) else [assign.target]
    for t in targets:
        name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
        if name.lower() in _LABEL_NAMES:
            return True
    return False


@rule("DF111", "hard-coded CUDA device",
      severity=sev("warning"),
      why="a hard-coded CUDA device raises on {device} (no CUDA device) unless torch_npu's transfer_to_npu "
          "rewrites it at run time, and the code still cannot run anywhere else",
      fix="take the device from the caller (or torch.accelerator.current_accelerator()); difforge parses --device "
          "once into a Backend and passes backend.device down",
      on=(ast.Constant, ast.JoinedStr))
def cuda_string(node: ast.Constant | ast.JoinedStr, name: str | None, w: Walker) -> None:
    if isinstance(node, ast.Constant):
        if not is_cuda_string(node.value):
            return
    elif not is_cuda_fstring(node):
        return
    if w.compare_depth or w.cuda_guard or w.is_consumed(node):
        return
    parent = w.parent
    if isinstance(parent, ast.Subscript | ast.JoinedStr) or _in_literal_table(w, node):
        return
    if isinstance(parent, ast.keyword) and parent.arg in ("device_types", "device_type_filter"):
        return  # registers a CUDA kernel (torch.library custom ops): CUDA-only by design
    if isinstance(parent, ast.Assign | ast.AnnAssign) and len(w.stack) > 1 \
            and isinstance(w.stack[-2], ast.ClassDef) and _is_label(parent):
        return  # ``name = "cuda"`` in a backend class's body: the backend's name, not a device choice
    if isinstance(parent, ast.Call):
        func = parent.func
        callee = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if callee in _TEXT_CALLS:
            return
    text = node.value if isinstance(node, ast.Constant) else ast.unparse(node)
    w.report("DF111", node, f"hard-coded device {text!r}" if isinstance(node, ast.Constant) else
             f"hard-coded device {text}")


# ---- DF112 torch.cuda.amp ------------------------------------------------------------------------------
@rule("DF112", "torch.cuda.amp (CUDA-only autocast / scaler)",
      severity=sev("warning"),
      why="torch.cuda.amp autocasts and scales for CUDA only: on {device} autocast does nothing (the model "
          "silently runs in float32) and GradScaler is disabled; it is also deprecated",
      fix="use torch.autocast(device_type=device.type, dtype=...) and torch.amp.GradScaler(device.type); difforge "
          "runs its models in the dtype it resolves per device (Backend.resolve_dtype), without autocast",
      on=(ast.Attribute, ast.ImportFrom))
def cuda_amp(node: ast.AST, name: str | None, w: Walker) -> None:
    if isinstance(node, ast.ImportFrom):
        if node.module == "torch.cuda.amp" or (node.module == "torch.cuda" and any(a.name == "amp" for a in node.names)):
            w.report("DF112", node, f"`from {node.module} import ...`")
        return
    if name and (name == "torch.cuda.amp" or name.startswith("torch.cuda.amp.")):
        w.report("DF112", node, f"`{name}`")


# ---- DF113 CUDA / cuDNN switches -----------------------------------------------------------------------
_SWITCH_READERS = ("is_available", "is_built", "version", "is_flash_attention_available", "flash_sdp_enabled",
                   "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled")


@rule("DF113", "torch.backends.cuda / cudnn switch",
      severity=sev("info"),
      why="a CUDA/cuDNN switch has no effect on {device}, so what it sets (TF32 matmuls, the attention kernel, "
          "cuDNN's autotuner or determinism) silently does not apply there",
      fix="set the device's own switch (on the NPU e.g. torch.npu.matmul.allow_hf32 / torch.npu.conv.allow_hf32; "
          "for attention pick the kernel explicitly); difforge keeps such switches in the device's environment "
          "presets (difforge doctor lists them)",
      on=(ast.Attribute,))
def backend_switch(node: ast.Attribute, name: str | None, w: Walker) -> None:
    if not name or not name.startswith(("torch.backends.cuda.", "torch.backends.cudnn.")):
        return
    if name.rsplit(".", 1)[-1] in _SWITCH_READERS or w.cuda_guard:
        return
    parent = w.parent
    stored = isinstance(parent, ast.Assign | ast.AugAssign | ast.AnnAssign) and node is not getattr(parent, "value", None)
    called = isinstance(parent, ast.Call) and parent.func is node
    if stored or called:
        severity = "warning" if "sdp" in name else None  # an attention-kernel choice changes speed and memory
        w.report("DF113", node, f"`{name}`{' = ...' if stored else '(...)'}", severity)


# ---- DF114 torch.cuda runtime calls --------------------------------------------------------------------
#: torch.cuda calls that raise without a CUDA device (the rest silently do nothing or answer zero).
_CUDA_RAISING = ("synchronize", "set_device", "current_device", "get_device_properties", "get_device_name",
                 "get_device_capability", "mem_get_info", "Stream", "Event", "stream", "current_stream",
                 "default_stream", "CUDAGraph", "graph", "jiterator", "nvtx", "device")
_CUDA_HINTS = {
    "synchronize": "torch.accelerator.synchronize()", "empty_cache": "torch.accelerator.empty_cache()",
    "manual_seed": "torch.manual_seed(seed), which seeds every device",
    "manual_seed_all": "torch.manual_seed(seed), which seeds every device",
    "is_bf16_supported": "ask the device in use: this answers False on other devices and picks float16 there",
}


@rule("DF114", "torch.cuda runtime call",
      severity=sev("warning"),
      why="a torch.cuda runtime call: on {device} it raises (no CUDA device) or silently does nothing / answers "
          "zero, so the sync, seed or memory figure is not the accelerator's",
      fix="use torch.accelerator (synchronize, memory_allocated, max_memory_allocated, empty_cache; torch >= "
          "2.6 / 2.8) or the device's own module (torch.npu.*); difforge asks its Backend for sync and memory "
          "(difforge.devices)",
      on=(ast.Call,))
def cuda_runtime(node: ast.Call, name: str | None, w: Walker) -> None:
    if not name or not name.startswith("torch.cuda.") or name.startswith("torch.cuda.amp."):
        return
    if name in _CUDA_QUERIES or w.cuda_guard or w.is_consumed(node):
        return
    if w.caught("RuntimeError", "AssertionError", "AttributeError"):
        return  # the author expects it to fail off CUDA and handles that
    leaf = name.split(".")[2]
    hint = _CUDA_HINTS.get(name.rsplit(".", 1)[-1])
    raises = leaf in _CUDA_RAISING
    detail = f"`{name}(...)`" + (" raises without CUDA" if raises else "") + (f"; use {hint}" if hint else "")
    w.report("DF114", node, detail, "error" if raises else None)


# ---- DF115 float16-only assumptions --------------------------------------------------------------------
_AUTOCASTS = frozenset({"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast"})
_FP16 = frozenset({"torch.float16", "torch.half"})


@rule("DF115", "float16 assumed",
      severity=sev("info", cpu="warning"),
      why="float16 is hard-coded: models trained in bfloat16 overflow in float16 (NaN or black images) and "
          "{device} runs bfloat16 as well",
      why_by_target={"cpu": "float16 is hard-coded: on the CPU float16 is slow and lacks kernels, and models "
                            "trained in bfloat16 overflow in it"},
      fix="take the dtype from the caller (bfloat16 where the device has it); difforge resolves --dtype auto per "
          "device (Backend.resolve_dtype)",
      on=(ast.Call,))
def fp16_only(node: ast.Call, name: str | None, w: Walker) -> None:
    if _method(node) == "half" and not node.args and not _receiver_is_torch(node, w):
        if not w.conditional:  # a cast in one branch of a dtype choice is a choice, not an assumption
            w.report("DF115", node, "`.half()`")
        return
    if name in _AUTOCASTS:
        dtype = _kwarg(node, "dtype")
        if dtype is None and name == "torch.autocast" and len(node.args) > 1:
            dtype = node.args[1]
        if dtype is not None and w.dotted(dtype) in _FP16:
            w.report("DF115", node, f"`{name}(dtype=torch.float16)`")


def describe_rules(target: str = "npu") -> list[dict[str, Any]]:
    """The rule table as data (docs, ``--json`` consumers): id, title, severity here, why, fix."""
    return [{"id": r.id, "title": r.title, "severity": r.severity_for(target), "why": r.why_for(target),
             "fix": r.fix} for r in RULES.values()]
