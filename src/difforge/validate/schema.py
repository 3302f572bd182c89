"""The shape of a golden or capture bundle's ``manifest.json`` and ``data.json``, checked when it is opened.

Why: SHA256SUMS proves only that a bundle's files agree with one another, so a bundle edited with its sums
recomputed reaches the reader (the external digest, ``--golden-digest``, is optional).  Without this check a
list where an object belongs, a missing key or a tensor name the bundle does not hold surfaced halfway
through the run as a KeyError or TypeError (exit 1, "unexpected", blamed on nobody).  Every value the
readers (:mod:`.golden`, :mod:`.captured`, :mod:`.opstore`) index is described here once and checked before
anything loads; a mismatch is one line naming the file and the place (exit 2).

The spec language is small: a Python type (``bool`` is not an ``int``), ``[spec]`` a list of, ``{key: spec}``
an object with those keys (more are allowed), :class:`Map` an object of any keys, :class:`Opt` also None,
:class:`May` a key that may be absent, :class:`OneOf` one of fixed values, :data:`ANY` anything, and
:data:`TENSOR` a tensor (after ``data.json`` was unpacked against ``tensors.safetensors``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..devices import DTYPES


class SchemaError(ValueError):
    """A value that is not what the spec says; ``where`` is its place (``runs/0/ref/images``)."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where or 'the top level'}: {why}")


@dataclass(frozen=True)
class Map:
    """An object whose keys are any strings and whose values are all ``value``."""

    value: Any


@dataclass(frozen=True)
class Opt:
    """``spec`` or None."""

    spec: Any


@dataclass(frozen=True)
class May:
    """In an object spec: a key that may be absent (when present, it must be ``spec``)."""

    spec: Any


class OneOf:
    """One of fixed values."""

    def __init__(self, *values: Any) -> None:
        self.values = values


ANY = object()
TENSOR = torch.Tensor

_NAMES = {bool: "true/false", int: "a whole number", float: "a number", str: "a string", list: "a list",
          dict: "an object", torch.Tensor: "a tensor"}


def _name(value: Any) -> str:
    return _NAMES.get(type(value), type(value).__name__) if value is not None else "null"


def check(value: Any, spec: Any, where: str = "") -> None:
    """Raise :class:`SchemaError` unless ``value`` fits ``spec``."""
    if spec is ANY:
        return
    if isinstance(spec, Opt):
        if value is not None:
            check(value, spec.spec, where)
        return
    if isinstance(spec, OneOf):
        if not any(type(value) is type(v) and value == v for v in spec.values):
            raise SchemaError(where, f"must be one of {', '.join(repr(v) for v in spec.values)}, not {value!r:.60}")
        return
    if isinstance(spec, type):
        ok = isinstance(value, spec) and not (spec in (int, float) and isinstance(value, bool))
        if spec is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise SchemaError(where, f"must be {_NAMES.get(spec, spec.__name__)}, not {_name(value)}")
        return
    if isinstance(spec, list):
        if not isinstance(value, list | tuple):
            raise SchemaError(where, f"must be a list, not {_name(value)}")
        for i, item in enumerate(value):
            check(item, spec[0], f"{where}/{i}")
        return
    if isinstance(spec, Map):
        if not isinstance(value, dict):
            raise SchemaError(where, f"must be an object, not {_name(value)}")
        for key, item in value.items():
            if not isinstance(key, str):
                raise SchemaError(where, f"has a key that is not a string ({key!r:.40})")
            check(item, spec.value, f"{where}/{key}")
        return
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise SchemaError(where, f"must be an object, not {_name(value)}")
        for key, sub in spec.items():
            if key not in value:
                if isinstance(sub, May):
                    continue
                raise SchemaError(where, f"has no {key!r}")
            check(value[key], sub.spec if isinstance(sub, May) else sub, f"{where}/{key}")
        return
    raise TypeError(f"not a spec: {spec!r}")  # a programming error, not the bundle's


DTYPE = OneOf(*sorted(DTYPES))
NAMED_TENSORS = Map(ANY)  # a probe's outputs or inputs by name: tensors, or nested values of them
IMAGES = {"file": str, "sha256": str}
INPUTS = {"prompts": [str], "images": [IMAGES], "synthetic": ANY}
COMMON_MANIFEST = {"format": str, "format_version": int, "difforge": str, "model": str, "weights": Map(str),
                   "inputs": INPUTS}
PLANS = {"plans": Map(TENSOR), "reducer": May(Opt(Map(int)))}

GOLDEN_MANIFEST = {
    **COMMON_MANIFEST,
    "settings": Map(ANY),
    "reference": {"label": str, "device": str, "dtype": str},
    "floor": {"label": str, "kind": OneOf("reference", "none", "floor"), "dtype_plan": Map(Map(DTYPE))},
    "msprobe": May(Opt({"floor": May(str)})),
}
_TRACE = {"inputs": [NAMED_TENSORS], "outputs": [NAMED_TENSORS]}
_RUN = {"images": [str], "trace": _TRACE}
GOLDEN_DATA = {
    "seeds": [int],
    "runs": Map({"ref": _RUN, "floor": Opt(_RUN), "steps": [{
        "ref": NAMED_TENSORS, "ref_blocks": Map([TENSOR]), "floor": Opt(NAMED_TENSORS),
        "floor_blocks": Opt(Map([TENSOR]))}]}),
    "components": {"inputs": Map(NAMED_TENSORS), "ref": Map(ANY), "floor": Opt(Map(ANY))},
    "gallery": [{"prompt": str, "image": str}],
    **PLANS,
}

CAPTURE_MANIFEST = {
    **COMMON_MANIFEST,
    "inputs": {**INPUTS, "prompt_set": May(Opt(str))},
    "options": Map(ANY),
    "device": {"label": str, "device": str, "dtype": DTYPE, "random_stream": str, "name": May(Opt(str)),
               "memory_after_load": May(Opt(int)), "describe": May(Map(ANY))},
    "dtype_plan": Map(Map(DTYPE)),
    "golden": May(Opt({"digest": str})),
    "budget": May(Opt(Map(ANY))),
}
_CALL = {"op": str, "func": str, "index": int, "where": ANY, "shape": ANY, "how": ANY, "args": ANY, "out": ANY,
         "out_index": Opt(TENSOR)}
CAPTURE_DATA = {
    "load_record": Map(ANY),
    "size_multiple": int,
    "block_names": [str],
    "family": May(str),
    "portable_stream": May(bool),
    "flops": May(ANY),
    "runs": Map([{"images": May([str]), "record": May(Opt(Map(ANY))), "trace": May(Opt(_TRACE)),
                  "error": May(Opt(str))}]),
    "components": {"inputs": Map(NAMED_TENSORS), "outputs": Map(ANY)},
    "operator": {"cases": [{"op": str, "impl": str, "exact": bool, "shape": ANY, "dut": TENSOR, "ref": TENSOR,
                            "floor": TENSOR, "note": str}],
                 "captures": [{"component": str, "seen": Map(int), "skipped": Map([ANY]), "calls": [_CALL]}]},
    "states": Map([NAMED_TENSORS]),
    "steps": Map([{"out": NAMED_TENSORS, "blocks": Map([TENSOR]), "sampler": May(NAMED_TENSORS),
                   "post": May({"teacher": NAMED_TENSORS, "out": NAMED_TENSORS})}]),
    **PLANS,
}


def referenced_files(manifest: dict[str, Any], data: dict[str, Any]) -> list[str]:
    """Every file a bundle's manifest and data name (pictures, msprobe dumps): each must be one the bundle lists."""
    names = [x["file"] for x in manifest["inputs"]["images"]]
    floor_dump = (manifest.get("msprobe") or {}).get("floor")
    if isinstance(floor_dump, str):
        names.append(floor_dump)
    if "seeds" in data:  # a golden bundle
        for run in data["runs"].values():
            names += run["ref"]["images"] + (run["floor"]["images"] if run["floor"] else [])
        names += [g["image"] for g in data["gallery"]]
    else:
        names += [name for runs in data["runs"].values() for run in runs for name in run.get("images", [])]
    return names


__all__ = ["CAPTURE_DATA", "CAPTURE_MANIFEST", "GOLDEN_DATA", "GOLDEN_MANIFEST", "SchemaError", "check",
           "referenced_files"]
