"""The two things every training loop of the shapes recipes does alike: one optimiser step, a running log.

One place for them, so the recipes' loops differ only in what they compute (their pinned first-step
losses in ``tests/training`` do not depend on this module: the arithmetic is the loops' own).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch


def optimiser_step(opt: torch.optim.Optimizer, loss: torch.Tensor, params: Iterable[torch.nn.Parameter] | None = None,
                   clip: float | None = None) -> float:
    """Backward ``loss`` and step ``opt`` (gradients clipped to norm ``clip`` over ``params`` when given);
    returns the loss as a float."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(list(params or ()), clip)
    opt.step()
    return float(loss.item())


class RunningLog:
    """Every step's loss, and a line with the mean of the last ``window`` every ``every`` steps and at the end:
    ``NAME STEP/TOTAL loss MEAN lr LR (SECONDSs)``."""

    def __init__(self, name: str, total: int, log: Callable[[str], None], every: int = 50, window: int = 50) -> None:
        self.name, self.total, self.log, self.every, self.window = name, total, log, every, window
        self.losses: list[float] = []
        self._t0 = time.perf_counter()

    def __call__(self, step: int, loss: float, lr: float) -> None:
        self.losses.append(loss)
        if step % self.every == 0 or step == self.total - 1:
            recent = self.losses[-self.window:]
            self.log(f"{self.name} {step + 1}/{self.total} loss {sum(recent) / len(recent):.4f} lr {lr:.2e} "
                     f"({time.perf_counter() - self._t0:.0f}s)")
