"""Outcomes of Verify and Outcome operations in simulation.

Random mode draws from the acceptance model with a seeded generator. In
deterministic mode a Verify returns each row's *expected* accepted length (a
float), and an Outcome follows error diffusion: the event holds on exactly
floor(n * p) of the first n asks, so its frequency is p with no randomness.
"""

from __future__ import annotations

import numpy as np

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
        if self.deterministic:
            key = (op.gamma, op.position)
            e = self._expected.get(key)
            if e is None:
                e = self._expected[key] = self.acceptance.expected(op.gamma, op.position)
            return Verdict((e,) * op.batch)
        return Verdict(self.acceptance.sample(op.gamma, op.batch, self.rng, op.position))

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
