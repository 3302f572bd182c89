"""Issue 26 (B2, B3): a bad value on the command line is one line and exit 2, and --steps has a ceiling."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from difforge.cli import app
from difforge.config import MAX_STEPS, RunConfig
from difforge.errors import StepsError
from tests.test_cli_inputs import assert_refused

runner = CliRunner()


@pytest.mark.parametrize(("args", "needle"), [
    (["generate", "--steps", "x", "-p", "a"], "--steps"),
    (["generate", "--bogus"], "no such option: --bogus"),
    (["edit", "-p", "a"], "--image"),
    (["validate", "--out", "r", "--lang"], "requires an argument"),
    (["nosuch"], "no such command"),
])
def test_usage_errors_are_one_line(args: list[str], needle: str) -> None:
    """Typer drew click's usage errors as a five-line box; now one ``difforge: error:`` line naming the fix."""
    result = runner.invoke(app, args)
    err = assert_refused(result, needle)
    assert "--help" in err and "╭" not in result.output


def test_help_and_version_still_work() -> None:
    assert runner.invoke(app, ["--version"]).exit_code == 0
    shown = runner.invoke(app, ["generate", "--help"])
    assert shown.exit_code == 0 and "--steps" in shown.stdout


@pytest.mark.parametrize("steps", [MAX_STEPS + 1, 10**9])
def test_steps_above_the_ceiling_are_refused(steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge import api

    monkeypatch.setattr(api, "load_pipeline", lambda *a, **k: pytest.fail("loaded before --steps was checked"))
    assert_refused(runner.invoke(app, ["generate", "--model", "tiny-ursa", "-p", "a", "--steps", str(steps)]), f"at most {MAX_STEPS}")
    with pytest.raises(StepsError):
        RunConfig(model="tiny-ursa", steps=steps)
    RunConfig(model="tiny-ursa", steps=MAX_STEPS)  # the ceiling itself is allowed


def test_validate_steps_ceiling(tmp_path) -> None:
    result = runner.invoke(app, ["validate", "--model", "tiny-ursa", "--out", str(tmp_path / "r"),
                                 "--steps", str(MAX_STEPS + 1)])
    assert_refused(result, f"at most {MAX_STEPS}")
    assert not (tmp_path / "r").exists()
