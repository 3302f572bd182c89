"""``difforge capture`` then ``difforge validate --capture``: the device's half made in one process, judged in another.

Through the real CLI in subprocesses, as on two machines: the capture runs on the "device" (here the CPU in
bfloat16), inside ``tests.validate.fault_cli`` so a planted fault breaks only the capturing process; the judge
runs clean and computes the reference and the floor.  Both families: a clean capture PASSes, a broken one
FAILs.  Refused (exit 2, one line, nothing written): a changed file of the bundle, other weights, another
``--steps``, a golden bundle given as a capture.  The stored operator calls are replayed bit for bit like
the live ones.  ``tests/fixtures/captures/`` is where device captures go: each is judged here, and a clean one
(its manifest says ``clean``) must PASS; with none there, a CPU capture made here stands in, so the judging
path always runs.  Sizes are small (64x64, --quick) so the file stays near two minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from difforge.models.registry import resolve_model

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "captures"
SIZE = ["--height", "64", "--width", "64", "--quick"]
#: The device kit's budget per capture (eight in its 8 MB tarball): most tests below capture under it.
BUDGET = ["--max-bytes", "1M"]
DEVICE = ["--device", "cpu", "--dtype", "bfloat16", "--rounds", "1", "--warmup", "0", "--no-speed-table", "--quiet"]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}", "OMP_NUM_THREADS": "1"}
    env.pop("DIFFORGE_DEBUG", None)
    return env


def _cli(*args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = ([sys.executable, "-m", "tests.validate.fault_cli", fault, "--", *args] if fault is not None
           else [sys.executable, "-m", "difforge", *args])
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)


def _capture(model: str, out: Path, fault: str = "none", *extra: str) -> Path:
    res = _cli("capture", "--model", model, *DEVICE, *SIZE, *extra, "--out", str(out), fault=fault)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "capture:" in res.stdout
    return out


def _judge(capture: Path, report: Path, *extra: str) -> tuple[int, dict]:
    res = _cli("validate", "--capture", str(capture), "--quiet", *extra, "--out", str(report))
    assert res.returncode in (0, 1), res.stderr[-2000:]
    return res.returncode, json.loads((report / "report.json").read_text())


def _rungs(data: dict) -> dict[str, str]:
    return {k: v["verdict"] for k, v in data["rungs"].items()}


@pytest.fixture(scope="module")
def clean_ursa(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _capture("tiny-ursa", tmp_path_factory.mktemp("capture") / "ursa", "none", "--clean")


# ---- end to end, two processes, both families ---------------------------------------------------------
def test_clean_ursa_capture_passes_when_judged_in_another_process(clean_ursa: Path, tmp_path: Path) -> None:
    code, data = _judge(clean_ursa, tmp_path / "r")
    assert code == 0 and data["verdict"] == "PASS", _rungs(data)
    rungs = _rungs(data)
    assert {rungs[k] for k in ("operator", "component", "step", "trajectory", "determinism")} == {"PASS"}
    manifest = json.loads((clean_ursa / "manifest.json").read_text())
    assert data["capture"]["device"] == manifest["device"]["label"] == "cpu bfloat16"
    assert len(data["capture"]["digest"]) == 64 and data["capture"]["environment"]
    assert any("capture" in note and data["capture"]["digest"][:16] in note for note in data["notes"])
    assert "--capture" in data["reproduce"][0]
    assert data["signoff"]["weights"] == manifest["weights"] and manifest["weights"]
    # the step rung teacher-forced on the device's own states, one row per recorded step
    steps = data["rungs"]["step"]["data"]["seeds"][0]["steps"]
    assert len(steps) == len(json.loads((clean_ursa / "data.json").read_text())["steps"]["0"]) == 4
    assert all("sampler" in p for p in steps[:-1])  # the sampler judged on the device's logits and targets
    # the benchmark is the device's timing, read from the capture
    assert data["rungs"]["benchmark"]["data"]["memory_after_load_bytes"] == manifest["device"]["memory_after_load"]


def _bundle_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_budgeted_clean_ursa_capture_fits_and_passes(tmp_path: Path) -> None:
    """--max-bytes 1M (the device kit's): every file of the bundle together within 10^6 bytes, the caps it used
    in the manifest and the report, and still PASS on every rung."""
    capture = _capture("tiny-ursa", tmp_path / "c", "none", *BUDGET)
    assert _bundle_bytes(capture) <= 10**6
    budget = json.loads((capture / "manifest.json").read_text())["budget"]
    assert budget["max_bytes"] == 10**6 and budget["level"] >= 1 and budget["calls_per_op"] == 1, budget
    tensors = load_file(str(capture / "tensors.safetensors"))  # no tensor stored twice
    assert len({(str(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes())
                for t in tensors.values()}) == len(tensors)
    code, data = _judge(capture, tmp_path / "r")
    assert code == 0 and data["verdict"] == "PASS", _rungs(data)
    assert {_rungs(data)[k] for k in ("operator", "component", "step", "trajectory", "determinism")} == {"PASS"}
    assert data["capture"]["budget"] == budget
    assert any(f"--max-bytes 1000000 (level {budget['level']}:" in note and f"{budget['call_bytes']} B per call" in note
               for note in data["notes"]), data["notes"]


def test_impossible_budget_is_one_line_naming_the_size_needed(tmp_path: Path) -> None:
    out = tmp_path / "c"
    res = _cli("capture", "--model", "tiny-ursa", *DEVICE, *SIZE, "--max-bytes", "20KiB", "--out", str(out))
    _one_line_refusal(res, "--max-bytes 20480 is too small", "needs")
    need = int(res.stderr.split("needs ")[1].split()[0])
    assert need > 20480 and not out.exists()
    res = _cli("capture", "--model", "tiny-ursa", *DEVICE, *SIZE, "--max-bytes", "1 parsec", "--out", str(out))
    _one_line_refusal(res, "--max-bytes", "not a size")
    assert not out.exists()


def test_broken_ursa_capture_fails(tmp_path: Path) -> None:
    """Under the kit's budget: one call per op type and sampled outputs still see a shifted embedding on every
    rung that looks at it, and the sampled block outputs still locate it."""
    capture = _capture("tiny-ursa", tmp_path / "c", "embedding_shift", *BUDGET)
    assert _bundle_bytes(capture) <= 10**6
    code, data = _judge(capture, tmp_path / "r")
    assert code == 1 and data["verdict"] == "FAIL"
    rungs = _rungs(data)
    assert rungs["component"] == "FAIL" and rungs["step"] == "FAIL", rungs
    assert rungs["operator"] == "FAIL", rungs  # the stored embedding calls, replayed on the judge's kernels
    loc = data["rungs"]["step"]["data"]["localisation"]  # located from the device's recorded block outputs
    assert loc is not None and loc["first_divergent"] == "model.embed_tokens"


@pytest.mark.slow  # two tiny-qwen-edit captures, each judged in another process: minutes under load (make test-slow)
def test_qwen_edit_capture_passes_clean_and_fails_broken(tmp_path: Path) -> None:
    """Both under the kit's budget (--max-bytes 1M)."""
    clean = _capture("tiny-qwen-edit", tmp_path / "clean", "none", *BUDGET)
    assert _bundle_bytes(clean) <= 10**6
    code, data = _judge(clean, tmp_path / "rc")
    assert code == 0 and data["verdict"] == "PASS", _rungs(data)
    assert {_rungs(data)[k] for k in ("operator", "component", "step", "trajectory")} == {"PASS"}
    point = data["rungs"]["step"]["data"]["seeds"][0]["steps"][0]
    assert set(point["post_network"]) >= {"latents_next", "vae_input"}  # fed the device's own stored outputs
    assert {"cond_pred", "uncond_pred"} <= set(point["outputs"])
    broken = _capture("tiny-qwen-edit", tmp_path / "broken", "linear_noise", *BUDGET)
    code, data = _judge(broken, tmp_path / "rb")
    assert code == 1 and data["verdict"] == "FAIL"
    rungs = _rungs(data)
    assert rungs["component"] == "FAIL" and rungs["step"] == "FAIL", rungs


def test_sampler_fault_in_an_ursa_capture_fails(tmp_path: Path) -> None:
    """exp computed as 2**x in URSA's jump probability: only the sampler step (the judge's sampler run on the
    device's stored logits and targets) sees it."""
    capture = _capture("tiny-ursa", tmp_path / "c", "exp_base2", *BUDGET)
    code, data = _judge(capture, tmp_path / "r")
    assert code == 1 and _rungs(data)["step"] == "FAIL", _rungs(data)
    sampler = [p.get("sampler", {}) for p in data["rungs"]["step"]["data"]["seeds"][0]["steps"]]
    assert any(v.get("decision", "").startswith("rel-L2") and v["ratio"] > 3 for s in sampler for v in s.values()
               if isinstance(v, dict)), sampler


@pytest.mark.slow  # a tiny-qwen-edit capture judged in another process: minutes under load (make test-slow)
def test_post_network_fault_in_a_qwen_edit_capture_fails(tmp_path: Path) -> None:
    """The true-CFG direction reversed after the network: the network's outputs are clean, so only the
    post-network stages (fed the device's own stored outputs on every side) can see it."""
    capture = _capture("tiny-qwen-edit", tmp_path / "c", "cfg_sub_swap", *BUDGET)
    code, data = _judge(capture, tmp_path / "r")
    assert code == 1 and _rungs(data)["step"] == "FAIL", _rungs(data)
    post = [p.get("post_network", {}) for p in data["rungs"]["step"]["data"]["seeds"][0]["steps"]]
    assert any(v["verdict"] == "FAIL" for stages in post for v in stages.values()), post


def test_a_capture_teacher_forced_on_a_golden_bundle_is_judged_against_it(clean_ursa: Path, tmp_path: Path) -> None:
    """capture --golden G: the device replays the golden reference's states; validate --capture C --golden G then
    computes nothing of the reference (both halves made elsewhere).  Clean PASS, broken FAIL; a capture made on
    its own states, or on another bundle, is refused with that bundle."""
    golden = tmp_path / "golden"
    res = _cli("golden", "--model", "tiny-ursa", "--dtype", "bfloat16", *SIZE, "--quiet", "--out", str(golden))
    assert res.returncode == 0, res.stderr[-2000:]
    clean = _capture("tiny-ursa", tmp_path / "clean", "none", "--golden", str(golden))
    code, data = _judge(clean, tmp_path / "rc", "--golden", str(golden))
    assert code == 0 and data["verdict"] == "PASS", _rungs(data)
    assert "golden bundle" in data["floor_label"] and data["capture"]["device"] == "cpu bfloat16"
    broken = _capture("tiny-ursa", tmp_path / "broken", "embedding_shift", "--golden", str(golden))
    code, data = _judge(broken, tmp_path / "rb", "--golden", str(golden))
    assert code == 1 and _rungs(data)["component"] == "FAIL" and _rungs(data)["step"] == "FAIL", _rungs(data)
    res = _cli("validate", "--capture", str(clean_ursa), "--golden", str(golden), "--out", str(tmp_path / "r"))
    _one_line_refusal(res, "own states")
    assert not (tmp_path / "r").exists()


# ---- refusals --------------------------------------------------------------------------------------------
def _one_line_refusal(res: subprocess.CompletedProcess[str], *words: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_changed_bundle_is_refused(clean_ursa: Path, tmp_path: Path) -> None:
    changed = tmp_path / "changed"
    shutil.copytree(clean_ursa, changed)
    tensors = load_file(str(changed / "tensors.safetensors"))
    name = next(k for k, v in tensors.items() if k.startswith("components/dut/"))
    tensors[name] = tensors[name] * 0.5  # a "better" device output, pasted in
    save_file(tensors, str(changed / "tensors.safetensors"))
    report = tmp_path / "r"
    res = _cli("validate", "--capture", str(changed), "--out", str(report))
    _one_line_refusal(res, "tensors.safetensors", "sha256")
    assert not report.exists()


def test_capture_of_other_weights_is_refused(clean_ursa: Path, tmp_path: Path) -> None:
    folder, _ = resolve_model("tiny-ursa")
    other = tmp_path / "other-ursa"
    shutil.copytree(folder, other)
    weights = sorted((other / "transformer").glob("*.safetensors"))[0]
    tensors = load_file(str(weights))
    name = next(k for k, v in tensors.items() if v.is_floating_point())
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, str(weights))
    report = tmp_path / "r"
    res = _cli("validate", "--capture", str(clean_ursa), "--model", str(other), "--out", str(report))
    _one_line_refusal(res, "other weights", weights.name)
    assert not report.exists()


def test_other_settings_and_bundles_are_refused(clean_ursa: Path, tmp_path: Path) -> None:
    report = tmp_path / "r"
    res = _cli("validate", "--capture", str(clean_ursa), "--steps", "5", "--out", str(report))
    _one_line_refusal(res, "--steps")
    res = _cli("validate", "--capture", str(clean_ursa), "--dtype", "float16", "--out", str(report))
    _one_line_refusal(res, "--dtype")
    res = _cli("validate", "--capture", str(clean_ursa), "--msprobe", "--out", str(report))
    _one_line_refusal(res, "--msprobe")
    not_a_capture = tmp_path / "golden-like"
    shutil.copytree(clean_ursa, not_a_capture)
    manifest = not_a_capture / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"difforge-capture"', '"difforge-golden"'))
    res = _cli("validate", "--capture", str(not_a_capture), "--out", str(report))
    _one_line_refusal(res, "not a capture bundle")
    assert not report.exists()


# ---- the stored operator calls replay like the live ones ---------------------------------------------------
@pytest.mark.parametrize("model", ["tiny-ursa", "tiny-qwen-edit"])
def test_stored_operator_calls_replay_bit_for_bit(model: str, tmp_path: Path) -> None:
    from difforge.api import load_pipeline
    from difforge.config import RunConfig
    from difforge.models.registry import probe_for
    from difforge.validate.bundle import CAPTURE_FORMAT, BundleWriter, Reducer, open_bundle
    from difforge.validate.opstore import load_capture, store_capture
    from difforge.validate.steps import StepTrace
    from difforge.validate.tracing import _map, probe_captures, replay

    cfg = RunConfig(model=model, prompt="a red circle", device="cpu", dtype="bfloat16", height=64, width=64,
                    steps=2, quiet=True)
    from difforge.engine import run_pipeline

    pipe = load_pipeline(model, "cpu", "bfloat16", cfg=cfg)
    trace = StepTrace()
    images = None
    if probe_for(pipe).takes_images:
        from difforge.runtime.images import test_picture

        images = [test_picture(64)]
    run_pipeline(pipe, cfg, images=images, step_hook=trace.hook)
    probe = probe_for(pipe)
    live = list(probe_captures(probe, cfg, trace.inputs[0]))
    writer = BundleWriter(tmp_path, Reducer())
    data = {"captures": [writer.put(store_capture(c), f"c{k}") for k, c in enumerate(live)]}
    writer.finish({"format": CAPTURE_FORMAT, "format_version": 1, "difforge": __import__("difforge").__version__},
                  data)
    stored = open_bundle(tmp_path, fmt=CAPTURE_FORMAT, flag="--capture").data["captures"]
    ops = set()
    for cap, back in zip(live, (load_capture(s) for s in stored), strict=True):
        assert back.component == cap.component and back.seen == cap.seen
        for op, calls in cap.calls.items():
            for a, b in zip(calls, back.calls[op], strict=True):
                # a bundle stores tensors contiguous; the live copy may keep a channels-last layout, whose
                # kernel rounds differently: the same function on the same layout must give the same bits
                ref_a, floor_a = replay(replace(a, args=_map(a.args, lambda t: t.contiguous())))
                ref_b, floor_b = replay(b)
                assert b.dtype == a.dtype and torch.equal(b.out, a.out)
                assert torch.equal(ref_a, ref_b) and torch.equal(floor_a, floor_b), (op, a.func, a.how)
                ops.add(op)
    assert {"linear", "conv2d"} <= ops, ops


def test_every_traced_op_type_round_trips_through_a_bundle(tmp_path: Path) -> None:
    """Op types the tiny models may not reach (a transposed convolution kept whole, attention with its own
    floor, interpolation, the pointwise ops, the norms) stored, read back and replayed as the live calls."""
    import torch.nn.functional as F  # noqa: N812

    from difforge.validate.bundle import CAPTURE_FORMAT, BundleWriter, Reducer, open_bundle
    from difforge.validate.opstore import load_capture, store_capture
    from difforge.validate.tracing import _map, capture, replay

    gen = torch.Generator().manual_seed(0)

    def bf16(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    def forward() -> None:
        x = bf16(1, 4, 8, 8)
        F.conv_transpose2d(x, bf16(4, 3, 3, 3), bf16(3), stride=2)
        F.interpolate(x, scale_factor=2.0, mode="nearest")
        F.gelu(x, approximate="tanh")
        F.silu(x)
        torch.softmax(x, -1)
        F.group_norm(x, 2, bf16(4), bf16(4))
        F.layer_norm(x, (8,), bf16(8), bf16(8))
        F.rms_norm(x, (8,), bf16(8))
        F.normalize(x, dim=1)
        q = bf16(1, 2, 16, 8)
        F.scaled_dot_product_attention(q, bf16(1, 2, 16, 8), bf16(1, 2, 16, 8), is_causal=True)
        torch.matmul(bf16(3, 5), bf16(5, 7))
        F.embedding(torch.tensor([[1, 3, 5]]), bf16(8, 4))

    live = capture("unit", forward)
    writer = BundleWriter(tmp_path, Reducer())
    data = {"capture": writer.put(store_capture(live), "c")}
    writer.finish({"format": CAPTURE_FORMAT, "format_version": 1, "difforge": __import__("difforge").__version__},
                  data)
    back = load_capture(open_bundle(tmp_path, fmt=CAPTURE_FORMAT, flag="--capture").data["capture"])
    assert set(back.calls) == set(live.calls) >= {"conv_transpose2d", "scaled_dot_product_attention", "interpolate",
                                                  "gelu", "group_norm", "rms_norm", "normalize", "embedding"}
    for op, calls in live.calls.items():
        for a, b in zip(calls, back.calls[op], strict=True):
            ref_a, floor_a = replay(replace(a, args=_map(a.args, lambda t: t.contiguous())))
            ref_b, floor_b = replay(b)
            assert torch.equal(ref_a, ref_b) and torch.equal(floor_a, floor_b), (op, a.how)
    assert any(c.how == "whole call" for c in back.calls["conv_transpose2d"])


# ---- device captures kept in the repository ------------------------------------------------------------------
def _fixture_captures() -> list[Path]:
    return sorted(p.parent for p in FIXTURES.glob("*/manifest.json"))


def test_every_kept_device_capture_is_judged(clean_ursa: Path, tmp_path: Path) -> None:
    """Each capture under tests/fixtures/captures/ is judged; one whose manifest says ``clean`` must PASS.  With
    none kept, the CPU capture made above stands in, so this never passes without judging one."""
    captures = _fixture_captures() or [clean_ursa]
    for k, capture in enumerate(captures):
        manifest = json.loads((capture / "manifest.json").read_text())
        code, data = _judge(capture, tmp_path / f"r{k}")
        assert data["capture"]["device"] == manifest["device"]["label"]
        if manifest.get("clean"):
            assert code == 0 and data["verdict"] == "PASS", (capture.name, _rungs(data), data["verdict_reasons"])


# ---- the byte budget's parts ------------------------------------------------------------------------------------
def test_max_bytes_units() -> None:
    from difforge.errors import InputError
    from difforge.validate.budget import parse_bytes

    assert parse_bytes("1M") == parse_bytes("1MB") == 10**6 and parse_bytes("1MiB") == 2**20
    assert parse_bytes("8000000") == 8 * 10**6 and parse_bytes("1.5k") == 1500 and parse_bytes(None) is None
    for bad in ("", "1X", "-1M", "0", "M"):
        with pytest.raises(InputError):
            parse_bytes(bad)


def test_size_estimate_is_what_finish_writes(tmp_path: Path) -> None:
    """The budget is checked on :meth:`BundleWriter.size` before writing: it must be the bytes written, and a
    rolled-back part (tensors and sampling plans) must leave nothing behind."""
    from PIL import Image

    from difforge.validate.bundle import CAPTURE_FORMAT, BundleWriter, Reducer

    writer = BundleWriter(tmp_path, Reducer(limits={"block_full": 16, "block_sample": 8}))
    data = {"a": writer.put({"x": torch.ones(3, 5, dtype=torch.bfloat16), "n": [1, 2.5, None]}, "a"),
            "img": writer.image(Image.new("RGB", (8, 8), (200, 10, 10)), "images/x.png")}
    mark = writer.mark()
    data["b"] = writer.put(writer.reducer.block(torch.arange(100.0)), "b")
    assert data["b"]["__tensor__"] in writer.tensors and writer.reducer.plans
    writer.rollback(mark)
    assert set(writer.tensors) == {"a/x"} and not writer.reducer.plans
    writer.reducer.block_sample = 4
    data["b"] = writer.put(writer.reducer.block(torch.arange(100.0)), "b")
    assert writer.tensors["b"].numel() == 4
    manifest = {"format": CAPTURE_FORMAT, "format_version": 1, "difforge": __import__("difforge").__version__,
                "created": "2026-12-04T00:00:00Z"}
    need = writer.size(manifest, data)
    writer.finish(manifest, data)
    written = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert need >= written and need - written <= 64, (need, written)
    from difforge.validate.bundle import open_bundle

    back = open_bundle(tmp_path, fmt=CAPTURE_FORMAT, flag="--capture")
    assert back.reducer.limits["block_sample"] == 4 and back.reducer.block(torch.arange(100.0)).numel() == 4
