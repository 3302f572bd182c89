"""Semantic rung: does the port still draw what it was asked?

Every other rung measures numbers against the floor; a port that scrambles meaning but keeps its
numbers near the floor (an embedding table read one row off, two attention heads swapped in a way
the floor's error swamps) can pass them all on random weights.  This rung generates N prompts of a
prompt set with expected attributes (:mod:`difforge.shapes.prompts`: the held-out sets of the shapes
models, or a set written by hand for any model) on the device, the reference and the floor, scores
every picture with the rule-based checker, and counts what each side *loses*: prompts the reference
draws correctly and the side does not.

The judgement is against the floor, as everywhere: the device may lose at most what the floor loses
plus a small allowance for sampling chance (10 % of N, at least one prompt) to PASS, twice that
allowance to WARN, and FAILs beyond.  A reference that gets fewer than half of the set right cannot
tell a broken port from a clean one: the rung then says so and WARNs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .verdict import Row, RungResult, Verdict

#: The full run's prompts (issue 13: N >= 16); --quick scores QUICK_N.
FULL_N = 16
QUICK_N = 4
#: Allowance for sampling chance, as a share of N (at least one prompt): PASS within 1x, WARN within 2x.
ALLOWANCE = 0.10
#: Below this reference accuracy the set does not fit the model: the rung cannot judge (WARN).
MIN_REFERENCE_ACCURACY = 0.5


@dataclass
class Scored:
    """One prompt's three pictures and what the checker made of each (None: that side did not run)."""

    item_id: str
    prompt: str
    device: Any
    reference: Any
    floor: Any = None


def allowance(n: int) -> int:
    """Prompts a side may lose by chance beyond the floor's: 10 % of ``n``, at least one."""
    return max(1, math.ceil(ALLOWANCE * n))


def judge_lost(n: int, ref_ok: int, dut_lost: int, floor_lost: int) -> tuple[Verdict, str]:
    """The rung's rule on its counts (a pure function, so a report's numbers can be judged again): the
    prompts the device loses against the floor's, within the allowance PASS, within twice it WARN."""
    allow = allowance(n)
    if ref_ok < MIN_REFERENCE_ACCURACY * n:
        return Verdict.WARN, (f"the reference draws only {ref_ok} of {n} prompts correctly (< "
                              f"{MIN_REFERENCE_ACCURACY:.0%}): the set does not fit this model, so meaning cannot "
                              "be judged")
    if dut_lost <= floor_lost + allow:
        return Verdict.PASS, f"lost {dut_lost} <= {floor_lost} + {allow}"
    if dut_lost <= floor_lost + 2 * allow:
        return Verdict.WARN, f"lost {dut_lost} <= {floor_lost} + {2 * allow}"
    return Verdict.FAIL, f"lost {dut_lost} > {floor_lost} + {2 * allow}"


def _mark(score: Any) -> str:
    return "–" if score is None else ("✓" if score.correct else "✗")


def semantic_rung(scored: list[Scored], floor_label: str) -> RungResult:
    """Rows per prompt (device / reference / floor correct, the checker's detail for a device miss) and
    the verdict by the floor rule above."""
    n = len(scored)
    if not n:
        return RungResult("semantic", Verdict.SKIP, "no prompt with expected attributes")
    rows: list[Row] = []
    for s in scored:
        row = Row(s.item_id, note="" if s.device.correct else f"device: {s.device.detail}")
        row.add("prompt", s.prompt)
        row.add("device correct", _mark(s.device))
        row.add("reference correct", _mark(s.reference))
        if s.floor is not None:
            row.add("floor correct", _mark(s.floor))
        failed = [k for k, ok in s.device.checks.items() if not ok]
        row.add("device checks failed", ", ".join(failed) or "–")
        # a prompt the device draws is PASS; one it loses (the reference draws it) WARN - the rung counts
        # the losses against the floor's; one neither side draws says nothing about the port (SKIP)
        row.verdict = (Verdict.PASS if s.device.correct else
                       Verdict.WARN if s.reference.correct else Verdict.SKIP)
        rows.append(row)
    ref_ok = sum(s.reference.correct for s in scored)
    dut_ok = sum(s.device.correct for s in scored)
    dut_lost = sum(s.reference.correct and not s.device.correct for s in scored)
    has_floor = all(s.floor is not None for s in scored)
    floor_ok = sum(s.floor.correct for s in scored) if has_floor else None
    floor_lost = sum(s.reference.correct and not s.floor.correct for s in scored) if has_floor else 0
    allow = allowance(n)
    verdict, rule = judge_lost(n, ref_ok, dut_lost, floor_lost)
    floor_part = f", floor {floor_ok}/{n} ({floor_label})" if has_floor else ", no floor"
    summary = (f"prompts drawn correctly: device {dut_ok}/{n}, reference {ref_ok}/{n}{floor_part}; the device loses "
               f"{dut_lost} the reference gets right ({rule})")
    result = RungResult("semantic", verdict, summary, rows, {
        "n": n, "device_correct": dut_ok, "reference_correct": ref_ok, "floor_correct": floor_ok,
        "device_lost": dut_lost, "floor_lost": floor_lost if has_floor else None, "allowance": allow,
        # a WARN of the ratio rule (lost beyond the allowance, within twice it), not of an unfit set
        "warn_band": rule if verdict is Verdict.WARN and ref_ok >= MIN_REFERENCE_ACCURACY * n else None,
        "items": [{"id": s.item_id, "prompt": s.prompt, "device": s.device.correct, "reference": s.reference.correct,
                   "floor": None if s.floor is None else s.floor.correct,
                   "device_checks": s.device.checks} for s in scored]})
    return result
