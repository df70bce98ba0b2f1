"""Mirror-SD's settings, the plan a run takes from them, and the closed forms that
decide a step's fallback.

``plan`` resolves the defaults (kappa by batch as the paper schedules it, eta by
whether the draft has multi-token heads, the early exit at half depth, Omega from a
value, a per-kappa list or a recorded trace) and checks them against the models.
When some rows have no precomputed path, the batch stalls for a fresh rollout or
those rows skip the step: ``skips`` compares the rollout's cost ratio with
``skip_bound``, the ratio above which skipping commits more per second.
``policies/mirror.py`` schedules the plan and prices its law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from policies.base import MAX_COLLECTIVES, PolicyContext, PolicyError, PolicyParams
from policies.traces import recorded_rate

KAPPA_SCHEDULE = ((8, 8), (16, 4), (32, 2))  # (largest batch, kappa); 1 beyond


def default_kappa(batch: int) -> int:
    """The paper's schedule: kappa 8 up to batch 8, 4 at 16, 2 at 32, 1 from 64."""
    for largest, kappa in KAPPA_SCHEDULE:
        if batch <= largest:
            return kappa
    return 1


class MirrorParams(PolicyParams):
    gamma: int = Field(7, ge=1, le=64, description="window depth: draft tokens per branch")
    kappa: int | None = Field(None, ge=1, le=64, description=(
        "early-exit candidates (window roots); default: 8 at batch <= 8, 4 at 16, "
        "2 at 32, 1 from 64"))
    exit_layer: int | None = Field(None, ge=1, description=(
        "target layers before the early exit (l_e); default: half the layers"))
    eta: int | None = Field(None, ge=1, le=64, description=(
        "tokens per speculative-streaming draft step; default: 2 (two SS streams) "
        "where the draft has multi-token heads, 1 where it has none (the executor)"))
    omega: float | tuple[float, ...] = Field(0.9, description=(
        "Omega_kappa: per-row chance the corrected prefix lies on a precomputed path; "
        "a list gives Omega_1, Omega_2, ... by kappa (the last repeats)"))
    omega_trace: str | None = Field(None, description=(
        "acceptance.jsonl of a measured run: Omega is the rate of its 'reuse' events"))
    draft_collectives: int | None = Field(2, ge=0, le=MAX_COLLECTIVES, description=(
        "all-reduces per draft step when the draft runs on a group (2: SPD-style; "
        "none: two per layer)"))
    batch_fallback: Literal["auto", "stall", "skip"] = Field("auto", description=(
        "a row whose prefix left the window: 'stall' re-rolls on the critical path, "
        "'skip' verifies it with no proposal for one step; auto: skip when "
        "rollout_ratio exceeds skip_bound, else stall"))
    rollout_ratio: float | None = Field(None, ge=0, description=(
        "T_f / T: a fresh rollout with its trip over one step (eq. 10), from the cost "
        "model or a stall run; auto skips when it exceeds skip_bound"))

    def single_token_defaults(self) -> dict:
        """eta defaults to 1 where the draft emits one token a pass."""
        return {"eta": 1} if self.eta is None else {}

    def unused(self) -> str | None:
        """A given setting this configuration ignores (PolicyParams.unused)."""
        if self.omega_trace is not None and "omega" in self.model_fields_set:
            return "omega has no effect with omega_trace (the trace's rate is used); drop one"
        if self.rollout_ratio is not None and self.batch_fallback != "auto":
            return (f"rollout_ratio has no effect with batch_fallback={self.batch_fallback} "
                    "(it decides between stall and skip under auto); drop one")
        return None

    @field_validator("omega")
    @classmethod
    def _unit(cls, v):
        values = v if isinstance(v, tuple) else (v,)
        if not values or any(not 0 <= w <= 1 for w in values):
            raise ValueError("every Omega must lie in [0, 1]; write e.g. omega=0.9")
        return v


@dataclass(frozen=True)
class MirrorPlan:
    """Validated sizes of one Mirror-SD run."""

    gamma: int
    kappa: int
    eta: int
    exit_layer: int
    n_layers: int
    draft_layers: int
    omega: float
    collectives: int | None
    chunks: tuple[int, ...]  # tokens each draft step emits; len = J
    fallback: str = "auto"  # "auto", "stall" or "skip"
    rollout_ratio: float | None = None

    @property
    def draft_steps(self) -> int:
        return len(self.chunks)


def default_eta(multi_token: bool) -> int:
    """Tokens per draft step when ``eta`` is not given: 2 (two speculative streams)
    for a draft with multi-token heads, 1 for one without (the executor's)."""
    return 2 if multi_token else 1


def plan(ctx: PolicyContext, params: MirrorParams) -> MirrorPlan:
    """Resolve defaults and check the sizes against the models."""
    draft = ctx.need_draft("mirror")
    n = ctx.target.n_layers
    exit_layer = params.exit_layer if params.exit_layer is not None else n // 2
    if not 1 <= exit_layer < n:
        raise PolicyError(f"exit_layer ({exit_layer}) must lie in [1, {n - 1}] for "
                          f"{ctx.target.name}'s {n} layers; choose a smaller value")
    kappa = params.kappa if params.kappa is not None else default_kappa(ctx.batch)
    if params.omega_trace is not None:
        omega = recorded_rate(params.omega_trace, "reuse", "omega_trace")
    elif isinstance(params.omega, tuple):
        omega = params.omega[min(kappa, len(params.omega)) - 1]
    else:
        omega = params.omega
    eta = params.eta if params.eta is not None else default_eta(ctx.draft_multi_token)
    eta = min(eta, params.gamma)
    chunks = tuple(min(eta, params.gamma - j * eta)
                   for j in range(math.ceil(params.gamma / eta)))
    return MirrorPlan(params.gamma, kappa, eta, exit_layer, n, draft.n_layers, omega,
                      params.draft_collectives, chunks, params.batch_fallback,
                      params.rollout_ratio)


def failing_rows(omega: float, batch: int) -> float:
    """Expected rows without a precomputed path in a step where at least one
    row has none: batch (1 - omega) / (1 - omega^batch)."""
    miss_any = 1 - omega ** batch
    return batch * (1 - omega) / miss_any if miss_any > 0 else 0.0


def skip_bound(omega: float, batch: int, expected_accepted: float) -> float:
    """The ratio T_f / T of a fresh rollout (with its trip) to a step above
    which skipping beats stalling: (1 - Omega) E / ((1 - Omega^B)(1 + Omega E))."""
    miss_any = 1 - omega ** batch
    if miss_any <= 0:
        return math.inf
    return (1 - omega) * expected_accepted / (miss_any * (1 + omega * expected_accepted))


def skips(p: MirrorPlan, batch: int, accepted_mean: float) -> bool:
    """Whether the rows that miss this step skip (True) or stall the batch."""
    if p.fallback != "auto":
        return p.fallback == "skip"
    return p.rollout_ratio is not None and \
        p.rollout_ratio > skip_bound(p.omega, batch, accepted_mean)
