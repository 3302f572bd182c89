"""Issue 28.6: every command takes the spellings users bring (diffusers' ``num_inference_steps``,
``true_cfg_scale``, ``negative_prompt``; ``--prompts`` = ``--prompt-file``), and one option given twice, under
any spellings, is refused with one line instead of click silently keeping the last value."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from difforge.cli import app

runner = CliRunner()


def one_line(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("difforge: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["validate", "golden", "capture"])
def test_validate_golden_and_capture_take_the_diffusers_spellings(command: str, tmp_path) -> None:
    """Each spelling reaches the option: a steps value of 1 is refused by the steps rule, not as an unknown option;
    the true-CFG and negative-prompt spellings get as far as the model lookup."""
    out = ["--out", str(tmp_path / "o")]
    for steps in ("--num-inference-steps", "--num_inference_steps", "--num-steps"):
        assert "--steps must be at least 2" in one_line([command, *out, steps, "1"])
    line = one_line([command, *out, "--true-cfg-scale", "2", "--negative_prompt", "x", "--model", "/nonexistent"])
    assert "not found" in line and "No such option" not in line


@pytest.mark.parametrize(("command", "flag"), [("generate", "--prompts"), ("validate", "--prompt-file"),
                                               ("golden", "--prompt-file")])
def test_prompts_and_prompt_file_are_one_option(command: str, flag: str, tmp_path) -> None:
    args = [command, flag, str(tmp_path / "missing.txt")]
    if command != "generate":
        args += ["--out", str(tmp_path / "o")]
    else:
        args += ["--model", "tiny-ursa"]
    line = one_line(args)
    assert "does not exist" in line and "missing.txt" in line  # the file reached the prompt-file rule


@pytest.mark.parametrize(("command", "given", "named"), [
    ("generate", ["--prompt", "a", "--steps", "2", "--num-inference-steps", "3"], "--steps and --num-inference-steps"),
    ("generate", ["--prompt", "a", "--steps=2", "--steps", "3"], "--steps is given 2 times"),
    ("edit", ["-i", "a.png", "--prompt", "a", "--negative-prompt", "a", "--negative_prompt", "b"],
     "--negative-prompt and --negative_prompt"),
    ("edit", ["-i", "a.png", "--prompt", "a", "--true-cfg", "2", "--true_cfg_scale", "3"], "--true-cfg and --true_cfg_scale"),
    ("validate", ["--out", "o", "--quick", "--no-quick"], "--quick and --no-quick"),
    ("golden", ["--out", "o", "--prompts", "p", "--prompt-file", "q"], "--prompts and --prompt-file"),
])
def test_one_option_given_twice_is_refused(command: str, given: list[str], named: str) -> None:
    line = one_line([command, *given])
    assert named in line and "give it once" in line and f" {command} --help' lists" in line


def test_repeatable_options_and_values_that_look_like_options_still_pass() -> None:
    """``--fast`` repeats by design, and a prompt that reads ``--steps`` is a value, not a second --steps: both get
    past the check to the steps rule."""
    line = one_line(["generate", "--prompt", "--steps", "--fast", "philox-rng", "--fast", "unguided-tail",
                     "--steps", "1", "--model", "tiny-ursa"])
    assert "--steps must be at least 2" in line
