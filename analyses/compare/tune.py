"""Each schedule at its best setting: an integer search over its own parameter.

``hetspec compare`` without ``--sweep`` tunes every schedule's main integer
parameter (gamma, SSD's k) over its whole valid range instead of a fixed grid
whose edge may hold the winner. The search runs in rounds so that each round's
points run in parallel: first a ladder around the default (x0 ± 1, 2, 4, 8, ...),
then, round by round, the midpoints between the best value and its evaluated
neighbours, widening past the largest (or smallest) value tried while the best
sits there. It stops when the best value's neighbours are both evaluated (or
are the valid bounds); a best value on a bound is reported as such.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# The parameter each schedule is tuned over (its own main integer knob).
TUNED = {"sd": "gamma", "mirror": "gamma", "eesd": "gamma", "cats": "gamma",
         "kangaroo": "gamma", "ssd": "k"}
MAX_ROUNDS = 12  # the ladder and the refinement meet long before (a 64-wide range: ~6)


@dataclass
class Search:
    """One schedule's search over ``key`` in [lo, hi] (scores: higher is better)."""

    policy: str
    key: str
    lo: int
    hi: int
    start: int
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
    def on_bound(self) -> str | None:
        best = self.best
        if best == self.hi:
            return f"{self.key}={best} is the largest value {self.policy} allows"
        if best == self.lo and self.lo != self.start:
            return f"{self.key}={best} is the smallest value {self.policy} allows"
        return None


def searches(policies: list[str], fixed: set[str]) -> list[Search]:
    """A search for every policy whose tuned parameter the user neither set nor swept."""
    from policies import entry

    out = []
    for policy in policies:
        key = TUNED.get(policy)
        if key is None or key in fixed:
            continue
        f = entry(policy).params.model_fields[key]
        lo = next(m.ge for m in f.metadata if hasattr(m, "ge"))
        hi = next(m.le for m in f.metadata if hasattr(m, "le"))
        out.append(Search(policy, key, lo, hi, f.default))
    return out


def run_searches(found: list[Search], evaluate: Callable[[list[tuple[str, str, int]]],
                                                         list[float | None]]) -> None:
    """Run every search to its end. ``evaluate`` takes a round's (policy, key,
    value) triples and returns their scores (None: the point failed), in order."""
    for _ in range(MAX_ROUNDS):
        batch = [(s, v) for s in found for v in s.next_values()]
        if not batch:
            return
        scores = evaluate([(s.policy, s.key, v) for s, v in batch])
        for (s, v), score in zip(batch, scores):
            s.scores[v] = score
