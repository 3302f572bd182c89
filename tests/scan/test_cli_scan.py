"""``difforge scan``: exit 0 with findings, 1 with --fail-on, 2 (one line) for bad input; --json."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from difforge.cli import app

runner = CliRunner()


def _snippet(tmp_path: Path) -> Path:
    path = tmp_path / "model.py"
    path.write_text("import torch\n\ndef f(t):\n    return t.cuda()\n", encoding="utf-8")
    return path


def test_findings_exit_zero_and_print_a_table(tmp_path: Path) -> None:
    r = runner.invoke(app, ["scan", str(_snippet(tmp_path))], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "model.py:4" in r.stdout and "DF102" in r.stdout
    assert "scanned 1 file for npu" in r.stdout and "1 warning" in r.stdout


def test_fail_on(tmp_path: Path) -> None:
    path = str(_snippet(tmp_path))
    assert runner.invoke(app, ["scan", path, "--fail-on", "warning"]).exit_code == 1
    assert runner.invoke(app, ["scan", path, "--fail-on", "error"]).exit_code == 0


def test_json(tmp_path: Path) -> None:
    r = runner.invoke(app, ["scan", str(_snippet(tmp_path)), "--json", "--target", "cpu"], catch_exceptions=False)
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["target"] == "cpu" and [f["rule"] for f in data["findings"]] == ["DF102"]


def test_bad_input_is_one_line_and_exit_two(tmp_path: Path) -> None:
    for args, needle in ([str(tmp_path / "nope.py")], "no such file"), \
            ([str(tmp_path), "--target", "tpu"], "unknown scan target"), \
            ([str(tmp_path), "--fail-on", "loud"], "unknown --fail-on"):
        r = runner.invoke(app, ["scan", *args])
        assert r.exit_code == 2, (args, r.output)
        err = r.stderr.strip()
        assert err.startswith("difforge: error: ") and len(err.splitlines()) == 1 and needle in err, err
