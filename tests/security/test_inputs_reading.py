"""Issue 26 (S5 input part, C2, W6): --config, --prompt-file, --prompts and prompt sets are read with bounds.

Each hostile input is one ``difforge: error:`` line and exit 2, in bounded time, and the peak memory of
the process that reads it is measured (under 1 GB; the alias bomb took 2.7 GB, /dev/zero grew forever).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image
from typer.testing import CliRunner

from difforge import cli
from difforge.config import MAX_PROMPT_CHARS
from difforge.validate.inputs import MAX_PROMPT_FILE_BYTES
from tests.memory import PEAK_RSS_CODE
from tests.test_cli_inputs import assert_refused

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
GB = 1 << 30

#: Runs the CLI in a fresh interpreter and prints its own peak RSS (bytes) last on stderr.
MEASURE = PEAK_RSS_CODE + textwrap.dedent("""
    import sys
    from difforge.cli import main
    sys.argv = ["difforge", *sys.argv[1:]]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    print(f"peak-rss {peak_rss_bytes()}", file=sys.stderr)
    sys.exit(code)
""")


def measured(*args: str, timeout: float = 120) -> tuple[int, str, int]:
    """(exit code, the error lines, peak RSS in bytes) of ``difforge ARGS`` in a process of its own."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"}
    env.pop("DIFFORGE_DEBUG", None)
    res = subprocess.run([sys.executable, "-c", MEASURE, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    *lines, last = res.stderr.strip().splitlines()
    assert last.startswith("peak-rss "), res.stderr
    return res.returncode, "\n".join(lines), int(last.split()[1])


def one_line(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("difforge: error: "), err
    assert needle.lower() in err.lower(), err


ALIAS_BOMB = "".join(
    f"{a}: &{a} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
    for p, a in zip(["", *"abcdefgh"], "abcdefghi", strict=True))


def test_yaml_alias_bomb_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    assert len(ALIAS_BOMB) < 500  # 9**9 = 387 million strings once expanded
    code, err, peak = measured("generate", "--model", "tiny-ursa", "--config", str(bomb), "-p", "x")
    one_line(code, err, "uses a YAML alias (*name) on line 2")
    assert peak < GB, peak


@pytest.mark.parametrize("source", ["/dev/zero", "fifo"])
@pytest.mark.parametrize("flag", ["generate --config", "generate --prompt-file", "validate --prompts"])
def test_devices_and_fifos_are_refused_not_read_forever(tmp_path: Path, source: str, flag: str) -> None:
    if source == "fifo":
        path = tmp_path / "in.yaml"
        os.mkfifo(path)  # no writer: opening or reading it would wait forever
    else:
        path = Path(source)
        if not path.exists():
            pytest.skip("no /dev/zero here")
    command, option = flag.split()
    extra = ["--out", str(tmp_path / "r")] if command == "validate" else ["-o", str(tmp_path / "a.png")]
    model = ["--model", "tiny-ursa"] if command == "generate" else []
    code, err, peak = measured(command, *model, option, str(path), *extra, timeout=60)
    one_line(code, err, "FIFO" if source == "fifo" else "character device")
    assert peak < GB, peak
    assert not (tmp_path / "r").exists() and not (tmp_path / "a.png").exists()


def test_oversized_prompt_file_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    big = tmp_path / "prompts.txt"
    with big.open("wb") as fh:  # sparse: no disk is used for the hole
        fh.truncate(MAX_PROMPT_FILE_BYTES * 64)
    code, err, peak = measured("generate", "--model", "tiny-ursa", "--prompt-file", str(big), "-o", str(tmp_path / "a.png"))
    one_line(code, err, "larger than")
    assert peak < GB, peak


def test_a_prompt_longer_than_any_model_reads_is_refused_before_loading(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge import api

    monkeypatch.setattr(api, "load_pipeline", lambda *a, **k: pytest.fail("loaded before the prompt was checked"))
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle\n" + "x" * (MAX_PROMPT_CHARS + 1) + "\n")
    result = runner.invoke(cli.app, ["generate", "--model", "tiny-ursa", "--prompt-file", str(prompts), "-o", str(tmp_path / "a.png")])
    assert_refused(result, f"at most {MAX_PROMPT_CHARS}")
    result = runner.invoke(cli.app, ["generate", "--model", "tiny-ursa", "-p", "y" * (MAX_PROMPT_CHARS + 1), "-o", str(tmp_path / "a.png")])
    assert_refused(result, f"at most {MAX_PROMPT_CHARS}")
    assert not (tmp_path / "a.png").exists()


def test_running_out_of_memory_while_reading_config_is_one_line(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """C2: the --config callback runs while click parses, outside the command's error handler."""
    config = tmp_path / "c.yaml"
    config.write_text("steps: 3\n")

    def exhausted(path: Path) -> None:
        raise MemoryError

    monkeypatch.setattr(cli, "_read_config", exhausted)
    assert_refused(runner.invoke(cli.app, ["generate", "--model", "tiny-ursa", "--config", str(config), "-p", "x"]), "too large")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_deeply_nested_config_is_one_line(tmp_path: Path, suffix: str) -> None:
    config = tmp_path / f"c{suffix}"
    config.write_text('{"steps": ' + "[" * 200_000 + "]" * 200_000 + "}")
    assert_refused(runner.invoke(cli.app, ["generate", "--model", "tiny-ursa", "--config", str(config), "-p", "x"]),
                   f"--config {config}")


# ---- W6: prompt sets -----------------------------------------------------------------------------------
def _edit_set(folder: Path, image_bytes: bytes | None = None) -> Path:
    folder.mkdir()
    (folder / "images").mkdir()
    picture = folder / "images" / "e0.png"
    Image.new("RGB", (64, 64), (0, 0, 255)).save(picture)
    if image_bytes is not None:
        picture.write_bytes(image_bytes)
    items = [{"id": "e0", "prompt": "make the circle red", "image": "images/e0.png",
              "expect": {"background": "blue", "items": [{"shape": "circle", "colour": "red"}]}}]
    (folder / "prompts.json").write_text(json.dumps({"format": "difforge-prompt-set/1", "kind": "edit",
                                                     "items": items}))
    return folder


def test_a_prompt_set_nested_too_deeply_is_input_error(tmp_path: Path) -> None:
    from difforge.errors import InputError
    from difforge.shapes.prompts import load_prompt_set

    deep = tmp_path / "prompts.json"
    deep.write_text('{"format": "difforge-prompt-set/1", "kind": "caption", "items": ' + "[" * 100_000
                    + "]" * 100_000 + "}")
    with pytest.raises(InputError, match="nested too deeply"):
        load_prompt_set(deep)


def test_an_undecodable_edit_picture_is_refused_before_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The picture starts like a PNG but is cut short: before, the set loaded and the semantic rung FAILed."""
    from difforge.validate import runner as validate_runner

    good = (tmp_path / "ok.png")
    Image.new("RGB", (64, 64), (0, 0, 255)).save(good)
    pset = _edit_set(tmp_path / "set", good.read_bytes()[:60])
    monkeypatch.setattr(validate_runner, "_load_side", lambda *a, **k: pytest.fail("a model loaded before the set "
                                                                                   "was checked"))
    result = runner.invoke(cli.app, ["validate", "--model", "tiny-qwen-edit", "--prompt-set", str(pset), "--quiet",
                                     "--out", str(tmp_path / "r")])
    assert_refused(result, "cannot be decoded")
    assert not (tmp_path / "r").exists()
