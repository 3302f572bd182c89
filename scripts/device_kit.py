"""Build the offline device kit: wheels + a run script for a GPU machine with no package index.

The 2026-12-04 H200 machine had torch but no package index, no diffusers and an older
transformers, so ``pip install -e .`` could not work there; the packages had to travel as wheels
made here.  ``make device-kit`` writes, in the ignored folder ``.kit/``:

- ``wheels/``: difforge's own wheel (``pip wheel --no-deps .``) and one wheel of every package
  difforge needs at run time that a torch-only machine lacks, at the versions installed in the
  environment running this script (the tested ones: constraints.txt builds it), for CPython 3.12 on
  manylinux x86_64 (``--platform local``: this interpreter's own tags, so the same script builds
  the kit the offline-install test installs here);
- ``run.sh``: a copy of ``scripts/device_kit_run.sh``, which installs the wheels with
  ``pip --no-index --no-deps --target``, runs this file's ``--preflight`` there, and captures the
  built-in models (see that script); ``kit.py``: a copy of this file, for the preflight;
- ``manifest.json``: every wheel with its distribution, version, bytes and sha256.

The reference, diffnext (BAAI's URSA code, for ``bench_ursa``'s same-process ratios), travels as one
more wheel only when its source is here: ``--reference PATH`` (default ``$DIFFORGE_DIFFNEXT_PATH``,
else the ignored ``reference/`` folder), built with ``pip wheel --no-deps`` from a temporary copy at
kit time, never committed.  Its imports beyond difforge's stack (scipy, einops) are in the GPU image.

"A torch-only machine" has torch and what torch itself requires; every other package reached from
pyproject.toml's requirements travels (one version each: two would stop the install), including
the ones torch also pulls that difforge names itself (jinja2) - except the large binary ones the GPU
image brings (:data:`TARGET_PROVIDES`), which would push a device call past its 64 MiB;
``--carry-all`` carries those too.  Nothing is installed here.

    python scripts/device_kit.py [--out .kit] [--platform manylinux|local] [--python-version 3.12]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_SCRIPT = ROOT / "scripts" / "device_kit_run.sh"
#: The packages the target machine brings: torch, and (through it) what torch requires.
TARGET_ROOTS = ("torch",)
#: Large binary packages the GPU machines' image also brings (the device README's package list for
#: nvidia-h200; numpy 2.5.2 there), at versions inside difforge's ranges.  Left out by default because
#: a device call carries at most 64 MiB with the working tree (about 16 MiB), and with them the kit is
#: 87 MiB; ``--carry-all`` carries them too (a bare machine).  The kit's preflight (``--preflight``,
#: run first on the machine) checks every requirement there and names any that is missing or too old.
TARGET_PROVIDES = ("numpy", "pillow", "matplotlib", "contourpy", "kiwisolver", "fonttools", "cycler", "pyparsing",
                   "python-dateutil", "six", "psutil", "pyyaml", "hf-xet")
#: pip's platform tags for the GPU machines (glibc manylinux x86_64): pip matches each N exactly, so
#: the common ones are listed (the device README's list).
MANYLINUX = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_35_x86_64")
#: Where the reference's source may be named (as bench_ursa reads it).
REFERENCE_ENV = "DIFFORGE_DIFFNEXT_PATH"
#: A wheel file name: distribution, version, then the tags (PEP 427).
WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def normalise(name: str) -> str:
    """PEP 503's comparison form of a distribution name (``Jinja2``, ``jinja2`` and ``jinja-2`` agree)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The normalised names of ``[project].dependencies`` (extras are not run-time needs)."""
    import tomllib
    from packaging.requirements import Requirement

    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    return [normalise(Requirement(d).name) for d in deps]


def _requires(name: str) -> list[str]:
    """What installed distribution ``name`` requires here (markers evaluated, extras left out)."""
    from packaging.requirements import Requirement

    out = []
    for text in md.distribution(name).requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        out.append(normalise(req.name))
    return out


def closure(roots: list[str] | tuple[str, ...]) -> set[str]:
    """Every distribution reached from ``roots`` through the installed packages' requirements."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(_requires(name))
    return seen


def kit_packages(requirements: list[str], carry_all: bool = False) -> dict[str, str]:
    """name -> installed version of every package the kit carries (sorted by name).

    The closure of the non-torch requirements, less what only the target's torch brings and (unless
    ``carry_all``) :data:`TARGET_PROVIDES`.  A package difforge requires directly travels even when
    torch also pulls it (its version range is ours).
    """
    wanted = [r for r in requirements if r not in TARGET_ROOTS]
    target_has = closure(TARGET_ROOTS) - set(wanted)
    if not carry_all:
        target_has |= set(TARGET_PROVIDES)
    missing = [r for r in wanted if not _installed(r)]
    if missing:
        raise SystemExit(f"device_kit: not installed here, so no version to carry: {', '.join(missing)}")
    return {name: md.version(name) for name in sorted(closure(wanted) - target_has)}


def _installed(name: str) -> bool:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


def wheel_distributions(folder: Path) -> dict[str, list[str]]:
    """normalised distribution -> versions of the wheels in ``folder``."""
    out: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.whl")):
        match = WHEEL_NAME.match(path.name)
        if match is None:
            raise SystemExit(f"device_kit: {path.name} is not a wheel file name")
        out.setdefault(normalise(match["name"]), []).append(match["version"])
    return out


def check_wheels(folder: Path, packages: dict[str, str]) -> None:
    """One wheel per distribution, each package of the kit present at its version, difforge's own there."""
    found = wheel_distributions(folder)
    twice = {n: v for n, v in found.items() if len(v) > 1}
    if twice:
        raise SystemExit(f"device_kit: more than one version of {twice}: the install would stop")
    absent = [f"{n}=={v}" for n, v in packages.items() if found.get(n) != [v]]
    if absent:
        raise SystemExit(f"device_kit: no wheel for {', '.join(absent)}")
    if "difforge" not in found:
        raise SystemExit("device_kit: difforge's own wheel is missing")


def download_command(packages: dict[str, str], dest: Path, platform: str, python_version: str) -> list[str]:
    """The one ``pip download`` of every package, binary wheels only, no dependency resolution."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    if platform == "manylinux":
        cmd += ["--python-version", python_version, "--implementation", "cp"]
        for tag in MANYLINUX:
            cmd += ["--platform", tag]
    elif platform != "local":
        raise SystemExit(f"device_kit: --platform must be manylinux or local, not {platform!r}")
    return cmd + [f"{name}=={version}" for name, version in packages.items()]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def preflight(dist: str = "difforge") -> list[str]:
    """On the target, with the kit installed: every requirement reached from ``dist`` that is missing
    or outside its range, one line each (empty when the stack is complete)."""
    from packaging.requirements import Requirement

    problems: list[str] = []
    seen: set[str] = set()
    todo = [dist]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in md.distribution(name).requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                version = md.version(req.name)
            except md.PackageNotFoundError:
                problems.append(f"{req.name}: not installed (needed by {name}: {text})")
                continue
            if req.specifier and not req.specifier.contains(version, prereleases=True):
                problems.append(f"{req.name} {version}: outside {req.specifier} (needed by {name})")
            todo.append(normalise(req.name))
    return problems


def reference_source(given: Path | None = None) -> Path | None:
    """The folder holding diffnext's ``setup.py`` and package: ``given``, else ``$DIFFORGE_DIFFNEXT_PATH``,
    else ``reference/`` - or None when none of them holds it (then no reference wheel travels)."""
    candidates = [given] if given is not None else [Path(os.environ[REFERENCE_ENV]) if os.environ.get(REFERENCE_ENV)
                                                     else None, ROOT / "reference"]
    for folder in candidates:
        if folder is None:
            continue
        folder = folder.expanduser()
        if folder.name == "diffnext":  # the package folder itself was named
            folder = folder.parent
        if (folder / "setup.py").is_file() and (folder / "diffnext" / "__init__.py").is_file():
            return folder
        if given is not None:
            raise SystemExit(f"device_kit: {given} holds no diffnext source (setup.py and diffnext/)")
    return None


def build_reference_wheel(source: Path, wheels: Path) -> Path:
    """diffnext's wheel, built from a temporary copy (its setup.py writes into the tree it builds)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "diffnext-src"
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns(".git", "assets", "*.pyc", "__pycache__"))
        before = set(wheels.glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(wheels), str(copy)], check=True)
    made = sorted(set(wheels.glob("diffnext-*.whl")) - before)
    if len(made) != 1:
        raise SystemExit(f"device_kit: building diffnext's wheel from {source} made {len(made)} wheels")
    return made[0]


def build(out: Path, platform: str, python_version: str, carry_all: bool = False,
          reference: Path | None = None) -> dict:
    """Write the kit into ``out`` (its wheels/ replaced); return the manifest."""
    packages = kit_packages(project_requirements(), carry_all)
    wheels = out / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    subprocess.run(download_command(packages, wheels, platform, python_version), check=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(ROOT)], check=True)
    check_wheels(wheels, packages)
    ref_wheel = build_reference_wheel(reference, wheels) if reference is not None else None
    shutil.copy2(RUN_SCRIPT, out / "run.sh")
    shutil.copy2(Path(__file__), out / "kit.py")  # the preflight, run there before anything else
    files = sorted(wheels.glob("*.whl"))
    manifest = {
        "platform": platform,
        "python_version": python_version if platform == "manylinux" else sys.version.split()[0],
        "carry_all": carry_all,
        "target_provides": [] if carry_all else list(TARGET_PROVIDES),
        "packages": packages,
        "wheels": [{"file": p.name, "bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files],
        "bytes": sum(p.stat().st_size for p in files),
        "reference": {"wheel": ref_wheel.name, "from": str(reference)} if ref_wheel is not None else None,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".kit", help="the kit folder (default .kit/)")
    parser.add_argument("--platform", default="manylinux", choices=("manylinux", "local"),
                        help="wheels for the GPU machines (manylinux x86_64) or for this interpreter (local)")
    parser.add_argument("--python-version", default="3.12", help="the target's Python (manylinux only)")
    parser.add_argument("--carry-all", action="store_true",
                        help="also carry what the GPU image brings (TARGET_PROVIDES): for a bare machine")
    parser.add_argument("--reference", type=Path, default=None,
                        help="diffnext's source folder, built into a wheel (default: $DIFFORGE_DIFFNEXT_PATH, "
                             "else reference/; none there: no reference wheel)")
    parser.add_argument("--no-reference", action="store_true", help="carry no diffnext wheel")
    parser.add_argument("--list", action="store_true", help="print the packages the kit would carry and stop")
    parser.add_argument("--preflight", action="store_true",
                        help="(on the target) check that every requirement of the installed difforge is satisfied")
    args = parser.parse_args(argv)
    if args.preflight:
        problems = preflight()
        for line in problems:
            print(f"preflight: {line}")
        print(f"preflight: {'FAILED' if problems else 'every requirement of difforge is satisfied'}")
        return 1 if problems else 0
    if args.list:
        for name, version in kit_packages(project_requirements(), args.carry_all).items():
            print(f"{name}=={version}")
        return 0
    reference = None if args.no_reference else reference_source(args.reference)
    manifest = build(args.out, args.platform, args.python_version, args.carry_all, reference)
    ref = manifest["reference"]
    print(f"device kit: {args.out} - {len(manifest['wheels'])} wheels, {manifest['bytes'] / 2**20:.1f} MiB"
          f" ({manifest['platform']}, Python {manifest['python_version']}); reference: "
          + (f"{ref['wheel']} from {ref['from']}" if ref else "none (no diffnext source here)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
