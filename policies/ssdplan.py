"""SSD's settings, its closed forms and the plan a run takes from them.

The fan-out F_0..F_K of bonus-token guesses cached per accepted count (uniform, or
SSD's geometric shape a^(k/(1+r)) under a budget), the power-law miss rate F^-r of
a cache holding F guesses, the per-row hit rate it gives under plain sampling, and
SAGUARO's sampling constant C moving draft mass onto the cached tokens (hit rate
up, acceptance scaled down). ``plan`` gathers them for one run; ``policies/ssd.py``
schedules it and prices its law.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from hwprofiles.schema import MAX_TIME_S
from policies.base import MAX_COLLECTIVES, PolicyContext, PolicyError, PolicyParams
from policies.ops import ALTERNATIVES
from policies.sd import expected_accepted
from policies.traces import recorded_rate


class SSDParams(PolicyParams):
    k: int = Field(5, ge=1, le=32, description="speculation length K: draft tokens per round")
    fanout: int = Field(3, ge=1, le=64, description=(
        "bonus-token guesses cached per outcome k (uniform shape); with "
        "shape=geometric the budget defaults to (k+1)*fanout"))
    shape: Literal["uniform", "geometric"] = Field("uniform", description="fan-out over k")
    budget: int | None = Field(None, ge=1, description="cap on sum(F_k), speculations per row")
    a_p: float = Field(0.8, gt=0, lt=1, description=(
        "primary speculator's per-token acceptance the fan-out is planned for"))
    r: float | None = Field(None, gt=0, description="miss-rate exponent: miss = F^-r")
    hit_rate: float | None = Field(None, ge=0, le=1, description="fixed per-row hit rate")
    hit_trace: str | None = Field(None, description=(
        "acceptance.jsonl of a measured run: the hit rate of its 'cache_hit' events"))
    backup: Literal["jit", "fast"] = Field("jit", description="speculator after a miss")
    partial_hits: Literal["keep", "backup"] = Field("keep", description=(
        "a round in which some rows hit and others missed: keep (the rows that hit "
        "keep their cached speculation, the backup runs for the missed rows alone: "
        "the per-row law) or backup (every row takes the backup's speculation, as "
        "the SSD repository's jit path re-speculates the whole batch on any miss)"))
    fast_alpha: float = Field(0.0, ge=0, le=1, description=(
        "per-token acceptance of the fast backup's tokens (0: random tokens)"))
    fast_backup_s: float = Field(0.0, ge=0, le=MAX_TIME_S,
                                 description="fast backup latency on the draft")
    c_saguaro: float = Field(1.0, ge=0, le=1, description=(
        "SAGUARO sampling constant C (1: plain sampling)"))
    top_mass: float = Field(0.5, ge=0, le=1, description=(
        "draft probability mass on its cached top-F tokens (SAGUARO model)"))
    draft_collectives: int | None = Field(2, ge=0, le=MAX_COLLECTIVES, description=(
        "all-reduces per draft step when the draft runs on a group (2: SPD-style, as "
        "every separate-draft schedule by default; none: two per layer)"))

    def unused(self) -> str | None:
        """A given setting this configuration ignores (PolicyParams.unused)."""
        given = self.model_fields_set
        fast = sorted(given & {"fast_alpha", "fast_backup_s"})
        if self.backup == "jit" and fast:
            return (f"{fast[0]} has no effect with backup=jit (it describes the fast "
                    f"backup); set backup=fast or drop {fast[0]}")
        if self.hit_trace is not None and "hit_rate" in given:
            return "hit_rate has no effect with hit_trace (the trace's rate is used); drop one"
        if "r" in given and self.shape == "uniform" and (self.hit_rate is not None
                                                         or self.hit_trace is not None):
            return ("r has no effect with shape=uniform and a given hit rate (it shapes a "
                    "geometric fan-out or models the hit rate); drop r or set shape=geometric")
        if "top_mass" in given and self.c_saguaro == 1:
            return ("top_mass has no effect with c_saguaro=1 (plain sampling moves no mass); "
                    "set c_saguaro below 1 or drop top_mass")
        return None


def planning_weights(a_p: float, k_max: int) -> list[float]:
    """P(k accepted) for k = 0..K under i.i.d. acceptance a_p."""
    return [a_p ** k * (1 - a_p) for k in range(k_max)] + [a_p ** k_max]


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


def _largest_remainder(real: list[float], total: int) -> tuple[int, ...]:
    floors = [int(x) for x in real]
    order = sorted(range(len(real)), key=lambda i: floors[i] - real[i])
    for i in order[:total - sum(floors)]:
        floors[i] += 1
    return tuple(floors)


def fanout_of(params: SSDParams) -> tuple[int, ...]:
    """F_0..F_K, the bonus-token guesses cached for each accepted count."""
    k = params.k
    if params.shape == "uniform":
        f = (params.fanout,) * (k + 1)
        if params.budget is not None and sum(f) > params.budget:
            raise PolicyError(f"fanout {params.fanout} x (k+1) = {sum(f)} speculations "
                              f"exceed budget {params.budget}; lower fanout or raise budget")
        return f
    if params.r is None:
        raise PolicyError("shape=geometric needs the miss-rate exponent; set r=EXPONENT")
    budget = params.budget if params.budget is not None else (k + 1) * params.fanout
    shape = geometric_fanout_shape(params.a_p, params.r, k)
    return _largest_remainder([budget * w / sum(shape) for w in shape], budget)


def base_hit_rate(params: SSDParams, fanout: tuple[int, ...]) -> float:
    """Per-row hit rate under plain sampling."""
    if params.hit_trace is not None:
        return recorded_rate(params.hit_trace, "cache_hit", "hit_trace")
    if params.hit_rate is not None:
        return params.hit_rate
    if params.r is None:
        raise PolicyError("policy 'ssd' needs a hit model: set hit_rate=P, r=EXPONENT "
                          "(miss = F^-r) or hit_trace=PATH")
    weights = planning_weights(params.a_p, params.k)
    return sum(w * (1 - miss_rate(f, params.r)) for w, f in zip(weights, fanout) if f > 0)


def saguaro(params: SSDParams, hit: float) -> tuple[float, float]:
    """(hit rate, acceptance scale) under SAGUARO sampling with constant C."""
    if params.top_mass > params.a_p:
        raise PolicyError(f"top_mass ({params.top_mass}) cannot exceed a_p ({params.a_p}): "
                          "the cached tokens' agreed mass is part of the acceptance")
    moved = (1 - params.c_saguaro) * params.top_mass
    rho = 1 - params.a_p
    return (hit * rho + moved) / (rho + moved), 1 - moved / params.a_p


@dataclass(frozen=True)
class SSDPlan:
    k: int
    fanout: tuple[int, ...]
    hit_row: float
    scale: float
    backup: str
    partial_hits: str
    fast_expected: float
    fast_backup_s: float
    n_layers: int
    draft_layers: int
    collectives: int | None

    @property
    def branches(self) -> int:
        return sum(self.fanout)

    @property
    def alternatives(self) -> int:
        """Draft candidates kept beside each sampled token: the F_k guesses of an
        outcome k are the draft's candidates other than its proposed token, so
        F_k + 1 are needed (one spare kept)."""
        return max(ALTERNATIVES, max(self.fanout) + 2)


def plan(ctx: PolicyContext, params: SSDParams) -> SSDPlan:
    draft = ctx.need_draft("ssd")
    fanout = fanout_of(params)
    hit_row, scale = saguaro(params, base_hit_rate(params, fanout))
    fast_expected = expected_accepted(params.fast_alpha, params.k)
    return SSDPlan(params.k, fanout, hit_row, scale, params.backup, params.partial_hits,
                   fast_expected, params.fast_backup_s, ctx.target.n_layers,
                   draft.n_layers, params.draft_collectives)
