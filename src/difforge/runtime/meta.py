"""Build modules on the meta device without running their weight initialisers.

Why: a module built under ``torch.device("meta")`` still runs ``reset_parameters``, and torch's
``nn.init`` functions on meta tensors go through ``torch._refs``, whose wrappers import
``torch._dynamo`` - about 2 s of every cold start (issue 11) that nothing asked for, spent
initialising tensors that have no storage and are replaced by the checkpoint's weights anyway.
:func:`on_meta` swaps the in-place initialisers for no-ops while the modules are built, as
transformers' ``no_init_weights`` and accelerate's ``init_empty_weights`` do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn import init

#: The in-place initialisers of ``torch.nn.init`` that module constructors call.
INITIALISERS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
                "sparse_")


def _skip(tensor: Any, *_args: Any, **_kwargs: Any) -> Any:
    return tensor


@contextmanager
def on_meta() -> Iterator[None]:
    """``torch.device("meta")`` with every ``nn.init`` initialiser a no-op until the block ends."""
    saved = {name: getattr(init, name) for name in INITIALISERS if hasattr(init, name)}
    try:
        for name in saved:
            setattr(init, name, _skip)
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(init, name, fn)


__all__ = ["INITIALISERS", "on_meta"]
