"""CLI contract: every bad input gives one sentence on stderr, exit code 2, and no output file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from difforge import cli
from difforge.cli import app
from difforge.models.tiny import ensure_tiny

runner = CliRunner()


def _invoke(args: list[str]):
    return runner.invoke(app, args, catch_exceptions=False)


def assert_clean_failure(result, out_dir: Path, needle: str, code: int = 2) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("difforge: error: "), err
    assert len(err.splitlines()) == 1, f"expected one line, got: {err!r}"
    assert "Traceback" not in result.stdout + result.stderr
    assert needle.lower() in err.lower(), err
    leftovers = [p.name for p in out_dir.iterdir()]
    assert leftovers == [] or all(p == "in.png" for p in leftovers), leftovers


@pytest.fixture
def in_png(tmp_out: Path) -> Path:
    from difforge.demo import write_test_picture

    return write_test_picture(tmp_out / "in.png", size=64)


def _copy_model(name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(ensure_tiny(name), target)
    return target


# ---- devices, dtypes, options ------------------------------------------------------------------


def test_unknown_device(tmp_out: Path) -> None:
    r = _invoke(["generate", "--prompt", "x", "--device", "tpu", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "unknown device 'tpu'")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_not_present(tmp_out: Path) -> None:
    r = _invoke(["generate", "--prompt", "x", "--device", "cuda:1", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "not present")


def test_unknown_and_unsupported_dtype(tmp_out: Path) -> None:
    r = _invoke(["generate", "--prompt", "x", "--device", "cpu", "--dtype", "float8", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "unknown dtype")
    r = _invoke(["generate", "--prompt", "x", "--device", "cpu", "--dtype", "float16", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "not supported on cpu")


def test_steps_below_two(tmp_out: Path, in_png: Path) -> None:
    r = _invoke(["edit", "--image", str(in_png), "--prompt", "x", "--steps", "1", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "at least 2")
    r = _invoke(["generate", "--prompt", "x", "--steps", "0", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "at least 2")


def test_unknown_offload_plan(tmp_out: Path) -> None:
    r = _invoke(["generate", "--prompt", "x", "--offload", "disk", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "offload")


# ---- model folders -------------------------------------------------------------------------------


def test_missing_model_folder(tmp_out: Path) -> None:
    r = _invoke(["generate", "--prompt", "x", "--model", str(tmp_out / "nope"), "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "not found")


def test_folder_without_model_index(tmp_path: Path, tmp_out: Path) -> None:
    (tmp_path / "empty").mkdir()
    r = _invoke(["generate", "--prompt", "x", "--model", str(tmp_path / "empty"), "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "model_index.json")


def test_folder_of_another_family(tmp_out: Path, in_png: Path) -> None:
    r = _invoke(["generate", "--prompt", "x", "--model", "tiny-qwen-edit", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "needs a ursa model")
    r = _invoke(["edit", "--image", str(in_png), "--prompt", "x", "--model", "tiny-ursa", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "needs a qwen-edit")


def test_unsupported_pipeline_class(tmp_path: Path, tmp_out: Path) -> None:
    folder = tmp_path / "sd"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    r = _invoke(["generate", "--prompt", "x", "--model", str(folder), "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "StableDiffusionPipeline")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete"])
def test_broken_ursa_weights(tmp_path: Path, tmp_out: Path, damage: str) -> None:
    folder = _copy_model("tiny-ursa", tmp_path)
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    if damage == "truncate":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        weights.write_bytes(b"\x00\x01not a safetensors file" * 10)
    else:
        weights.unlink()
    r = _invoke(["generate", "--prompt", "x", "--model", str(folder), "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "safetensors")


@pytest.mark.parametrize("damage", ["truncate", "missing-shard"])
def test_broken_qwen_weights(tmp_path: Path, tmp_out: Path, in_png: Path, damage: str) -> None:
    from safetensors.torch import load_file, save_file

    folder = _copy_model("tiny-qwen-edit", tmp_path)
    tdir = folder / "transformer"
    weights = tdir / "diffusion_pytorch_model.safetensors"
    if damage == "truncate":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) - 100])
        needle = "truncated"
    else:  # re-shard into two files, then lose the second
        sd = load_file(str(weights))
        keys = sorted(sd)
        half = len(keys) // 2
        names = ["diffusion_pytorch_model-00001-of-00002.safetensors", "diffusion_pytorch_model-00002-of-00002.safetensors"]
        save_file({k: sd[k] for k in keys[:half]}, str(tdir / names[0]))
        weight_map = {k: names[0] if i < half else names[1] for i, k in enumerate(keys)}
        (tdir / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        weights.unlink()
        needle = "missing shard"
    r = _invoke(["edit", "--image", str(in_png), "--prompt", "x", "--model", str(folder), "--steps", "2",
                 "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, needle)


# ---- inputs --------------------------------------------------------------------------------------


def test_input_not_an_image(tmp_out: Path) -> None:
    bogus = tmp_out / "in.png"
    bogus.write_text("definitely not a PNG")
    r = _invoke(["edit", "--image", str(bogus), "--prompt", "x", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "not an image")


def test_missing_input_image(tmp_out: Path) -> None:
    r = _invoke(["edit", "--image", str(tmp_out / "nope.png"), "--prompt", "x", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "does not exist")


def test_size_not_multiple_of_stride(tmp_out: Path, in_png: Path) -> None:
    r = _invoke(["generate", "--prompt", "x", "--height", "100", "--width", "64", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "multiple")
    r = _invoke(["edit", "--image", str(in_png), "--prompt", "x", "--height", "70", "--width", "64", "--steps", "2",
                 "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "multiple")


def test_out_of_memory_names_next_plan(tmp_out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge.models.ursa import URSAPipeline

    def boom(self, *a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(URSAPipeline, "__call__", boom)
    r = _invoke(["generate", "--prompt", "x", "--device", "cpu", "--output", str(tmp_out / "a.png"),
                 "--record", str(tmp_out / "r.json")])
    assert_clean_failure(r, tmp_out, "ran out of memory")  # on the CPU the hint is a smaller size, not offload
    assert "--offload" not in r.output


def test_unexpected_error_is_one_line(tmp_out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge.models.ursa import URSAPipeline

    def boom(self, *a, **k):
        raise RuntimeError("kernel exploded\nwith a second line")

    monkeypatch.setattr(URSAPipeline, "__call__", boom)
    r = _invoke(["generate", "--prompt", "x", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "kernel exploded", code=1)


# ---- happy paths ---------------------------------------------------------------------------------


def test_generate_twice_is_byte_identical_and_records(tmp_out: Path) -> None:
    outs = []
    for i in range(2):
        png, rec = tmp_out / f"a{i}.png", tmp_out / f"a{i}.json"
        r = _invoke(["generate", "--prompt", "a red circle", "--seed", "0", "--output", str(png), "--record", str(rec),
                     "--quiet"])
        assert r.exit_code == 0, r.stderr
        outs.append(png.read_bytes())
        data = json.loads(rec.read_text())
        assert set(data["phases"]) >= {"load", "encode", "denoise", "decode", "save"}
        assert len(data["step_times_s"]) == 25
        assert data["outputs"][0]["path"] == str(png)
        assert data["backend"]["device"] == "cpu"
    assert outs[0] == outs[1]


def test_edit_twice_is_byte_identical_and_plus_takes_two_images(tmp_out: Path, in_png: Path) -> None:
    outs = []
    for i in range(2):
        png = tmp_out / f"e{i}.png"
        r = _invoke(["edit", "--image", str(in_png), "--prompt", "make it red", "--seed", "0", "--steps", "3",
                     "--output", str(png), "--quiet"])
        assert r.exit_code == 0, r.stderr
        outs.append(png.read_bytes())
    assert outs[0] == outs[1]
    rec = tmp_out / "plus.json"
    r = _invoke(["edit", "--model", "tiny-qwen-edit-plus", "--image", str(in_png), "--image", str(in_png),
                 "--prompt", "combine", "--steps", "2", "--output", str(tmp_out / "p.png"), "--record", str(rec), "--quiet"])
    assert r.exit_code == 0, r.stderr
    data = json.loads(rec.read_text())
    assert data["config"]["images"] == [str(in_png), str(in_png)]
    assert len(data["step_times_s"]) == 2


def test_doctor_json() -> None:
    r = _invoke(["doctor", "--json"])
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["packages"]["torch"] == torch.__version__
    assert [b["name"] for b in info["backends"]] == ["npu", "cuda", "xpu", "mps", "cpu"]  # the auto order
    cpu = info["backends"][-1]
    assert cpu["available"] and cpu["count"] == 1
    assert info["auto"]["backend"] == ("cuda" if torch.cuda.is_available() else "cpu")


# ---- nothing in a model folder is ever executed ----------------------------------------------------


def _plant_payload(folder: Path, marker: Path) -> None:
    """Python files a hostile folder could carry: importing or running any of them writes ``marker``."""
    code = f"open({str(marker)!r}, 'w').write('executed')\n"
    for sub in ("", "transformer", "vae", "scheduler", "text_encoder"):
        if (folder / sub).is_dir():
            for name in ("__init__.py", f"__{sub or 'pipeline'}__.py", f"{sub or 'pipeline'}.py", "modeling.py"):
                (folder / sub / name).write_text(code)


def test_python_files_in_an_ursa_folder_are_never_run(tmp_path: Path, tmp_out: Path) -> None:
    folder = _copy_model("tiny-ursa", tmp_path)
    marker = tmp_path / "pwned"
    _plant_payload(folder, marker)
    r = _invoke(["generate", "--prompt", "x", "--model", str(folder), "--steps", "2", "--height", "64", "--width", "64",
                 "--output", str(tmp_out / "a.png"), "--quiet"])
    assert r.exit_code == 0, r.stderr
    assert not marker.exists()


def test_qwen_folder_asking_for_custom_code_is_refused(tmp_path: Path, tmp_out: Path, in_png: Path) -> None:
    folder = _copy_model("tiny-qwen-edit", tmp_path)
    marker = tmp_path / "pwned"
    _plant_payload(folder, marker)
    index = folder / "model_index.json"
    data = json.loads(index.read_text())
    index.write_text(json.dumps({**data, "transformer": ["modeling", "QwenImageTransformer2DModel"]}))
    r = _invoke(["edit", "--image", str(in_png), "--prompt", "x", "--model", str(folder), "--steps", "2",
                 "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "transformer")
    assert not marker.exists()


# ---- outputs that cannot be written fail before any work ------------------------------------------


def test_output_problems_fail_before_loading(tmp_out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge import api

    def must_not_load(*a, **k):
        raise AssertionError("the model was loaded before the output path was checked")

    monkeypatch.setattr(api, "load_pipeline", must_not_load)
    (tmp_out / "taken.png").mkdir()
    r = _invoke(["generate", "--prompt", "x", "--output", str(tmp_out / "taken.png")])
    assert_clean_failure(r, tmp_out / "taken.png", "is a directory")
    r = _invoke(["generate", "--prompt", "x", "--output", str(tmp_out / "a.txt")])
    assert_clean_failure(r, tmp_out / "taken.png", "cannot write output a.txt")
    (tmp_out / "file").write_text("a file where a folder should be")
    r = _invoke(["generate", "--prompt", "x", "--output", str(tmp_out / "file" / "sub" / "a.png")])
    assert_clean_failure(r, tmp_out / "taken.png", "not a writable folder")
    r = _invoke(["generate", "--prompt", "x", "--output", str(tmp_out / "a.png"), "--record", str(tmp_out / "taken.png")])
    assert_clean_failure(r, tmp_out / "taken.png", "is a directory")
    r = _invoke(["generate", "--prompt", "x", "--num-frames", "1", "--output", str(tmp_out / "a.gif")])
    assert_clean_failure(r, tmp_out / "taken.png", "cannot write output a.gif")
    assert sorted(p.name for p in tmp_out.iterdir()) == ["file", "taken.png"]


def test_folders_given_as_files(tmp_out: Path) -> None:
    r = _invoke(["edit", "--image", str(tmp_out), "--prompt", "x", "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "is a folder")
    r = _invoke(["edit", "--image", str(tmp_out), "--prompt", "x", "--transformer", str(tmp_out),
                 "--output", str(tmp_out / "a.png")])
    assert_clean_failure(r, tmp_out, "is a folder")


def test_oom_hint_follows_the_family() -> None:
    from difforge.errors import out_of_memory_message

    assert "--vae-tiling" not in out_of_memory_message("cuda:0", "before-decode", "ursa")
    assert "--offload model" in out_of_memory_message("cuda:0", "before-decode", "ursa")
    assert "sequential" not in out_of_memory_message("cuda:0", "model", "ursa")
    assert "--offload sequential and --vae-tiling" in out_of_memory_message("npu:0", "model", "qwen-edit")
    assert "reduce --height/--width" in out_of_memory_message("npu:0", "sequential", "qwen-edit-plus")


# ---- ecosystem spellings, --version, names in --help (issue 11) ----------------------------------
def test_version_flag() -> None:
    from difforge.version import __version__

    res = CliRunner().invoke(cli.app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"difforge {__version__}"


def test_help_lists_each_familys_own_optimisation_names() -> None:
    from difforge.models.qwen_edit.loop import EXACT_OPTIMISATIONS as QE
    from difforge.models.qwen_edit.loop import FAST_OPTIMISATIONS as QF
    from difforge.models.ursa.call import EXACT_OPTIMISATIONS as UE
    from difforge.models.ursa.call import FAST_OPTIMISATIONS as UF

    assert cli.URSA_EXACT.split(", ") == list(UE) and cli.URSA_FAST.split(", ") == list(UF)
    assert cli.QWEN_EXACT.split(", ") == list(QE)
    assert [n.split("[")[0] for n in cli.QWEN_FAST.split(", ")] == list(QF)
    gen = " ".join(CliRunner().invoke(cli.app, ["generate", "--help"], terminal_width=400).output.split())
    assert all(name in gen for name in (*UE, *UF)) and "tiny-qwen-edit" not in gen
    edit = " ".join(CliRunner().invoke(cli.app, ["edit", "--help"], terminal_width=400).output.split())
    assert all(name in edit for name in (*QE, *QF))


@pytest.mark.parametrize("alias", ["--num-inference-steps", "--num_steps", "--num_inference_steps"])
def test_step_aliases_reach_the_same_option(alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fake_generate(prompt: str, **kw: object) -> object:
        seen.update(kw)
        raise SystemExit(0)

    monkeypatch.setattr("difforge.api.generate", fake_generate)
    res = CliRunner().invoke(cli.app, ["generate", "-p", "x", alias, "7", "--guidance-scale", "3",
                                       "--model-path", "tiny-ursa"])
    assert res.exit_code == 0, res.output
    assert seen["steps"] == 7 and seen["guidance"] == 3.0 and seen["model"] == "tiny-ursa"


def test_true_cfg_scale_and_model_path_aliases_on_edit(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen: dict[str, object] = {}

    def fake_edit(images: object, prompt: str, **kw: object) -> object:
        seen.update(kw)
        raise SystemExit(0)

    monkeypatch.setattr("difforge.api.edit", fake_edit)
    res = CliRunner().invoke(cli.app, ["edit", "-i", "a.png", "-p", "x", "--true-cfg-scale", "2.5",
                                       "--model_path", "m", "--num_inference_steps", "9"])
    assert res.exit_code == 0, res.output
    assert seen["true_cfg"] == 2.5 and seen["model"] == "m" and seen["steps"] == 9


def test_preset_unknown_to_the_cpu_backend_is_one_line_exit_2(tmp_path) -> None:
    res = CliRunner().invoke(cli.app, ["generate", "-p", "x", "--device", "cpu", "--height", "64", "--width", "64",
                                       "--steps", "2", "--preset", "ACL_PRECISION_MODE", "-o", str(tmp_path / "o.png")])
    assert res.exit_code == 2
    assert "not an opt-in preset of the cpu backend (its opt-in presets: none)" in res.output
    assert not (tmp_path / "o.png").exists()


def test_asked_preset_is_recorded_as_approximate(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a backend with an opt-in preset, the engine applies the named one and records it as not exact."""
    from difforge import engine
    from difforge.devices import get_backend
    from difforge.devices.base import EnvPreset
    from difforge.runtime.record import RunRecord

    backend = get_backend("cpu")
    monkeypatch.setattr(type(backend), "env_presets",
                        lambda self: [EnvPreset("DIFFORGE_TEST_OPT_IN", "fast", "a test trade-off", opt_in=True)])
    monkeypatch.delenv("DIFFORGE_TEST_OPT_IN", raising=False)
    record = RunRecord(kind="generate")
    from difforge.config import RunConfig

    cfg = RunConfig(model="tiny-ursa", device="cpu", presets=["DIFFORGE_TEST_OPT_IN=faster"])
    engine.load_pipeline("tiny-ursa", backend, torch.float32, cfg=cfg, record=record)
    adapted = {a.what: a for a in record.adaptations}
    assert adapted["env DIFFORGE_TEST_OPT_IN"].choice == "faster"
    assert adapted["env DIFFORGE_TEST_OPT_IN"].exact is False
    monkeypatch.delenv("DIFFORGE_TEST_OPT_IN", raising=False)


# ---- --json, --perf-dump, --config (issue 11) --------------------------------------------------------
def _generate(tmp_path, *extra: str):
    return CliRunner().invoke(cli.app, ["generate", "-p", "a red circle", "--device", "cpu", "--height", "64",
                                        "--width", "64", "--steps", "3", "-o", str(tmp_path / "o.png"), *extra])


def test_json_summary_and_sglang_shaped_perf_dump(tmp_path) -> None:
    res = _generate(tmp_path, "--json", "--perf-dump", str(tmp_path / "perf.json"))
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)  # stdout holds the JSON and nothing else
    assert summary["outputs"] == [str(tmp_path / "o.png")] and summary["steps"] == 3
    assert summary["device"] == "cpu" and len(summary["step_s"]) == 3
    perf = json.loads((tmp_path / "perf.json").read_text())
    assert [s["step"] for s in perf["denoise_steps_ms"]] == [0, 1, 2]
    assert {s["name"] for s in perf["steps"]} >= {"load", "denoise", "decode"}
    assert perf["total_duration_ms"] >= sum(s["duration_ms"] for s in perf["steps"]) - 1e-6
    assert "after_denoise" in perf["memory_checkpoints"]


def test_perf_dump_may_not_overwrite_the_image(tmp_path) -> None:
    res = _generate(tmp_path, "--perf-dump", str(tmp_path / "o.png"))
    assert res.exit_code == 2 and "same file" in res.output
    assert not (tmp_path / "o.png").exists()


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file_sets_options_and_the_command_line_wins(tmp_path, suffix: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def fake_generate(prompt: str, **kw: object) -> object:
        seen.update(kw, prompt=prompt)
        raise SystemExit(0)

    monkeypatch.setattr("difforge.api.generate", fake_generate)
    opts = {"num_inference_steps": 7, "--guidance-scale": 3.5, "prompt": "from the file", "fast": ["unguided-tail"],
            "seed": 5}
    path = tmp_path / f"c{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(opts))
    else:
        import yaml

        path.write_text(yaml.safe_dump(opts))
    res = CliRunner().invoke(cli.app, ["generate", "--config", str(path), "--seed", "9"])
    assert res.exit_code == 0, res.output
    assert seen["steps"] == 7 and seen["guidance"] == 3.5 and seen["prompt"] == "from the file"
    assert seen["fast"] == ["unguided-tail"] and seen["seed"] == 9  # the flag beats the file


@pytest.mark.parametrize(("content", "words"), [("bogus: 1\n", "'bogus' is not an option"),
                                                 ("- a\n- b\n", "must hold a mapping"),
                                                 ("steps: [unclosed\n", "is not valid YAML")])
def test_bad_config_file_is_one_line_exit_2(tmp_path, content: str, words: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(content)
    res = CliRunner().invoke(cli.app, ["generate", "--config", str(path), "-p", "x"])
    assert res.exit_code == 2 and words in res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1


# ---- --prompt-file / --num-images-per-prompt (issue 11) ------------------------------------------------
def test_prompt_file_batch_numbers_outputs_and_image_k_is_seed_plus_k(tmp_path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n# a comment\na blue square\n")
    common = ["--device", "cpu", "--height", "64", "--width", "64", "--steps", "2", "--quiet"]
    res = CliRunner().invoke(cli.app, ["generate", "--prompt-file", str(prompts), "--num-images-per-prompt", "2",
                                       "--seed", "3", *common, "-o", str(tmp_path / "b" / "out.png"), "--json"])
    assert res.exit_code == 0, res.output
    runs = json.loads(res.stdout)
    assert [(r["prompt"], r["seed"]) for r in runs] == [("a red circle", 3), ("a red circle", 4),
                                                         ("a blue square", 3), ("a blue square", 4)]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "out_000_00.png", "out_000_01.png", "out_001_00.png", "out_001_01.png"]
    single = CliRunner().invoke(cli.app, ["generate", "-p", "a blue square", "--seed", "4", *common,
                                          "-o", str(tmp_path / "one.png")])
    assert single.exit_code == 0, single.output  # one image of the batch, remade alone: the same bytes
    assert (tmp_path / "one.png").read_bytes() == (tmp_path / "b" / "out_001_01.png").read_bytes()


@pytest.mark.parametrize("args", [[], ["-p", "x", "--prompt-file", "p.txt"], ["-p", "x", "--num-images-per-prompt", "0"]])
def test_prompt_and_batch_usage_errors(tmp_path, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("a\n")
    res = CliRunner().invoke(cli.app, ["generate", *args, "--device", "cpu", "-o", str(tmp_path / "o.png")])
    assert res.exit_code == 2, res.output
    assert not (tmp_path / "o.png").exists()
