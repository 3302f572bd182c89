"""Compile at a bounded cost: the caches under DIFFORGE_HOME, the mode, and the rule that compiles unasked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from difforge.devices import compile as comp
from difforge.devices.compile import CompilePolicy, auto_compile, compile_policy, use_compile_caches
from difforge.errors import DifforgeError

ROOT = Path(__file__).resolve().parents[2]
CUDA = CompilePolicy("cuda", True, "inductor", None, "inductor", "default mode")


@pytest.fixture
def clean_cache_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No cache variable set (the Makefile sets one), restored afterwards; the cache switches off, restored too."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    for name in (*comp.CACHE_ENV, *comp.CACHE_SWITCH_ENV, comp.MODE_ENV):
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    saved = inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache
    inductor_config.fx_graph_cache = functorch_config.enable_autograd_cache = False
    yield monkeypatch
    inductor_config.fx_graph_cache, functorch_config.enable_autograd_cache = saved


def test_caches_go_under_difforge_home(clean_cache_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    caches = use_compile_caches(tmp_path)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile" / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "compile" / "inductor" / "triton")
    assert caches.user_set == () and caches.folders["TORCHINDUCTOR_CACHE_DIR"] == os.environ["TORCHINDUCTOR_CACHE_DIR"]
    assert inductor_config.fx_graph_cache and functorch_config.enable_autograd_cache
    # Inductor itself now finds its folder there (it reads the variable when it first needs the folder)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(tmp_path / "compile" / "inductor")


def test_a_user_set_cache_folder_wins(clean_cache_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Makefile's TORCHINDUCTOR_CACHE_DIR stays, and Triton's goes beside it, not under DIFFORGE_HOME."""
    clean_cache_env.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    clean_cache_env.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    caches = use_compile_caches(tmp_path / "home")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine" / "triton")
    assert caches.user_set == ("TORCHINDUCTOR_CACHE_DIR",)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    assert inductor_config.fx_graph_cache is False  # the user's switch is theirs
    assert functorch_config.enable_autograd_cache  # the other one, not set by the user, is on


def test_markers_say_which_models_are_cached(tmp_path: Path, clean_cache_env: pytest.MonkeyPatch) -> None:
    caches = use_compile_caches(tmp_path)
    key = "ursa-h64-l2/float16 cuda 1x32x32"
    assert not caches.is_warm(key)
    caches.mark(key, 12.5)
    assert caches.is_warm(key) and not caches.is_warm(key + "-r4")
    assert json.loads(caches.marker(key).read_text())["compile_s"] == 12.5
    assert caches.marker(key).parent == tmp_path / "compile" / "compiled"


def test_default_mode_is_not_max_autotune(clean_cache_env: pytest.MonkeyPatch) -> None:
    """max-autotune benchmarks every matmul (75 s at URSA 512² on the H200): only on request."""
    cuda = compile_policy("cuda")
    assert cuda.mode is None and "mode" not in cuda.torch_compile_kwargs()
    clean_cache_env.setenv(comp.MODE_ENV, "max-autotune-no-cudagraphs")
    asked = compile_policy("cuda")
    assert asked.torch_compile_kwargs()["mode"] == "max-autotune-no-cudagraphs" and comp.MODE_ENV in asked.detail
    clean_cache_env.setenv(comp.MODE_ENV, "fastest")
    with pytest.raises(DifforgeError, match=comp.MODE_ENV):
        compile_policy("cuda")


def test_auto_compile_never_on_the_cpu_or_without_a_compiler() -> None:
    cpu = CompilePolicy("cpu", True, "inductor", None, "inductor", "default mode")
    assert not auto_compile(cpu, 1.0, 10_000, 50, True).compile
    missing = CompilePolicy("npu", False, detail="torchair is not importable")
    choice = auto_compile(missing, 1.0, 10_000, 50, True)
    assert not choice.compile and "torchair" in choice.reason


def test_auto_compile_rents_until_eager_has_lost_the_compile_cost() -> None:
    """Rent or buy: compile once (steps so far + this call's) x step x saved share reaches the estimated cost."""
    share = comp.AUTO_SAVED_SHARE["cuda"]
    step_s = 0.05  # URSA-1.7B 512² eager on the H200
    assert not auto_compile(CUDA, None, 10_000, 25, True).compile  # nothing measured yet: no estimate
    cold_steps = comp.COLD_COMPILE_S / (step_s * share)
    warm_steps = comp.WARM_COMPILE_S / (step_s * share)
    assert warm_steps < cold_steps
    below, at = int(cold_steps) - 30, int(cold_steps) + 1
    assert not auto_compile(CUDA, step_s, below, 25, False).compile
    chosen = auto_compile(CUDA, step_s, at, 25, False)
    assert chosen.compile and "cold cache" in chosen.reason and f"{at} + 25 steps" in chosen.reason
    # a warm cache makes the same run worth compiling much sooner
    assert not auto_compile(CUDA, step_s, int(warm_steps) - 30, 25, True).compile
    assert auto_compile(CUDA, step_s, int(warm_steps), 25, True).compile


@pytest.mark.skipif(not compile_policy("cpu").available, reason=f"no CPU compile here: {compile_policy('cpu').detail}")
def test_a_second_process_compiles_from_the_first_ones_cache(tmp_path: Path) -> None:
    """The same model compiled in two processes with one DIFFORGE_HOME: the first misses Inductor's graph cache and
    fills it under DIFFORGE_HOME, the second hits it for every graph.  How much time that saves is a benchmark's
    question (benchmarks/bench_compile_cache.py, ratio in benchmarks/RESULTS.md), not a timed unit test's."""
    env = {k: v for k, v in os.environ.items() if k not in (*comp.CACHE_ENV, *comp.CACHE_SWITCH_ENV)}
    env.update(DIFFORGE_HOME=str(tmp_path), PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))

    def one_process() -> dict[str, int]:
        out = subprocess.run([sys.executable, "-m", "benchmarks.compile_cache_child"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600, check=True)
        info = json.loads(out.stdout.strip().splitlines()[-1])
        assert info["folders"]["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile" / "inductor")
        return info["fxgraph_cache"]

    cold = one_process()
    assert cold.get("fxgraph_cache_miss", 0) > 0 and cold.get("fxgraph_cache_hit", 0) == 0, cold
    assert any((tmp_path / "compile" / "inductor").rglob("*")), "the first process left nothing in the cache"
    warm = one_process()
    assert warm.get("fxgraph_cache_hit", 0) >= cold["fxgraph_cache_miss"], (cold, warm)
    assert warm.get("fxgraph_cache_miss", 0) == 0, warm
