"""difforge: run diffusion image models on any accelerator and prove the port works."""

from __future__ import annotations

from .version import __version__

__all__ = ["__version__", "edit", "generate", "load_pipeline", "validate"]


def __getattr__(name: str):  # lazy: `import difforge` stays cheap (no torch import for --help)
    if name in ("edit", "generate", "load_pipeline", "validate"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
