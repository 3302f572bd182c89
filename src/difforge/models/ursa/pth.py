"""Read tensors from a ``torch.save`` zip file without unpickling it.

``scheduler/scheduler_model.pth`` is a pickle, and unpickling runs whatever the file names.  Here the
pickle program in ``<archive>/data.pkl`` is only *walked* (``pickletools.genops``) by a tiny stack
machine that understands containers, strings, numbers and symbolic references.  Globals are never
imported: the only ones accepted are the tensor-rebuild function, the typed storage classes and
``collections.OrderedDict``; anything else makes the file unreadable rather than executable.  Tensor
bytes then come straight from ``<archive>/data/<key>``.

Not executing the pickle is not enough: a 1.7 KB file can still describe a tensor that *reads* as
gigabytes (a stride-0 view of one float, cloned into a huge shape) and a 1 MB deflate bomb inflates to
a gigabyte.  So everything the file declares is bounded before anything is allocated: the member
count, each member's uncompressed size and compression ratio, the total, every storage (its size must
equal what the pickle says), every view (non-negative strides, inside its storage, a bounded shape
product) -- and members are read through a size-limited stream that never returns more than the
size the zip declares.  The limits are far above the real ``path.emb`` (131072 x 256 float32 =
128 MiB for the largest known IBQ codebook).
"""

from __future__ import annotations

import math
import os
import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointError
from ...runtime.reading import open_file
from ..checkpoint import model_roots

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
_ITEMSIZE = {name: torch.empty(0, dtype=dtype).element_size() for name, dtype in STORAGE_DTYPES.items()}

#: Limits on what a scheduler ``.pth`` may declare (see the module docstring for why each exists).
MAX_FILE_BYTES = 2 << 30  # the file on disk
MAX_MEMBERS = 256  # torch.save writes ~6 bookkeeping members plus one per storage
MAX_PICKLE_BYTES = 1 << 20  # data.pkl of a dict of a few tensors is a few hundred bytes
MAX_MEMBER_BYTES = 1 << 30  # one uncompressed member (a storage)
MAX_TOTAL_BYTES = 1 << 30  # all storages together
MAX_RATIO = 50  # uncompressed / compressed; torch.save stores members uncompressed (ratio 1)
RATIO_FREE_BYTES = 1 << 20  # members smaller than this may compress as well as they like
MAX_DIMS = 8
#: A view may repeat storage elements (a stride of 0, overlapping strides) only up to this size: a
#: broadcast bias is harmless, a 64 x 25M view of one float (6.4 GB when copied) is not.
MAX_REPEAT_BYTES = 1 << 20


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


def _plain_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 2**62:
        raise ValueError(f"{what} is not an integer of at most 62 bits")
    return value


def _dims(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or len(value) > MAX_DIMS:
        raise ValueError(f"{what} is not a tuple of at most {MAX_DIMS} integers")
    return tuple(_plain_int(v, what) for v in value)


def _check_members(zf: zipfile.ZipFile) -> None:
    """Refuse archives whose directory alone promises too much (count, sizes, compression ratio)."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ValueError(f"{len(infos)} zip members (at most {MAX_MEMBERS})")
    total = 0
    for info in infos:
        if info.file_size > MAX_MEMBER_BYTES:
            raise ValueError(f"member {info.filename} declares {info.file_size} bytes (at most {MAX_MEMBER_BYTES})")
        if info.file_size > RATIO_FREE_BYTES and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise ValueError(
                f"member {info.filename} inflates {info.compress_size} bytes to {info.file_size} (a zip bomb?)"
            )
        total += info.file_size
    if total > MAX_TOTAL_BYTES:
        raise ValueError(f"members total {total} uncompressed bytes (at most {MAX_TOTAL_BYTES})")


def _read_member(zf: zipfile.ZipFile, name: str, limit: int) -> bytearray:
    """A member's bytes, at most ``limit`` and never more than its declared size (read in bounded chunks)."""
    info = zf.getinfo(name)
    if info.file_size > limit:
        raise ValueError(f"member {name} declares {info.file_size} bytes (at most {limit})")
    buf = bytearray(info.file_size)
    view, got = memoryview(buf), 0
    with zf.open(info) as fh:
        while got < info.file_size:
            n = fh.readinto(view[got : got + (16 << 20)])
            if not n:
                break
            got += n
        if got != info.file_size or fh.read(1):
            raise ValueError(f"member {name} does not hold the {info.file_size} bytes its zip entry declares")
    return buf


def _tensor(call: Any, zf: zipfile.ZipFile, prefix: str, storages: dict[str, torch.Tensor]) -> torch.Tensor:
    if not (isinstance(call, _Call) and call.func == _Global("torch._utils", "_rebuild_tensor_v2")):
        raise ValueError("value is not a plain tensor")
    if len(call.args) < 4:
        raise ValueError("tensor rebuild call has too few arguments")
    pers, offset, size, stride = call.args[:4]
    if not isinstance(pers, _PersId) or not isinstance(pers.ref, tuple) or len(pers.ref) != 5:
        raise ValueError("tensor has no storage reference")
    kind, storage_cls, key, _location, numel = pers.ref
    if kind != "storage" or not isinstance(storage_cls, _Global) or storage_cls.name not in STORAGE_DTYPES:
        raise ValueError("unknown storage type")
    if not isinstance(key, str):
        raise ValueError("storage key is not a string")
    dtype, itemsize = STORAGE_DTYPES[storage_cls.name], _ITEMSIZE[storage_cls.name]
    numel = _plain_int(numel, f"storage {key} size")
    offset = _plain_int(offset, "storage offset")
    size, stride = _dims(size, "tensor shape"), _dims(stride, "tensor strides")
    if len(size) != len(stride):
        raise ValueError(f"shape {size} and strides {stride} differ in length")
    if numel < 0 or numel * itemsize > MAX_MEMBER_BYTES:
        raise ValueError(f"storage {key} declares {numel} elements")
    if any(s < 0 for s in size) or any(s < 0 for s in stride):
        raise ValueError(f"tensor shape {size} / strides {stride} has a negative entry")
    count = math.prod(size)
    if not count:  # an empty view reads nothing, whatever its offset and strides
        return torch.empty(size, dtype=dtype)
    last = offset + sum((n - 1) * st for n, st in zip(size, stride, strict=True))
    if offset < 0 or last >= numel:
        raise ValueError(
            f"tensor view (offset {offset}, shape {size}, strides {stride}) reaches element {last} "
            f"of a {numel}-element storage"
        )
    if count > numel and count * itemsize > MAX_REPEAT_BYTES:
        raise ValueError(f"tensor shape {size} repeats its {numel}-element storage (stride 0 or overlapping strides)")
    member = f"{prefix}data/{key}"
    flat = storages.get(member)
    if flat is None:
        if zf.getinfo(member).file_size != numel * itemsize:
            raise ValueError(f"storage {key} has {zf.getinfo(member).file_size} bytes, expected {numel * itemsize}")
        raw = _read_member(zf, member, MAX_MEMBER_BYTES)
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        storages[member] = flat
    elif flat.dtype != dtype or flat.numel() != numel:
        raise ValueError(f"storage {key} is referenced with two different types or sizes")
    if offset == 0 and count == numel and _is_contiguous(size, stride):
        return flat.view(size)  # the whole storage in order (what torch.save writes): no second copy
    return flat.as_strided(size, stride, offset).clone()  # bounded: inside the storage, repeats capped


def _is_contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for n, st in zip(reversed(size), reversed(stride), strict=True):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def read_pth_tensors(path: Path, root: Path | None = None) -> dict[str, torch.Tensor]:
    """All top-level tensors of a ``torch.save``'d dict, read statically.

    The file is opened by the one reading rule (a regular file inside the model folder ``root`` after
    every link, at most :data:`MAX_FILE_BYTES`) and the zip is read from that very descriptor."""
    if not os.path.lexists(path):
        raise CheckpointError(f"Missing file {path}.")
    root = Path(root) if root is not None else Path(path).parent.parent
    handle = open_file(path, what=str(path), error=CheckpointError, root=root, also=model_roots(root)[1:],
                       limit=MAX_FILE_BYTES)
    try:
        with handle, zipfile.ZipFile(handle) as zf:
            _check_members(zf)
            pkl = [n for n in zf.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
            if len(pkl) != 1:
                raise ValueError("no single <archive>/data.pkl member (legacy non-zip .pth files are not read)")
            prefix = pkl[0][: -len("data.pkl")]
            order = f"{prefix}byteorder"
            if order in zf.namelist() and bytes(_read_member(zf, order, 64)).strip() != b"little":
                raise ValueError("big-endian tensors are not supported")
            root = _walk(bytes(_read_member(zf, pkl[0], MAX_PICKLE_BYTES)))
            if not isinstance(root, dict):
                raise ValueError("top-level object is not a dict")
            storages: dict[str, torch.Tensor] = {}
            return {str(k): _tensor(v, zf, prefix, storages) for k, v in root.items()}
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, KeyError, IndexError, TypeError, AttributeError,
            OSError, EOFError, RecursionError) as exc:
        raise CheckpointError(f"{path} cannot be read as a plain tensor file ({exc}).") from None
