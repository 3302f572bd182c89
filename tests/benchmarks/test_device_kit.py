"""The offline device kit (scripts/device_kit.py) carries what difforge needs: pure, no network.

A GPU machine without a package index gets difforge's runtime stack as wheels; a requirement the
kit neither carries nor leaves, by name, to the machine's image is an ImportError there after a
device call was spent.  These checks read pyproject.toml and the installed metadata only.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kit():
    spec = importlib.util.spec_from_file_location("device_kit", ROOT / "scripts" / "device_kit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_runtime_requirement_but_torch_travels_or_is_the_targets(kit) -> None:
    requirements = kit.project_requirements()
    assert "torch" in requirements and {"diffusers", "transformers"} <= set(requirements)
    carried = kit.kit_packages(requirements)
    for name in requirements:
        if name == "torch":
            assert name not in carried  # the machine's own CUDA/NPU build stays
        else:
            assert name in carried or name in kit.TARGET_PROVIDES, name
    # what the 2026-12-04 H200 lacked or had too old travels, whatever the image list says
    for name in ("diffusers", "transformers", "regex", "importlib-metadata", "safetensors", "tokenizers",
                 "huggingface-hub", "typer", "rich", "jinja2"):
        assert name in carried, name
    assert not {"diffusers", "transformers"} & set(kit.TARGET_PROVIDES)


def test_carry_all_covers_every_requirement_and_its_dependencies(kit) -> None:
    requirements = kit.project_requirements()
    carried = kit.kit_packages(requirements, carry_all=True)
    assert set(requirements) - {"torch"} <= set(carried)
    torch_only = kit.closure(["torch"]) - (set(requirements) - {"torch"})
    for name in carried:  # each carried package's own requirements travel too, or come with torch
        for dep in kit._requires(name):
            assert dep in carried or dep in torch_only, (name, dep)
    assert set(kit.TARGET_PROVIDES) <= set(carried) | torch_only | {"six"}


def test_one_version_each_and_the_download_is_binary_only_for_the_gpu_machines(kit, tmp_path: Path) -> None:
    packages = kit.kit_packages(kit.project_requirements())
    cmd = kit.download_command(packages, tmp_path, "manylinux", "3.12")
    assert {"--no-deps", "--only-binary=:all:"} <= set(cmd)
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "manylinux_2_28_x86_64" in cmd
    assert sorted(a for a in cmd if "==" in a) == sorted(f"{n}=={v}" for n, v in packages.items())
    local = kit.download_command(packages, tmp_path, "local", "3.12")
    assert "--platform" not in local and "--python-version" not in local
    with pytest.raises(SystemExit, match="--platform"):
        kit.download_command(packages, tmp_path, "win32", "3.12")


def test_check_wheels_refuses_two_versions_a_missing_wheel_and_no_difforge(kit, tmp_path: Path) -> None:
    def wheel(name: str) -> None:
        (tmp_path / name).write_bytes(b"")

    wheel("regex-2026.11.19-cp312-cp312-manylinux_2_17_x86_64.whl")
    wheel("Jinja2-3.1.6-py3-none-any.whl")
    with pytest.raises(SystemExit, match="difforge"):
        kit.check_wheels(tmp_path, {"regex": "2026.11.19", "jinja2": "3.1.6"})
    wheel("difforge-0.1.0-py3-none-any.whl")
    kit.check_wheels(tmp_path, {"regex": "2026.11.19", "jinja2": "3.1.6"})
    with pytest.raises(SystemExit, match="no wheel for typer==0.29.2"):
        kit.check_wheels(tmp_path, {"regex": "2026.11.19", "typer": "0.29.2"})
    wheel("regex-2025.1.1-cp312-cp312-manylinux_2_17_x86_64.whl")
    with pytest.raises(SystemExit, match="more than one version"):
        kit.check_wheels(tmp_path, {"regex": "2026.11.19"})


def test_preflight_names_a_missing_requirement(kit, monkeypatch: pytest.MonkeyPatch) -> None:
    assert kit.preflight() == []  # this environment is complete
    real = kit.md.version

    def version(name: str) -> str:
        if kit.normalise(name) == "regex":
            raise kit.md.PackageNotFoundError(name)
        return "0.0.1" if kit.normalise(name) == "tokenizers" else real(name)

    monkeypatch.setattr(kit.md, "version", version)
    problems = kit.preflight()
    assert any(p.startswith("regex: not installed") for p in problems), problems
    assert any(p.startswith("tokenizers 0.0.1: outside") for p in problems), problems


def test_run_script_installs_offline_and_never_resolves_dependencies() -> None:
    text = (ROOT / "scripts" / "device_kit_run.sh").read_text()
    assert "pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target" in text
    assert "install -e" not in text and "validate" not in text.split("# 2.")[1]  # captures only: judged elsewhere
    for model in ("shapes-ursa", "shapes-qwen-edit", "tiny-ursa", "tiny-qwen-edit"):
        assert model in text
    assert "bf16 fp16" in text and "--device \"$DEV\"" in text and "--quick" in text
    # eight captures within the tarball's 8 MB: each made under --max-bytes of an eighth of it, at 64x64
    assert "MAX_BYTES=${KIT_MAX_BYTES:-8000000}" in text and "CAPTURE_BYTES=${KIT_CAPTURE_BYTES:-$((MAX_BYTES / 8))}" in text
    assert "--height 64 --width 64 --max-bytes \"$CAPTURE_BYTES\"" in text
    out = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "device_kit_run.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_list_prints_pinned_names(kit) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_kit.py"), "--list"], capture_output=True,
                         text=True, check=True).stdout.split()
    assert "diffusers==" + kit.md.version("diffusers") in out
    assert not any(line.startswith("torch==") for line in out)


def test_the_reference_travels_only_when_its_source_is_here(kit, tmp_path: Path, monkeypatch) -> None:
    """diffnext's wheel is built at kit time from a source folder (never committed); none there, none carried."""
    monkeypatch.delenv(kit.REFERENCE_ENV, raising=False)
    monkeypatch.setattr(kit, "ROOT", tmp_path / "project")
    assert kit.reference_source() is None
    src = tmp_path / "ursa"
    (src / "diffnext").mkdir(parents=True)
    (src / "diffnext" / "__init__.py").write_text("VALUE = 1\n")
    (src / "setup.py").write_text("import setuptools\nsetuptools.setup(name='diffnext', version='0.3.0a0', "
                                  "packages=['diffnext'])\n")
    monkeypatch.setenv(kit.REFERENCE_ENV, str(src / "diffnext"))  # the package folder works as well
    assert kit.reference_source() == src
    with pytest.raises(SystemExit, match="no diffnext source"):
        kit.reference_source(tmp_path / "elsewhere")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    made = kit.build_reference_wheel(src, wheels)
    assert made.name.startswith("diffnext-0.3.0a0-") and made.suffix == ".whl"
    assert not (src / "build").exists() and sorted(p.name for p in src.iterdir()) == ["diffnext", "setup.py"]
