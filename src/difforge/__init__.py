"""difforge: run diffusion image models on any accelerator and prove the port works."""

from __future__ import annotations

import sys
import types
from typing import Any

from .version import __version__

__all__ = ["__version__", "edit", "generate", "load_pipeline", "validate"]


def __getattr__(name: str) -> Any:  # lazy: `import difforge` stays cheap (no torch import for --help)
    if name in ("edit", "generate", "load_pipeline", "validate"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)


class _ValidatePackage(types.ModuleType):
    """The ``difforge.validate`` package, callable as the API function of the same name.

    Importing a subpackage binds it as an attribute of its parent, so once anything has imported
    ``difforge.validate`` (the API function itself does), ``difforge.validate`` would stop being the
    function the README documents; this keeps ``difforge.validate(model=..., out=...)`` working while
    ``difforge.validate.ValidateOptions`` and friends stay reachable.
    """

    def __call__(self, **options: Any) -> Any:
        from .api import validate

        return validate(**options)


class _Difforge(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "validate" and type(value) is types.ModuleType:
            value.__class__ = _ValidatePackage
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Difforge
