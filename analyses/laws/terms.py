"""The terms of each latency law for one simulated run's configuration.

``Scenario`` asks the roofline cost model for the times a run's schedule
spends (target and draft passes at the run's contexts, messages along the
platform's routes); ``ssd_terms``, ``mirror_terms`` and ``stream_terms`` turn
them into the closed forms' inputs (``analyses.laws.forms``). ``analyses.compare.lawviews``
draws the laws with these terms and places the simulated runs on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analyses.laws import forms as laws
from hwprofiles import load_model, load_platform, load_stack
from hwprofiles.placement import resolve
from policies import PolicyContext, PolicyError, outcome_models
from policies import cats as cats_policy
from policies import mirror as mirror_policy
from policies import ppsd as ppsd_policy
from policies import sd as sd_policy
from policies import ssd as ssd_policy
from policies.ops import ENTRY_BYTES, TOKEN_BYTES, VERDICT_BYTES
from simcore import RooflineCost, acceptance
from simcore.outcomes import scaled_expected


def params_of(cfg, policy: str):
    """The typed parameters of a ``policy`` run; another policy's run is refused."""
    if cfg.policy != policy:
        raise ValueError(f"the {policy} law terms need a {policy} run, not policy "
                         f"'{cfg.policy}'; pass a config with policy='{policy}'")
    return cfg.params


class Scenario:
    """The cost model's times (seconds) for one run's configuration."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.platform = load_platform(cfg.platform)
        self.placement = resolve(self.platform, cfg.placement)
        self.target = cfg.run_model(load_model(cfg.target))
        self.draft = cfg.run_model(load_model(cfg.draft)) if cfg.draft else None
        self.cost = RooflineCost(self.platform, load_stack(cfg.stack))
        self.batch = cfg.batch
        self.context = self.contexts(1)[0]
        self.acceptance = cfg.acceptance

    def contexts(self, n: int) -> list[int]:
        """KV positions at the middle of n equal parts of the run (one if fixed)."""
        c = self.cfg
        if c.fixed_context:
            return [c.prompt_tokens]
        return [c.prompt_tokens + int((i + 0.5) * c.tokens / n) for i in range(n)]

    def policy_context(self) -> PolicyContext:
        c = self.cfg
        return PolicyContext(self.target, self.draft, c.tokens, c.batch, c.prompt_tokens,
                             c.fixed_context)

    def target_s(self, layers, n_tokens: int, head, context: int | None = None,
                 head_tokens: int | None = None) -> float:
        return self.cost.forward(self.target, self.placement["target"], layers,
                                 n_tokens, self.batch,
                                 self.context if context is None else context, head,
                                 None, head_tokens).total_s

    def draft_s(self, n_tokens: int, rows: int, context: int, collectives) -> float:
        where = self.placement["draft"]
        return self.cost.forward(self.draft, where, (0, self.draft.n_layers), n_tokens,
                                 rows, context, "lm", collectives).total_s

    def shared(self) -> bool:
        """Whether the target and the draft share a device (its stream is FIFO)."""
        members = [set(self.platform.members(self.placement[r]))
                   for r in ("target", "draft")]
        return bool(members[0] & members[1])

    def trip_s(self, src: str, dst: str, nbytes: float) -> float:
        """A message from the first device of role src to the first of role dst."""
        a = self.platform.members(self.placement[src])[0]
        b = self.platform.members(self.placement[dst])[0]
        return sum(RooflineCost.hop_s(link, nbytes) for link in self.platform.route(a, b))


SSD_CONTEXTS = 32  # parts of a run whose round times are averaged (context grows)


@dataclass(frozen=True)
class SSDTerms:
    """The closed form's terms for one run; times in verify times T_v. Each round
    time is averaged over the run's contexts: a term that crosses another as the
    context grows (the pre-speculation outlasting the verify) bends the mean.
    The backup runs for the rows that missed alone, so its latency T_b depends
    on how many did: ``t_b[backup][m - 1]`` is a round's with m of B rows missed,
    and the law takes its mean over the rounds with a miss (``mean_t_b``)."""

    t_v_s: float
    t_p: float
    t_b: dict  # backup -> T_b per missed rows, as scheduled
    t_b_at_once: dict  # backup -> T_b per missed rows, if a miss stopped prespec at once
    e_miss: dict  # backup -> E_miss
    e_hit: float
    backup: str
    partial_hits: str  # keep: rows that hit keep their speculation; backup: all rows take it
    k: int
    fanout: tuple
    batch: int
    shared: bool  # one device: no pre-speculation during the verify, no law to match

    def mean_t_b(self, hit_rate: float, backup: str | None = None,
                 at_once: bool = False) -> float:
        """T_b averaged over the rounds in which some row missed, rows missing
        independently with chance 1 - hit_rate (binomial, less the all-hit round)."""
        per_missed = (self.t_b_at_once if at_once else self.t_b)[backup or self.backup]
        weights = [math.comb(self.batch, m) * (1 - hit_rate) ** m
                   * hit_rate ** (self.batch - m) for m in range(1, self.batch + 1)]
        if sum(weights) <= 0:
            return per_missed[-1]  # every row hits: no backup runs
        return sum(w * t for w, t in zip(weights, per_missed)) / sum(weights)

    def speedup(self, hit_rate: float, backup: str | None = None, at_once: bool = False):
        """The closed form at a per-row hit rate with this run's terms."""
        b = backup or self.backup
        if self.partial_hits == "backup":  # a round is a hit or a miss for the whole batch
            t_b = (self.t_b_at_once if at_once else self.t_b)[b][-1]
            return laws.ssd(hit_rate ** self.batch, self.e_hit, self.e_miss[b], self.t_p,
                            t_b)["speedup"]
        t_b = self.mean_t_b(hit_rate, b, at_once)
        return laws.ssd(hit_rate, self.e_hit, self.e_miss[b], self.t_p, t_b,
                        self.batch)["speedup"]


def _ssd_rounds_s(s: Scenario, p, c: int) -> np.ndarray:
    """Seconds at context c: T_v, a hit round, then for m = 1..B missed rows the
    miss rounds (jit, fast) as scheduled and as if the miss stopped
    pre-speculation at once. Rows that hit need all the pre-speculation, so with
    some hits it runs to its end; a miss on every row stops it after the step in
    flight."""
    b = s.batch
    to_draft = s.trip_s("target", "draft", b * VERDICT_BYTES)
    to_target = s.trip_s("draft", "target", b * p.k * ENTRY_BYTES)
    arrival = s.target_s((0, p.n_layers), p.k + 1, "lm", c) + to_draft
    ends = np.cumsum([s.draft_s(1, b * p.branches, c + p.k + j, p.collectives)
                      for j in range(p.k)])
    stop = next((float(e) for e in ends if e >= arrival), arrival)  # step in flight ends
    hit = max(arrival, ends[-1])
    rows = []
    for m in range(1, b + 1):
        jit = sum(s.draft_s(1, m, c + j, p.collectives) for j in range(p.k))
        after = stop if m == b else hit
        rows.append([after + jit, after + p.fast_backup_s, arrival + jit,
                     arrival + p.fast_backup_s])
    return np.concatenate([[arrival, hit], np.ravel(rows)]) + to_target


def ssd_terms(cfg) -> SSDTerms:
    """E_hit, E_miss, T_p, T_b of a run, derived from the costs as the schedule
    spends them: T_v is the verify plus both rendezvous messages."""
    s = Scenario(cfg)
    ctx, params = s.policy_context(), params_of(cfg, "ssd")
    p = ssd_policy.plan(ctx, params)
    mean = np.mean([_ssd_rounds_s(s, p, c) for c in s.contexts(SSD_CONTEXTS)], axis=0)
    t_v, hit = mean[0], mean[1]
    jit, fast, jit_now, fast_now = (tuple(v / t_v - 1) for v in mean[2:].reshape(-1, 4).T)
    # the verdicts' means as the simulator draws them: the schedule's outcome models
    models = outcome_models("ssd", ctx, params)
    e_hit = 1 + scaled_expected(s.acceptance, p.k, 0, models[ssd_policy.VERIFY].scale)
    e_fast = 1 + models[ssd_policy.FAST_VERIFY].expected
    return SSDTerms(t_v, hit / t_v, {"jit": jit, "fast": fast},
                    {"jit": jit_now, "fast": fast_now},
                    {"jit": e_hit, "fast": e_fast}, e_hit, p.backup, p.partial_hits,
                    p.k, p.fanout, s.batch, s.shared())


@dataclass(frozen=True)
class MirrorTerms:
    """Eq. 10's terms for one run (seconds) and its expected stall per step."""

    prefix_s: float
    suffix_s: float
    draft_s: float
    rv_ee_s: float
    rv_fv_s: float
    fresh_s: float
    stall_share: float  # steps that wait for a fresh rollout (1 - Omega^B when stalling)
    plan: mirror_policy.MirrorPlan
    shared: bool  # one device runs suffix and draft in turn: no overlap budget
    startup_share: float = 0.0  # the start-up rollout spread over a run's steps

    @property
    def delta_s(self) -> float:
        return 0.0 if self.shared else self.suffix_s

    def eq10(self, draft_s: float) -> dict:
        return laws.mirror(self.prefix_s + self.suffix_s - self.delta_s, self.delta_s,
                           draft_s, t_rv_ee_s=self.rv_ee_s, t_rv_fv_s=self.rv_fv_s)

    def step_s(self, draft_s: float) -> float:
        stalls = self.stall_share + self.startup_share
        return self.eq10(draft_s)["step_latency_s"] + stalls * self.fresh_s


def mirror_terms(cfg) -> MirrorTerms:
    s = Scenario(cfg)
    p = mirror_policy.plan(s.policy_context(), params_of(cfg, "mirror"))
    b, g = s.batch, p.gamma

    def rollout(rows: int) -> float:
        return sum(s.draft_s(n, rows, s.context + j * p.eta, p.collectives)
                   for j, n in enumerate(p.chunks))

    rv_fv = max(s.trip_s("draft", "target", b * p.kappa * g * ENTRY_BYTES),
                s.trip_s("target", "draft", b * VERDICT_BYTES))
    stall = not mirror_policy.skips(p, b, s.acceptance.expected(g))
    return MirrorTerms(s.target_s((0, p.exit_layer), g + 1, "exit",
                                  head_tokens=mirror_policy.TOPK_POSITIONS),
                       s.target_s((p.exit_layer, p.n_layers), g + 1, "lm"),
                       rollout(b * p.kappa), s.trip_s("target", "draft",
                                                      b * p.kappa * ENTRY_BYTES),
                       rv_fv, rollout(b) + s.trip_s("draft", "target", b * g * ENTRY_BYTES),
                       (1 - p.omega ** b) if stall else 0.0, p, s.shared())


STREAMING = ("cats", "kangaroo", "ar_stream")


@dataclass(frozen=True)
class StreamTerms:
    """Bytes per committed token of one streaming run's settings over budgets."""

    policy: str
    params: object
    ctx: PolicyContext
    layer_gb: float
    mean: float  # tokens committed per cycle (1 for AR)
    law_gb: float  # the law's decoder-weight bytes read per token

    def streamed_gb(self, budget_gb: float) -> float | None:
        """Flash bytes per token: the layers the policy's memory plan streams."""
        try:
            p = cats_policy.plan_memory(self.ctx, self.params.model_copy(
                update={"dram_budget_gb": budget_gb}), self.policy).resident
        except PolicyError:  # the budget cannot hold the stream buffer
            return None
        return (self.ctx.target.n_layers - p) * self.layer_gb / self.mean


def stream_terms(cfg) -> StreamTerms:
    s = Scenario(cfg)
    prm = cfg.params
    n, layer_gb, ctx = s.target.n_layers, s.target.layer_bytes / 1e9, s.policy_context()
    if cfg.policy == "ar_stream":
        return StreamTerms(cfg.policy, prm, ctx, layer_gb, 1.0, n * layer_gb)
    mean = prm.mean_accepted or 1 + s.acceptance.expected(prm.gamma)
    if cfg.policy == "kangaroo":
        law = laws.kangaroo(layer_gb, n, prm.gamma, prm.l_dm, mean)
    else:  # the total does not depend on L_SV (any valid one gives it)
        law = laws.cats(layer_gb, n, prm.gamma, prm.l_dm, mean, prm.l_sv or prm.l_dm + 1)
    return StreamTerms(cfg.policy, prm, ctx, layer_gb, mean, law["bytes_per_token_gb"])


@dataclass(frozen=True)
class EarlyExitTerms:
    """PPSD's and EESD's step times (seconds) for one run, from the cost model:
    the heads and the links included, which eq. 6 and eq. 4 leave out."""

    t_ar_s: float  # one token of the schedule's AR baseline (ppsd: through its stages)
    t_match_s: float  # PPSD: between two outputs on a match (the bottleneck)
    t_flush_s: float  # PPSD: from a mismatch to its correction's output
    t_draft_s: float  # EESD: gamma exit-head drafts
    t_verify_s: float  # EESD: one verify pass of gamma + 1 positions
    match_rate: float  # every row's draft matches: alpha^batch

    def ppsd(self, match_rate: float | None = None) -> dict:
        """Eq. 6 with these times, at the run's match rate or the one given."""
        rate = self.match_rate if match_rate is None else match_rate
        return laws.ppsd_cost(rate, self.t_ar_s, self.t_match_s, self.t_flush_s)

    def eesd(self, alpha: float, gamma: int) -> dict:
        return laws.eesd_cost(alpha, gamma, self.t_ar_s, self.t_draft_s, self.t_verify_s)


def _ppsd_pipeline_s(s: Scenario, e: int, head: str) -> tuple[float, float, float]:
    """(T_match, T_flush, T_AR) of the pipeline (``policies.ppsd``): on a match the
    next output follows after the busiest resource's share of a token (stage 0:
    exit head + its layers, which the schedule runs one token at a time; a later
    stage; a link; or the whole journey over the tokens in flight); on a
    mismatch the correction travels to stage 0 and through every stage and hop,
    while the schedule refills the pipeline behind it. T_AR is ppsd's baseline,
    AR through the same stages (``policies.ar`` with ``pipeline_layers``): a token
    passes every stage and hop, and its id travels back to stage 0."""
    n, b, c = s.target.n_layers, s.batch, s.context
    bounds = [(a, min(a + e, n)) for a in range(0, n, e)]
    last = len(bounds) - 1
    roles = [f"stage{k}" for k in range(len(bounds))]

    def stage_s(k: int, head_name=None, layers=None) -> float:
        where = s.placement[roles[k]]
        return s.cost.forward(s.target, where, layers or bounds[k], 1, b, c, head_name,
                              None).total_s

    stages = [stage_s(k, "lm" if k == last else None) for k in range(len(bounds))]
    exit_s = stage_s(0, head, (e, e))
    act = s.target.hidden * s.target.dtype_bytes * b
    hops = [s.trip_s(roles[k - 1], roles[k], act) for k in range(1, len(bounds))]
    after = sum(hops) + sum(stages[1:])  # from the end of stage 0 to the verdict
    entry = exit_s + stages[0]  # the schedule drafts and enters one token at a time
    correction = s.trip_s(roles[last], roles[0], TOKEN_BYTES * b)
    match = max([entry, *stages[1:], *hops, (entry + after) / len(bounds)])
    # after a flush the schedule refills the pipeline one entry at a time until the
    # correction's verdict arrives (or the pipeline is full), then takes it
    entries = min(len(bounds) - 1, math.ceil(after / entry))
    t_ar = stages[0] + after + (correction if last else 0.0)
    return match, correction + stages[0] + max(after, entries * entry), t_ar


def early_exit_terms(cfg) -> EarlyExitTerms:
    """The cost model's times for a ppsd or eesd run's settings (exit layer, head,
    gamma), at the run's context."""
    s = Scenario(cfg)
    prm = cfg.params
    e, n, b, c = prm.exit_layer, s.target.n_layers, s.batch, s.context
    head = ppsd_policy.EXIT_HEADS[prm.exit_head]
    t_ar = s.target_s((0, n), 1, "lm")  # eesd's baseline: AR on the target role
    match = flush = draft = verify = float("nan")
    if cfg.policy == "ppsd":
        match, flush, t_ar = _ppsd_pipeline_s(s, e, head)
    else:
        where = s.placement["target"]
        draft = sum(s.cost.forward(s.target, where, (0, e), 1, b, c + i, head, None).total_s
                    for i in range(prm.gamma))
        verify = s.target_s((0, n), prm.gamma + 1, "lm")
    alpha = s.acceptance.expected(1)  # P(one draft matches)
    return EarlyExitTerms(t_ar, match, flush, draft, verify, alpha ** b)


@dataclass(frozen=True)
class SDTerms:
    """Leviathan's law with the cost model's step times (seconds): gamma draft steps
    with the proposal's and the verdict's trips (``t_draft_s``), one verify of
    gamma + 1 positions, one AR token."""

    t_ar_s: float
    t_draft_s: float
    t_verify_s: float
    gamma: int

    @property
    def c(self) -> float:
        """Leviathan's c: one draft step (its share of the trips included) over T_AR."""
        return self.t_draft_s / self.gamma / self.t_ar_s

    def law(self, alpha: float) -> dict:
        """Eq. with T_target(gamma+1) as the cost model has it (the paper takes it
        equal to T_AR; a compute-bound target pays for its gamma + 1 positions)."""
        return laws.eesd_cost(alpha, self.gamma, self.t_ar_s, self.t_draft_s,
                              self.t_verify_s)


def sd_terms(cfg) -> SDTerms:
    """The cost model's times of an sd run's step at the run's context."""
    s = Scenario(cfg)
    prm = params_of(cfg, "sd")
    model, layers, head = sd_policy.draft_source(s.policy_context(), prm.draft_layers, "sd")
    spec = s.draft if model == "draft" else s.target
    n, b, c, g = s.target.n_layers, s.batch, s.context, prm.gamma
    where = s.placement["draft"]
    drafts = sum(s.cost.forward(spec, where, layers, 1, b, c + i, head,
                                prm.draft_collectives).total_s for i in range(g))
    trips = (s.trip_s("draft", "target", b * g * TOKEN_BYTES)
             + s.trip_s("target", "draft", b * VERDICT_BYTES))
    return SDTerms(s.target_s((0, n), 1, "lm"), drafts + trips,
                   s.target_s((0, n), g + 1, "lm"), g)
