"""Triton kernels on CPU tensors through Triton's interpreter.

Triton decides when a function is *decorated* - its own standard library's at ``import triton``,
ours at our import - whether it is compiled or interpreted.  So this conftest sets
``TRITON_INTERPRET=1`` when pytest collects this directory, before any test runs (no test module
imports triton at collection; a torch.compile test imports it later, and on a machine without a GPU
the variable changes nothing for it).  Where triton is not installed (it has wheels for Linux only)
these tests skip; if something imported triton before collection reached here, they skip saying so.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

import pytest

HAVE_TRITON = importlib.util.find_spec("triton") is not None
#: Whether triton's first import in this process happens with the interpreter switched on.
INTERPRETABLE = "triton" not in sys.modules or os.environ.get("TRITON_INTERPRET") == "1"
if HAVE_TRITON and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"


def interpreted(name: str) -> ModuleType:
    """``difforge.ops.<name>`` imported under the interpreter (skips where that cannot be had)."""
    if not HAVE_TRITON:
        pytest.skip("triton is not installed (it has wheels for Linux only)")
    if not INTERPRETABLE:
        pytest.skip("triton was imported before TRITON_INTERPRET was set; run tests/ops/triton on its own")
    module = importlib.import_module(f"difforge.ops.{name}")
    assert module.INTERPRETED
    return module


@pytest.fixture
def tk() -> ModuleType:
    return interpreted("triton_kernels")
