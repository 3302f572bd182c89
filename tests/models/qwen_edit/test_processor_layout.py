"""The built-in Qwen folders load where real folders load: with transformers' torchvision branch active.

With torchvision installed, transformers' ``Qwen2VLProcessor`` builds a video processor and reads
its config from ``processor/``; the built-ins lacked it, so ``edit`` and ``validate`` exited 2 on the
2026-12-04 H200 (``../shared/real-hardware/h200-2026-12-04/qwen-processor-load.txt``).  PyPI's
torchvision does not import beside the pinned CPU torch, so each check runs in a child interpreter
with a stand-in torchvision (``standin_torchvision/sitecustomize.py``) that transformers' own
availability checks accept.  A folder in the old layout must fail there as it did on the H200 -
so the check can fail - and difforge must say so in one line (exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from difforge.errors import CheckpointError
from difforge.models.qwen_edit.folder import check_processor_files
from difforge.models.qwen_edit.tiny import IMAGE_PROCESSOR_FILE, VIDEO_PROCESSOR_FILE
from difforge.models.tiny import ensure_tiny
from difforge.models.trained import trained_path

STANDIN = Path(__file__).parent / "standin_torchvision"

#: Loads ``argv[1]``'s processor the way difforge's loader does, reports what transformers built.
_LOAD = """
import json, sys
from pathlib import Path
from transformers.utils import is_torchvision_available
from difforge.models.qwen_edit.folder import processor_builds_video
from difforge.models.qwen_edit.loader import _load_text_side
out = {"torchvision": is_torchvision_available(), "builds_video": processor_builds_video()}
try:
    parts = _load_text_side(Path(sys.argv[1]))
    out["video_processor"] = type(getattr(parts["processor"], "video_processor", None)).__name__
    out["image_processor"] = type(parts["processor"].image_processor).__name__
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""
#: transformers' own call, without difforge in between: the H200's failing call.
_RAW = """
import sys
from transformers import AutoProcessor
AutoProcessor.from_pretrained(sys.argv[1], local_files_only=True, trust_remote_code=False)
"""


def child(code: str, *args: str, torchvision: bool = True, cli: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if torchvision:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STANDIN), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "difforge", *args] if cli else [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def load_report(folder: Path, torchvision: bool = True) -> dict:
    result = child(_LOAD, str(folder), torchvision=torchvision)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def old_layout(folder: Path, tmp_path: Path) -> Path:
    """A copy of ``folder`` whose processor/ is what transformers 5 saves without torchvision:
    the image settings nested in processor_config.json, no preprocessor or video config."""
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    proc = copy / "processor"
    image = json.loads((proc / IMAGE_PROCESSOR_FILE).read_text())
    (proc / "processor_config.json").write_text(json.dumps({"image_processor": image, "processor_class": "Qwen2VLProcessor"}))
    (proc / IMAGE_PROCESSOR_FILE).unlink()
    (proc / VIDEO_PROCESSOR_FILE).unlink()
    return copy


@pytest.mark.parametrize("name", ["shapes-qwen-edit", "tiny-qwen-edit", "tiny-qwen-edit-plus"])
def test_builtin_has_the_published_processor_layout(name: str) -> None:
    folder = trained_path(name) if name.startswith("shapes") else ensure_tiny(name)
    proc = folder / "processor"
    image = json.loads((proc / IMAGE_PROCESSOR_FILE).read_text())
    video = json.loads((proc / VIDEO_PROCESSOR_FILE).read_text())
    assert image["image_processor_type"] == "Qwen2VLImageProcessor"
    assert video["video_processor_type"] == "Qwen2VLVideoProcessor"
    assert image["processor_class"] == video["processor_class"] == "Qwen2VLProcessor"
    for key in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels", "image_mean", "image_std"):
        assert video[key] == image[key], key  # one set of vision settings, as in the published files
    assert not (proc / "processor_config.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["shapes-qwen-edit", "tiny-qwen-edit", "tiny-qwen-edit-plus"])
def test_builtin_loads_with_the_torchvision_branch_active(name: str) -> None:
    folder = trained_path(name) if name.startswith("shapes") else ensure_tiny(name)
    report = load_report(folder)
    assert report["torchvision"] and report["builds_video"], report  # the branch the H200 took
    assert report.get("video_processor") == "Qwen2VLVideoProcessor", report


@pytest.mark.slow
def test_old_layout_fails_like_the_h200_and_difforge_says_so_in_one_line(tmp_path: Path) -> None:
    folder = old_layout(trained_path("shapes-qwen-edit"), tmp_path)
    raw = child(_RAW, str(folder / "processor"))
    assert raw.returncode != 0
    assert "OSError: Can't load video processor" in raw.stderr and VIDEO_PROCESSOR_FILE in raw.stderr, raw.stderr[-1500:]
    picture = tmp_path / "in.png"
    from difforge.runtime.images import test_picture

    test_picture(64, 64).save(picture)
    out = tmp_path / "out.png"
    result = child("", "edit", "--model", str(folder), "--image", str(picture), "--prompt", "x", "--steps", "2",
                   "--output", str(out), "--quiet", cli=True)
    assert result.returncode == 2, (result.returncode, result.stderr[-1500:])
    err = result.stderr.strip()
    assert err.startswith("difforge: error: ") and len(err.splitlines()) == 1, err
    assert VIDEO_PROCESSOR_FILE in err and str(folder / "processor") in err, err
    assert not out.exists()


@pytest.mark.slow
def test_old_layout_still_loads_without_torchvision(tmp_path: Path) -> None:
    """The check refuses only where transformers would fail: without torchvision the shim drops the slot."""
    folder = old_layout(trained_path("shapes-qwen-edit"), tmp_path)
    report = load_report(folder, torchvision=False)
    assert not report["torchvision"] and not report["builds_video"], report
    assert "error" not in report and report["video_processor"] == "NoneType", report


def test_check_processor_files_names_the_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge.models.qwen_edit import folder as folder_checks

    proc = old_layout(trained_path("shapes-qwen-edit"), tmp_path) / "processor"
    monkeypatch.setattr(folder_checks, "processor_builds_video", lambda: True)
    with pytest.raises(CheckpointError, match=VIDEO_PROCESSOR_FILE):
        check_processor_files(proc)
    (proc / VIDEO_PROCESSOR_FILE).write_text("{}")
    check_processor_files(proc)  # the file is there: nothing to say
    monkeypatch.setattr(folder_checks, "processor_builds_video", lambda: False)
    (proc / VIDEO_PROCESSOR_FILE).unlink()
    check_processor_files(proc)  # no video branch: the folder loads, nothing to refuse


def test_memory_estimate_reads_the_published_layout(tmp_path: Path) -> None:
    """The estimate's vision settings come from preprocessor_config.json (published) or the nested form (transformers 5)."""
    from difforge.models.qwen_edit.memory import VISION_DEFAULTS, processor_settings

    folder = trained_path("shapes-qwen-edit")
    settings = processor_settings(folder)
    assert settings["max_pixels"] == 12544 != VISION_DEFAULTS["max_pixels"]  # the folder's, not the defaults
    nested = old_layout(folder, tmp_path)
    assert processor_settings(nested) == settings
