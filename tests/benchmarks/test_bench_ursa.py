"""Smoke test of benchmarks/bench_ursa.py on the tiny size: fields, ratios and token equality, never speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_ursa as bench


def test_tiny_bench_writes_complete_json(tmp_path: Path) -> None:
    out = tmp_path / "ursa.json"
    bench.main(["--tiny", "--steps", "3", "--warmup", "0", "--fast", "--draws", "--gumbel", "--threads", "1",
          "--no-reference", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["size"] == "tiny" and data["device"] == "cpu" and data["steps"] == 3
    names = [r["name"] for r in data["results"]]
    assert names[0].startswith("baseline") and "optimised (exact)" in names and any("philox-rng" in n for n in names)
    for r in data["results"]:
        for key in ("ms_per_step", "forwards_per_step", "tokens_per_forward", "flops_per_step", "tflops"):
            assert r[key] > 0, (r["name"], key)
        assert "mfu" in r and "peak_memory_bytes" in r
        assert r["extra"]["speedup_vs_baseline"] > 0 and len(r["extra"]["step_ms"]) == 3
        if r["notes"] == "exact":  # CPU float32: the exact switches must not move a token
            assert r["extra"]["tokens_equal_baseline"], r["name"]
        draws = r["extra"]["draws"]  # --draws: the instrumented run's draw and scheduler time, and their shares
        assert draws["draw_ms_per_step"] > 0 and draws["sampler_ms_per_step"] > 0  # draws include the initial codes
        assert 0 < draws["draw_share"] < 1 and 0 < draws["sampler_share"] < 1
        assert draws["cfg_ms_per_step"] > 0 and 0 < draws["cfg_share"] < 1  # CFG 7: the combine runs
    by_name = {r["name"]: r for r in data["results"]}
    assert by_name["optimised (exact)"]["extra"]["random_stream"] == "reference"  # the CPU's default
    assert by_name["optimised + philox-rng"]["extra"]["random_stream"] == "philox"
    assert by_name["optimised + philox-rng"]["extra"]["philox_sampler"] == "inverse-cdf"
    assert by_name["philox-rng, gumbel-max"]["extra"]["philox_sampler"] == "gumbel-max"
    assert by_name["optimised (exact)"]["extra"]["philox_sampler"] is None
    assert data["reference"] == []  # --no-reference
    assert by_name["optimised (exact)"]["forwards_per_step"] < 1  # reuse-first-forward saved a forward
    assert data["flops"]["flops_per_forward"] > 0 and data["flops"]["ms_at_ceiling"] > 0


def test_flops_only_counts_full_size_on_meta(tmp_path: Path) -> None:
    out = tmp_path / "flops.json"
    bench.main(["--size", "full", "--flops-only", "--json", str(out)])
    flops = json.loads(out.read_text())["flops"]
    assert flops["sequence_length"] == 320 + 1 + 32 * 32 and flops["rows"] == 2
    assert 1.9e9 < flops["parameters"] < 2.1e9
    # ~2 * non-embedding params * tokens: a wrong count (e.g. attention or lm_head missed) leaves this band
    assert 8.5e12 < flops["flops_per_forward"] < 9.5e12


def test_the_reference_is_reported_when_it_cannot_be_imported(tmp_path: Path, monkeypatch, capsys) -> None:
    """An empty DIFFORGE_DIFFNEXT_PATH and no diffnext in the environment: one line saying why, nothing timed."""
    import importlib.util

    import benchmarks.bench_ursa as bench

    monkeypatch.setenv(bench.DIFFNEXT_ENV, str(tmp_path))
    monkeypatch.setattr(bench, "REFERENCE_DIR", tmp_path / "reference")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "diffnext" else real_find_spec(name, *a))
    mods, why = bench.import_diffnext()
    assert mods is None and "diffnext is not importable" in why and bench.DIFFNEXT_ENV in why
    out = tmp_path / "ursa.json"
    bench.main(["--tiny", "--steps", "1", "--warmup", "0", "--threads", "1", "--json", str(out)])
    assert "reference (diffnext, eager): not timed - diffnext is not importable" in capsys.readouterr().out
    ref = json.loads(out.read_text())["reference"]
    assert len(ref) == 1 and ref[0]["available"] is False


def test_rope_theta_shim_answers_from_rope_parameters_only_while_open() -> None:
    """transformers 5 keeps Qwen3's rope_theta in rope_parameters; diffnext reads the attribute while it builds."""
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

    def read(config: Qwen3Config) -> object:
        return getattr(config, "rope_theta", None)

    native = read(Qwen3Config.from_dict({"rope_theta": 123456.0, "hidden_size": 64, "num_attention_heads": 2}))
    with bench.rope_theta_shim() as shimmed:
        config = Qwen3Config.from_dict({"rope_theta": 123456.0, "hidden_size": 64, "num_attention_heads": 2})
        assert read(config) == 123456.0  # the value given, not the class default
        assert shimmed == (native is None)
    assert read(Qwen3Config()) == native  # the class is as it was


@pytest.mark.skipif(bench.import_diffnext()[0] is None, reason=f"diffnext: {bench.import_diffnext()[1]}")
def test_the_reference_runs_in_the_same_process_and_ratios_are_printed(tmp_path: Path, capsys) -> None:
    """diffnext (DIFFORGE_DIFFNEXT_PATH, or reference/) on difforge's weights: same tokens, one ratio per row."""
    out = tmp_path / "ursa.json"
    payload = bench.main(["--tiny", "--steps", "2", "--json", str(out)])
    ref = payload["reference"][0]
    assert ref["available"], ref.get("why")
    assert ref["tokens_equal_baseline"] and not ref["weights_not_copied"]
    assert set(ref["ratios"]) == {r.name for r in payload["results"]} and all(v > 0 for v in ref["ratios"].values())
    assert "the reference's speed" in capsys.readouterr().out


def test_fused_kernels_off_is_a_variant_where_the_backend_offers_them(monkeypatch) -> None:
    """The kernels' off state runs beside the default (its tokens are their off-identity check); the switch is
    the backend's environment variable, set for that variant only."""
    import torch

    from difforge.devices import CPUBackend

    backend = CPUBackend()
    args = bench.parse_args(["--tiny"])
    assert all(v.kernels is None for v in bench.variants(args, backend))  # the CPU offers none
    monkeypatch.setattr(backend, "fused_kernel", lambda op: object())
    names = [v.name for v in bench.variants(args, backend)]
    assert names[:3] == ["baseline (exact opts off, eager)", "optimised (exact)", "optimised, fused kernels off"]
    monkeypatch.setenv(bench.KERNELS_ENV, "rotary")
    pipe = bench.build_pipeline(bench.SIZES["tiny"], CPUBackend(), torch.float32, 0)
    seen, moved = [], []
    monkeypatch.setattr(pipe.transformer, "set_ops", lambda ops: seen.append(bench.os.environ.get(bench.KERNELS_ENV)))
    monkeypatch.setattr(pipe.scheduler, "to", lambda device: moved.append(bench.os.environ.get(bench.KERNELS_ENV)))
    with bench.fused_kernels(pipe, "off"):
        assert bench.os.environ[bench.KERNELS_ENV] == "off"
    assert bench.os.environ[bench.KERNELS_ENV] == "rotary" and seen == moved == ["off", "rotary"]


def test_no_host_stream_leaves_the_host_drawn_variant_out_on_an_accelerator() -> None:
    from difforge.devices import CUDABackend

    backend = CUDABackend()  # only asked for its stream and kernels here: no GPU needed
    assert backend.random_stream == "philox"
    with_host = [v.name for v in bench.variants(bench.parse_args(["--tiny", "--compile"]), backend)]
    without = [v.name for v in bench.variants(bench.parse_args(["--tiny", "--compile", "--no-host-stream"]), backend)]
    assert "optimised, reference stream" in with_host and without == [n for n in with_host if "reference stream" not in n]


def test_a_run_stopped_midway_leaves_the_variants_it_finished(tmp_path: Path, monkeypatch) -> None:
    """Each finished variant is written at once (``partial``): a step stopped at its time cap keeps its rows."""
    out = tmp_path / "ursa.json"
    real = bench.run_variant
    done = []

    def second_one_dies(*a, **k):
        if done:
            raise KeyboardInterrupt  # what a timeout's signal does to the run, between two variants
        done.append(1)
        return real(*a, **k)

    monkeypatch.setattr(bench, "run_variant", second_one_dies)
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--tiny", "--steps", "2", "--warmup", "0", "--no-reference", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["partial"] and [r["name"] for r in data["results"]] == ["baseline (exact opts off, eager)"]
    assert data["results"][0]["extra"]["tokens_equal_baseline"] and data["benchmark"] == "ursa"
