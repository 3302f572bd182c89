"""A stand-in ``torchvision`` for exercising transformers' torchvision branch on hosts without one.

PyPI's torchvision wheels do not import beside the pinned CPU torch, yet nearly every CUDA or
Ascend machine has torchvision, and with it transformers builds a video processor for
``Qwen2VLProcessor`` (the 2026-12-04 H200 run failed there).  Placed on ``PYTHONPATH`` this file
is imported at interpreter start (as ``sitecustomize``) and makes ``import torchvision`` and any
submodule succeed with objects that answer every attribute and call, and reports a version, so
transformers' own availability checks (``find_spec`` plus ``__version__``) take the branch as they
would on a real install, whatever transformers version is installed.  Loading a processor works;
processing a picture with the torchvision backend would not, and the tests never do.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _Anything:
    """Answers every attribute, call and subscript with another stand-in; can be a base class."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, item: str) -> _Anything:
        if item.startswith("__"):
            raise AttributeError(item)
        return _Anything(f"{self._name}.{item}")

    def __call__(self, *args: object, **kwargs: object) -> _Anything:
        return _Anything(f"{self._name}()")

    def __getitem__(self, key: object) -> _Anything:
        return _Anything(f"{self._name}[]")

    def __mro_entries__(self, bases: tuple) -> tuple[type, ...]:
        return (object,)

    def __hash__(self) -> int:
        return hash(self._name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Anything) and other._name == self._name

    def __repr__(self) -> str:
        return f"<torchvision stand-in {self._name}>"


def _module_getattr(name: str):  # noqa: ANN202 - a module-level __getattr__
    def getattr_(item: str) -> _Anything:
        if item.startswith("__"):  # inspect and importlib probe dunders: a real module lacks them
            raise AttributeError(item)
        return _Anything(f"{name}.{item}")

    return getattr_


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "0.99.0"
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.insert(0, _Finder())
