"""The GPU session script and its summary: bounded, one tarball, a section RESULTS.md takes as it is."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from benchmarks import bench_qwen_edit, bench_ursa

ROOT = Path(__file__).resolve().parents[2]
SESSION = ROOT / "benchmarks" / "gpu_session.sh"


@pytest.fixture(scope="module")
def summary_mod():
    spec = importlib.util.spec_from_file_location("device_kit_summary", ROOT / "scripts" / "device_kit_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_step_is_capped_and_the_whole_ends_inside_9_minutes() -> None:
    text = SESSION.read_text()
    default = int(re.search(r"SESSION_S=\$\{SESSION_S:-(\d+)\}", text).group(1))
    assert default <= 540  # 9 minutes, the packing included (each step stops 10 s before the session's end)
    caps = [int(m) for m in re.findall(r"^run \S+ +(\d+) ", text, re.M)]
    assert len(caps) >= 5 and all(c <= 180 for c in caps)
    assert 'timeout "$secs" "$@"' in text and "timeout 100 bash .kit/run.sh" in text
    assert text.count("tar -czf") == 1 and "device-session.tgz" in text and "summary.md" in text
    # issue 27's measurements: URSA with the reference in the same process and the fused kernels' off state
    # (bench_ursa adds it where the backend offers kernels), Qwen bf16 and fp8 side by side, compiled too
    assert "bench_ursa --size full --device cuda --dtype float16 --compile --draws" in text
    assert "--variant plus --device cuda --dtype bf16 --fp8 --steps" in text and "--fp8 --compile" in text
    out = subprocess.run(["bash", "-n", str(SESSION)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_a_spent_session_still_writes_its_tarball_and_summary(tmp_path: Path) -> None:
    """With no time left every benchmark is skipped, yet the one tarball and the summary come back."""
    work = tmp_path / "tree"
    work.mkdir()
    for name in ("benchmarks", "scripts"):
        (work / name).symlink_to(ROOT / name)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PY": str(Path(os.sys.executable)), "SESSION_S": "20", "COMMIT": "abc1234",
           "PYTHONPATH": str(ROOT / "src"), "DIFFORGE_HOME": str(tmp_path / "home")}
    done = subprocess.run(["bash", str(SESSION)], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["device-session.tgz", "summary.md"]
    with tarfile.open(out / "device-session.tgz") as tar:
        names = set(tar.getnames())
    assert {"./steps.txt", "./summary.md", "./commit.txt", "./date.txt"} <= names
    text = (out / "summary.md").read_text()
    assert "Commit `abc1234`" in text and "ursa512 skipped" in text and "qwen_plus skipped" in text


def test_the_summary_tables_come_from_the_benchmarks_json(tmp_path: Path, summary_mod) -> None:
    session = tmp_path / "session"
    (session / "bench").mkdir(parents=True)
    ursa = bench_ursa.main(["--tiny", "--steps", "2", "--warmup", "0", "--draws", "--no-reference",
                            "--json", str(session / "bench" / "ursa512.json")])
    qwen = bench_qwen_edit.main(["--tiny", "--steps", "1", "--warmup", "1", "--fp8",
                                 "--json", str(session / "bench" / "qwen_plus.json")])
    (session / "bench" / "ursa1024.log").write_text("Killed\n")  # a step that ran out of time: no JSON
    (session / "date.txt").write_text("2026-12-05T08:00:00Z\n")
    (session / "commit.txt").write_text("abc1234\n")
    (session / "steps.txt").write_text("== ursa512 rc=0 50s (cap 170s)\n")
    text = summary_mod.summary(session, "bash benchmarks/gpu_session.sh")
    assert text.startswith("## GPU session 2026-12-05T08:00:00Z") and "Commit `abc1234`" in text
    assert "goal by default ≤ 15 ms/step" in text and "goal ≤ 500 ms/step lossless" in text
    for r in ursa["results"]:  # each variant's row carries its own ms/step and token comparison
        row = next(line for line in text.splitlines() if line.startswith(f"| {r.name} |"))
        assert f"| {summary_mod._ms(r.ms_per_step)} |" in row
        assert ("| yes |" in row) == bool(r.extra["tokens_equal_baseline"])
    assert "scheduler step" in text and "(goal ≤ 1 ms)" in text
    names = [r.name for r in qwen["results"]]
    assert "difforge default" in names and "difforge default, fp8" in names
    for name in names:  # bf16 and fp8 side by side in one table
        assert f"| {name} |" in text
    assert "No JSON" in text and "ursa1024" in text
    data = json.loads((session / "bench" / "qwen_plus.json").read_text())
    ref_row = next(line for line in text.splitlines() if line.startswith(f"| {bench_qwen_edit.REFERENCE} |"))
    assert f"| {summary_mod._ms(data['results'][0]['ms_per_step'])} | 1.00× |" in ref_row
    pipeline = next(r for r in data["results"] if r["name"] == bench_qwen_edit.PIPELINE)
    default_row = next(line for line in text.splitlines() if line.startswith("| difforge default |"))
    default = next(r for r in data["results"] if r["name"] == "difforge default")
    assert f"| {pipeline['ms_per_step'] / default['ms_per_step']:.2f}× |" in default_row


def test_the_reference_rows_and_ratios_are_printed(summary_mod) -> None:
    """A run where diffnext was timed: its rows and difforge ÷ diffnext for every variant."""
    data = {"benchmark": "ursa", "size": "full", "res": 512, "dtype": "float16", "guidance": 7.0, "steps": 8,
            "results": [{"name": "baseline (exact opts off, eager)", "ms_per_step": 55.0, "notes": "exact",
                         "extra": {"tokens_equal_baseline": True}},
                        {"name": "optimised (exact)", "ms_per_step": 40.0, "notes": "exact",
                         "extra": {"tokens_equal_baseline": True}}],
            "reference": [{"available": True, "compiled": False, "ms_per_step": 44.0, "tokens_equal_baseline": False,
                           "warmup_s": 3.0, "ratios": {"baseline (exact opts off, eager)": 44.0 / 55.0,
                                                       "optimised (exact)": 44.0 / 40.0}}]}
    text = "\n".join(summary_mod.ursa_section("ursa512", data))
    assert "| **diffnext, eager** (same process) | 44.0 |" in text
    assert "optimised (exact) **1.10×**" in text and "baseline (exact opts off, eager) **0.80×**" in text


def test_a_partial_run_is_said_to_be_partial(summary_mod) -> None:
    data = {"benchmark": "ursa", "size": "full", "res": 1024, "dtype": "float16", "guidance": 7.0, "steps": 4,
            "partial": True, "reference": [],
            "results": [{"name": "baseline (exact opts off, eager)", "ms_per_step": 120.0, "notes": "exact",
                         "extra": {"tokens_equal_baseline": True}}]}
    text = "\n".join(summary_mod.ursa_section("ursa1024", data))
    assert "Partial: the run stopped" in text and "goal by default ≤ 55 ms/step" in text
    assert "Partial" not in "\n".join(summary_mod.ursa_section("ursa1024", {**data, "partial": False}))


def test_an_exact_label_the_device_does_not_bear_out_is_flagged(summary_mod) -> None:
    data = {"benchmark": "ursa", "size": "full", "res": 512, "dtype": "float16", "guidance": 7.0, "steps": 8,
            "reference": [],
            "results": [{"name": "baseline (exact opts off, eager)", "ms_per_step": 55.0, "notes": "exact",
                         "extra": {"tokens_equal_baseline": True}},
                        {"name": "optimised, fused kernels off", "ms_per_step": 50.0, "notes": "exact",
                         "extra": {"tokens_equal_baseline": False}},
                        {"name": "optimised + compile", "ms_per_step": 18.0, "notes": "approximate (opt-in)",
                         "extra": {"tokens_equal_baseline": False}}]}
    rows = {line.split(" | ")[0]: line for line in summary_mod.ursa_section("ursa512", data) if line.startswith("| ")}
    assert summary_mod.UNPROVEN in rows["| optimised, fused kernels off"]
    assert summary_mod.UNPROVEN not in rows["| baseline (exact opts off, eager)"]
    assert summary_mod.UNPROVEN not in rows["| optimised + compile"]  # labelled approximate: nothing to prove
