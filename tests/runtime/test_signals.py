"""Ctrl-C and SIGTERM take the exception path: every command cleans up, exits 130/143, one line.

The end-to-end tests run the real CLI entry point in a subprocess whose PNG writer pauses after
writing a temp file, wait until that ``.part`` file exists, send the signal and check that neither
a temp file nor a (partial) output stays behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from PIL import Image

from difforge.runtime.atomic import atomic_path
from difforge.runtime.signals import Terminated, deferred_signals, signals_raise

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")


# ---- the handlers ---------------------------------------------------------------------------------------
@posix_only
def test_sigterm_raises_terminated_inside_and_the_old_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as info, signals_raise():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises out of the sleep
    assert info.value.exit_code == 143 and isinstance(info.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is before


@posix_only
def test_an_ignored_signal_stays_ignored() -> None:
    """``nohup`` ignores SIGHUP: the CLI must not turn it back on."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with signals_raise():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)  # ignored: nothing happens
    finally:
        signal.signal(signal.SIGHUP, before)


@posix_only
def test_deferred_signals_hold_ctrl_c_until_the_section_ends() -> None:
    # Python's own Ctrl-C handler, whatever the process inherited: a suite started as a background job of a
    # shell without job control inherits SIGINT ignored (POSIX), and Python then keeps it ignored
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    reached_end = False
    try:
        with pytest.raises(KeyboardInterrupt), deferred_signals():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            reached_end = True
        assert reached_end
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_interrupted_write_removes_the_folders_it_made(tmp_path: Path) -> None:
    (tmp_path / "there").mkdir()
    with pytest.raises(Terminated), atomic_path(tmp_path / "there" / "new" / "deeper" / "a.png") as tmp:
        tmp.write_bytes(b"half")
        raise Terminated(signal.SIGTERM)
    assert [p.name for p in tmp_path.rglob("*")] == ["there"]  # the folder that was there stays


# ---- the CLI, for real ------------------------------------------------------------------------------------
DRIVER = textwrap.dedent("""
    import signal, sys, time
    import PIL.Image

    _save = PIL.Image.Image.save

    def slow_save(self, fp, *args, **kwargs):  # write the temp file, then wait to be signalled
        _save(self, fp, *args, **kwargs)
        if ".part" in str(fp):
            time.sleep(120)

    PIL.Image.Image.save = slow_save
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if the test runner ignores SIGINT
    sys.argv = ["difforge", *sys.argv[1:]]
    from difforge.cli import main
    main()
""")

TINY = ["--steps", "2", "--height", "32", "--width", "32", "--device", "cpu", "--quiet"]
COMMANDS = {
    "generate": ["generate", "--prompt", "a red circle", "--output", "out/a.png", *TINY],
    "edit": ["edit", "--image", "{input}", "--prompt", "make it red", "--output", "out/a.png", *TINY],
    "validate": ["validate", "--out", "out/report", "--dtype", "bfloat16", "--quick", "--rounds", "1", "--warmup", "0",
                 *TINY],
}


def _everything(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@posix_only
@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", ["generate", "edit", "validate"])
def test_a_signal_during_the_save_leaves_no_temp_or_partial_file(tmp_path: Path, command: str,
                                                                  signame: str) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    picture = tmp_path / "input.png"
    Image.new("RGB", (32, 32), (20, 90, 200)).save(picture)
    work = tmp_path / "work"
    work.mkdir()
    args = [a.replace("{input}", str(picture)) for a in COMMANDS[command]]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(driver), *args], cwd=work, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not any(".part" in p.name and p.is_file() for p in work.rglob("*")):
            assert proc.poll() is None, f"exited {proc.returncode} before saving: {proc.communicate()}"
            assert time.monotonic() < deadline, "no temp file appeared"
            time.sleep(0.05)
        proc.send_signal(getattr(signal, signame))
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (130 if signame == "SIGINT" else 143), err
    assert err.strip().splitlines() == ["difforge: error: interrupted."]  # one line, no traceback
    assert _everything(work) == []  # no .part file, no output, not even the out/ folder the run made
