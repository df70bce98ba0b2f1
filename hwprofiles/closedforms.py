"""Closed-form pieces shared by the schedules, the profiles and the laws.

They live once, at the bottom of the import graph, so that ``policies`` (which
plan with them), ``hwprofiles.schema`` (which costs collectives with them) and
``analyses.laws.forms`` (which states the papers' formulas with them) cannot drift.
"""

from __future__ import annotations

import math


def expected_accepted(alpha: float, gamma: int) -> float:
    """E[accepted drafts] of gamma i.i.d. drafts accepted with probability alpha
    until the first rejection: sum_{j=1..gamma} alpha^j (the bonus not counted)."""
    return sum(alpha ** j for j in range(1, gamma + 1))


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per step] of speculative decoding: the accepted drafts plus the
    target's own token, (1 - alpha^(gamma+1)) / (1 - alpha)."""
    return 1.0 + expected_accepted(alpha, gamma)


def geometric_fanout_shape(acceptance: float, r: float, k: int) -> list[float]:
    """F_k / F_0 of SSD's geometric fan-out: a^(k/(1+r)) for k < K, and
    a^(K/(1+r)) (1-a)^(-1/(1+r)) for the last, K = k."""
    e = 1 / (1 + r)
    return [acceptance ** (i * e) for i in range(k)] + [
        acceptance ** (k * e) * (1 - acceptance) ** -e]


def miss_rate(fanout: float, r: float) -> float:
    """Power-law miss rate of a speculation cache holding ``fanout`` guesses: F^(-r),
    capped at 1 (no guess: always a miss)."""
    return min(1.0, fanout ** -r) if fanout > 0 else 1.0


def allreduce_s(algorithm: str, alpha_s: float, bandwidth_bytes_s: float, group: int,
                nbytes: float) -> float:
    """One all-reduce of nbytes over ``group`` members.

    ``alpha_beta``: alpha log2 G + M / bandwidth (the Mirror-SD model);
    ``ring``: 2(G-1) alpha + 2(G-1)/G M / bandwidth;
    ``tree``: 2 log2 G (alpha + M / bandwidth).
    """
    g = group
    if g == 1:
        return 0.0
    bw = bandwidth_bytes_s
    if algorithm == "alpha_beta":
        return alpha_s * math.log2(g) + nbytes / bw
    if algorithm == "ring":
        return 2 * (g - 1) * alpha_s + 2 * (g - 1) / g * nbytes / bw
    return 2 * math.log2(g) * (alpha_s + nbytes / bw)
