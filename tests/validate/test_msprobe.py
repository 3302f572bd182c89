"""``--msprobe``: msprobe's own dumps of the device's and the floor's step 0, and msprobe compare's table in the
report, beside difforge's verdicts (issue 16).

The tests that run msprobe are skipped, with the reason, where it is not importable: ``make test-msprobe``
installs ``difforge[msprobe]`` into its own virtualenv (``.venv-msprobe``, layered on ``.venv``) and runs
this file.  The refusal without msprobe and the report's how-to run everywhere (msprobe is made to look
absent).  Sizes are small (tiny-ursa, 64x64, --quick, one timed round, no warm-up).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from difforge import cli
from difforge.errors import InputError
from difforge.report import write_report
from difforge.validate import ValidateOptions, Verdict, msprobe_view
from difforge.validate.bundle import GoldenError

from ..report.test_render import _result
from .ladder_run import run_validation
from .test_ladder import broken_rms_norm

ROOT = Path(__file__).resolve().parents[2]
needs_msprobe = pytest.mark.skipif(
    not msprobe_view.available(),
    reason="msprobe (mindstudio-probe) is not installed; 'make test-msprobe' installs difforge[msprobe] into "
           ".venv-msprobe and runs this file")
TINY = ["--model", "tiny-ursa", "--dtype", "bfloat16", "--height", "64", "--width", "64", "--quick", "--quiet"]


def _opts(out: Path, **kw) -> ValidateOptions:
    return ValidateOptions(model="tiny-ursa", device="cpu", dtype="bfloat16", quick=True, height=64, width=64,
                           rounds=1, warmup=0, out=out, quiet=True, msprobe=True, **kw)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}", "OMP_NUM_THREADS": "1"}
    env.pop("DIFFORGE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "difforge", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)


# ---- without msprobe ------------------------------------------------------------------------------------
def test_without_msprobe_the_flag_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(msprobe_view, "available", lambda: False)
    with pytest.raises(InputError) as exc:
        run_validation(_opts(tmp_path / "r"))
    assert exc.value.exit_code == 2 and "pip install 'difforge[msprobe]'" in str(exc.value)
    assert not (tmp_path / "r").exists()
    for command in (["validate", "--device", "cpu"], ["golden"]):
        res = CliRunner().invoke(cli.app, [*command, *TINY, "--msprobe", "--out", str(tmp_path / "o")])
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert res.exit_code == 2 and len(lines) == 1, res.output
        assert "--msprobe needs msprobe" in lines[0] and "pip install 'difforge[msprobe]'" in lines[0]
    assert not (tmp_path / "o").exists()


def test_the_report_always_says_how_to_get_the_msprobe_view(tmp_path: Path) -> None:
    result, files = _result(tmp_path)  # a report without the view (no "msprobe" data at all)
    for lang, heading in (("en", r"\d+\.\d+ msprobe view"), ("zh", r"\d+\.\d+ msprobe 视图")):  # an accuracy subsection
        paths = write_report(result, tmp_path, lang=lang, files=files)
        for kind in ("markdown", "html"):
            text = paths[kind].read_text().replace("\\", "")  # report.md escapes the brackets
            assert re.search(heading, text) and "difforge[msprobe]" in text and "--msprobe" in text, (lang, kind)


def test_golden_without_a_msprobe_dump_is_refused_for_msprobe() -> None:
    golden = SimpleNamespace(bundle=SimpleNamespace(manifest={"format": "difforge-golden"}))
    with pytest.raises(GoldenError, match="difforge golden --msprobe"):
        msprobe_view.check_golden(golden, "g/")


# ---- with msprobe ------------------------------------------------------------------------------------------
@needs_msprobe
def test_a_broken_kernel_shows_in_msprobes_table_where_difforge_localises_it(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = run_validation(_opts(out, op_overrides={"rms_norm": broken_rms_norm}))
    assert result.verdict is Verdict.FAIL
    first = result.rungs["step"].data["localisation"]["first_divergent"]
    assert first == "model.layers.0"
    m = json.loads(result.report_paths["json"].read_text())["msprobe"]
    assert m["requested"] and not m.get("error"), m.get("error")
    # msprobe's own layout: DIR/msprobe/{device,floor}/step0/<rank or proc>/dump.json (+ construct, stack)
    for side in ("device", "floor"):
        (rank,) = (out / "msprobe" / side / "step0").iterdir()
        assert {p.name for p in rank.iterdir()} >= {"dump.json", "construct.json", "stack.json"}
        assert json.loads((rank / "dump.json").read_text())["task"] == "statistics"
    assert m["golden"]["kind"] == "emulated" and m["unit"].startswith("teacher-forced step 0")
    csv = out / m["csv"]
    assert csv.is_file() and m["csv"] in (out / "SHA256SUMS").read_text()  # a deliverable like every file
    # the fault is where difforge located it: msprobe's first flagged call ran in that block, and so do
    # the worst rows inside the transformer; difforge's verdict stands beside msprobe's Result
    flagged = m["first_flagged"]
    assert flagged["block"] == first and flagged["result"] in ("error", "warning")
    assert flagged["difforge_block"] == f"{first}: FAIL (first divergent)"
    in_blocks = [r for r in m["worst"] if r["block"]]
    assert in_blocks and in_blocks[0]["block"] in (first, "model.layers.1")
    assert m["counts"].get("error", 0) > 0
    md = result.report_paths["markdown"].read_text()
    html = result.report_paths["html"].read_text()
    for text in (md, html):
        assert "msprobe compare -tp" in text and "msprobe graph_visualize" in text and "CANN" in text
        assert "Tensor.add\\_.0.forward" in text or "Tensor.add_.0.forward" in text
    log = (out / "msprobe" / "msprobe.log").read_text()
    assert msprobe_view.CANN_LINE not in log and "msprobe compare ends successfully" in log
    # the graph view the report tells users to open works on these dumps
    graph = tmp_path / "graph"
    res = subprocess.run([sys.executable, "-m", "msprobe.msprobe", "graph_visualize", "-tp",
                          str(out / m["device_dump"]), "-gp", str(out / m["golden_dump"]), "-o", str(graph)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and list(graph.glob("*.vis*")), res.stdout[-2000:]


@needs_msprobe
def test_golden_bundle_holds_the_floor_dump_and_a_clean_device_compares_dtype_for_dtype(tmp_path: Path) -> None:
    bundle, report = tmp_path / "bundle", tmp_path / "report"
    res = _cli("golden", *TINY, "--msprobe", "--out", str(bundle))
    assert res.returncode == 0, res.stderr[-2000:]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["msprobe"]["floor"] == "msprobe/floor/step0" and manifest["msprobe"]["kind"] == "emulated"
    sums = (bundle / "SHA256SUMS").read_text()
    assert "msprobe/floor/step0/" in sums and "dump.json" in sums  # a listed (tamper-checked) part of the bundle
    res = _cli("validate", *TINY, "--device", "cpu", "--rounds", "1", "--warmup", "0", "--golden", str(bundle),
               "--msprobe", "--out", str(report))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[INFO]" not in res.stdout and "[ERROR]" not in res.stdout + res.stderr  # msprobe's log stays in its file
    data = json.loads((report / "report.json").read_text())
    m = data["msprobe"]
    assert data["verdict"] == "PASS" and not m.get("error"), m.get("error")
    assert m["golden"]["from_bundle"] and (report / "msprobe" / "floor" / "step0").is_dir()
    # the floor's dump holds the device's dtypes, so msprobe compares like with like: no dtype errors
    assert m["dtype_mismatch"] == 0 and m["counts"].get("error", 0) == 0
    assert m["rows_total"] > 100 and "--msprobe" in data["reproduce"][0]
