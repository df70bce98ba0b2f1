"""Each schedule at its best setting: an integer search over its own parameter.

``hetspec compare`` without ``--sweep`` tunes every schedule's main integer
parameter, the one its registration names (``register(..., tuned=Tuned(key))``,
``policies.declared``), over its whole valid range instead of a fixed grid
whose edge may hold the winner. The search runs in rounds so that each round's
points run in parallel: first a ladder around the default (x0 ± 1, 2, 4, 8, ...),
then, round by round, the midpoints between the best value and its evaluated
neighbours, widening past the largest (or smallest) value tried while the best
sits there. It stops when the best value's neighbours are both evaluated (or
are the valid bounds); a best value on a bound is reported as such.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from analyses.run import budget
from policies import entry


@dataclass
class Search:
    """One schedule's search over ``key`` in [lo, hi] (scores: higher is better)."""

    policy: str
    key: str
    lo: int
    hi: int
    start: int
    valid_hi: int | None = None  # the parameter's own bound, when above ``hi``
    scores: dict[int, float] = field(default_factory=dict)

    def ladder(self) -> list[int]:
        out = {self.start}
        step = 1
        while self.start - step >= self.lo or self.start + step <= self.hi:
            out |= {v for v in (self.start - step, self.start + step) if self.lo <= v <= self.hi}
            step *= 2
        return sorted(out)

    @property
    def best(self) -> int | None:
        valid = {v: s for v, s in self.scores.items() if s is not None}
        return max(valid, key=lambda v: (valid[v], -abs(v - self.start))) if valid else None

    def next_values(self) -> list[int]:
        """The values the next round evaluates: [] once the best is bracketed."""
        if not self.scores:
            return self.ladder()
        best = self.best
        if best is None:
            return []
        below = [v for v in self.scores if v < best]
        above = [v for v in self.scores if v > best]
        out = set()
        if above:
            right = min(above)
            if right - best > 1:
                out.add((best + right + 1) // 2)
        elif best < self.hi:
            out.add(min(self.hi, 2 * best))  # widen past the largest value tried
        if below:
            left = max(below)
            if best - left > 1:
                out.add((left + best) // 2)
        elif best > self.lo:
            out.add(max(self.lo, best // 2))
        return sorted(v for v in out if v not in self.scores)

    @property
    def rounds(self) -> int:
        """Rounds after the ladder: each halves the gaps beside the best value (the
        ladder's widest is under the range), one more may widen past its top."""
        return math.ceil(math.log2(self.hi - self.lo + 1)) + 2

    @property
    def max_points(self) -> int:
        """The most values the search can evaluate: its ladder, then at most two a
        round (a bound the work estimate counts)."""
        return len(self.ladder()) + 2 * self.rounds

    @property
    def on_bound(self) -> str | None:
        best = self.best
        if best == self.hi and self.valid_hi and self.valid_hi > self.hi:
            return (f"{self.key}={best} is the top of the search (valid up to "
                    f"{self.valid_hi}); --sweep {self.key}={best}..{self.valid_hi} looks "
                    "further")
        if best == self.hi:
            return f"{self.key}={best} is the largest value {self.policy} allows"
        if best == self.lo and self.lo != self.start:
            return f"{self.key}={best} is the smallest value {self.policy} allows"
        return None


def searches(policies: list[str], fixed: set[str]) -> list[Search]:
    """A search for every policy whose tuned parameter the user neither set nor swept."""
    out = []
    for policy in policies:
        tuned = entry(policy).tuned
        if tuned is None or tuned.key in fixed:
            continue
        f = entry(policy).params.model_fields[tuned.key]
        lo = next(m.ge for m in f.metadata if hasattr(m, "ge"))
        hi = next(m.le for m in f.metadata if hasattr(m, "le"))
        out.append(Search(policy, tuned.key, lo, min(hi, tuned.top), f.default, valid_hi=hi))
    return out


def run_searches(found: list[Search], evaluate: Callable[[list[tuple[str, str, int]]],
                                                         list[float | None]]) -> None:
    """Run every search to its end. ``evaluate`` takes a round's (policy, key,
    value) triples and returns their scores (None: the point failed), in order."""
    for _ in range(1 + max((s.rounds for s in found), default=0)):
        batch = [(s, v) for s in found for v in s.next_values()]
        if not batch:
            return
        scores = evaluate([(s.policy, s.key, v) for s, v in batch])
        for (s, v), score in zip(batch, scores):
            s.scores[v] = score


def estimate(found: list[Search], others: dict[str, dict], sets_of: dict[str, dict],
             base: dict):
    """The work of a tuned comparison (analyses.run.budget): each search's ladder at
    its own values, its refinement rounds at the top of its range, one AR baseline
    per schedule (its points share it), and every untuned schedule once.
    ``others``/``sets_of``: policy -> its fixed settings as value lists."""
    tokens, batch = int(base.get("tokens", 1000)), int(base.get("batch", 1))
    models = budget.Models(base.get("target"), base.get("draft"))

    def units(policy: str, values: dict) -> tuple[float, float]:
        return budget.point_units(policy, values, tokens, batch, models)

    total, sims = 0.0, 0
    for s in found:
        fixed = sets_of.get(s.policy, {})
        for v in s.ladder():
            total += units(s.policy, {**fixed, s.key: [v]})[0]
        top, base_units = units(s.policy, {**fixed, s.key: [s.hi]})
        total += 2 * s.rounds * top + base_units
        sims += s.max_points + 1
    for policy, values in others.items():
        run, base_units = units(policy, values)
        total += run + base_units
        sims += 2
    product = (f"{len(found)} schedules tuned (at most {sims - 2 * len(others):,} "
               f"simulations with their baselines) and {len(others)} run once, of "
               f"{budget.plural(tokens, 'token')} x {budget.plural(batch, 'sequence')}")
    return budget.sim_estimate("compare", product, total,
                               "pass --no-tune, drop policies or lower --tokens or --batch",
                               sims)
