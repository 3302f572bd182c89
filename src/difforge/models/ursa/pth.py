"""Read tensors from a ``torch.save`` zip file without unpickling it.

``scheduler/scheduler_model.pth`` is a pickle, and unpickling runs whatever the file names.  Here the
pickle program in ``<archive>/data.pkl`` is only *walked* (``pickletools.genops``) by a tiny stack
machine that understands containers, strings, numbers and symbolic references.  Globals are never
imported: the only ones accepted are the tensor-rebuild function, the typed storage classes and
``collections.OrderedDict``; anything else makes the file unreadable rather than executable.  Tensor
bytes then come straight from ``<archive>/data/<key>``.
"""

from __future__ import annotations

import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointError

STORAGE_DTYPES = {
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "DoubleStorage": torch.float64,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
}
_ALLOWED_GLOBALS = {("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict")} | {
    ("torch", name) for name in STORAGE_DTYPES
}


@dataclass(frozen=True)
class _Global:
    module: str
    name: str


@dataclass(frozen=True)
class _Call:
    func: Any
    args: tuple


@dataclass(frozen=True)
class _PersId:
    ref: Any


class _Mark:
    pass


_MARK = _Mark()


def _pop_mark(stack: list) -> list:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1 :]
            del stack[i:]
            return items
    raise ValueError("MARK not found")


def _walk(program: bytes) -> Any:
    """Evaluate the data-only subset of the pickle machine; raise ValueError on anything else."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    for op, arg, _pos in pickletools.genops(program):
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            return stack.pop()
        if name == "MARK":
            stack.append(_MARK)
        elif name in ("EMPTY_DICT",):
            stack.append({})
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in ("BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "BININT", "BININT1", "BININT2",
                      "LONG1", "LONG4", "BINFLOAT", "SHORT_BINSTRING", "BINSTRING") or name == "INT":
            stack.append(arg)
        elif name == "NONE":
            stack.append(None)
        elif name in ("NEWTRUE", "NEWFALSE"):
            stack.append(name == "NEWTRUE")
        elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = stack[-1]
        elif name == "MEMOIZE":
            memo[len(memo)] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET", "GET"):
            stack.append(memo[arg])
        elif name == "TUPLE":
            stack.append(tuple(_pop_mark(stack)))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif name in ("GLOBAL", "STACK_GLOBAL"):
            if name == "GLOBAL":
                module, _, attr = arg.partition(" ")
            else:
                attr, module = stack.pop(), stack.pop()
            if (module, attr) not in _ALLOWED_GLOBALS:
                raise ValueError(f"refuses global {module}.{attr}")
            stack.append(_Global(module, attr))
        elif name == "BINPERSID":
            stack.append(_PersId(stack.pop()))
        elif name == "REDUCE":
            args = stack.pop()
            stack.append(_Call(stack.pop(), tuple(args)))
        elif name == "SETITEM":
            value, key = stack.pop(), stack.pop()
            stack[-1][key] = value
        elif name == "SETITEMS":
            items = _pop_mark(stack)
            for k, v in zip(items[::2], items[1::2], strict=True):
                stack[-1][k] = v
        elif name in ("APPEND", "APPENDS"):
            items = [stack.pop()] if name == "APPEND" else _pop_mark(stack)
            stack[-1].extend(items)
        elif name == "BUILD":
            stack.pop()  # state for OrderedDict() (tensor hooks): ignored
        else:
            raise ValueError(f"unsupported pickle opcode {name}")
    raise ValueError("pickle program has no STOP")


def _tensor(call: Any, zf: zipfile.ZipFile, prefix: str) -> torch.Tensor:
    if not (isinstance(call, _Call) and call.func == _Global("torch._utils", "_rebuild_tensor_v2")):
        raise ValueError("value is not a plain tensor")
    pers, offset, size, stride = call.args[:4]
    if not isinstance(pers, _PersId) or not isinstance(pers.ref, tuple) or len(pers.ref) != 5:
        raise ValueError("tensor has no storage reference")
    kind, storage_cls, key, _location, numel = pers.ref
    if kind != "storage" or not isinstance(storage_cls, _Global) or storage_cls.name not in STORAGE_DTYPES:
        raise ValueError("unknown storage type")
    dtype = STORAGE_DTYPES[storage_cls.name]
    raw = zf.read(f"{prefix}data/{key}")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if len(raw) != numel * itemsize:
        raise ValueError(f"storage {key} has {len(raw)} bytes, expected {numel * itemsize}")
    flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    return flat.as_strided(tuple(size), tuple(stride), int(offset)).clone()


def read_pth_tensors(path: Path) -> dict[str, torch.Tensor]:
    """All top-level tensors of a ``torch.save``'d dict, read statically."""
    if not path.is_file():
        raise CheckpointError(f"Missing file {path}.")
    try:
        with zipfile.ZipFile(path) as zf:
            pkl = [n for n in zf.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
            if len(pkl) != 1:
                raise ValueError("no single <archive>/data.pkl member (legacy non-zip .pth files are not read)")
            prefix = pkl[0][: -len("data.pkl")]
            order = f"{prefix}byteorder"
            if order in zf.namelist() and zf.read(order).strip() != b"little":
                raise ValueError("big-endian tensors are not supported")
            root = _walk(zf.read(pkl[0]))
            if not isinstance(root, dict):
                raise ValueError("top-level object is not a dict")
            return {str(k): _tensor(v, zf, prefix) for k, v in root.items()}
    except (zipfile.BadZipFile, ValueError, KeyError, IndexError, TypeError, OSError) as exc:
        raise CheckpointError(f"{path} cannot be read as a plain tensor file ({exc}).") from None
