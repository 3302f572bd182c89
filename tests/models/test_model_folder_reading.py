"""Issue 26, model folders: every file read from ``--model`` by the one reading rule, every config value checked.

Each case plants one problem in a copy of a built-in tiny model and runs the CLI as a user would; each
must end in one ``difforge: error:`` line and exit 2, with no image written and nothing read from
outside the folder.  Cases that could hang (FIFOs), print from Rust (tokenizer panics) or allocate
without bound (huge configs) run in a subprocess with a timeout, and the memory ones
measure the child's peak RSS (``RUSAGE_CHILDREN``) against 1 GB.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from difforge.errors import CheckpointError
from difforge.models.checkpoint import CONFIG_LIMIT, MAX_VOCAB, TOKENIZER_LIMIT
from difforge.models.ursa.config import SchedulerConfig
from difforge.models.ursa.tokenizer import PromptTokenizer

from .test_hostile_checkpoints import (
    WEIGHTS,
    copy_model,
    edit,
    edit_json,
    edit_tensor,
    generate,
    one_line_error,
)

ROOT = Path(__file__).resolve().parents[2]
GB = 1 << 30


@pytest.fixture
def in_png(tmp_path: Path) -> Path:
    from difforge.demo import write_test_picture

    return write_test_picture(tmp_path / "in.png", size=64)


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}", "OMP_NUM_THREADS": "1", "RUST_BACKTRACE": "1"}
    env.pop("DIFFORGE_DEBUG", None)
    return env


def _cli(*args: str, timeout: int = 120) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run ``python -m difforge`` in a child; return its result and its peak RSS in bytes.

    The peak is read from ``RUSAGE_CHILDREN`` in a fresh wrapper process, so it is this child's alone.
    """
    return _child("-m", "difforge", *args, timeout=timeout)


def _child(*args: str, timeout: int = 120) -> tuple[subprocess.CompletedProcess[str], int]:
    """``python ARGS`` in a child, with its peak RSS in bytes (see :func:`_cli`)."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run([sys.executable, *sys.argv[1:]])\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
        "sys.exit(r.returncode)\n"
    )
    res = subprocess.run([sys.executable, "-c", wrapper, *args], cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=timeout)
    *lines, peak = res.stderr.rstrip("\n").split("\n")
    res.stderr = "\n".join(lines)
    return res, int(peak) * 1024  # Linux reports KiB


def _one_line(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr[-3000:])
    err = res.stderr.strip()
    assert err.startswith("difforge: error: ") and len(err.splitlines()) == 1, err[-3000:]
    for needle in needles:
        assert needle in err, (needle, err)
    assert "output:" not in res.stdout
    return err


def _gen_args(folder: Path, out: Path, prompt: str = "x") -> list[str]:
    return ["generate", "--model", str(folder), "--prompt", prompt, "--steps", "2", "--height", "64", "--width", "64",
            "--device", "cpu", "--output", str(out / "a.png"), "--quiet"]


def _link_elsewhere(path: Path, elsewhere: Path) -> None:
    """Move ``path`` (a file or folder of a model) to ``elsewhere`` and leave a link to it in its place."""
    elsewhere.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(path, elsewhere)
    path.symlink_to(elsewhere, target_is_directory=elsewhere.is_dir())


# ---- S1: everything resolves inside the model folder --------------------------------------------------


@pytest.mark.parametrize(("family", "component"), [("tiny-ursa", "transformer"), ("tiny-ursa", "tokenizer"),
                                                   ("tiny-qwen-edit", "text_encoder"), ("tiny-qwen-edit", "processor")])
def test_a_component_folder_linked_elsewhere_is_refused(family: str, component: str, tmp_path: Path,
                                                        in_png: Path) -> None:
    folder = copy_model(family, tmp_path)
    _link_elsewhere(folder / component, tmp_path / "elsewhere" / component)
    result = generate(folder, tmp_path) if family == "tiny-ursa" else edit(folder, in_png, tmp_path)
    one_line_error(result, str(folder / component), "outside")


@pytest.mark.parametrize(("family", "file"), [
    ("tiny-ursa", "scheduler/scheduler_model.pth"), ("tiny-ursa", "tokenizer/tokenizer.json"),
    ("tiny-ursa", "tokenizer/tokenizer_config.json"), ("tiny-ursa", "vae/config.json"),
    ("tiny-qwen-edit", "processor/preprocessor_config.json"), ("tiny-qwen-edit", "tokenizer/tokenizer.json"),
    ("tiny-qwen-edit", "text_encoder/generation_config.json"), ("tiny-qwen-edit", "model_index.json"),
])
def test_a_file_linked_elsewhere_is_refused(family: str, file: str, tmp_path: Path, in_png: Path) -> None:
    folder = copy_model(family, tmp_path)
    _link_elsewhere(folder / file, tmp_path / "elsewhere" / file.replace("/", "-"))
    result = generate(folder, tmp_path) if family == "tiny-ursa" else edit(folder, in_png, tmp_path)
    one_line_error(result, "outside")


def test_links_that_stay_inside_load_and_are_not_called_outside(tmp_path: Path, in_png: Path) -> None:
    """A component folder and a weights file linked to places inside the model folder are the folder's own."""
    ursa = copy_model("tiny-ursa", tmp_path)
    _link_elsewhere(ursa / "transformer", ursa / "store" / "transformer-v2")
    (ursa / "transformer").unlink()
    (ursa / "transformer").symlink_to(Path("store") / "transformer-v2", target_is_directory=True)
    shutil.move(ursa / "vae" / WEIGHTS, ursa / "store" / "vae.safetensors")
    (ursa / "vae" / WEIGHTS).symlink_to(Path("..") / "store" / "vae.safetensors")
    result = generate(ursa, tmp_path)
    assert result.exit_code == 0, result.stderr
    qwen = copy_model("tiny-qwen-edit", tmp_path)
    shutil.move(qwen / "tokenizer" / "tokenizer.json", qwen / "processor" / "shared-tokenizer.json")
    (qwen / "tokenizer" / "tokenizer.json").symlink_to(Path("..") / "processor" / "shared-tokenizer.json")
    result = edit(qwen, in_png, tmp_path)
    assert result.exit_code == 0, result.stderr


# ---- B2: what a file is, said as it is ----------------------------------------------------------------


@pytest.mark.parametrize(("family", "file"), [("tiny-ursa", "tokenizer/tokenizer.json"),
                                              ("tiny-ursa", "scheduler/scheduler_model.pth"),
                                              ("tiny-qwen-edit", "processor/preprocessor_config.json")])
def test_a_fifo_is_named_a_fifo_and_nothing_hangs(family: str, file: str, tmp_path: Path, in_png: Path) -> None:
    folder = copy_model(family, tmp_path)
    (folder / file).unlink()
    os.mkfifo(folder / file)
    args = _gen_args(folder, tmp_path) if family == "tiny-ursa" else [
        "edit", "--model", str(folder), "--image", str(in_png), "--prompt", "x", "--steps", "2", "--device", "cpu",
        "--output", str(tmp_path / "a.png"), "--quiet"]
    res, _ = _cli(*args, timeout=120)
    err = _one_line(res, str(folder / file), "is a FIFO, not a regular file")
    assert "Missing" not in err


@pytest.mark.parametrize("family", ["tiny-ursa", "tiny-qwen-edit"])
def test_a_component_that_is_a_file_is_not_called_missing(family: str, tmp_path: Path, in_png: Path) -> None:
    folder = copy_model(family, tmp_path)
    shutil.rmtree(folder / "vae")
    (folder / "vae").write_text("not a folder")
    result = generate(folder, tmp_path) if family == "tiny-ursa" else edit(folder, in_png, tmp_path)
    err = one_line_error(result, str(folder / "vae"), "is a regular file, not a folder")
    assert "Missing" not in err


def test_a_damaged_built_in_cache_says_how_to_rebuild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge.models.tiny import ensure_tiny, manifest_path

    monkeypatch.setenv("DIFFORGE_HOME", str(tmp_path / "home"))
    folder = ensure_tiny("tiny-ursa")
    assert manifest_path("tiny-ursa").is_file()
    weights = folder / "vae" / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-64])  # a truncated file
    err = one_line_error(generate("tiny-ursa", tmp_path), "built-in model tiny-ursa", "vae/" + WEIGHTS, "delete")
    assert str(folder) in err
    shutil.rmtree(folder)
    assert generate("tiny-ursa", tmp_path).exit_code == 0  # deleted: built again


# ---- S5: sizes are capped, a long prompt is cut before tokenising ---------------------------------------


def _pad_json(path: Path, size: int) -> None:
    """Keep ``path``'s JSON valid and make the file ``size`` bytes (trailing whitespace)."""
    text = path.read_text()
    path.write_text(text + " " * (size - len(text.encode())))


@pytest.mark.parametrize(("file", "limit"), [("transformer/config.json", CONFIG_LIMIT),
                                             ("tokenizer/tokenizer.json", TOKENIZER_LIMIT)])
def test_oversized_configs_are_refused_in_bounded_memory(file: str, limit: int, tmp_path: Path) -> None:
    folder = copy_model("tiny-ursa", tmp_path)
    _pad_json(folder / file, limit + 1)
    res, peak = _cli(*_gen_args(folder, tmp_path))
    _one_line(res, str(folder / file), f"larger than {limit >> 20} MB")
    assert peak < GB, peak


def _grow_vocab(path: Path, entries: int, width: int) -> None:
    """Add tokens ``t000...`` of ``width`` characters to ``path``'s vocabulary until it holds ``entries``."""
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    base = len(vocab)
    vocab.update({f"t{i:0{width - 1}d}": base + i for i in range(entries - base)})
    path.write_text(json.dumps(data))


def test_a_vocabulary_over_its_count_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """Bytes alone do not bound a tokenizer (short entries cost ~500 bytes each once held): entries are counted."""
    folder = copy_model("tiny-ursa", tmp_path)
    _grow_vocab(folder / "tokenizer" / "tokenizer.json", MAX_VOCAB + 1, 9)
    res, peak = _cli(*_gen_args(folder, tmp_path))
    _one_line(res, "tokenizer.json holds 262145 vocabulary entries")
    assert peak < GB, peak


def test_the_largest_tokenizers_accepted_load_in_bounded_memory(tmp_path: Path, in_png: Path) -> None:
    """Qwen folders load two tokenizers; both at the entry cap, filling the byte cap, still fit in 1 GB
    (measured 801 MB; two 23 MB files of 1.1M short entries, before the count, held 1.3 GB)."""
    folder = copy_model("tiny-qwen-edit", tmp_path)
    for sub in ("tokenizer", "processor"):
        _grow_vocab(folder / sub / "tokenizer.json", MAX_VOCAB - 16, 80)
        assert TOKENIZER_LIMIT - (2 << 20) < (folder / sub / "tokenizer.json").stat().st_size <= TOKENIZER_LIMIT
    res, peak = _cli("edit", "--model", str(folder), "--image", str(in_png), "--prompt", "x", "--steps", "2",
                     "--device", "cpu", "--output", str(tmp_path / "a.png"), "--quiet", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert peak < GB, peak


def test_the_cut_keeps_the_first_ids_exactly() -> None:
    """A long prompt is cut to what can reach the first ``max_length`` ids before the tokenizer sees it (a 26 MB
    line took 5.8 GB tokenised whole; ``config.check_text`` now also refuses such a line), and the ids stay the
    same."""
    from difforge.models.tiny import ensure_tiny

    tok = PromptTokenizer.from_folder(ensure_tiny("tiny-ursa") / "tokenizer")
    tok.max_chars = tok.max_length * 8  # a small bound, so the cut really happens on this text
    text = "a red circle left of a blue square " * 400
    assert len(tok.cut(text)) < len(text)
    whole = tok.tokenizer.encode(text, add_special_tokens=False).ids[: tok.max_length]
    assert len(whole) == tok.max_length
    assert tok.encode([text])[0].tolist() == whole


# ---- C1: a Rust panic in the tokenizer ------------------------------------------------------------------

BACKTRACKING = {"type": "Replace", "pattern": {"Regex": "(a|a)+$"}, "content": "x"}


def test_a_backtracking_tokenizer_regex_is_one_line(tmp_path: Path) -> None:
    folder = copy_model("tiny-ursa", tmp_path)
    edit_json(folder / "tokenizer" / "tokenizer.json", lambda t: t.update(normalizer=BACKTRACKING))
    res, _ = _cli(*_gen_args(folder, tmp_path))
    _one_line(res, "tokenizer.json", "tokenizers library fail")
    assert "panicked" not in res.stderr and "Traceback" not in res.stderr


def test_a_panic_only_a_prompt_triggers_is_one_line_too(tmp_path: Path) -> None:
    """The load-time probe text has no run of ``q``; the prompt does: the panic at encode time is caught too."""
    folder = copy_model("tiny-ursa", tmp_path)
    edit_json(folder / "tokenizer" / "tokenizer.json", lambda t: t.update(
        normalizer={"type": "Replace", "pattern": {"Regex": "(q|q)+$"}, "content": "x"}))
    res, _ = _cli(*_gen_args(folder, tmp_path, prompt="q" * 40 + "z"))
    _one_line(res, "The tokenizer (tokenizer.json) made the tokenizers library fail")
    assert "panicked" not in res.stderr


# ---- W1 / B1: scheduler values of the wrong type or impossible ------------------------------------------

BAD_SCHEDULER = {
    "shift": ["abc", [1.0], float("nan"), 0, -1, True, 1e9],
    "eps": [-1, 0, float("inf"), "1e-5", 0.5],
    "c": [0, -3, float("nan"), [3]],
    "alpha": ["0.9", -1, float("nan"), {"a": 1}],
}


@pytest.mark.parametrize(("key", "value"), [(k, v) for k, vs in BAD_SCHEDULER.items() for v in vs])
def test_scheduler_values_are_checked(key: str, value: object) -> None:
    with pytest.raises(CheckpointError, match=f"scheduler_config.json: '{key}' must be") as err:
        SchedulerConfig.from_dict({"alpha": 0.9, "c": 3.0, key: value})
    assert "\n" not in str(err.value)


def test_good_scheduler_values_still_load() -> None:
    assert SchedulerConfig.from_dict({"alpha": None}).path == "mixture"
    assert SchedulerConfig.from_dict({"alpha": 0.9, "c": 3, "shift": 3, "eps": 1e-5}).shift == 3.0


@pytest.mark.parametrize(("key", "value", "needle"), [("shift", "abc", "finite number"), ("eps", -1, "positive"),
                                                      ("c", 0, "positive"), ("shift", float("nan"), "NaN")])
def test_cli_scheduler_values(key: str, value: object, needle: str, tmp_path: Path) -> None:
    folder = copy_model("tiny-ursa", tmp_path)
    edit_json(folder / "scheduler" / "scheduler_config.json", lambda c: c.update({key: value}))
    one_line_error(generate(folder, tmp_path), f"'{key}'", needle)


# ---- W2: pad_token --------------------------------------------------------------------------------------


@pytest.mark.parametrize("pad", [5, ["<|endoftext|>"], "", {"content": 3}])
def test_pad_token_must_be_a_string(pad: object, tmp_path: Path) -> None:
    folder = copy_model("tiny-ursa", tmp_path)
    edit_json(folder / "tokenizer" / "tokenizer_config.json", lambda c: c.update(pad_token=pad))
    one_line_error(generate(folder, tmp_path), "tokenizer_config.json", "'pad_token'")


# ---- W3: fp8 NaN codes in URSA weights ----------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "code"), [(torch.float8_e4m3fn, 0x7F), (torch.float8_e4m3fn, 0xFF),
                                             (torch.float8_e5m2, 0x7C), (torch.float8_e5m2, 0xFE)])
def test_fp8_nan_and_inf_codes_in_ursa_weights(dtype: torch.dtype, code: int, tmp_path: Path) -> None:
    folder = copy_model("tiny-ursa", tmp_path)

    def poison(t: torch.Tensor) -> torch.Tensor:
        codes = t.to(dtype).view(torch.uint8).clone()
        codes.view(-1)[0] = code
        return codes.view(dtype)

    key = edit_tensor(folder / "vae" / WEIGHTS, lambda k, t: t.is_floating_point() and t.dim() == 4, poison)
    one_line_error(generate(folder, tmp_path), f"'{key}'", "NaN or infinite")


# ---- W4 / B1: Qwen configs --------------------------------------------------------------------------------

QWEN_CONFIGS = {
    "latents_mean too short": ("vae/config.json", {"latents_mean": [0.0, 0.0, 0.0]}, "'latents_mean' must hold z_dim"),
    "latents_std all zero": ("vae/config.json", {"latents_std": [0.0] * 4}, "'latents_std' must hold values"),
    "latents_std NaN": ("vae/config.json", {"latents_std": [1.0, float("nan"), 1.0, 1.0]}, "'latents_std'"),
    "patch_size 0": ("processor/preprocessor_config.json", {"patch_size": 0}, "'patch_size' must be between 1"),
    "video patch_size 0": ("processor/video_preprocessor_config.json", {"patch_size": 0}, "'patch_size'"),
    "min above max pixels": ("processor/preprocessor_config.json", {"min_pixels": 20000}, "'min_pixels'"),
    "image_std zero": ("processor/preprocessor_config.json", {"image_std": [0, 0, 0]}, "'image_std'"),
    "scheduler shift text": ("scheduler/scheduler_config.json", {"shift": "abc"}, "'shift' must be a finite number"),
    "scheduler seq lens equal": ("scheduler/scheduler_config.json", {"max_image_seq_len": 256}, "base_image_seq_len"),
    "scheduler flag text": ("scheduler/scheduler_config.json", {"use_dynamic_shifting": "false"}, "true or false"),
    "transformer layers text": ("transformer/config.json", {"num_layers": "2"}, "'num_layers' must be an integer"),
    "text encoder eps NaN": ("text_encoder/config.json", {"rms_norm_eps": float("nan")}, "'rms_norm_eps'"),
    "tokenizer pad int": ("tokenizer/tokenizer_config.json", {"pad_token": 7}, "'pad_token'"),
    "rope axes do not split a head": ("transformer/config.json", {"axes_dims_rope": [8, 4, 2]}, "add up to"),
    "transformer out_channels not z_dim": ("vae/config.json", {"z_dim": 8, "latents_mean": [0.0] * 8,
                                                               "latents_std": [1.0] * 8}, "'in_channels' is 16"),
}


@pytest.mark.parametrize("case", sorted(QWEN_CONFIGS))
def test_qwen_config_values_are_checked_at_load(case: str, tmp_path: Path, in_png: Path) -> None:
    file, change, needle = QWEN_CONFIGS[case]
    folder = copy_model("tiny-qwen-edit", tmp_path)
    edit_json(folder / file, lambda c: c.update(change))
    err = one_line_error(edit(folder, in_png, tmp_path), str(folder / file), needle)
    assert "--height" not in err  # the folder is at fault, not the size asked for


def test_a_processor_that_enlarges_every_image_is_named_not_the_size(tmp_path: Path, in_png: Path, available) -> None:
    """B2: when the processor's min_pixels, not --height/--width, makes the encoder's images too large to fit."""
    folder = copy_model("tiny-qwen-edit", tmp_path)
    big = 1 << 20
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        edit_json(folder / "processor" / name, lambda c: c.update(
            min_pixels=big, max_pixels=big, size={"shortest_edge": big, "longest_edge": big}))
    available(1 << 20)  # nothing fits: the hint is what is tested
    plain = one_line_error(edit(copy_model("tiny-qwen-edit", tmp_path / "plain"), in_png, tmp_path))
    assert "reduce --height/--width" in plain and "min_pixels" not in plain
    err = one_line_error(edit(folder, in_png, tmp_path), "min_pixels 1048576", str(folder / "processor"))
    assert "reduce --height" not in err
    too_big = 1 << 21
    edit_json(folder / "processor" / "preprocessor_config.json", lambda c: c.update(min_pixels=too_big))
    one_line_error(edit(folder, in_png, tmp_path), "'min_pixels' must be between 1 and 1048576")


@pytest.mark.parametrize("area", [10**12, 512, "4096", True])
def test_qwen_settings_areas_are_bounded(area: object, tmp_path: Path, in_png: Path) -> None:
    """A folder's difforge.json resizes every reference image to its areas: 10^12 would allocate without bound."""
    folder = copy_model("tiny-qwen-edit", tmp_path)
    edit_json(folder / "difforge.json", lambda c: c.update(reference_area=area))
    one_line_error(edit(folder, in_png, tmp_path), "difforge.json", "'reference_area' must be an integer area")


# ---- S4: weight identity follows links ----------------------------------------------------------------


def test_a_transformer_swapped_behind_a_link_is_other_weights(tmp_path: Path) -> None:
    """A golden bundle made with ``transformer -> store/a`` refuses (exit 2) the folder re-pointed at ``store/b``."""
    from safetensors.torch import load_file, save_file

    folder = copy_model("tiny-ursa", tmp_path)
    store = folder / "store"
    store.mkdir()
    shutil.move(folder / "transformer", store / "a")
    shutil.copytree(store / "a", store / "b")
    weights = store / "b" / WEIGHTS
    tensors = load_file(str(weights))
    name = next(k for k in sorted(tensors) if tensors[k].is_floating_point())
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, str(weights))
    (folder / "transformer").symlink_to(Path("store") / "a", target_is_directory=True)
    size = ["--height", "64", "--width", "64", "--quick", "--quiet"]
    golden = tmp_path / "golden"
    res, _ = _cli("golden", "--model", str(folder), "--dtype", "bfloat16", *size, "--out", str(golden), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (folder / "transformer").unlink()
    (folder / "transformer").symlink_to(Path("store") / "b", target_is_directory=True)
    report = tmp_path / "report"
    res, _ = _cli("validate", "--model", str(folder), "--device", "cpu", "--dtype", "bfloat16", "--rounds", "1",
                  "--warmup", "0", "--no-speed-table", *size, "--golden", str(golden), "--out", str(report), timeout=600)
    _one_line(res, "other weights", f"transformer/{WEIGHTS} differs")
    assert not report.exists()


def test_the_folder_walk_ends_on_loops_and_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge.models import checkpoint

    model = tmp_path / "m"
    (model / "sub").mkdir(parents=True)
    (model / "sub" / "up").symlink_to(model, target_is_directory=True)  # a loop ends where it began
    checkpoint.check_tree(model)
    monkeypatch.setattr(checkpoint, "MAX_FOLDER_ENTRIES", 1000)
    levels = [model / f"l{i}" for i in range(12)]
    for level in levels:
        level.mkdir()
    for here, below in zip(levels, levels[1:], strict=False):
        for name in ("x", "y"):
            (here / name).symlink_to(below, target_is_directory=True)
    with pytest.raises(CheckpointError, match="more than 1000 entries"):
        checkpoint.check_tree(model)
