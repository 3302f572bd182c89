"""The dtype of a tensor expression as far as the source alone tells: float, integer, or unknown.

Ascend's embedding (``aclnnEmbedding``) and the index kernels take int32/int64 indices only, so the
question the index rules ask is "can this index be a floating tensor here?".  The answer is built per
function, in source order, from the names' assignments (:class:`Flow`); it is deliberately shallow:
no calls into other functions, no branches joined (the last assignment seen wins), and anything not
recognised is unknown - an unknown index is never reported, so what is reported was seen to be float.

``FORWARD`` is the one in-between kind: the output of the module's own ``self.forward(x)``.  A module
forward returns its compute dtype in most code (and, in the URSA reference's quantizers, hands float16
"indices" straight to ``nn.Embedding``), so an index taken from it without a cast is worth a warning.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

FLOAT = "float"
INT = "int"
FORWARD = "forward"
#: A Python int literal: neutral in arithmetic (``ids + 1`` keeps the kind of ``ids``).
_INT_LITERAL = "int-literal"

FLOAT_DTYPES = frozenset(f"torch.{n}" for n in (
    "float16", "half", "bfloat16", "float32", "float", "float64", "double"))
INT_DTYPES = frozenset(f"torch.{n}" for n in (
    "int64", "long", "int32", "int", "int16", "short", "int8", "uint8",
    "LongTensor", "IntTensor", "cuda.LongTensor", "cuda.IntTensor"))

#: Tensor methods whose result is a floating tensor, whatever went in.
_FLOAT_METHODS = frozenset({"float", "half", "double", "bfloat16", "div", "div_", "true_divide", "round",
                            "floor", "ceil", "trunc", "sqrt", "exp", "log", "sigmoid", "tanh", "softmax",
                            "mean", "rsqrt", "sin", "cos", "lerp"})
#: Tensor methods whose result is an integer tensor.
_INT_METHODS = frozenset({"long", "int", "short", "argmax", "argmin", "argsort", "nonzero", "multinomial"})
#: Tensor methods that keep the receiver's dtype (shape moves, selection, reductions that keep it).
_KEEP_METHODS = frozenset({"view", "reshape", "flatten", "squeeze", "unsqueeze", "permute", "transpose",
                           "contiguous", "clone", "detach", "expand", "expand_as", "repeat", "flip",
                           "clamp", "clamp_", "clip", "sum", "cumsum", "roll", "narrow", "select",
                           "masked_fill", "t", "movedim", "unflatten", "squeeze_", "unsqueeze_", "cpu",
                           "abs", "neg"})
#: Tensor methods combining the receiver with one argument (the kind is the two kinds joined).
_JOIN_METHODS = frozenset({"mul", "mul_", "add", "add_", "sub", "sub_", "floor_divide", "fmod", "remainder",
                           "pow", "maximum", "minimum"})
#: Free functions (fully qualified) with a float result / an integer result.
_FLOAT_FUNCS = frozenset(f"torch.{n}" for n in (
    "linspace", "logspace", "rand", "randn", "rand_like", "randn_like", "round", "floor", "ceil", "trunc",
    "div", "true_divide", "sigmoid", "softmax", "sqrt", "exp", "sin", "cos", "nn.functional.softmax",
    "nn.functional.interpolate"))
_INT_FUNCS = frozenset({"torch.argmax", "torch.argmin", "torch.argsort", "torch.randint", "torch.randperm",
                        "torch.multinomial", "torch.bucketize", "torch.searchsorted", "torch.nonzero",
                        "int", "len", "math.floor", "math.ceil", "numpy.argmax"})
#: Tensor factories: float32 unless ``dtype=`` says otherwise.
_FACTORIES = frozenset(f"torch.{n}" for n in ("zeros", "ones", "empty", "full", "zeros_like", "ones_like",
                                             "empty_like", "full_like"))


def join(a: str | None, b: str | None) -> str | None:
    """The kind of ``a op b``: float wins, two integers stay integer, anything else is unknown."""
    if FLOAT in (a, b):
        return FLOAT
    if a == FORWARD or b == FORWARD:
        return FORWARD
    ints = (INT, _INT_LITERAL)
    if a in ints and b in ints:
        return INT if INT in (a, b) else _INT_LITERAL
    return None


def _dtype_kind(node: ast.expr | None, dotted: Callable[[ast.AST], str | None]) -> str | None:
    if node is None:
        return None
    name = dotted(node)
    if name in FLOAT_DTYPES or name == "self.dtype":
        return FLOAT
    if name in INT_DTYPES:
        return INT
    return None


class Flow:
    """Kinds of the names of one function (or module), updated as assignments are visited."""

    __slots__ = ("dotted", "env")

    def __init__(self, dotted: Callable[[ast.AST], str | None]) -> None:
        self.dotted = dotted
        self.env: dict[str, str | None] = {}

    def assign(self, target: ast.AST, value: ast.AST | None) -> None:
        """Record ``target = value`` (tuples pair up with tuples; other unpacking forgets the names)."""
        if isinstance(target, ast.Name):
            self.env[target.id] = self.kind(value) if value is not None else None
        elif isinstance(target, ast.Tuple | ast.List):
            values = value.elts if isinstance(value, ast.Tuple | ast.List) else None
            if values is not None and len(values) != len(target.elts):
                values = None
            for i, elt in enumerate(target.elts):
                self.assign(elt, values[i] if values is not None else None)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, None)

    def augassign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            old = self.env.get(node.target.id)
            self.env[node.target.id] = FLOAT if isinstance(node.op, ast.Div) else join(old, self.kind(node.value))

    def kind(self, node: ast.AST | None, depth: int = 0) -> str | None:
        """FLOAT, INT, FORWARD or None (unknown) for ``node``."""
        if node is None or depth > 12:
            return None
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool):
                return None
            if isinstance(node.value, int):
                return _INT_LITERAL
            return FLOAT if isinstance(node.value, float) else None
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Div):
                return FLOAT
            if isinstance(node.op, ast.MatMult):
                return None
            return join(self.kind(node.left, depth + 1), self.kind(node.right, depth + 1))
        if isinstance(node, ast.UnaryOp):
            return self.kind(node.operand, depth + 1) if isinstance(node.op, ast.USub | ast.UAdd) else None
        if isinstance(node, ast.Subscript):
            return self.kind(node.value, depth + 1)
        if isinstance(node, ast.IfExp):
            a, b = self.kind(node.body, depth + 1), self.kind(node.orelse, depth + 1)
            return a if a == b else (FLOAT if FLOAT in (a, b) else None)
        if isinstance(node, ast.Call):
            return self._call_kind(node, depth)
        return None

    def _call_kind(self, node: ast.Call, depth: int) -> str | None:
        func = node.func
        if isinstance(func, ast.Attribute):
            method, receiver = func.attr, func.value
            if method == "forward" and isinstance(receiver, ast.Name) and receiver.id == "self" and node.args:
                return FORWARD
            name = self.dotted(func)
            if name is not None and not name.startswith("self."):
                free = self._free_call_kind(name, node, depth)
                if free != "?":
                    return free
            if method in _FLOAT_METHODS:
                return FLOAT
            if method in _INT_METHODS:
                return INT
            if method in ("to", "type"):
                dtype = next((k.value for k in node.keywords if k.arg == "dtype"), None)
                for arg in node.args:
                    k = _dtype_kind(arg, self.dotted)
                    if k is not None:
                        return k
                k = _dtype_kind(dtype, self.dotted)
                if k is not None:
                    return k
                return self.kind(receiver, depth + 1) if dtype is None else None
            if method in _KEEP_METHODS:
                return self.kind(receiver, depth + 1)
            if method in _JOIN_METHODS:
                arg = node.args[0] if node.args else None
                return join(self.kind(receiver, depth + 1), self.kind(arg, depth + 1))
            return None
        name = self.dotted(func)
        if name is None:
            return None
        free = self._free_call_kind(name, node, depth)
        return None if free == "?" else free

    def _free_call_kind(self, name: str, node: ast.Call, depth: int) -> str | None:
        """The kind of a call to a module-level function ``name``; "?" when the name is not one we know."""
        if name in _INT_FUNCS:
            return INT
        if name in _FLOAT_FUNCS:
            return FLOAT
        dtype = next((k.value for k in node.keywords if k.arg == "dtype"), None)
        if name in _FACTORIES:
            if dtype is not None:
                return _dtype_kind(dtype, self.dotted)
            if name.endswith("_like"):  # the input's dtype
                return self.kind(node.args[0], depth + 1) if node.args else None
            return FLOAT
        if name == "torch.arange":
            if dtype is not None:
                return _dtype_kind(dtype, self.dotted)
            kinds = [self.kind(a, depth + 1) for a in node.args]
            return FLOAT if FLOAT in kinds else INT
        if name == "torch.where" and len(node.args) == 3:
            return join(self.kind(node.args[1], depth + 1), self.kind(node.args[2], depth + 1))
        return "?"
