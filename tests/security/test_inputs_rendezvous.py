"""Issue 26 (W7): ``--parallel`` with a WORLD_SIZE but no peer gives up after a bounded wait, and answers
SIGTERM / Ctrl-C while it waits (before, it waited 30 minutes in C++ and ignored both)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from difforge.runtime.parallel import DEFAULT_RENDEZVOUS_S, RENDEZVOUS_ENV, rendezvous_timeout

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/net/tcp to see the rank wait")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    """Rank 0 hosts the rendezvous store on MASTER_PORT: listening there means it is waiting for its peer."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        if any(r.split()[1].endswith(f":{port:04X}") and r.split()[3] == "0A" for r in rows):
            return True
    return False


def _rank0(tmp_path: Path, wait_s: str, rank: int = 0) -> tuple[subprocess.Popen[str], int]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}", "WORLD_SIZE": "2", "RANK": str(rank),
           "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), RENDEZVOUS_ENV: wait_s}
    env.pop("DIFFORGE_DEBUG", None)
    cmd = [sys.executable, "-m", "difforge", "generate", "--model", "tiny-ursa", "--parallel", "cfg", "--device", "cpu", "-p", "a red circle",
           "--steps", "2", "--height", "64", "--width", "64", "--quiet", "-o", str(tmp_path / "out.png")]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), port


@pytest.mark.parametrize("rank", [0, 1])
def test_no_peer_gives_up_after_the_rendezvous_timeout(tmp_path: Path, rank: int) -> None:
    """Rank 0 hosts the store and waits for rank 1; rank 1 retries connecting to rank 0: each gives up alone, with
    one line of its own (not torch's multi-line retry log, not an abort at exit)."""
    proc, _port = _rank0(tmp_path, "2", rank)
    start = time.monotonic()
    _out, err = proc.communicate(timeout=240)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"rank {rank} of 2: the other ranks did not join the process group within 2 s" in lines[0], err
    assert time.monotonic() - start < 200
    assert not (tmp_path / "out.png").exists()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_waiting_rank_answers_signals(tmp_path: Path, signum: int, code: int) -> None:
    proc, port = _rank0(tmp_path, "600")
    try:
        deadline = time.monotonic() + 180
        while not _listening(port):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "rank 0 never started waiting"
            time.sleep(0.2)
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert time.monotonic() - sent < 30
    assert err.strip().splitlines() == ["difforge: error: interrupted."], err
    assert not (tmp_path / "out.png").exists()


def test_rendezvous_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge.errors import InputError

    monkeypatch.delenv(RENDEZVOUS_ENV, raising=False)
    assert rendezvous_timeout() == DEFAULT_RENDEZVOUS_S
    monkeypatch.setenv(RENDEZVOUS_ENV, "12.5")
    assert rendezvous_timeout() == 12.5
    for bad in ("0", "-3", "nan", "inf", "soon"):
        monkeypatch.setenv(RENDEZVOUS_ENV, bad)
        with pytest.raises(InputError, match=RENDEZVOUS_ENV):
            rendezvous_timeout()
