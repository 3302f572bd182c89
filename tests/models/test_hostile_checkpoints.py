"""Hostile or broken model folders: one named error (exit 2), nothing from the folder run, nothing outside it read.

Each case plants one problem in a copy of a built-in tiny model and runs the CLI as a user would:
configs asking for custom code (``auto_map``), shard indexes and links leading outside the folder,
malformed JSON and class names, weights of the wrong dtype or holding NaN/inf, and a
``DIFFORGE_HOME`` where the tiny models cannot be built.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from difforge.cli import app
from difforge.errors import CheckpointError
from difforge.models.checkpoint import read_json, weight_files
from difforge.models.tiny import ensure_tiny

runner = CliRunner()
WEIGHTS = "diffusion_pytorch_model.safetensors"


# ---- helpers -------------------------------------------------------------------------------------


def copy_model(name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(ensure_tiny(name), target)
    return target


@pytest.fixture
def in_png(tmp_path: Path) -> Path:
    from difforge.demo import write_test_picture

    return write_test_picture(tmp_path / "in.png", size=64)


def generate(folder: Path | str, out: Path, stdin: str | None = None):
    return runner.invoke(app, ["generate", "--prompt", "x", "--model", str(folder), "--steps", "2", "--height", "64",
                               "--width", "64", "--output", str(out / "a.png"), "--quiet"], input=stdin)


def edit(folder: Path | str, image: Path, out: Path, *extra: str, stdin: str | None = None):
    return runner.invoke(app, ["edit", "--image", str(image), "--prompt", "x", "--model", str(folder), "--steps", "2",
                               "--output", str(out / "a.png"), "--quiet", *extra], input=stdin)


def one_line_error(result, *needles: str) -> str:
    """Exit 2, one ``difforge: error:`` line holding every needle, and no image written."""
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("difforge: error: ") and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert "output:" not in result.stdout
    return err


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    change(data)
    path.write_text(json.dumps(data))


def plant_code(folder: Path, module: str, marker: Path) -> None:
    """A ``.py`` that writes ``marker`` when imported, with the classes an auto_map could name."""
    (folder / f"{module}.py").write_text(
        f"open({str(marker)!r}, 'w').write('executed')\nclass Evil:\n    pass\nEvilProcessor = EvilTok = Evil\n"
    )


def move_outside(component: Path, outside: Path, name: str = WEIGHTS) -> Path:
    outside.mkdir(exist_ok=True)
    target = outside / f"{component.parent.name}-{component.name}.safetensors"
    shutil.move(component / name, target)
    return target


def edit_tensor(path: Path, pick: Callable[[str, torch.Tensor], bool], change: Callable[[torch.Tensor], torch.Tensor]) -> str:
    """Replace the first tensor (by sorted key) that ``pick`` accepts with ``change(tensor)``; return its key."""
    state = load_file(str(path))
    key = next(k for k in sorted(state) if pick(k, state[k]))
    state[key] = change(state[key])
    save_file(state, str(path))
    return key


def matrix(key: str, t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.dim() == 2


def vector(key: str, t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.dim() == 1


# ---- D1: configs asking for custom code ------------------------------------------------------------

AUTO_MAPS: dict[str, tuple[str, Callable[[dict], None]]] = {
    # file -> (module the auto_map names, edit that plants it)
    "processor/preprocessor_config.json": ("evil_proc", lambda c: c.update(
        auto_map={"AutoImageProcessor": "evil_proc.EvilProcessor"}, image_processor_type="EvilProcessor")),
    "processor/processor_config.json": ("evil_proc", lambda c: c.setdefault("image_processor", {}).update(
        auto_map={"AutoImageProcessor": "evil_proc.EvilProcessor"}, image_processor_type="EvilProcessor")),
    "processor/tokenizer_config.json": ("evil_tok", lambda c: c.update(
        auto_map={"AutoTokenizer": ["evil_tok.EvilTok", None]}, tokenizer_class="EvilTok")),
    "tokenizer/tokenizer_config.json": ("evil_tok", lambda c: c.update(
        auto_map={"AutoTokenizer": ["evil_tok.EvilTok", None]}, tokenizer_class="EvilTok")),
    "text_encoder/config.json": ("evil_model", lambda c: c.update(auto_map={"AutoModel": "evil_model.Evil"})),
}


@pytest.mark.parametrize("config", sorted(AUTO_MAPS))
def test_qwen_auto_map_is_refused_and_never_imported(config: str, tmp_path: Path, in_png: Path) -> None:
    """Answering y to transformers' "run the custom code?" prompt used to import the planted module."""
    folder = copy_model("tiny-qwen-edit", tmp_path)
    module, change = AUTO_MAPS[config]
    marker = tmp_path / "pwned"
    edit_json(folder / config, change)
    plant_code((folder / config).parent, module, marker)
    result = edit(folder, in_png, tmp_path, stdin="y\ny\ny\n")
    one_line_error(result, str(folder / config), "auto_map")
    assert not marker.exists()


def test_ursa_auto_map_is_refused(tmp_path: Path) -> None:
    folder = copy_model("tiny-ursa", tmp_path)
    marker = tmp_path / "pwned"
    edit_json(folder / "transformer" / "config.json", lambda c: c.update(auto_map={"AutoModel": "evil.Evil"}))
    plant_code(folder / "transformer", "evil", marker)
    one_line_error(generate(folder, tmp_path), str(folder / "transformer" / "config.json"), "auto_map")
    assert not marker.exists()


def test_libraries_are_told_not_to_trust_folder_code(tmp_path: Path, in_png: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With the config check switched off, transformers itself refuses (no prompt) because difforge
    passes ``trust_remote_code=False`` - a second lock, not a prompt a user can answer wrongly."""
    from difforge.models.qwen_edit import folder as folder_checks

    monkeypatch.setattr(folder_checks, "check_configs", lambda folder: None)
    folder = copy_model("tiny-qwen-edit", tmp_path)
    marker = tmp_path / "pwned"
    module, change = AUTO_MAPS["processor/processor_config.json"]
    edit_json(folder / "processor" / "processor_config.json", change)
    plant_code(folder / "processor", module, marker)
    result = edit(folder, in_png, tmp_path, stdin="y\ny\ny\n")
    one_line_error(result, "contains custom code")
    assert "[y/N]" not in result.stdout + result.stderr
    assert not marker.exists()


# ---- D5: weights outside the folder ----------------------------------------------------------------


@pytest.mark.parametrize("form", ["relative", "absolute", "etc"])
def test_shard_index_pointing_outside_is_refused(form: str, tmp_path: Path) -> None:
    folder = copy_model("tiny-ursa", tmp_path)
    component = folder / "transformer"
    outside = move_outside(component, tmp_path / "outside")
    name = {"relative": os.path.relpath(outside, component), "absolute": str(outside), "etc": "/etc/passwd"}[form]
    keys = load_file(str(outside))
    (component / f"{WEIGHTS}.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(keys, name)}))
    one_line_error(generate(folder, tmp_path), str(component / f"{WEIGHTS}.index.json"), name, "outside")


def test_qwen_text_encoder_shard_outside_is_refused(tmp_path: Path, in_png: Path) -> None:
    folder = copy_model("tiny-qwen-edit", tmp_path)
    component = folder / "text_encoder"
    outside = move_outside(component, tmp_path / "outside", "model.safetensors")
    rel = os.path.relpath(outside, component)
    (component / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": dict.fromkeys(load_file(str(outside)), rel)}))
    one_line_error(edit(folder, in_png, tmp_path), "model.safetensors.index.json", rel, "outside")


@pytest.mark.parametrize("family", ["tiny-ursa", "tiny-qwen-edit"])
def test_weights_linked_outside_are_refused(family: str, tmp_path: Path, in_png: Path) -> None:
    folder = copy_model(family, tmp_path)
    component = folder / "vae"
    (component / WEIGHTS).symlink_to(move_outside(component, tmp_path / "outside"))
    result = generate(folder, tmp_path) if family == "tiny-ursa" else edit(folder, in_png, tmp_path)
    one_line_error(result, str(component / WEIGHTS), "outside")


def test_index_beside_a_single_file_may_name_only_it(tmp_path: Path, in_png: Path) -> None:
    """diffusers loads the index when both exist, so a harmless single file must not hide a hostile index."""
    folder = copy_model("tiny-qwen-edit", tmp_path)
    component = folder / "vae"
    outside = tmp_path / "outside.safetensors"
    shutil.copy(component / WEIGHTS, outside)
    index = component / f"{WEIGHTS}.index.json"
    index.write_text(json.dumps({"weight_map": dict.fromkeys(load_file(str(outside)), str(outside))}))
    one_line_error(edit(folder, in_png, tmp_path), str(index), "outside")
    index.write_text(json.dumps({"weight_map": dict.fromkeys(load_file(str(outside)), WEIGHTS)}))
    assert weight_files(component) == [component / WEIGHTS]  # an index naming just the single file is fine


def _as_hub_snapshot(model: Path, hub: Path) -> Path:
    """``model`` laid out like a huggingface_hub cache: snapshot files are links into ``blobs``."""
    repo = hub / "models--tiny--model"
    snapshot = repo / "snapshots" / "0123abcd"
    shutil.copytree(model, snapshot)
    (repo / "blobs").mkdir()
    for path in sorted(snapshot.rglob("*")):
        if path.is_file():
            blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
            shutil.move(path, blob)
            path.symlink_to(os.path.relpath(blob, path.parent))
    return snapshot


def test_hub_cache_snapshot_links_still_load(tmp_path: Path) -> None:
    snapshot = _as_hub_snapshot(ensure_tiny("tiny-ursa"), tmp_path / "hub")
    result = generate(snapshot, tmp_path)
    assert result.exit_code == 0, result.stderr
    from difforge.models.qwen_edit.folder import check_model_folder

    check_model_folder(_as_hub_snapshot(ensure_tiny("tiny-qwen-edit"), tmp_path / "hub2"))
    # ... but a blobs store that is itself a link elsewhere opens nothing
    repo = tmp_path / "hub" / "models--tiny--model"
    (repo / "blobs").rename(tmp_path / "elsewhere")
    (repo / "blobs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="outside"):
        weight_files(snapshot / "transformer")


# ---- D8: malformed files are named errors, not crashes -----------------------------------------------


@pytest.mark.parametrize("value", [3, None, ["a.safetensors"], ""])
def test_non_string_weight_map_values(value, tmp_path: Path) -> None:
    folder = copy_model("tiny-ursa", tmp_path)
    component = folder / "transformer"
    (component / WEIGHTS).unlink()
    (component / f"{WEIGHTS}.index.json").write_text(json.dumps({"weight_map": {"x": value}}))
    one_line_error(generate(folder, tmp_path), f"{WEIGHTS}.index.json", "weight_map values must be file names")


CLASS_NAMES = {
    # (model, file, edit, words in the message)
    "ursa-index-list": ("tiny-ursa", "model_index.json", lambda c: c.update(_class_name=["URSAPipeline"]),
                        "string _class_name"),
    "qwen-index-object": ("tiny-qwen-edit", "model_index.json", lambda c: c.update(_class_name={"a": 1}),
                          "string _class_name"),
    "ursa-vae-list": ("tiny-ursa", "vae/config.json", lambda c: c.update(_class_name=["AutoencoderVQ"]),
                      "must be a string"),
    "ursa-vae-unknown": ("tiny-ursa", "vae/config.json", lambda c: c.update(_class_name="EvilVAE"), "EvilVAE"),
    "qwen-scheduler-list": ("tiny-qwen-edit", "scheduler/scheduler_config.json",
                            lambda c: c.update(_class_name=["FlowMatchEulerDiscreteScheduler"]), "must be a string"),
    "qwen-scheduler-other": ("tiny-qwen-edit", "scheduler/scheduler_config.json",
                             lambda c: c.update(_class_name="EulerDiscreteScheduler"), "EulerDiscreteScheduler"),
    "qwen-tokenizer-int": ("tiny-qwen-edit", "processor/tokenizer_config.json",
                           lambda c: c.update(tokenizer_class=5), "must be a string"),
    "qwen-tokenizer-unknown": ("tiny-qwen-edit", "tokenizer/tokenizer_config.json",
                               lambda c: c.update(tokenizer_class="EvilTokenizer"), "transformers does not provide"),
    "qwen-architectures-nested": ("tiny-qwen-edit", "text_encoder/config.json",
                                  lambda c: c.update(architectures=[["Qwen2_5_VLForConditionalGeneration"]]),
                                  "must be a string"),
}


@pytest.mark.parametrize("case", sorted(CLASS_NAMES))
def test_class_names_must_be_known_strings(case: str, tmp_path: Path, in_png: Path) -> None:
    model, config, change, words = CLASS_NAMES[case]
    folder = copy_model(model, tmp_path)
    edit_json(folder / config, change)
    result = generate(folder, tmp_path) if model == "tiny-ursa" else edit(folder, in_png, tmp_path)
    one_line_error(result, str(folder / config), words)


@pytest.mark.parametrize("entry", [{"a": 1}, ["__transformer__", ["URSATransformer3DModel"]], [None], 7])
def test_model_index_entries_of_the_wrong_shape(entry, tmp_path: Path) -> None:
    """Regression guard (already a named error before this change): entries are checked by shape."""
    folder = copy_model("tiny-ursa", tmp_path)
    edit_json(folder / "model_index.json", lambda c: c.update(transformer=entry))
    one_line_error(generate(folder, tmp_path), "model_index.json", "'transformer'")


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("where", ["model_index.json", "transformer/config.json", "header"])
def test_deeply_nested_json(where: str, tmp_path: Path, in_png: Path) -> None:
    if where == "header":  # safetensors' parser stops at depth 128; a bare list is not even a header
        folder = copy_model("tiny-ursa", tmp_path)
        path = folder / "transformer" / WEIGHTS
        for header, words in [('{"w": {"x": ' + DEEP + "}}", "nested too deeply"), (DEEP, "not a JSON object")]:
            path.write_bytes(len(header).to_bytes(8, "little") + header.encode())
            one_line_error(generate(folder, tmp_path), str(path), words)
        return
    model = "tiny-ursa" if where == "model_index.json" else "tiny-qwen-edit"
    folder = copy_model(model, tmp_path)
    (folder / where).write_text(DEEP if where == "model_index.json" else '{"a": ' + DEEP + "}")
    result = generate(folder, tmp_path) if model == "tiny-ursa" else edit(folder, in_png, tmp_path)
    one_line_error(result, str(folder / where), "nested too deeply")
    with pytest.raises(CheckpointError, match="nested too deeply"):
        read_json(folder / where)


WRONG_DTYPES = {
    # (model, component, pick, new dtype, dtype word in the message)
    "ursa-int8": ("tiny-ursa", "transformer", matrix, torch.int8, "int8"),
    "ursa-bool": ("tiny-ursa", "vae", vector, torch.bool, "bool"),
    "qwen-int8": ("tiny-qwen-edit", "transformer", matrix, torch.int8, "I8"),
    "qwen-bool": ("tiny-qwen-edit", "vae", vector, torch.bool, "BOOL"),
}


@pytest.mark.parametrize("case", sorted(WRONG_DTYPES))
def test_integer_or_bool_weights_of_the_right_shape(case: str, tmp_path: Path, in_png: Path) -> None:
    """Same shape, wrong kind: URSA crashed in load_state_dict, diffusers silently cast to float."""
    model, component, pick, dtype, word = WRONG_DTYPES[case]
    folder = copy_model(model, tmp_path)
    key = edit_tensor(folder / component / WEIGHTS, pick, lambda t: (t > 0) if dtype == torch.bool else t.to(dtype))
    result = generate(folder, tmp_path) if model == "tiny-ursa" else edit(folder, in_png, tmp_path)
    one_line_error(result, str(folder / component), f"'{key}'", word, "floating-point")


def _poison(value: float) -> Callable[[torch.Tensor], torch.Tensor]:
    def change(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t.view(-1)[t.numel() // 2] = value
        return t

    return change


NON_FINITE = {
    # (model, component, weights file, pick, value)
    "ursa-transformer-nan": ("tiny-ursa", "transformer", WEIGHTS, matrix, float("nan")),
    "ursa-vae-inf": ("tiny-ursa", "vae", WEIGHTS, vector, float("-inf")),
    "qwen-vae-inf": ("tiny-qwen-edit", "vae", WEIGHTS, vector, float("inf")),
    "qwen-transformer-nan": ("tiny-qwen-edit", "transformer", WEIGHTS, matrix, float("nan")),
    "qwen-text-encoder-nan": ("tiny-qwen-edit", "text_encoder", "model.safetensors", matrix, float("nan")),
}


@pytest.mark.parametrize("case", sorted(NON_FINITE))
def test_nan_or_inf_weights_are_refused_at_load(case: str, tmp_path: Path, in_png: Path) -> None:
    model, component, name, pick, value = NON_FINITE[case]
    folder = copy_model(model, tmp_path)
    key = edit_tensor(folder / component / name, pick, _poison(value))
    result = generate(folder, tmp_path) if model == "tiny-ursa" else edit(folder, in_png, tmp_path)
    one_line_error(result, str(folder / component), "NaN or infinite")
    if component != "text_encoder":  # transformers renames the text encoder's keys while loading
        assert f"'{key}'" in result.stderr


def test_nan_code_in_an_fp8_transformer_file(tmp_path: Path, in_png: Path) -> None:
    """fp8 codes are checked too: 0x7F is NaN in float8_e4m3fn."""
    from difforge.models.qwen_edit import build_tiny_fp8_transformer

    folder = ensure_tiny("tiny-qwen-edit")
    fp8 = tmp_path / "scaled.safetensors"
    build_tiny_fp8_transformer(folder, fp8, "scaled")
    key = edit_tensor(fp8, lambda k, t: t.dtype == torch.float8_e4m3fn,
                      lambda t: t.view(torch.uint8).index_fill(1, torch.tensor([0]), 0x7F).view(t.dtype))
    one_line_error(edit(folder, in_png, tmp_path, "--transformer", str(fp8)), str(fp8), f"'{key}'", "NaN or infinite")


def test_fp8_layers_are_judged_after_their_scale() -> None:
    """Codes are read as bits; a scale that overflows the compute dtype is caught by dequantising that layer."""
    from difforge.models.qwen_edit.fp8 import Fp8Linear
    from difforge.models.qwen_edit.loader import check_finite_weights

    def layer(codes: list[float], dtype: torch.dtype, scale: float | None = None) -> torch.nn.Module:
        weight = torch.tensor([codes], dtype=torch.float32).to(dtype)
        return torch.nn.Sequential(Fp8Linear(weight, None, None if scale is None else torch.tensor(scale)))

    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    check_finite_weights(layer([448.0, -1.0], e4m3), Path("ok"), torch.float16)
    check_finite_weights(layer([57344.0], e5m2), Path("ok"), torch.float16)
    check_finite_weights(layer([1.0, 0.5], e4m3, scale=1e37), Path("ok"), torch.float32)  # bound fails, values fit
    with pytest.raises(CheckpointError, match="'0.weight' (is|holds) NaN or infinite"):
        nan = layer([1.0], e4m3)
        nan[0].weight.data.view(torch.uint8)[0, 0] = 0x7F
        check_finite_weights(nan, Path("bad"), torch.bfloat16)
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        check_finite_weights(layer([float("inf")], e5m2), Path("bad"), torch.float32)
    with pytest.raises(CheckpointError, match="in float16"):
        check_finite_weights(layer([448.0], e4m3, scale=200.0), Path("bad"), torch.float16)  # 89600 > 65504
    check_finite_weights(layer([448.0], e4m3, scale=200.0), Path("ok"), torch.bfloat16)


# ---- D8: DIFFORGE_HOME where tiny models cannot be built ----------------------------------------------


def _no_half_built(home: Path) -> None:
    models = home / "models"
    assert not models.exists() or list(models.iterdir()) == []


def test_difforge_home_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("DIFFORGE_HOME", str(home))
    one_line_error(generate("tiny-ursa", tmp_path), "Cannot build the built-in model tiny-ursa", str(home),
                   "Not a directory")


def test_difforge_home_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DIFFORGE_HOME", str(home))
    if os.geteuid() == 0:  # root ignores mode bits: refuse the write the way a read-only folder would
        import tempfile

        def refuse(*args, **kwargs):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

        (home / "models").mkdir()
        monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    else:
        home.chmod(0o555)
    try:
        one_line_error(generate("tiny-ursa", tmp_path), "Cannot build the built-in model tiny-ursa", "Permission denied")
    finally:
        home.chmod(0o755)
    _no_half_built(home)


@pytest.mark.parametrize("error", ["oserror", "safetensors"])
def test_full_disk_while_building_leaves_nothing(error: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk mid-build is one OutputError and no half-built folder (safetensors reports ENOSPC as its own type)."""
    from safetensors import SafetensorError

    from difforge.models.ursa import tiny as ursa_tiny

    home = tmp_path / "home"
    monkeypatch.setenv("DIFFORGE_HOME", str(home))
    real_save = ursa_tiny.save_file
    calls = []

    def full(tensors, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:  # the first file fits, the second does not
            return real_save(tensors, path, *args, **kwargs)
        if error == "oserror":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(ursa_tiny, "save_file", full)
    one_line_error(generate("tiny-ursa", tmp_path), "Cannot build the built-in model tiny-ursa",
                   "No space left on device")
    assert len(calls) == 2
    _no_half_built(home)
