"""``--parallel`` over torch.distributed: real 2-process gloo runs on the CPU, on the tiny models.

* data: a prompt file sharded over 2 ranks (launched by torchrun) writes byte-identical images to one
  process's sequential batch, and rank 0 writes one combined record of both ranks' runs;
* cfg: URSA's CFG batch split over 2 ranks gives one process's token ids exactly; Qwen-Image-Edit's two
  true-CFG branches on 2 ranks end in the same latents as one process's batched-CFG run within the
  tolerance batched CFG itself is held to (1e-5, ``test_perf_exact.py``);
* ulysses: Qwen-Image-Edit's sequence over 2 ranks through diffusers' context parallelism ends in one
  process's latents within the same tolerance (URSA's ulysses: one process's token ids exactly);
* a failing rank ends both processes with one line (exit 1; 2 for bad input) and no output file;
* without torchrun, ``--parallel`` is refused with one line naming the torchrun command.

The ranks run ``tests/parallel/rank_main.py`` (``difforge.cli.main`` plus test-only hooks).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from difforge import api
from difforge.cli import app
from difforge.config import RunConfig
from difforge.devices import CPUBackend, CUDABackend, NPUBackend
from difforge.errors import InputError
from difforge.models.tiny import TINY_VERSIONS
from difforge.runtime import parallel

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 150
URSA = ["generate", "--model", "tiny-ursa", "--steps", "2", "--height", "64", "--width", "64", "--device", "cpu", "-q"]
QWEN_STEPS = 2
EXACT_TOL = 1e-5  # batched CFG vs two calls (tests/models/qwen_edit/test_perf_exact.py)
URSA_PROMPT, URSA_CFG_STEPS, URSA_CFG_SIZE = "a red circle", 4, "128"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), MASTER_ADDR="127.0.0.1", **more)
    return env


def _launch(args: list[str], tmp: Path, world: int = 2, **env: str) -> list[tuple[int, str, str]]:
    """Start ``world`` ranks the way torchrun does (its environment variables) and wait for all of them."""
    port = str(_free_port())
    procs = []
    for rank in range(world):
        out, err = open(tmp / f"rank{rank}.out", "w+"), open(tmp / f"rank{rank}.err", "w+")  # noqa: SIM115
        rank_env = _env(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_PORT=port, **env)
        procs.append((subprocess.Popen([sys.executable, "-m", "tests.parallel.rank_main", *args], cwd=tmp,
                                       env=rank_env, stdout=out, stderr=err), out, err))
    deadline = time.monotonic() + TIMEOUT_S
    results = []
    try:
        for proc, out, err in procs:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            out.seek(0)
            err.seek(0)
            results.append((code, out.read(), err.read()))
    finally:
        for proc, out, err in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            out.close()
            err.close()
    return results


def _error_lines(results: list[tuple[int, str, str]]) -> list[str]:
    return [line for _, _, err in results for line in err.splitlines() if line.startswith("difforge: error:")]


def _torchrun() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


# ---- data ---------------------------------------------------------------------------------------
def test_data_parallel_equals_sequential(tmp_path: Path) -> None:
    """4 prompts over 2 ranks under torchrun: the same bytes as one process, one combined record."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\na blue square\na green triangle\na yellow star\n", encoding="utf-8")
    start = time.perf_counter()
    proc = subprocess.run([*_torchrun(), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                           "--master-port", str(_free_port()), "-m", "tests.parallel.rank_main", *URSA,
                           "--prompt-file", str(prompts), "--parallel", "data", "-o", "par/p.png",
                           "--record", "par/run.json"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run
    try:
        seq = api.batch("generate", None, "tiny-ursa", prompt_file=str(prompts), steps=2, height=64, width=64,
                        device="cpu", quiet=True, output=str(tmp_path / "seq" / "p.png"))
    finally:
        torch.set_num_threads(threads)
    names = [f"p_{i:03d}_00.png" for i in range(4)]
    assert _files(tmp_path / "par") == sorted([*names, "run.json"] + [f"run_{i:03d}_00.json" for i in range(4)])
    for name, result in zip(names, seq, strict=True):
        assert (tmp_path / "par" / name).read_bytes() == result.paths[0].read_bytes(), name
    combined = json.loads((tmp_path / "par" / "run.json").read_text(encoding="utf-8"))
    par = combined["extra"]["parallel"]
    assert (par["mode"], par["world_size"], par["dist_backend"]) == ("data", 2, "gloo")
    assert [[run["prompt_index"] for run in r["runs"]] for r in par["ranks"]] == [[0, 2], [1, 3]]
    assert all(len(run["step_times_s"]) == 2 for r in par["ranks"] for run in r["runs"])
    assert [Path(o["path"]).name for o in combined["outputs"]] == names
    assert set(combined["phases"]) == {"rank0", "rank1"}
    one = json.loads((tmp_path / "par" / "run_001_00.json").read_text(encoding="utf-8"))
    assert one["extra"]["parallel"]["rank"] == 1 and one["config"]["parallel"] == "data"
    print(f"data parallel, 4 prompts, 2 ranks under torchrun: wall {wall:.1f}s")


def test_failing_rank_ends_the_run_without_output(tmp_path: Path) -> None:
    """Rank 1 raises in its first decode: both ranks exit 1, one line, rank 0's images removed again."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\na blue square\na green triangle\n", encoding="utf-8")
    results = _launch([*URSA, "--prompt-file", str(prompts), "--parallel", "data", "-o", "out/p.png",
                       "--record", "out/run.json"], tmp_path, DIFFORGE_TEST_FAIL_RANK="1")
    assert [code for code, _, _ in results] == [1, 1], results
    lines = _error_lines(results)
    assert len(lines) == 1 and "rank 1" in lines[0] and "injected failure" in lines[0], results
    assert "Traceback" not in "".join(err for _, _, err in results)
    assert _files(tmp_path / "out") == []


class _FakeGroup(parallel.Group):
    """A group whose status headers answer from a script (the protocol's logic without processes)."""

    statuses: list[int] = []

    def _header(self, status: int) -> list[int]:
        return [status if r == self.rank else s for r, s in enumerate(self.statuses)]


@pytest.mark.parametrize(("rank", "raised", "peers", "expect", "code"), [
    (0, InputError("bad prompt"), [2, 2], InputError, 2),  # the same input error everywhere: rank 0 says it
    (1, InputError("bad prompt"), [2, 2], parallel.PeerFailed, 2),  # ... and rank 1 stays silent
    (1, RuntimeError("boom"), [0, 1], parallel.RankFailed, 1),  # an unexpected error: one line, exit 1
    (0, None, [0, 1], parallel.PeerFailed, 1),  # rank 0 finished, its peer did not: rank 0's file goes
])
def test_failure_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: int, raised: Exception | None,
                          peers: list[int], expect: type, code: int) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setattr(_FakeGroup, "statuses", peers)
    monkeypatch.setattr(parallel, "_start", lambda mode, backend, info, *timeout: _FakeGroup(mode, info, backend))
    written = tmp_path / "p.png"

    def work(group: parallel.Group) -> None:
        group.will_write(written)
        written.write_bytes(b"png")
        if raised is not None:
            raise raised

    with pytest.raises(expect) as info:
        parallel.guarded("data", "generate", "cpu", work)
    assert info.value.exit_code == code
    assert not written.exists()
    if expect is not parallel.PeerFailed:
        assert str(info.value).startswith(f"rank {rank}: ")
    assert parallel.active() is None


# ---- cfg ----------------------------------------------------------------------------------------
def test_cfg_parallel_equals_one_process(tmp_path: Path) -> None:
    """Rank 0 the conditional, rank 1 the unconditional branch: the latents of one batched-CFG process.

    The one-process reference is the same edit run again by rank 0 after the group has closed, on the
    pipeline it loaded, with ``parallel="none"`` (batched CFG): a third model load would double the
    test's time on a 2-core machine.
    """
    picture = tmp_path / "in.png"
    Image.fromarray((np.arange(64 * 64 * 3).reshape(64, 64, 3) % 251).astype(np.uint8)).save(picture)
    args = ["edit", "--model", "tiny-qwen-edit", "-i", str(picture), "-p", "make it blue", "--steps", str(QWEN_STEPS),
            "--height", "64", "--width", "64", "--device", "cpu", "-q"]
    results = _launch([*args, "--parallel", "cfg", "-o", "out/e.png", "--record", "out/run.json"], tmp_path,
                      DIFFORGE_TEST_LATENTS=str(tmp_path / "latents"), DIFFORGE_TEST_REFERENCE=str(tmp_path / "reference"))
    assert [code for code, _, _ in results] == [0, 0], results
    assert _files(tmp_path / "out") == ["e.png", "run.json"]  # rank 0 wrote; rank 1 nothing
    lat0, lat1 = (torch.load(tmp_path / f"latents.rank{r}") for r in (0, 1))
    assert torch.equal(lat0, lat1)  # the same combine and scheduler step on both ranks

    reference = torch.load(tmp_path / "reference")  # rank 0, afterwards, as one process (rank_main.py)
    diff = (reference - lat0).abs().max().item()
    print(f"cfg parallel vs one batched-CFG process: max abs latent diff {diff:.3g}")
    assert diff <= EXACT_TOL
    assert Image.open(tmp_path / "out" / "e.png").size == (64, 64)
    par = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))["extra"]["parallel"]
    assert (par["mode"], par["dist_backend"], [r["rank"] for r in par["ranks"]]) == ("cfg", "gloo", [0, 1])
    assert all(len(r["step_times_s"]) == QWEN_STEPS for r in par["ranks"])
    rec = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))
    assert any(a["what"] == "true CFG" and "cfg-parallel" in a["choice"] for a in rec["adaptations"])
    assert rec["extra"]["forwards_per_step"] == 1


def _one_process_edit(picture: Path | list[Path], model: str = "tiny-qwen-edit",
                      **options: object) -> tuple[torch.Tensor, np.ndarray]:
    """``model`` in this process, one thread (as the ranks run), ``--parallel none`` (batched CFG): its
    final latents and pixels."""
    pictures = picture if isinstance(picture, list) else [picture]
    from difforge import engine
    from difforge.runtime.images import load_images

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = RunConfig(model=model, prompt="make it blue", images=[str(p) for p in pictures], steps=QWEN_STEPS,
                        height=64, width=64, device="cpu", quiet=True, **options)  # type: ignore[arg-type]
        pipe = api.load_pipeline(model, "cpu", cfg=cfg, task="edit")
        seen: list[torch.Tensor] = []
        decode = pipe.decode
        pipe.decode = lambda lat, h, w: (seen.append(lat.detach().cpu().clone()), decode(lat, h, w))[1]
        result = engine.run_pipeline(pipe, cfg, images=load_images(cfg.images))
    finally:
        torch.set_num_threads(threads)
    return seen[-1], np.asarray(result.images[0])


@pytest.mark.parametrize("extra", [[]])  # diffusers' complex RoPE: the Edit-Plus test below
def test_edit_ulysses_equals_one_process(tmp_path: Path, extra: list[str]) -> None:
    """Qwen-Image-Edit's sequence over 2 ranks through diffusers' context parallelism (Ulysses all-to-all in
    every block; text of 299 and 288 tokens, so the split is uneven): both ranks end in the same latents, which
    equal one batched-CFG process's within the tolerance batched CFG is held to.  With difforge's real-valued
    RoPE tables (its own plan entry for them) and with diffusers' complex ones (the model's plan as it is)."""
    picture = tmp_path / "in.png"
    Image.fromarray((np.arange(64 * 64 * 3).reshape(64, 64, 3) % 251).astype(np.uint8)).save(picture)
    args = ["edit", "--model", "tiny-qwen-edit", "-i", str(picture), "-p", "make it blue", "--steps", str(QWEN_STEPS),
            "--height", "64", "--width", "64", "--device", "cpu", "-q", *extra]
    results = _launch([*args, "--parallel", "ulysses=2", "-o", "out/e.png", "--record", "out/run.json"], tmp_path,
                      DIFFORGE_TEST_LATENTS=str(tmp_path / "latents"))
    assert [code for code, _, _ in results] == [0, 0], results
    assert _files(tmp_path / "out") == ["e.png", "run.json"]  # rank 0 wrote; rank 1 nothing
    lat0, lat1 = (torch.load(tmp_path / f"latents.rank{r}") for r in (0, 1))
    assert torch.equal(lat0, lat1)  # proj_out's gather gives both ranks the whole prediction

    reference, pixels = _one_process_edit(picture, disable=["real-rope"] if extra else [])
    diff = (reference - lat0).abs().max().item()
    print(f"edit ulysses=2 {extra} vs one batched-CFG process: max abs latent diff {diff:.3g}")
    assert diff <= EXACT_TOL
    shown = np.asarray(Image.open(tmp_path / "out" / "e.png")).astype(int)
    assert np.abs(shown - pixels.astype(int)).max() <= 1  # the same picture (a rounding step at most)
    rec = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))
    assert any(a["what"] == "sequence parallel" and a["choice"].startswith("ulysses: diffusers context parallelism "
                                                                            "over 2 ranks") for a in rec["adaptations"])
    assert rec["extra"]["forwards_per_step"] == 2  # true CFG as two calls, each split over both ranks
    par = rec["extra"]["parallel"]
    assert (par["mode"], par["dist_backend"], [r["rank"] for r in par["ranks"]]) == ("ulysses=2", "gloo", [0, 1])
    assert all(len(r["step_times_s"]) == QWEN_STEPS for r in par["ranks"])
    print(f"edit ulysses=2 median step: rank 0 {sorted(par['ranks'][0]['step_times_s'])[QWEN_STEPS // 2] * 1e3:.1f} ms")


def test_edit_plus_ulysses_equals_one_process(tmp_path: Path) -> None:
    """Edit-Plus / 2511 (two references, so three image stretches in the sequence, and 2511's zero_cond_t
    timestep rows) over 2 ranks, with diffusers' complex RoPE tables (the model's own plan, no difforge entry):
    both ranks' latents are equal and within the batched-CFG tolerance of one process."""
    pictures = [tmp_path / "a.png", tmp_path / "b.png"]
    for k, path in enumerate(pictures):
        Image.fromarray(((np.arange(64 * 64 * 3).reshape(64, 64, 3) * (k + 2)) % 251).astype(np.uint8)).save(path)
    args = ["edit", "--model", "tiny-qwen-edit-plus", "-i", str(pictures[0]), "-i", str(pictures[1]), "-p",
            "make it blue", "--steps", str(QWEN_STEPS), "--height", "64", "--width", "64", "--device", "cpu", "-q",
            "--disable", "real-rope", "--parallel", "ulysses=2", "-o", "out/e.png"]
    home = tmp_path / "home"  # the ranks build the built-in model themselves, both at once
    results = _launch(args, tmp_path, DIFFORGE_TEST_LATENTS=str(tmp_path / "latents"), DIFFORGE_HOME=str(home))
    assert [code for code, _, _ in results] == [0, 0], results
    built = home / "models" / f"tiny-qwen-edit-plus-{TINY_VERSIONS['tiny-qwen-edit-plus']}"
    assert (built / "text_encoder" / "config.json").is_file()  # a rank 1 building inside the group wrote none
    assert not [p.name for p in built.parent.iterdir() if p.name.startswith(".")]  # no build left half-done
    lat0, lat1 = (torch.load(tmp_path / f"latents.rank{r}") for r in (0, 1))
    assert torch.equal(lat0, lat1)
    reference, _ = _one_process_edit(pictures, model="tiny-qwen-edit-plus", disable=["real-rope"])
    diff = (reference - lat0).abs().max().item()
    print(f"edit-plus ulysses=2 vs one batched-CFG process: max abs latent diff {diff:.3g}")
    assert diff <= EXACT_TOL


@pytest.mark.parametrize(("rank", "block"), [("1", "1"), ("0", "0")])
def test_edit_ulysses_failing_rank_inside_a_call(tmp_path: Path, rank: str, block: str | None) -> None:
    """A rank fails inside a split transformer call (in block 1, after block 0's all-to-alls, or at block 0)
    while its peer waits in one of diffusers' all-to-alls, which no status header can meet: the failing rank
    tells the store and exits, the peer's collective breaks and it exits with the same code silently.  Both
    exit 1 within the test's timeout (not gloo's 30 minutes), one line, no output.  Rank 0 failing is the case
    where the store's host itself leaves."""
    picture = tmp_path / "in.png"
    Image.fromarray(np.full((64, 64, 3), 90, dtype=np.uint8)).save(picture)
    args = ["edit", "--model", "tiny-qwen-edit", "-i", str(picture), "-p", "make it blue", "--steps", "2",
            "--height", "64", "--width", "64", "--device", "cpu", "-q", "--parallel", "ulysses=2",
            "-o", "out/e.png", "--record", "out/run.json"]
    env = {"DIFFORGE_TEST_FAIL_RANK": rank, **({"DIFFORGE_TEST_FAIL_BLOCK": block} if block else {})}
    t0 = time.monotonic()
    results = _launch(args, tmp_path, **env)
    print(f"ulysses edit, rank {rank} fails (block {block}): both ranks ended in {time.monotonic() - t0:.1f} s")
    assert [code for code, _, _ in results] == [1, 1], results
    lines = _error_lines(results)
    assert len(lines) == 1 and f"rank {rank}" in lines[0] and "injected failure" in lines[0], results
    assert _files(tmp_path / "out") == []


def test_edit_ulysses_refusals(tmp_path: Path) -> None:
    """One line each, before any collective: --compile, --fast caches, more ranks than heads, an attention
    override; and a split pipeline refuses a run of another layout."""
    from difforge.models.qwen_edit import ulysses
    from difforge.models.qwen_edit.loop import SpeedOptions

    cfg = RunConfig(model="tiny-qwen-edit", device="cpu", quiet=True)
    pipe = api.load_pipeline("tiny-qwen-edit", "cpu", cfg=cfg, task="edit")
    transformer = pipe.pipe.transformer
    ulysses.check(transformer, 2, SpeedOptions())  # tiny-qwen-edit: 3 heads, 2 ranks (padded to 4)
    with pytest.raises(InputError, match="--compile"):
        ulysses.check(transformer, 2, SpeedOptions(compile=True))
    with pytest.raises(InputError, match="first-block-cache"):
        ulysses.check(transformer, 2, SpeedOptions.parse(fast=["first-block-cache"]))
    with pytest.raises(InputError, match="3 attention heads, fewer than 4 ranks"):
        ulysses.check(transformer, 4, SpeedOptions())
    override = api.load_pipeline("tiny-qwen-edit", "cpu", cfg=cfg, task="edit",
                                 op_overrides={"attention": torch.nn.functional.scaled_dot_product_attention})
    with pytest.raises(InputError, match="attention override"):
        ulysses.check(override.pipe.transformer, 2, SpeedOptions())
    setattr(transformer, ulysses.MARK, (2, True))  # as enable() leaves it
    with pytest.raises(InputError, match="split for --parallel ulysses=2"):
        pipe.configure(cfg)
    with pytest.raises(InputError, match="runs under torchrun"):
        pipe.denoiser(dataclasses.replace(cfg, parallel="ulysses=2"))


def _one_process_ursa(steps: int, **options: object) -> tuple[torch.Tensor, np.ndarray]:
    """tiny-ursa in this process, one thread (as the ranks run): its token ids and pixels."""
    from difforge import engine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        size = int(URSA_CFG_SIZE)
        cfg = RunConfig(model="tiny-ursa", prompt=URSA_PROMPT, steps=steps, height=size, width=size, device="cpu",
                        quiet=True, **options)  # type: ignore[arg-type]
        pipe = api.load_pipeline("tiny-ursa", "cpu", cfg=cfg, task="generate")
        result = engine.run_pipeline(pipe, cfg)
    finally:
        torch.set_num_threads(threads)
    assert pipe.last_tokens is not None
    return pipe.last_tokens.clone(), np.asarray(result.images[0])


def test_ursa_cfg_parallel_tokens_identical(tmp_path: Path) -> None:
    """URSA's CFG batch split over 2 ranks (rank 0 the conditional half, rank 1 the unconditional one, one
    all-gather of the logits per step): token ids and pixels identical to one process's batch-2 forward."""
    args = ["generate", "--model", "tiny-ursa", "-p", URSA_PROMPT, "--steps", str(URSA_CFG_STEPS), "--height",
            URSA_CFG_SIZE, "--width", URSA_CFG_SIZE, "--device", "cpu", "-q"]
    results = _launch([*args, "--parallel", "cfg", "-o", "out/g.png", "--record", "out/run.json"], tmp_path,
                      DIFFORGE_TEST_TOKENS=str(tmp_path / "tokens"))
    assert [code for code, _, _ in results] == [0, 0], results
    assert _files(tmp_path / "out") == ["g.png", "run.json"]  # rank 0 wrote; rank 1 nothing
    tok0, tok1 = (torch.load(tmp_path / f"tokens.rank{r}") for r in (0, 1))
    assert torch.equal(tok0, tok1)  # the same combine and the same draws on both ranks

    reference, pixels = _one_process_ursa(URSA_CFG_STEPS)
    unguided, _ = _one_process_ursa(URSA_CFG_STEPS, guidance=1.0)
    assert not torch.equal(reference, unguided)  # guidance moves tokens: a wrong half would show
    print(f"URSA cfg parallel: {tok0.numel()} token ids, {(tok0 != reference).sum().item()} differ from one process")
    assert tok0.dtype == reference.dtype and torch.equal(tok0, reference)
    assert np.array_equal(np.asarray(Image.open(tmp_path / "out" / "g.png")), pixels)

    rec = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))
    par = rec["extra"]["parallel"]
    assert (par["mode"], par["dist_backend"], [r["rank"] for r in par["ranks"]]) == ("cfg", "gloo", [0, 1])
    assert all(len(r["step_times_s"]) == URSA_CFG_STEPS for r in par["ranks"])
    assert any(a["what"] == "CFG" and "cfg-parallel" in a["choice"] for a in rec["adaptations"])
    assert rec["extra"]["ursa"]["forward_rows"] == 1 and rec["extra"]["ursa"]["cfg_parallel"]["half"] == "cond"
    steps0, steps1 = (sorted(r["step_times_s"])[URSA_CFG_STEPS // 2] * 1e3 for r in par["ranks"])
    print(f"URSA cfg parallel median step: rank 0 {steps0:.1f} ms, rank 1 {steps1:.1f} ms")


@pytest.mark.parametrize("extra", [[], ["--disable", "lm-head-slice", "--disable", "rope-cache"]])
def test_ursa_ulysses_tokens_identical(tmp_path: Path, extra: list[str]) -> None:
    """URSA's joint sequence split over 2 ranks (uneven stretches: 385 positions at 128x128), heads by all-to-all
    in every layer: token ids and pixels identical to one process's forward."""
    args = ["generate", "--model", "tiny-ursa", "-p", URSA_PROMPT, "--steps", str(URSA_CFG_STEPS), "--height",
            URSA_CFG_SIZE, "--width", URSA_CFG_SIZE, "--device", "cpu", "-q", *extra]
    results = _launch([*args, "--parallel", "ulysses=2", "-o", "out/g.png", "--record", "out/run.json"], tmp_path,
                      DIFFORGE_TEST_TOKENS=str(tmp_path / "tokens"))
    assert [code for code, _, _ in results] == [0, 0], results
    assert _files(tmp_path / "out") == ["g.png", "run.json"]  # rank 0 wrote; rank 1 nothing
    tok0, tok1 = (torch.load(tmp_path / f"tokens.rank{r}") for r in (0, 1))
    assert torch.equal(tok0, tok1)
    options = {"disable": ["lm-head-slice", "rope-cache"]} if extra else {}
    reference, pixels = _one_process_ursa(URSA_CFG_STEPS, **options)
    print(f"URSA ulysses=2 {extra}: {(tok0 != reference).sum().item()} of {tok0.numel()} token ids differ")
    assert torch.equal(tok0, reference)
    assert np.array_equal(np.asarray(Image.open(tmp_path / "out" / "g.png")), pixels)
    rec = json.loads((tmp_path / "out" / "run.json").read_text(encoding="utf-8"))
    assert rec["extra"]["ursa"]["ulysses"] == {"ranks": 2, "positions": [193, 192], "rank": 0}
    assert any(a["what"] == "attention" and a["choice"].startswith("ulysses: sequence split over 2 ranks (193+192")
               for a in rec["adaptations"])
    par = rec["extra"]["parallel"]
    assert (par["mode"], [r["rank"] for r in par["ranks"]]) == ("ulysses=2", [0, 1])
    steps0 = sorted(par["ranks"][0]["step_times_s"])[URSA_CFG_STEPS // 2] * 1e3
    print(f"URSA ulysses=2 median step: rank 0 {steps0:.1f} ms")


def test_ulysses_failing_rank_ends_the_run_without_output(tmp_path: Path) -> None:
    """Rank 1 raises in its decode after a sharded denoise: both ranks exit 1, one line, no image or record."""
    args = ["generate", "--model", "tiny-ursa", "-p", URSA_PROMPT, "--steps", "2", "--height", "64", "--width", "64",
            "--device", "cpu", "-q", "--parallel", "ulysses=2", "-o", "out/g.png", "--record", "out/run.json"]
    results = _launch(args, tmp_path, DIFFORGE_TEST_FAIL_RANK="1")
    assert [code for code, _, _ in results] == [1, 1], results
    lines = _error_lines(results)
    assert len(lines) == 1 and "rank 1" in lines[0] and "injected failure" in lines[0], results
    assert _files(tmp_path / "out") == []


def test_ulysses_rules() -> None:
    from difforge.config import ulysses_degree
    from difforge.models.ursa.ulysses import check_heads, stretches

    assert (ulysses_degree("ulysses=4"), ulysses_degree("cfg")) == (4, None)
    for bad in ("ulysses=1", "ulysses=x", "ulysses="):
        with pytest.raises(InputError, match="2 or more"):
            RunConfig(model="tiny-ursa", parallel=bad)
    assert stretches(385, 2) == [193, 192] and stretches(337, 4) == [85, 84, 84, 84] and sum(stretches(7, 3)) == 7
    check_heads(16, 8, 2)
    check_heads(16, 8, 16)  # one query head per rank, each reading its own kv head
    check_heads(2, 1, 2)  # tiny-ursa: both ranks read the one kv head
    from difforge.models.ursa.ulysses import SequenceShard

    def kv(heads: int, kv_heads: int, world: int) -> list[slice]:
        return [SequenceShard(None, [1] * world, heads, kv_heads)._kv_slice(r) for r in range(world)]

    assert kv(16, 8, 2) == [slice(0, 4), slice(4, 8)]  # URSA-1.7B: kv heads split with their query heads
    assert kv(16, 8, 16) == [slice(r // 2, r // 2 + 1) for r in range(16)]
    assert kv(2, 1, 2) == [slice(0, 1), slice(0, 1)]  # tiny-ursa: the one kv head to both ranks
    with pytest.raises(InputError, match="do not divide"):
        check_heads(16, 8, 3)
    with pytest.raises(InputError, match="whole kv"):
        check_heads(24, 4, 6)  # 4 query heads per rank over kv groups of 6


def test_ursa_cfg_parallel_needs_cfg() -> None:
    """--parallel cfg without guidance is refused with one line, before any collective; no group: refused too."""
    cfg = RunConfig(model="tiny-ursa", prompt=URSA_PROMPT, steps=2, height=64, width=64, device="cpu", quiet=True,
                    parallel="cfg")
    pipe = api.load_pipeline("tiny-ursa", "cpu", cfg=cfg, task="generate")
    with pytest.raises(InputError, match="no CFG"):
        pipe(dataclasses.replace(cfg, guidance=1.0))
    assert parallel.active() is None
    with pytest.raises(InputError, match="runs under torchrun"):
        pipe(cfg)


# ---- validate with a parallel device under test ----------------------------------------------------
VALIDATE = ["validate", "--model", "tiny-ursa", "--device", "cpu", "--dtype", "bfloat16", "--quick", "--height", "32",
            "--width", "32", "--steps", "2", "--rounds", "1", "--warmup", "0", "--no-speed-table", "-q"]


def test_validate_a_cfg_parallel_device_under_test(tmp_path: Path) -> None:
    """validate --parallel cfg under 2 ranks: the device under test's runs split over both, the reference and
    the floor on rank 0 alone, which alone writes the report; the same verdicts, numbers and device picture as
    a one-process validation, and a per-rank table in the report."""
    results = _launch([*VALIDATE, "--parallel", "cfg", "--out", "two"], tmp_path,
                      DIFFORGE_TEST_LOADS=str(tmp_path / "loads"))
    assert [code for code, _, _ in results] == [0, 0], results
    assert "html: two/report.html" in results[0][1] and "verdict: PASS" in results[0][1]
    assert results[1][1].strip() == "verdict: PASS"  # rank 1 names no report: it wrote none
    loads = [(tmp_path / f"loads.rank{r}").read_text(encoding="utf-8").splitlines() for r in (0, 1)]
    assert loads[1] == ["cpu torch.bfloat16"]  # rank 1: the device under test only
    assert loads[0][0] == "cpu torch.bfloat16" and len(loads[0]) == 3  # rank 0: it, the reference, the floor
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loads.rank0", "loads.rank1", "rank0.err", "rank0.out",
                                                          "rank1.err", "rank1.out", "two"]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run
    try:
        one = api.validate(model="tiny-ursa", device="cpu", dtype="bfloat16", quick=True, height=32, width=32, steps=2,
                           rounds=1, warmup=0, speed_table=False, quiet=True, out=str(tmp_path / "one"))
    finally:
        torch.set_num_threads(threads)
    two = json.loads((tmp_path / "two" / "report.json").read_text(encoding="utf-8"))
    assert {k: r["verdict"] for k, r in two["rungs"].items()} == one.rung_verdicts()
    for key in ("smoke", "determinism", "operator", "component", "step", "trajectory"):  # the same measurements
        assert two["rungs"][key]["summary"] == one.rungs[key].summary, key
    name = "images/device_seed0.png"
    assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    par = two["dut_record"]["extra"]["parallel"]
    assert (par["mode"], par["dist_backend"], [r["rank"] for r in par["ranks"]]) == ("cfg", "gloo", [0, 1])
    assert all(len(r["step_times_s"]) == 2 and "load" in r["phases_s"] for r in par["ranks"])
    assert any(a["what"] == "CFG" and "cfg-parallel" in a["choice"] for a in two["adaptations"])
    assert two["reproduce"][0].startswith("torchrun --nproc-per-node 2 -m difforge validate ")
    assert "--parallel cfg" in two["reproduce"][0]
    html = (tmp_path / "two" / "report.html").read_text(encoding="utf-8")
    section = html[html.index("Per-rank timings</h3>"):html.index("Per-phase detail</h3>")]
    assert section.count("<tr>") == 3  # the header and one row per rank
    assert "Per-rank timings" not in (tmp_path / "one" / "report.html").read_text(encoding="utf-8")


@pytest.mark.parametrize(("rank", "after"), [("1", "0"), ("1", "1"), ("0", "1")])
def test_validate_parallel_failing_rank_leaves_no_report(tmp_path: Path, rank: str, after: str) -> None:
    """A rank fails in a split run of the device under test (after 0: the smoke run; after 1: the benchmark's
    round, inside a rung's guard, which would keep a failed run as a failed rung and go on): both ranks exit 1
    with one line naming the failing rank, and rank 0 writes no report and leaves no staging folder."""
    results = _launch([*VALIDATE, "--parallel", "cfg", "--out", "two"], tmp_path, DIFFORGE_TEST_FAIL_RANK=rank,
                      DIFFORGE_TEST_FAIL_AFTER=after)
    assert [code for code, _, _ in results] == [1, 1], results
    lines = _error_lines(results)
    assert len(lines) == 1 and f"rank {rank}" in lines[0] and "injected failure" in lines[0], results
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.err", "rank0.out", "rank1.err", "rank1.out"]


def test_validate_parallel_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    res = CliRunner().invoke(app, [*VALIDATE, "--parallel", "cfg", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "torchrun --nproc-per-node 2 -m difforge validate --parallel cfg" in res.stderr
    from difforge.validate import ValidateOptions

    with pytest.raises(InputError, match="use --parallel cfg"):
        ValidateOptions(model="tiny-ursa", out=tmp_path / "r", parallel="data").check()
    with pytest.raises(InputError, match="built for difforge generate only"):
        ValidateOptions(model="tiny-ursa", out=tmp_path / "r", parallel="ulysses=2").check()
    assert not (tmp_path / "r").exists()
    from difforge.validate.ladder import Ladder

    lad = Ladder(ValidateOptions(model="tiny-ursa", out=tmp_path / "r", device="cpu", dtype="bfloat16", parallel="cfg"))
    dut = lad.dut_cfg()  # only the device under test's runs are split: the reference and the floor run one process
    assert (dut.parallel, lad.ref_cfg(dut).parallel, lad.floor_cfg(dut).parallel) == ("cfg", "none", "none")


# ---- refusals and the small rules ----------------------------------------------------------------
@pytest.mark.parametrize(("mode", "needle"), [("data", "torchrun --nproc-per-node"), ("cfg", "torchrun --nproc-per-node 2"),
                                              ("ulysses=2", "torchrun --nproc-per-node 2 -m difforge generate --parallel ulysses=2"),
                                              ("pipeline", "Unknown --parallel")])
def test_refused_without_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, needle: str) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    prompts = tmp_path / "p.txt"
    prompts.write_text("a cat\n", encoding="utf-8")
    res = CliRunner().invoke(app, [*URSA, "--prompt-file", str(prompts), "--parallel", mode, "-o", str(tmp_path / "o.png")])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
    assert not (tmp_path / "o_000_00.png").exists()


def test_parallel_rules() -> None:
    assert (CPUBackend.dist_backend, CUDABackend.dist_backend, NPUBackend.dist_backend) == ("gloo", "nccl", "hccl")
    assert CPUBackend.rank_index(3) is None
    cfg = RunConfig(model="tiny-ursa")
    assert cfg.parallel == "none"
    assert RunConfig(model="tiny-ursa", parallel="data").fingerprint() == cfg.fingerprint()  # no pixel changes
    assert RunConfig(model="tiny-ursa", parallel="ulysses=4").parallel == "ulysses=4"
    with pytest.raises(InputError, match="Unknown --parallel"):
        RunConfig(model="tiny-ursa", parallel="tensor")
