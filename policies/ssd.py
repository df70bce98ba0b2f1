"""Speculative speculative decoding (SSD, optimised as SAGUARO).

While the target verifies round T's speculation, the draft, on its own device,
pre-speculates round T+1 for the outcomes it guesses: for each number k of
accepted tokens (0..K) it caches F_k guesses of the bonus token t* and extends
each by K tokens, one batched decode over B * sum(F_k) rows per step. After the
verify the verdict travels to the draft, and each row's outcome is a hit or a
miss of its own (event "cache_hit", asked per row):

  * every row hit: the cached speculation travels back and the next round
    starts at once;
  * every row missed: the draft stops pre-speculating after its current step
    and a backup builds the speculation on the critical path, ``backup=jit``
    (the neural draft, K steps over B rows) or ``backup=fast`` (a near-free
    proposer, ``fast_backup_s`` on the draft device, per-token acceptance
    ``fast_alpha``);
  * some rows hit: they keep their cached speculation (the pre-speculation runs
    to its end, they need all of it) and the backup runs for the missed rows
    alone (``Feed.sequences``, ``Delay.sequences``), beside them on CACHE;
    with ``partial_hits=backup`` the round is a miss for every row instead (the
    SSD repository's jit path, ``ssd/engine/draft_runner.py``
    ``hit_cache_and_respond``, re-speculates the whole batch on any miss; its
    fast path keeps the rows that hit), and the law's numerator is then
    p^B E_hit + (1-p^B) E_miss.

With times in units of the verify time T_v (the verify Forward plus the two
rendezvous messages), T_p the pre-speculation plus the speculation's trip back
and T_b the backup's compute, p the per-row hit rate, a round takes max(1, T_p)
when all B rows hit (chance p^B) and 1 + T_b otherwise, while each row commits
E_hit tokens after a hit and E_miss after a miss, which gives the closed form
S = [p E_hit + (1-p) E_miss] / [p^B max(1, T_p) + (1-p^B)(1 + T_b)].
The closed form takes a miss to cut the pre-speculation short at once; here it
ends after the draft step in flight when every row missed, and runs to its end
when some row hit, so with T_p > 1 a round with a miss costs up to one draft step
more, or T_p - 1 more (``ssd_law_terms`` counts both).

Hit model (per row, before SAGUARO sampling): ``hit_rate``, the rate of
"cache_hit" events in ``hit_trace``, or the power law miss(F) = F^-r averaged
over the planning distribution of k (geometric in ``a_p``, truncated at K).
Geometric fan-out: F_k = F_0 a_p^(k/(1+r)) (k < K), F_K = F_0 a_p^(K/(1+r))
(1-a_p)^(-1/(1+r)), F_0 set so the F_k sum to ``budget``, rounded to integers
by largest remainders.

SAGUARO sampling (``c_saguaro`` = C < 1) multiplies the draft's probabilities of
its top-F tokens (mass ``top_mass``) by C. Modelled with the target agreeing with
the draft on those tokens: per-token acceptance falls by (1-C) * top_mass (the
verify's outcome model scales it by 1 - (1-C) top_mass / a_p), and that mass
moves into the residual distribution, onto cached tokens, so the hit rate rises to
(h rho + (1-C) top_mass) / (rho + (1-C) top_mass) with rho = 1 - a_p. The model
applies this to every round's bonus token, whichever proposer made the round's
speculation.

Outcome models (``ssd_outcomes``, simulation only): the verify of a neural
speculation (label "verify") scales the run's acceptance by SAGUARO's factor;
the verify of a fast backup's speculation (label "verify fast backup") has the
mean of ``fast_alpha`` (a round mixing cached and fast-backup rows gives each row
its proposer's label, ``Verify.row_labels``); event "cache_hit" holds per row
with the hit rate, rows independent (``EventModel.independent_rows``).

The operations say what each runtime needs (``policies.ops``): the backup
samples on branch ``BACKUP`` (0), one row per sequence; each pre-speculation
step is one Forward on branch ``CACHE`` (1) with ``tree=Fanout(F_0..F_K, the
branch under verification)``, over ``batch * sum(F_k)`` rows, and every draft
Forward keeps ``alternatives`` candidates beside its tokens (the guesses); the
cache-hit Outcome ``observes=OnTree(into=CACHE)``, and the round after a hit
verifies on ``CACHE``. The first step of the backup and of the pre-speculation
is a ``catch_up`` Forward: the runtime counts what their rows lack
(``policies.cachebook``); the fast backup's Delay ``proposes`` its K tokens on
``BACKUP``. A miss tells the spawned pre-speculation to stop through
a flag both generators share, so a runtime must drive them in one process (as
the simulator and the executor's task loop do).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from policies.base import (EventModel, LawCosts, OutcomeModels, PolicyContext, VerifyModel,
                           register)
from policies.declared import Count, Default, LawView, NonNegative, Probability, Tuned, check
from policies.ops import (ENTRY_BYTES, LM, VERDICT_BYTES, Branch, Delay, Fanout, Feed, Forward,
                          Join, OnTree, Outcome, Sample, Spawn, Transfer, Verify, rows_of)
from policies.ssdplan import SSDParams, SSDPlan, plan
from policies.traces import covered_s, intervals


class SSDBranch(Branch):
    """SSD's speculation branches: the backup's rollout, the tree a hit continues."""
    BACKUP = 0
    CACHE = 1


BACKUP, CACHE = SSDBranch.BACKUP, SSDBranch.CACHE
VERIFY, PRESPEC, BACKUP_LABEL = "verify", "pre-speculation", "backup"
FAST_VERIFY = "verify fast backup"  # the verify of a fast backup's speculation
TO_DRAFT, TO_TARGET = "verdict to draft", "speculation to target"


def _draft_steps(p: SSDPlan, context: int, rows: int, branch: Branch, tree: Fanout | None,
                 label: str, flag: dict | None = None, seqs: tuple[int, ...] | None = None):
    """K draft steps over ``rows`` rows (the pre-speculation: ``tree`` lays them
    out; ``seqs``: the sequences a narrow rollout runs for, None: all); stops
    early once ``flag['abort']`` is set. The first also feeds what its rows lack
    (``catch_up``)."""
    handle, emit = None, Sample(p.alternatives)
    for j in range(p.k):
        if flag is not None and flag["abort"]:
            break
        feed = Feed(handle, catch_up=j == 0, sequences=seqs)
        handle = yield Forward("draft", "draft", (0, p.draft_layers), 1, rows, context + j,
                               head=LM, emit=emit, feed=feed, branch=branch, tree=tree,
                               collectives=p.collectives, label=label)
    return handle


class Shapes:
    """Per row, the length of the proposal under verification, from which the
    verify's positions follow: K tokens, but K - 1 when a row that hit is one
    whose guess the tree sampled in its first pass: the row of k = K, or any k
    once the previous proposal was that short (a row accepted all of it).
    Expected outcomes: the laws' K + 1 positions."""

    def __init__(self, ctx: PolicyContext, p: SSDPlan):
        self.expected, self.p = ctx.expected_outcomes, p
        self.length = [p.k] * ctx.batch

    def verify_positions(self) -> int:
        """The bonus token and the longest row's proposal (rows padded)."""
        return self.p.k + 1 if self.expected else max(self.length) + 1

    def next_round(self, verdict, hits: tuple[bool, ...]) -> None:
        if not self.expected:
            self.length = [self.p.k - 1 if hit and a >= n else self.p.k
                           for a, n, hit in zip(verdict.accepted, self.length, hits)]


def ssd_outcomes(ctx: PolicyContext, params: SSDParams) -> OutcomeModels:
    """What the simulator models of SSD's verdicts and cache hits (module doc):
    rows hit independently, each with the per-row hit rate."""
    p = plan(ctx, params)
    return {VERIFY: VerifyModel(scale=p.scale),
            FAST_VERIFY: VerifyModel(expected=p.fast_expected),
            "cache_hit": EventModel(p.hit_row, independent_rows=True)}


@dataclass(frozen=True)
class Speculation:
    """The next round's proposal: its branch, the label of its Verify, and per
    row the label of its proposer where rows' proposers differ (None: alike)."""

    branch: Branch
    verify: str
    row_labels: tuple[str, ...] | None = None


def _backup(ctx: PolicyContext, p: SSDPlan, context: int, jit: bool,
            rows: tuple[int, ...] | None = None, branch: Branch = BACKUP):
    """The backup's speculation on ``branch`` for the sequences ``rows`` (None:
    every one); returns (handle, the label of its Verify). A jit backup's first
    step catches up on what the draft's own cache lacks."""
    if jit:
        count = ctx.batch if rows is None else len(rows)
        handle = yield from _draft_steps(p, context, count, branch, None, BACKUP_LABEL,
                                         seqs=rows)
        return handle, VERIFY
    yield Delay(p.fast_backup_s, device="draft", label=BACKUP_LABEL, branch=branch,
                proposes=p.k, sequences=rows)
    return None, FAST_VERIFY


def _next_speculation(ctx: PolicyContext, p: SSDPlan, context: int, hits: tuple[bool, ...],
                      cached):
    """Rows that hit keep their cached speculation (branch CACHE, the tree whose
    last Forward is ``cached``); the backup speculates for the rows that missed
    alone: every row on BACKUP when none hit, else the missed rows beside the
    cached ones on CACHE. Returns the ``Speculation`` and the handle that travels
    to the target (the backup's last Forward when one ran; None: a fast backup)."""
    missed = tuple(r for r, hit in enumerate(hits) if not hit)
    if not missed:
        return Speculation(CACHE, VERIFY), cached
    jit = p.backup == "jit"
    if len(missed) == len(hits):
        handle, verify = yield from _backup(ctx, p, context, jit)
        return Speculation(BACKUP, verify), handle
    handle, verify = yield from _backup(ctx, p, context, jit, missed, CACHE)
    labels = None if verify == VERIFY else tuple(VERIFY if hit else verify for hit in hits)
    return Speculation(CACHE, VERIFY, labels), handle


def _round(ctx: PolicyContext, p: SSDPlan, context: int, spec: Speculation, shapes: Shapes):
    """Verify this round's speculation while the draft pre-speculates the next.
    A miss on every row stops the pre-speculation after its step in flight; a
    row that hit needs all of it, so then it runs to its end."""
    b = ctx.batch
    flag = {"abort": False}
    task = yield Spawn(_draft_steps(p, context + p.k, b * p.branches, CACHE,
                                    Fanout(p.fanout, spec.branch), PRESPEC, flag))
    logits = yield Forward("target", "target", (0, p.n_layers), shapes.verify_positions(),
                           b, context, head=LM, branch=spec.branch, label=VERIFY)
    verdict = yield Verify(p.k, b, target=logits, branch=spec.branch, label=spec.verify,
                           row_labels=spec.row_labels)
    keep = p.partial_hits == "keep"  # else one answer: whether every row hit
    hits = rows_of((yield Outcome("cache_hit", batch=b, per_row=keep, label="cache hit",
                                   observes=OnTree(into=CACHE))), b)
    yield Transfer("target", "draft", b * VERDICT_BYTES, payload=verdict, label=TO_DRAFT)
    flag["abort"] = not any(hits)
    (handle,) = yield Join((task,))
    spec, handle = yield from _next_speculation(ctx, p, context, hits, handle)
    yield Transfer("draft", "target", b * p.k * ENTRY_BYTES, payload=handle,
                   label=TO_TARGET)
    return verdict, hits, spec


def _schedule(ctx: PolicyContext, p: SSDPlan):
    done, rounds, hits, shapes = 0.0, 0, 0, Shapes(ctx, p)
    handle, verify = yield from _backup(ctx, p, ctx.context(0), True)  # the first one
    yield Transfer("draft", "target", ctx.batch * p.k * ENTRY_BYTES, payload=handle,
                   label=TO_TARGET)
    spec = Speculation(BACKUP, verify)
    while done < ctx.budget:
        verdict, held, spec = yield from _round(
            ctx, p, ctx.context(done / ctx.batch), spec, shapes)
        shapes.next_round(verdict, held)
        done += verdict.tokens
        rounds += 1
        hits += int(all(held))
    return {"steps": rounds, "tokens": done, "cache_hits": hits, "fanout": list(p.fanout),
            "speculations_per_row": p.branches, "hit_rate_per_row": p.hit_row,
            "all_hit_probability": p.hit_row ** ctx.batch, "acceptance_scale": p.scale,
            "backup": p.backup}


def ssd_timeline(spans) -> dict:
    """Mean time per round on the target's critical path, split into verify,
    waiting for the draft (rendezvous messages, unfinished pre-speculation) and
    fallback (the backup's compute after a miss)."""
    starts = sorted(s.start_s for s in spans if s.name == VERIFY)
    if not starts:
        return {}
    rounds = len(starts)
    total = max(s.end_s for s in spans) - starts[0]
    verify = covered_s(intervals(spans, (VERIFY,))) / rounds
    fallback = covered_s([iv for iv in intervals(spans, (BACKUP_LABEL,))
                          if iv[0] >= starts[0]]) / rounds
    return {"round_time_s": total / rounds, "verify_time_s": verify,
            "wait_for_draft_time_s": total / rounds - verify - fallback,
            "fallback_time_s": fallback}


# closed forms (``hetspec law``) ------------------------------------------------
def ssd_law(hit_rate: Probability, e_hit: NonNegative, e_miss: NonNegative, t_p: NonNegative,
        t_b: NonNegative, batch: Count = 1) -> dict:
    """SSD expected speedup over AR, times normalised by the verify time, per row
    hit rate p over a batch of B rows: a row that hits keeps its cached
    speculation (E_hit tokens), a row that misses takes the backup's (E_miss),
    and a round waits for a backup unless every row hit (chance p^B):
    S = [p E_hit + (1-p) E_miss] / [p^B max(1, T_p) + (1-p^B)(1 + T_b)].
    hit_rate: p, the chance one row's outcome was cached; e_hit, e_miss: tokens a
    row commits per round (accepted + 1) from a cached or a backup speculation;
    t_p: pre-speculation plus its trip back, t_b: the backup's latency, both in
    verify times; batch: B rows per round."""
    check(0 <= hit_rate <= 1, "hit_rate must lie in [0, 1]")
    check(batch >= 1, "batch must be >= 1")
    check(e_hit >= 0 and e_miss >= 0, "e_hit and e_miss must be >= 0 tokens")
    check(t_p >= 0 and t_b >= 0, "t_p and t_b must be >= 0 (in verify times)")
    p_all = hit_rate ** batch
    tokens = hit_rate * e_hit + (1 - hit_rate) * e_miss
    time = p_all * max(1.0, t_p) + (1 - p_all) * (1 + t_b)
    return {"speedup": tokens / time, "all_hit_rate": p_all, "tokens_per_round": tokens,
            "round_time_over_verify": time}


# law terms ---------------------------------------------------------------------
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
    hit_rate: float  # the run's per-row hit rate
    closed_form: Callable[..., dict]  # the SSD law (ssd_law above)

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

    def law(self, hit_rate: float, backup: str | None = None, at_once: bool = False):
        """The closed form's results at a per-row hit rate with this run's terms."""
        b = backup or self.backup
        if self.partial_hits == "backup":  # a round is a hit or a miss for the whole batch
            t_b = (self.t_b_at_once if at_once else self.t_b)[b][-1]
            return self.closed_form(hit_rate ** self.batch, self.e_hit, self.e_miss[b],
                                    self.t_p, t_b)
        t_b = self.mean_t_b(hit_rate, b, at_once)
        return self.closed_form(hit_rate, self.e_hit, self.e_miss[b], self.t_p, t_b,
                                self.batch)

    def speedup(self, hit_rate: float, backup: str | None = None, at_once: bool = False):
        """The closed form's speedup at a per-row hit rate with this run's terms."""
        return self.law(hit_rate, backup, at_once)["speedup"]

    def metrics(self) -> dict:
        """What a deterministic run at these terms measures (``ssd_timeline``): the
        mean round, from its verify's start to the next one's."""
        return {"round_time_s": float(self.law(self.hit_rate)["round_time_over_verify"]
                                      * self.t_v_s)}


def _rounds_s(costs: LawCosts, p: SSDPlan, c: int) -> np.ndarray:
    """Seconds at context c: T_v, a hit round, then for m = 1..B missed rows the
    miss rounds (jit, fast) as scheduled and as if the miss stopped
    pre-speculation at once. Rows that hit need all the pre-speculation, so with
    some hits it runs to its end; a miss on every row stops it after the step in
    flight."""
    b = costs.batch
    to_draft = costs.trip_s("target", "draft", b * VERDICT_BYTES)
    to_target = costs.trip_s("draft", "target", b * p.k * ENTRY_BYTES)
    arrival = costs.target_s((0, p.n_layers), p.k + 1, "lm", c) + to_draft
    ends = np.cumsum([costs.draft_s(1, b * p.branches, c + p.k + j, p.collectives)
                      for j in range(p.k)])
    stop = next((float(e) for e in ends if e >= arrival), arrival)  # step in flight ends
    hit = max(arrival, ends[-1])
    rows = []
    for m in range(1, b + 1):
        jit = sum(costs.draft_s(1, m, c + j, p.collectives) for j in range(p.k))
        after = stop if m == b else hit
        rows.append([after + jit, after + p.fast_backup_s, arrival + jit,
                     arrival + p.fast_backup_s])
    return np.concatenate([[arrival, hit], np.ravel(rows)]) + to_target


def ssd_law_terms(costs: LawCosts, ctx: PolicyContext, params: SSDParams) -> SSDTerms:
    """E_hit, E_miss, T_p, T_b of a run, priced by ``costs``
    (``policies.base.LawCosts``) as the schedule spends them: T_v is the verify plus
    both rendezvous messages; the verdicts' means as the simulator draws them
    (``ssd_outcomes``)."""
    p = plan(ctx, params)
    mean = np.mean([_rounds_s(costs, p, c) for c in costs.contexts(SSD_CONTEXTS)], axis=0)
    t_v, hit = mean[0], mean[1]
    jit, fast, jit_now, fast_now = (tuple(v / t_v - 1) for v in mean[2:].reshape(-1, 4).T)
    e_hit = 1 + costs.mean_accepted(p.k, p.scale)
    e_fast = 1 + p.fast_expected
    return SSDTerms(t_v, hit / t_v, {"jit": jit, "fast": fast},
                    {"jit": jit_now, "fast": fast_now},
                    {"jit": e_hit, "fast": e_fast}, e_hit, p.backup, p.partial_hits,
                    p.k, p.fanout, costs.batch, costs.shared(), p.hit_row,
                    ssd_law)


# a comparison's assumed per-row hit rate of the speculation cache
HIT_RATE = Default("hit_rate", 0.7, unless=("r", "hit_trace"), meaning=(
    "hit_rate is the SSD cache's chance that a round's verify outcome was pre-speculated: "
    "an assumption unless --set hit_rate, r or hit_trace gives it."))


@register("ssd", SSDParams, needs_draft=True, timeline=ssd_timeline,
          outcome_models=ssd_outcomes, law_terms=ssd_law_terms, tuned=Tuned("k"),
          laws={"ssd": ssd_law}, law_views=(LawView("SSD: speedup vs hit rate", "hit_rate",
                                                     along=("hit_rate", "hit_trace")),),
          defaults=(HIT_RATE,))
def ssd(ctx: PolicyContext, params: SSDParams):
    """SSD/SAGUARO: the draft pre-speculates next-round outcomes during the verify."""
    return _schedule(ctx, plan(ctx, params))
