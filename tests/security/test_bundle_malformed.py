"""Issue 26 (S2, W5): what a bundle names must be a file it holds, and a malformed bundle is exit 2, not 1.

Each case edits a real golden bundle and recomputes its SHA256SUMS (so the bundle's own check passes, as an
attacker's would): an absolute or ``..`` picture path, a picture folder linked elsewhere, lists where objects
belong, nesting thousands deep, a tensor name the tensors file lacks.  Each is refused when the bundle is opened
(before anything loads), naming the file; no host file reaches the report.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from difforge.cli import app
from difforge.validate.bundle import GoldenError, check_shape, open_bundle
from tests.security.test_bundle_identity import DUT
from tests.test_cli_inputs import assert_refused

runner = CliRunner()


def resum(folder: Path) -> None:
    """Recompute SHA256SUMS over every listed file, as a forger would."""
    names = [line.split("  ", 1)[1] for line in (folder / "SHA256SUMS").read_text().splitlines()]
    (folder / "SHA256SUMS").write_text("".join(
        f"{hashlib.sha256((folder / n).read_bytes()).hexdigest()}  {n}\n" for n in names))


def edited(bundle: Path, to: Path, name: str, change: Callable[[Any], Any] | None = None, raw: str | None = None) -> Path:
    shutil.copytree(bundle, to)
    if raw is not None:
        (to / name).write_text(raw)
    else:
        value = json.loads((to / name).read_text())
        (to / name).write_text(json.dumps(change(value) if change else value))
    resum(to)
    return to


def _first_run(data: dict[str, Any]) -> dict[str, Any]:
    return next(iter(data["runs"].values()))


def _set(path: list[Any], value: Any) -> Callable[[Any], Any]:
    def change(doc: Any) -> Any:
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return doc
    return change


SECRET = "/etc/hostname"


def opened(folder: Path) -> None:
    """What ``validate --golden`` does first: open the bundle (files, sums, tensors) and check its shape."""
    check_shape(open_bundle(folder))


@pytest.mark.parametrize(("name", "change", "needle"), [
    ("data.json", lambda d: (_first_run(d)["ref"].__setitem__("images", [SECRET]), d)[1], "a file it does not hold"),
    ("data.json", lambda d: (_first_run(d)["ref"].__setitem__("images", ["../../outside.png"]), d)[1],
     "a file it does not hold"),
    ("data.json", lambda d: (d.__setitem__("gallery", [{"prompt": "p", "image": SECRET}]), d)[1],
     "a file it does not hold"),
    ("manifest.json", lambda m: (m["inputs"].__setitem__("images", [{"file": SECRET, "sha256": "0" * 64}]), m)[1],
     "a file it does not hold"),
])
def test_paths_outside_the_bundle_are_refused(golden: tuple[Path, str], tmp_path: Path, name: str,
                                              change: Callable[[Any], Any], needle: str) -> None:
    forged = edited(golden[0], tmp_path / "forged", name, change)
    with pytest.raises(GoldenError, match=needle):
        opened(forged)
    report = tmp_path / "r"
    result = runner.invoke(app, ["validate", *DUT, "--golden", str(forged), "--out", str(report)])
    assert_refused(result, needle)
    assert not report.exists()


def test_a_picture_folder_linked_elsewhere_is_refused(golden: tuple[Path, str], tmp_path: Path) -> None:
    forged = tmp_path / "forged"
    shutil.copytree(golden[0], forged)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(forged / "images", elsewhere)
    (forged / "images").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(GoldenError, match="outside|does not list"):
        opened(forged)


@pytest.mark.parametrize(("name", "change", "needle"), [
    ("manifest.json", _set(["floor"], []), "manifest.json is malformed at /floor: must be an object"),
    ("manifest.json", _set(["weights"], ["a"]), "manifest.json is malformed at /weights"),
    ("manifest.json", _set(["floor", "kind"], "elsewhere"), "/floor/kind: must be one of"),
    ("data.json", _set(["runs"], []), "data.json is malformed at /runs: must be an object"),
    ("data.json", _set(["seeds"], {"0": 0}), "data.json is malformed at /seeds: must be a list"),
    ("data.json", _set(["gallery"], [{"prompt": 3, "image": "x"}]), "/gallery/0/prompt: must be a string"),
    ("data.json", lambda d: (_first_run(d)["ref"]["trace"]["__dict__"].__setitem__("inputs", {"__list__": 5}), d)[1],
     "__list__ holds int"),
    ("data.json", lambda d: (_first_run(d)["ref"]["trace"]["__dict__"].__setitem__("inputs", {"__list__": [{"__tensor__": "nope"}]}), d)[1],
     "names a tensor 'nope'"),
])
def test_malformed_json_is_refused_when_opened(golden: tuple[Path, str], tmp_path: Path, name: str,
                                               change: Callable[[Any], Any], needle: str) -> None:
    forged = edited(golden[0], tmp_path / "forged", name, change)
    with pytest.raises(GoldenError, match=needle.replace("[", r"\[")):
        opened(forged)


@pytest.mark.parametrize("name", ["manifest.json", "data.json"])
def test_deep_nesting_is_refused(golden: tuple[Path, str], tmp_path: Path, name: str) -> None:
    forged = edited(golden[0], tmp_path / "forged", name, raw='{"format": "difforge-golden", "x": '
                    + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(GoldenError, match="nested too deeply"):
        opened(forged)
    if name == "data.json":  # and unpack's own bound, below JSON's
        shallow = edited(golden[0], tmp_path / "shallow", name, _set(["seeds"], [[[[[[[[[[0]]]]]]]]]] * 1))
        with pytest.raises(GoldenError, match="malformed"):
            opened(shallow)


def test_cli_malformed_bundle_is_one_line_exit_2(golden: tuple[Path, str], tmp_path: Path) -> None:
    forged = edited(golden[0], tmp_path / "forged", "data.json", _set(["components"], "none"))
    report = tmp_path / "r"
    result = runner.invoke(app, ["validate", *DUT, "--golden", str(forged), "--out", str(report)])
    assert_refused(result, "data.json is malformed at /components")
    assert not report.exists()


def test_capture_manifest_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    from tests.security.test_outputs_out_folder import fake_bundle

    capture = tmp_path / "C"
    fake_bundle(capture, "difforge-capture")
    manifest = json.loads((capture / "manifest.json").read_text())
    manifest["options"] = ["steps", 2]
    (capture / "manifest.json").write_text(json.dumps(manifest))
    resum(capture)
    result = runner.invoke(app, ["validate", "--capture", str(capture), "--out", str(tmp_path / "r")])
    assert_refused(result, "manifest.json is malformed at /options")
