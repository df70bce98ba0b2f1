"""Outcomes of Verify and Outcome operations in simulation.

Random mode draws from the acceptance model with a seeded generator. In
deterministic mode a Verify returns each row's *expected* accepted length (a
float), and an Outcome follows error diffusion: the event holds on exactly
floor(n * p) of the first n asks, so its frequency is p with no randomness.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from policies.acceptance import IID
from policies.ops import Outcome, Verdict, Verify


class Outcomes:
    def __init__(self, acceptance, *, seed: int = 0, deterministic: bool = False):
        self.acceptance = acceptance
        self.rng = np.random.default_rng(seed)
        self.deterministic = deterministic
        self._credit: dict[str, float] = {}
        self.asked: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self._expected: dict[tuple[int, int], float] = {}

    def verify(self, op: Verify) -> Verdict:
        if op.expected is not None or not op.bonus:
            return self._verify_modelled(op)
        if self.deterministic:
            key = (op.gamma, op.position)
            e = self._expected.get(key)
            if e is None:
                e = self._expected[key] = self.acceptance.expected(op.gamma, op.position)
            return Verdict((e,) * op.batch)
        return Verdict(self.acceptance.sample(op.gamma, op.batch, self.rng, op.position))

    def _verify_modelled(self, op: Verify) -> Verdict:
        """A Verify with its own modelled mean (``expected``) or without a bonus
        token: a row then commits min(accepted, gamma - 1) + 1 tokens."""
        model = self.acceptance if op.expected is None else iid_with_mean(op.gamma,
                                                                          op.expected)
        no_bonus = not op.bonus and op.gamma > 0
        if self.deterministic:
            key = (op.gamma, op.position, op.expected, no_bonus)
            pair = self._expected.get(key)
            if pair is None:
                e = model.expected(op.gamma, op.position) if op.expected is None \
                    else op.expected
                c = model.expected(op.gamma - 1, op.position) + 1 if no_bonus else None
                pair = self._expected[key] = (e, c)
            e, c = pair
            return Verdict((e,) * op.batch, committed=None if c is None else (c,) * op.batch)
        accepted = model.sample(op.gamma, op.batch, self.rng, op.position)
        committed = tuple(min(a, op.gamma - 1) + 1 for a in accepted) if no_bonus else None
        return Verdict(accepted, committed=committed)

    def outcome(self, op: Outcome) -> bool:
        p = op.probability ** op.batch  # the event must hold for every row
        if self.deterministic:
            credit = self._credit.get(op.event, 0.0) + p
            held = credit >= 1.0 - 1e-12
            self._credit[op.event] = credit - 1.0 if held else credit
        else:
            held = bool(self.rng.random() < p)
        self.asked[op.event] = self.asked.get(op.event, 0) + 1
        self.held[op.event] = self.held.get(op.event, 0) + int(held)
        return held

    def rate(self, event: str) -> float | None:
        n = self.asked.get(event, 0)
        return self.held.get(event, 0) / n if n else None


@lru_cache(maxsize=256)
def iid_with_mean(gamma: int, expected: float) -> IID:
    """The i.i.d. acceptance model whose mean accepted length over gamma proposals
    is ``expected`` (alpha found by bisection; the mean rises with alpha)."""
    if not 0 <= expected <= gamma:
        raise ValueError(f"a modelled mean of {expected} accepted tokens cannot come "
                         f"from {gamma} proposals; it must lie in [0, {gamma}]")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if IID(alpha=mid).expected(gamma) < expected else (lo, mid)
    return IID(alpha=(lo + hi) / 2)
