"""The sanity gate every calibration passes before a profile is written.

A least-squares fit always returns numbers; this module judges whether they
mean anything. ``hetspec calibrate --runs`` (``analyses.calibrate.session``) and
``--published`` (``analyses.calibrate.publishedcal``) describe their fit as
``Fitted`` numbers (each in the coordinate the fit moved it in: log of a
profile field, a row unknown's transform) plus the Jacobian of the fitted
residuals, and ask three questions:

- bounds: a number that ends within ``EDGE`` of the search range's edge (an
  arbitrary limit: a compute efficiency of 1e-4, a multi-row factor of 10) was
  placed by the range, not by the rows. A physical limit (an efficiency of 1,
  the hardware's peak; an overhead or latency of zero) is a fair answer when the
  rows are content there, a problem when they push past it: moved ``NUDGE`` past
  the limit, the fitted rows' median |log error| would drop by more than ``PUSH``;
- identifiability: a direction of the fitted numbers the rows do not measure
  (a singular value of the Jacobian under ``NULL_SV``: fewer rows than numbers,
  or two numbers that move every row alike) along which the fit still moved by
  more than ``NULL_MOVE`` (log units) from its start, or which holds a field
  that is off in the profile (the fit would write its stand-in start);
- errors: the fitted rows' median |relative error| over ``MAX_MEDIAN_ERROR``.

A problem is one sentence naming the number or row; ``enforce`` refuses the
first (ValueError: exit 2, nothing written) unless the caller accepts a poor
fit (``--accept-poor-fit``), and then returns them all to be printed as warnings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

EDGE = 0.01  # a fitted number within 1% (log units) of a bound is on it
NUDGE = 0.1  # how far past a physical limit the push test moves a number (log units)
PUSH = 0.02  # median |log error| gained by that move that counts as pushing
# A direction of the fitted numbers (log units) moving the rows' log residuals by
# less than this (norm) per log unit is unmeasured: a factor e changes them < 0.1%.
# Absolute, not relative to the largest singular value: a deterministic run's
# whole rounds can make one finite difference huge and every other look small.
NULL_SV = 1e-3
NULL_MOVE = 0.1  # log units the fit may drift along an unmeasured direction
MAX_MEDIAN_ERROR = 0.5  # fitted rows whose median |error| stays above this: refused
# Profile fields whose bound on one side is a physical limit (the hardware's peak,
# no overhead at all), not the edge of a search range.
PHYSICAL = {"compute_efficiency": "hi", "memory_efficiency": "hi",
            "launch_overhead_s": "lo", "call_overhead_s": "lo", "latency_s": "lo",
            "alpha_s": "lo", "request_latency_s": "lo", "stream_dispatch_s": "lo",
            "memory_half_bytes": "lo", "compute_half_flops": "lo",
            "roofline_exponent": "both"}


@dataclass(frozen=True)
class Fitted:
    """One fitted number in the coordinate the fit moved it in."""

    label: str
    field: str | None  # the profile field (None: a row's unknown)
    x: float  # where it ended
    start: float  # where the fit started it (the profile's value)
    lo: float
    hi: float
    value: float  # its value in the profile's units (for the sentence)
    # why its start is a stand-in, not a value of the profile ('' where it is one)
    stand_in: str = ""


def _side(n: Fitted) -> str | None:
    if n.x - n.lo <= EDGE:
        return "lo"
    if n.hi - n.x <= EDGE:
        return "hi"
    return None


def _physical(n: Fitted, side: str) -> bool:
    return PHYSICAL.get(n.field or "") in (side, "both")


def bound_problems(numbers: list[Fitted], push: Callable[[int, float], float],
                   fix: str) -> list[str]:
    """Numbers on an arbitrary bound, or on a physical one the rows push past;
    ``push(i, dx)`` is the drop of the fitted rows' median |log error| when
    number i moves by dx (log units) from where it ended."""
    out = []
    for i, n in enumerate(numbers):
        side = _side(n)
        if side is None:
            continue
        if not _physical(n, side):
            out.append(f"the fit pushed {n.label} to the edge of its search range "
                       f"({n.value:.4g}), so the rows did not place it: {fix}")
            continue
        gain = push(i, NUDGE if side == "hi" else -NUDGE)
        if gain > PUSH:
            limit = "above its physical limit" if side == "hi" else "below zero"
            out.append(f"the rows push {n.label} {limit} (it ended at {n.value:.4g}; "
                       f"{NUDGE:.0%} further would fit them {gain:.1%} better in median "
                       f"log error), which no hardware does: {fix}")
    return out


def null_problems(numbers: list[Fitted], jac: np.ndarray, n_rows: int, fix: str,
                  rows: str = "row", hold: str | None = None) -> list[str]:
    """Directions the ``rows`` (fitted rows, spans) do not measure along which the
    fit moved anyway, or that hold a number whose start is a stand-in; ``hold``
    names the option that keeps a field at the profile's value (the fix then
    names the fields to hold first)."""
    if not numbers:
        return []
    jac = np.nan_to_num(np.asarray(jac, dtype=float).reshape(-1, len(numbers)))
    # a row's unknown starts at a guess, not at a profile value: only the profile's
    # fields count as moved (what the written profile would change without evidence)
    moved = np.array([n.x - n.start if n.field else 0.0 for n in numbers])
    _, sv, vt = np.linalg.svd(jac, full_matrices=True)
    for k in range(len(numbers)):
        if k < len(sv) and sv[k] > NULL_SV:
            continue  # measured
        order = [j for j in np.argsort(-np.abs(vt[k])) if abs(vt[k][j]) > 0.2]
        names = [numbers[j].label for j in order[:2]]
        apart = f" apart from {names[1]}" if len(names) > 1 else ""
        stand_in = [numbers[j] for j in order if numbers[j].stand_in]
        if stand_in:
            n = stand_in[0]
            return [f"{n.label} starts at a stand-in ({n.stand_in}) and the fitted {rows}s "
                    f"do not measure it{apart if n.label == names[0] else ''}, so the fit "
                    f"would write {n.value:.4g}, which no {rows} supports: {fix}"]
        drift = float(vt[k] @ moved)
        if abs(drift) > NULL_MOVE:
            fields = list(dict.fromkeys(numbers[j].field for j in order[:2]
                                        if numbers[j].field))
            held = (f"hold {'one of them' if len(fields) > 1 else 'it'} at the "
                    f"profile's value ({' or '.join(f'{hold} {f}' for f in fields)}), "
                    if hold and fields else "")
            return [f"the fitted {rows}s do not measure {names[0]}{apart} ({n_rows} "
                    f"fitted {rows}s for {len(numbers)} fitted numbers), yet the fit "
                    f"moved the profile {_factor(drift)} that way, so they do not "
                    f"identify what it wrote: {held}{fix}"]
    return []


def _factor(log_move: float) -> str:
    """A move in log units as words: '+35%', or 'over 100-fold' (from an off field's
    floor, whose percentage says nothing)."""
    if abs(log_move) > math.log(100):
        return "over 100-fold"
    return f"{np.expm1(abs(log_move)):.0%}"


def error_problem(errors: list[tuple[str, float]], kind: str, fix: str) -> str | None:
    """The fitted rows (``kind``: 'row', 'span kind') whose median |error| stays
    over ``MAX_MEDIAN_ERROR``, naming the worst."""
    if not errors:
        return None
    values = np.abs([e for _, e in errors])
    median = float(np.median(values))
    if median <= MAX_MEDIAN_ERROR:
        return None
    name, worst = max(errors, key=lambda e: abs(e[1]))
    return (f"the fitted {kind}s stay far off after the fit (median |error| "
            f"{median:.1%}, over {MAX_MEDIAN_ERROR:.0%}; worst {kind} {name} "
            f"{worst:+.1%}): {fix}")


def enforce(problems: list[str], accept_poor_fit: bool) -> list[str]:
    """ValueError with the first problem unless ``accept_poor_fit``; the problems
    (to print as warnings) otherwise."""
    if problems and not accept_poor_fit:
        more = f" ({len(problems) - 1} more problem(s) with this fit)" if len(problems) > 1 \
            else ""
        raise ValueError(f"calibration refused, nothing written: {problems[0]}{more}; "
                         "--accept-poor-fit writes the profile anyway")
    return problems
