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


def test_generate_without_model_warns_that_tiny_ursa_draws_noise() -> None:
    # --steps 1 is refused after the model is chosen and before anything loads: the warning costs no run
    result = CliRunner().invoke(app, ["generate", "--prompt", "a red circle", "--steps", "1"])
    assert result.exit_code == 2
    lines = [x for x in result.stderr.splitlines() if "warning" in x]
    assert len(lines) == 1 and "no --model given" in lines[0] and "noise" in lines[0], result.stderr
    given = CliRunner().invoke(app, ["generate", "--model", "tiny-ursa", "--prompt", "a red circle", "--steps", "1"])
    assert given.exit_code == 2 and "no --model given" not in given.stderr
