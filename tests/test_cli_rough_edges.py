"""Issue 28.10's command-line rough edges: --help shows the msprobe extra's name whole (rich markup ate
``[msprobe]``), and ``generate`` without ``--model`` says on stderr that tiny-ursa draws noise."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from difforge.cli import app


@pytest.mark.parametrize("command", ["validate", "golden"])
def test_help_shows_the_msprobe_extra_whole(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one help line per option, so the install command is not wrapped
    out = CliRunner().invoke(app, [command, "--help"]).output
    assert "pip install 'difforge[msprobe]'" in out, out
    assert "pip install 'difforge')" not in out


def test_generate_without_model_warns_that_tiny_ursa_draws_noise(tmp_path) -> None:
    """The warning follows a made picture; a refused run keeps its one error line (no warning before it)."""
    args = ["generate", "--prompt", "a red circle", "--height", "64", "--width", "64", "--steps", "2"]
    result = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "a.png")])
    assert result.exit_code == 0, result.output
    lines = [x for x in result.stderr.splitlines() if "warning" in x]
    assert len(lines) == 1 and "no --model given" in lines[0] and "noise" in lines[0], result.stderr
    given = CliRunner().invoke(app, [*args, "--model", "tiny-ursa", "--output", str(tmp_path / "b.png")])
    assert given.exit_code == 0 and "no --model given" not in given.stderr
    refused = CliRunner().invoke(app, ["generate", "--prompt", "a red circle", "--steps", "1"])
    assert refused.exit_code == 2
    assert [x for x in refused.stderr.splitlines() if x.strip()] == [refused.stderr.strip()], refused.stderr
    assert "no --model given" not in refused.stderr
