"""``--parallel`` runs over torch.distributed: rank info, the process group, record gathering, the failure protocol.

difforge never launches processes: ``torchrun`` does (one node or several) and sets ``WORLD_SIZE``,
``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``.  Each rank parses the same options, takes
its device from ``LOCAL_RANK`` (:meth:`Backend.rank_index`) and opens the process group with the
backend's :attr:`~difforge.devices.Backend.dist_backend` (hccl on the NPU, nccl on CUDA, gloo on the
CPU and elsewhere), which the records name.

The failure protocol (no rank ever waits for a rank that has given up)
----------------------------------------------------------------------
Every synchronisation point of a run starts with the same one-number collective, the *status
header* (:meth:`Group.check`): each rank contributes 0, or the exit code it is failing with.  A rank
whose work raises goes straight to one last header with its code (:func:`guarded`); whatever header
its peers are waiting in - the next CFG step's, the record gather's, the final one - matches it, so
they learn of the failure there.  Then every rank removes the files it wrote in this run (so a failed
run leaves no partial output) and meets the others once more (:meth:`Group.cleaned`, so no rank exits
- and torchrun stops the rest - while a peer is still cleaning up); the lowest failing rank reports
its one line, the others exit with the same code silently (:class:`PeerFailed`).  Payload collectives (a CFG step's noise prediction, the records) only follow a
header that said "all well", with nothing that can fail in between.

One kind of section cannot keep that rule: a call whose collectives belong to another library
(diffusers' Ulysses all-to-alls inside a Qwen-Image-Edit transformer call), where a rank that fails
half-way leaves its peers inside a collective no header can meet.  Such a call runs in
:meth:`Group.opaque`.  A rank that fails inside it writes its exit code to the process group's
key-value store (out of band: the store answers while the collectives hang), removes its files,
reports and exits without any further collective; its exit closes its sockets, the peers' pending
collective raises, and each peer, finding the code in the store, exits with it silently after
removing its own files.  (gloo's ``abort`` does not close the sockets, so the exit is what ends the
peers' wait; under torchrun the agent's store outlives every rank, and when rank 0 hosts the store
itself and is the rank that failed, a peer that cannot reach the store any more knows that a peer
failed all the same.)
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import DifforgeError, InputError

if TYPE_CHECKING:
    import torch

    from ..devices import Backend
    from .record import RunRecord

T = TypeVar("T")

#: What torchrun sets; without ``WORLD_SIZE`` the process was not launched by it.
LAUNCH_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK")
#: How long a rank waits for every other rank to join the process group, in seconds (torch's own default is 30
#: minutes, spent in C++ where Ctrl-C and SIGTERM go unanswered): ``DIFFORGE_RENDEZVOUS_TIMEOUT`` overrides it.
RENDEZVOUS_ENV = "DIFFORGE_RENDEZVOUS_TIMEOUT"
DEFAULT_RENDEZVOUS_S = 300.0
#: How much longer torch's own store waits than difforge does (so difforge always gives up first).
STORE_MARGIN_S = 600.0


class PeerFailed(DifforgeError):
    """Another rank failed and reports it; this rank exits with the same code and says nothing."""

    silent = True

    def __init__(self, exit_code: int, rank: int | None = None) -> None:
        super().__init__(f"rank {rank} failed" if rank is not None else "another rank failed")
        self.exit_code = exit_code


class RendezvousTimeout(DifforgeError):
    """Not every rank joined the process group in time (a WORLD_SIZE without its peers): exit 2, on every rank."""


def rendezvous_timeout() -> float:
    """Seconds a rank waits for its peers to join (:data:`RENDEZVOUS_ENV`, else :data:`DEFAULT_RENDEZVOUS_S`)."""
    raw = os.environ.get(RENDEZVOUS_ENV, "").strip()
    if not raw:
        return DEFAULT_RENDEZVOUS_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{RENDEZVOUS_ENV} must be a number of seconds above 0, got {raw!r}.")
    return value


def _meet(info: RankInfo, timeout_s: float, serial: int) -> Any:
    """Connect to the rendezvous store (``env://``: torchrun's agent store, or rank 0's) and wait until every rank
    has: the part of opening a process group that waits for the peers.  Returns the store."""
    import datetime

    import torch.distributed as dist

    # torch's own wait outlasts the caller's, so the caller gives up first and this thread is still inside it (see
    # _rendezvous); a C++ timeout first would also print torch's multi-line retry log.
    store, _rank, _world = next(dist.rendezvous("env://", info.rank, info.world_size,
                                                timeout=datetime.timedelta(seconds=timeout_s + STORE_MARGIN_S)))
    key = f"difforge/joined/{serial}"
    store.add(key, 1)
    while store.add(key, 0) < info.world_size:  # every rank connected, not only rank 0's store host
        time.sleep(0.05)
    return store


def _rendezvous(info: RankInfo, timeout_s: float, serial: int) -> Any:
    """The store once every rank has joined (:func:`_meet`), waited for in a helper thread.

    torch waits for the peers inside C++ (with the GIL released), where Python's signal handlers never run, so
    Ctrl-C and SIGTERM were ignored for up to half an hour.  Waiting here instead, the main thread takes them
    at once (KeyboardInterrupt / :class:`~difforge.runtime.signals.Terminated`: exit 130 / 143, nothing written
    yet), and gives up after ``timeout_s``.  Only the waiting runs in the helper (a daemon thread, left behind by
    a rank that gives up); the process group itself, and its device communicator, are made on the main thread.
    """
    done = threading.Event()
    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(_meet(info, timeout_s, serial))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="difforge-rendezvous", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not done.wait(0.1):
        if time.monotonic() >= deadline:
            break
    if not done.is_set():  # the helper stays blocked in torch's wait until the process ends: it never returns into
        # a finalising interpreter (a C++ frame unwound by a dying thread aborts the process: exit 134)
        raise RendezvousTimeout(
            f"rank {info.rank} of {info.world_size}: the other ranks did not join the process group within "
            f"{timeout_s:g} s (WORLD_SIZE={info.world_size}); start every rank with torchrun "
            f"(or set {RENDEZVOUS_ENV} to wait longer).")
    if failure:
        raise failure[0]
    return result[0]


class RankFailed(DifforgeError):
    """An unexpected exception on a rank, as the one line the lowest failing rank prints."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in a torchrun launch."""

    rank: int
    world_size: int
    local_rank: int


def launched() -> RankInfo | None:
    """This process's place in a torchrun launch, or None when not launched by torchrun (no ``WORLD_SIZE``)."""
    if "WORLD_SIZE" not in os.environ:
        return None
    try:
        world = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise InputError("WORLD_SIZE, RANK and LOCAL_RANK must be whole numbers (torchrun sets them).") from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise InputError(f"RANK {rank} / WORLD_SIZE {world} do not describe a torchrun launch.")
    return RankInfo(rank, world, local)


def launch_hint(mode: str, task: str) -> str:
    from ..config import ulysses_degree

    ranks = 2 if mode == "cfg" else (ulysses_degree(mode) or "N")
    return f"torchrun --nproc-per-node {ranks} -m difforge {task} --parallel {mode} ..."


def require_launch(mode: str, task: str) -> RankInfo:
    """The rank info, or the one-line refusal naming the torchrun command (InputError, exit 2)."""
    info = launched()
    if info is None:
        raise InputError(f"--parallel {mode} runs one process per rank under torchrun; start it with "
                         f"'{launch_hint(mode, task)}'.")
    if mode == "cfg" and info.world_size != 2:
        raise InputError(f"--parallel cfg runs the two CFG branches on exactly 2 ranks; this launch has "
                         f"{info.world_size} ('torchrun --nproc-per-node 2 ...').")
    from ..config import ulysses_degree

    degree = ulysses_degree(mode)
    if degree is not None and info.world_size != degree:
        raise InputError(f"--parallel {mode} splits the sequence over exactly {degree} ranks; this launch has "
                         f"{info.world_size} ('torchrun --nproc-per-node {degree} ...').")
    return info


@dataclass
class Group:
    """One ``--parallel`` run's process group and the files this rank wrote in it."""

    mode: str
    info: RankInfo
    backend: Backend
    settled: bool = False  # a header reported a failure: only the clean-up barrier may follow
    broken: bool = False  # a collective itself failed (a peer died): none may follow
    in_opaque: bool = False  # inside :meth:`opaque` (still set when an exception left it)
    serial: int = 0  # which group of this process this is (the same on every rank): the store keys' prefix
    _written: dict[Path, tuple[int, int] | None] = field(default_factory=dict)
    _started: float = field(default_factory=time.perf_counter)

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def dist_backend(self) -> str:
        return self.backend.dist_backend

    @property
    def writes(self) -> bool:
        """Whether this rank writes its outputs: every rank in ``data`` mode, rank 0 only in ``cfg`` mode."""
        return self.mode == "data" or self.rank == 0

    def _comm_device(self) -> torch.device:
        import torch

        return torch.device("cpu") if self.dist_backend == "gloo" else self.backend.device

    # ---- collectives -----------------------------------------------------------------------------
    def _header(self, status: int) -> list[int]:
        import torch
        import torch.distributed as dist

        mine = torch.tensor([int(status)], dtype=torch.int64, device=self._comm_device())
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine)
        return [int(t.item()) for t in every]

    def check(self) -> None:
        """The status header with "all well": returns when every rank says so, raises PeerFailed otherwise."""
        if self.settled:
            raise PeerFailed(1)
        statuses = self._header(0)
        failed = [(r, s) for r, s in enumerate(statuses) if s]
        if failed:
            self.settled = True
            raise PeerFailed(failed[0][1], failed[0][0])

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (same shape and dtype on each), after a status header."""
        import torch.distributed as dist

        self.check()
        local = tensor.contiguous()
        moved = local.to(self._comm_device())
        every = [moved.new_empty(moved.shape) for _ in range(self.world_size)]
        dist.all_gather(every, moved)
        return [t.to(local.device) for t in every]

    def all_to_all(self, tensor: torch.Tensor, input_splits: list[int], output_splits: list[int]) -> torch.Tensor:
        """``all_to_all_single`` along dim 0 (uneven splits allowed), after a status header: rank ``j`` gets
        this rank's ``input_splits[j]`` rows; the result stacks ``output_splits[i]`` rows from each rank ``i``."""
        import torch.distributed as dist

        self.check()
        local = tensor.contiguous()
        moved = local.to(self._comm_device())
        out = moved.new_empty((sum(output_splits), *moved.shape[1:]))
        dist.all_to_all_single(out, moved, output_split_sizes=list(output_splits), input_split_sizes=list(input_splits))
        return out.to(local.device)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, after a status header."""
        import torch.distributed as dist

        self.check()
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, obj)
        return every

    @contextmanager
    def opaque(self) -> Iterator[None]:
        """A section whose collectives no status header can meet (module docstring).  An exception that
        leaves it keeps :attr:`in_opaque` set, which is how :func:`guarded` knows to fail out of band."""
        self.in_opaque = True
        yield
        self.in_opaque = False

    def _key(self, rank: int) -> str:
        return f"difforge/failed/{self.serial}/{rank}"

    def tell_failure(self, code: int) -> None:
        """Out of band: write this rank's exit code to the store; the group takes no collective after it."""
        self.settled = self.broken = True
        with suppress(Exception):  # no store left: the peers learn from the closed sockets alone
            _store().set(self._key(self.rank), str(int(code)))

    def told_failure(self) -> tuple[int, int | None] | None:
        """(exit code, rank) of a peer that failed out of band, (1, None) if the store is gone with the
        rank that hosted it, None if no peer said anything."""
        try:
            store = _store()
            for rank in range(self.world_size):
                if rank != self.rank and store.check([self._key(rank)]):
                    return int(store.get(self._key(rank))), rank
        except Exception:  # noqa: BLE001 - the store's host (rank 0, launched without torchrun) is gone
            return 1, None
        return None

    def fail(self, code: int) -> list[int] | None:
        """This rank's last header, with its exit code; every rank's status, or None if the group is gone."""
        if self.settled:
            return None
        self.settled = True
        try:
            return self._header(code)
        except Exception:  # noqa: BLE001 - a peer that died took the group with it: nothing left to tell
            self.broken = True
            return None

    def cleaned(self) -> None:
        """After a failure, wait until every rank has removed its files, so none exits (and torchrun stops
        the others) while a peer is still cleaning up."""
        if not self.broken:
            try:
                self._header(0)
            except Exception:  # noqa: BLE001 - the group is gone: nothing to wait for
                self.broken = True

    # ---- outputs ------------------------------------------------------------------------------------
    def will_write(self, *paths: str | Path | None) -> None:
        """Note files this rank is about to write, so a failed run removes them (a file that was there and
        is left untouched stays)."""
        for p in paths:
            if p:
                path = Path(p)
                if path not in self._written:
                    self._written[path] = _stamp(path)

    def remove_written(self) -> None:
        for path, before in self._written.items():
            if path.exists() and _stamp(path) != before:
                with suppress(OSError):
                    path.unlink()

    def describe(self) -> dict[str, Any]:
        """What a record says about this rank's part in the run."""
        return {"mode": self.mode, "world_size": self.world_size, "dist_backend": self.dist_backend,
                "rank": self.rank, "local_rank": self.info.local_rank, "host": socket.gethostname(),
                "device": str(self.backend)}

    def close(self) -> None:
        global _ACTIVE
        import torch.distributed as dist

        if _ACTIVE is self:
            _ACTIVE = None
        if dist.is_initialized():
            with suppress(Exception):
                dist.destroy_process_group()


def _store() -> Any:
    """The default process group's key-value store (torchrun's agent store, or rank 0's TCPStore)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


_ACTIVE: Group | None = None
_OPENED = 0  # process groups this process has opened (every rank opens the same ones, in the same order)


def active() -> Group | None:
    """The process group of the ``--parallel`` run in progress in this process, if any."""
    return _ACTIVE


def seq_split() -> Group:
    """The group a ``--parallel ulysses=N`` forward splits its sequence over (rank r: the r-th stretch)."""
    group = _ACTIVE
    if group is None or not group.mode.startswith("ulysses"):
        raise InputError("--parallel ulysses=N runs under torchrun through difforge generate/edit (or api.generate/api.edit/api.batch).")
    return group


def cfg_split() -> Group:
    """The group a ``--parallel cfg`` denoise loop splits its two branches over (rank 0 conditional)."""
    group = _ACTIVE
    if group is None or group.mode != "cfg":
        raise InputError("--parallel cfg runs under torchrun through difforge generate/edit (or api.edit/api.batch).")
    return group


def rank_backend(spec: str, info: RankInfo) -> Backend:
    """This rank's backend: ``--device`` without an index, indexed by ``LOCAL_RANK`` where there are several."""
    from ..devices import get_backend

    backend = get_backend(spec)
    if backend.index is not None:
        raise InputError(f"--parallel picks each rank's device from LOCAL_RANK; give --device {backend.name}, "
                         f"not {spec}.")
    index = type(backend).rank_index(info.local_rank)
    return backend if index is None else get_backend(f"{backend.name}:{index}")


def _start(mode: str, backend: Backend, info: RankInfo, timeout_s: float | None = None) -> Group:
    global _ACTIVE, _OPENED
    import datetime

    import torch.distributed as dist

    kwargs: dict[str, Any] = {}
    if timeout_s is not None:  # how long one collective may wait (torch's default: 10 to 30 minutes)
        kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
    if backend.dist_backend != "gloo" and backend.index is not None:
        kwargs["device_id"] = backend.device  # nccl/hccl: bind the rank's device to its group
    wait_s = rendezvous_timeout()
    try:
        store = _rendezvous(info, wait_s, _OPENED + 1)
        store.set_timeout(kwargs.get("timeout", datetime.timedelta(minutes=30)))  # what torch gives its own store
        dist.init_process_group(backend.dist_backend, store=dist.PrefixStore("default_pg", store), rank=info.rank,
                                world_size=info.world_size, **kwargs)
    except DifforgeError:
        raise
    except Exception as exc:  # noqa: BLE001 - one sentence, whatever the rendezvous says
        msg = " ".join(str(exc).split())[:200]
        raise RankFailed(f"could not open the {backend.dist_backend} process group (rank {info.rank} of "
                         f"{info.world_size}): {msg}") from None
    _OPENED += 1
    group = Group(mode, info, backend, serial=_OPENED)
    _ACTIVE = group
    return group


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, DifforgeError):
        return int(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return int(getattr(exc, "exit_code", 130))
    return 1


def _reported(exc: BaseException, rank: int) -> BaseException:
    """The exception the lowest failing rank raises: its message prefixed with the rank."""
    if isinstance(exc, DifforgeError):
        exc.message = f"rank {rank}: {exc.message}"
        return exc
    if isinstance(exc, Exception) and not os.environ.get("DIFFORGE_DEBUG"):
        msg = " ".join(str(exc).split())[:300]
        return RankFailed(f"rank {rank}: unexpected {exc.__class__.__name__}: {msg} "
                          "(set DIFFORGE_DEBUG=1 for the traceback)")
    return exc


def guarded(mode: str, task: str, device: str, work: Callable[[Group], T], timeout_s: float | None = None,
            before: Callable[[], None] | None = None) -> T:
    """Run ``work(group)`` on this rank of a ``--parallel`` run under the failure protocol (module docstring).

    ``timeout_s``: how long one collective may wait (``validate``: rank 1 waits while rank 0 runs the reference).
    ``before``: work every rank does before the group opens (building a built-in model: see ``api._build_builtin``).

    Errors before the group exists (a bad option, no torchrun, a missing device) are the same on every
    rank: rank 0 reports them, the others exit with the same code silently.
    """
    from ..config import check_parallel

    check_parallel(mode)
    info = require_launch(mode, task)
    try:
        if before is not None:
            before()
        group = _start(mode, rank_backend(device, info), info, timeout_s)
    except DifforgeError as exc:
        if info.rank == 0 or isinstance(exc, RendezvousTimeout):  # a rank left waiting alone says so itself
            raise
        raise PeerFailed(exc.exit_code, 0) from None
    try:
        result = work(group)
        group.check()  # the last header: every rank finished (and rank 0 wrote the combined record)
    except BaseException as exc:
        code = _exit_code(exc)
        peer = None if isinstance(exc, PeerFailed) or not group.in_opaque else group.told_failure()
        if peer is not None:  # a peer failed inside an opaque section and left: that broke this rank's collective
            group.settled = group.broken = True
            exc = PeerFailed(*peer)
        elif group.in_opaque and not isinstance(exc, PeerFailed):  # peers may wait in collectives no header meets
            group.tell_failure(code)
        statuses = group.fail(code) if not isinstance(exc, PeerFailed) else None
        group.remove_written()
        group.cleaned()
        group.close()
        if isinstance(exc, PeerFailed):
            if peer is not None:
                raise exc from None
            raise
        first = next((r for r, s in enumerate(statuses or []) if s), group.rank)
        if first != group.rank:
            raise PeerFailed(statuses[first] if statuses else code, first) from None
        reported = _reported(exc, group.rank)
        if reported is exc:
            raise
        raise reported from None
    group.close()
    return result


# ---- records ---------------------------------------------------------------------------------------
def run_timings(record: RunRecord) -> dict[str, Any]:
    """One run's phase and step times and device peak, as the parallel records list them per rank."""
    return {"phases_s": {k: round(v.wall_s, 6) for k, v in record.phases.items()},
            "peak_device_bytes": max((p.peak_device_bytes for p in record.phases.values()
                                      if p.peak_device_bytes is not None), default=None),
            "step_times_s": list(record.step_times_s)}


def rank_entry(group: Group, record: RunRecord) -> dict[str, Any]:
    """This rank (mode, backend, host, device) and its timings of one run."""
    return {**group.describe(), **run_timings(record)}


def gather_cfg_ranks(group: Group, record: RunRecord) -> None:
    """``cfg`` mode, after each run: rank 0's record gets both ranks' timings (``extra["parallel"]``)."""
    every = group.all_gather_object(rank_entry(group, record))
    record.extra["parallel"] = {"mode": group.mode, "world_size": group.world_size,
                                "dist_backend": group.dist_backend, "ranks": every}


def combined_record(group: Group, task: str, runs: list[dict[str, Any]], config: dict[str, Any]) -> RunRecord | None:
    """``data`` mode, at the end: every rank's runs gathered; rank 0 gets the one combined RunRecord.

    ``runs``: this rank's, each ``{"index", "rank", "outputs", **run_timings}``.  The combined record
    lists every output in prompt order, one phase per rank (its wall time from the group's start) and,
    in ``extra["parallel"]``, the process-group backend and every rank's runs with their timings.
    """
    from .record import PhaseStat, RunRecord

    every = group.all_gather_object({"rank": group.rank, "describe": group.describe(), "runs": runs,
                                     "wall_s": time.perf_counter() - group._started})
    if group.rank != 0:
        return None
    rec = RunRecord(kind=task)
    rec.config = {**config, "parallel": group.mode, "runs": sum(len(r["runs"]) for r in every)}
    ordered = sorted((run for r in every for run in r["runs"]), key=lambda run: run["index"])
    for run in ordered:
        rec.outputs.extend(run.pop("outputs", []))
    for r in every:
        peaks = [run.get("peak_device_bytes") for run in r["runs"] if run.get("peak_device_bytes") is not None]
        rec.phases[f"rank{r['rank']}"] = PhaseStat(f"rank{r['rank']}", r["wall_s"], max(peaks, default=None), 0)
    rec.extra["parallel"] = {"mode": group.mode, "world_size": group.world_size,
                             "dist_backend": group.dist_backend,
                             "ranks": [{**r["describe"], "wall_s": round(r["wall_s"], 6),
                                        "runs": [run for run in ordered if run["rank"] == r["rank"]]}
                                       for r in every]}
    return rec


def shard(prompt_index: int, group: Group | None) -> bool:
    """Whether this rank runs prompt ``prompt_index``: rank ``p % world_size`` in ``data`` mode (a fixed
    shard, so seeds and output names are those of one process); every rank otherwise (``cfg``: both
    ranks run every prompt in step)."""
    return group is None or group.mode != "data" or prompt_index % group.world_size == group.rank
