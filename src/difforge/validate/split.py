"""``validate --parallel cfg``: the device under test's runs split over two ranks, everything else on rank 0.

Under ``torchrun --nproc-per-node 2``, rank 0 climbs the whole ladder exactly as one process would: it
loads the device under test on its device (from ``LOCAL_RANK``), the reference and the floor, runs every
rung and alone writes the report.  Rank 1 (:func:`follow`) loads only the device-under-test pipeline, on
its own device, and waits for rank 0's word.  Every device-under-test run (``cfg.parallel == "cfg"``:
the plain path of the reference and the floor is ``none``) goes through :func:`lead`, which tells rank 1
``("run", (cfg, images))``; both ranks then make the same call, its two CFG branches split between them
(one all-gather per step, as ``generate``/``edit --parallel cfg``), and gather both ranks' timings into
rank 0's record (``extra.parallel.ranks``: the report's per-rank table).  ``("done", (verdict,
exit_code))`` ends rank 1's loop with rank 0's verdict (:func:`done`; ``runner.validate_rank`` is
what each rank runs).  The probe's own steps (teacher-forced steps,
components, operators) call no pipeline and run on rank 0 alone.

Each word is one ``all_gather_object``, which starts with the failure protocol's status header
(:mod:`difforge.runtime.parallel`), so a rank that fails anywhere is seen at the next word or step.  A
split run that fails on rank 0 cannot be kept as a failed rung (rank 1 may be waiting in the middle of
that run): :class:`Aborted` passes through every rung's guard and ends the validation on both ranks
with one line and no report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import engine
from ..runtime.parallel import gather_cfg_ranks

if TYPE_CHECKING:
    from PIL import Image

    from ..engine import RunResult
    from ..runtime.record import RunRecord

#: How long a rank may wait in one collective: rank 1 waits while rank 0 runs the reference (a CPU
#: float32 reference of a large model can take hours); a failing rank is seen at once by the protocol.
WAIT_S = 24 * 3600.0


class Aborted(BaseException):  # noqa: N818 - not an error of its own: it carries one past the rungs' guards
    """A split run failed on rank 0; ``error`` is what it raised (re-raised by :func:`validate_rank`)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def lead(group: Any, pipe: Any, cfg: Any, images: list[Image.Image] | None, record: RunRecord | None,
         step_hook: Callable[..., None] | None) -> RunResult:
    """Rank 0: one device-under-test run, split with rank 1; both ranks' timings in the record."""
    try:
        group.all_gather_object(("run", (cfg, images)))
        res = engine.run_pipeline(pipe, cfg, images=images, record=record, step_hook=step_hook)
        gather_cfg_ranks(group, res.record)
    except BaseException as exc:
        raise Aborted(exc) from exc
    return res


def follow(group: Any, pipe: Any, record: RunRecord | None) -> tuple[str, int]:
    """Rank 1: run each call rank 0 names on ``pipe`` (the device under test, loaded as rank 0 loads it;
    ``record``: its load's, which the first run - rank 0's smoke run - fills, as on rank 0); rank 0's
    (verdict, exit code) at the end."""
    while True:
        kind, payload = group.all_gather_object(None)[0]
        if kind == "done":
            return payload
        cfg, images = payload
        gather_cfg_ranks(group, engine.run_pipeline(pipe, cfg, images=images, record=record).record)
        record = None


def done(group: Any, verdict: str, exit_code: int) -> None:
    """Rank 0, after the report: end rank 1's loop with the verdict."""
    group.all_gather_object(("done", (verdict, exit_code)))
