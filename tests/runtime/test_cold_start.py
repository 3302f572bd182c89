"""Cold start: nothing imports ``torch._dynamo`` unless compile is asked for (issue 11, item 8).

Building a model on the meta device used to run every ``nn.init`` initialiser through ``torch._refs``,
whose wrappers import ``torch._dynamo`` (about 2 s of each cold start).  ``runtime.meta.on_meta`` skips
the initialisers; a URSA generate in a fresh process must not import dynamo at all.  (Qwen-Image-Edit
runs on diffusers, whose ``utils.torch_utils`` imports ``torch._dynamo`` itself at import time.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import init

from difforge.runtime.meta import INITIALISERS, on_meta

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from difforge import api
api.generate("a red circle", model="tiny-ursa", device="cpu", steps=2, height=64, width=64,
             output=sys.argv[1], quiet=True)
print("dynamo" if "torch._dynamo" in sys.modules else "no dynamo")
"""


def test_a_ursa_generate_never_imports_dynamo(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "out.png")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "no dynamo"
    assert (tmp_path / "out.png").is_file()


def test_on_meta_skips_initialisers_and_restores_them() -> None:
    before = {name: getattr(init, name) for name in INITIALISERS if hasattr(init, name)}
    with on_meta():
        layer = nn.Linear(4, 3)
        t = torch.empty(2)
        assert init.normal_(t) is t
        assert all(getattr(init, name) is not fn for name, fn in before.items())
    assert layer.weight.device.type == "meta"
    assert all(getattr(init, name) is fn for name, fn in before.items())
    real = nn.Linear(4, 3)  # outside: initialised as usual
    assert real.weight.device.type == "cpu" and float(real.weight.abs().sum()) > 0


def test_on_meta_restores_initialisers_after_an_error() -> None:
    before = init.kaiming_uniform_
    try:
        with on_meta():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert init.kaiming_uniform_ is before
