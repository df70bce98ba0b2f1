"""Mirror speculative decoding (Mirror-SD): the draft rolls out on a second
accelerator while the target finishes its layers.

One step, with the target on its tensor-parallel group and the draft on its own:

  target | layers [0, l_e) + exit head | top-k -> | layers [l_e, N) + LM head    | rendezvous
  draft  |                             |          | J = ceil(gamma/eta) steps     | rendezvous

The target verifies the current window (gamma+1 positions) and, at layer l_e,
an early-exit head emits its top-kappa candidates (token ids and log-probs,
B*kappa entries) over the token channel. From those kappa roots the draft builds
a branch-complete window, kappa roots x gamma depths, in J speculative-streaming
steps of eta tokens each, over B*kappa rows at once, while the target runs its
suffix. At the rendezvous the target verifies, the draft's window travels to the
target and the verdict to the draft. A row whose corrected prefix lies on a
precomputed path (event "reuse", modelled chance Omega_kappa per row, independently)
takes that branch as its next window; a row that missed has none. What the
schedule does about it is ``batch_fallback``:

  * "stall": the draft rolls out a fresh window on the critical path before the
    next step (the paper's fallback). Rows advance in lock-step: one Outcome
    asks whether every row reused (probability Omega^B) and a miss re-rolls
    all B rows.
  * "skip": nothing waits. A row without a window verifies with no proposal in
    the next step (``Verify.row_gamma`` 0: it commits the target's one token,
    an AR step for that row) while that step's early-exit top-kappa seeds its
    next window as usual. The Outcome answers per row. The target still scores
    gamma+1 positions for every row (rows are padded to one width; a step in
    which no row has a proposal scores one position, except with expected
    outcomes, whose rows all miss together). The start-up window, which every row
    lacks, is still rolled out (the B = 1 case below, for the whole batch).
  * "auto" (default): the algebra below, each step, with the mean accepted
    length observed so far and the one number a schedule cannot observe,
    ``rollout_ratio``; stall when that is not given.

With E the expected accepted tokens of a window, T the step (eq. 10), T_f the
fresh rollout with its trip and q = 1 - Omega^B the chance that some row
misses, a row gains per step E + 1 tokens in T + q*T_f when stalling and
1 + Omega*E tokens (a window with chance Omega) in T when skipping. Skipping
is faster iff

    T_f / T > (1 - Omega) E / (q (1 + Omega E))       (``skip_bound``)

At B = 1 (q = 1 - Omega) the bound is E / (1 + Omega E), about 0.8 at alpha
0.8, gamma 7, Omega 0.9: a single-row rollout would have to cost most of a
step (0.38 at most on the shipped platforms), so auto stalls at B = 1. As B
grows q tends to 1 and the bound falls to (1 - Omega) E / (1 + Omega E),
about 0.08 (0.14 at B = 8): skipping gives up a fixed share of the tokens,
(1 - Omega) E / (1 + E) (7.6% here), while a stall costs q T_f / T. Which is larger depends on the platform (T_f / T is 0.2 on
h100-sxm-5x but 0.02 on m2-ultra-8x at B = 32, whose ANE draft is cheap), and
the policy has no clock: hence ``rollout_ratio``.

``fallback_rate`` is the share of (step, row) pairs that missed, counted row by
row when skipping (stalling at B > 1 counts ``failing_rows`` per fallback: a
lock-step Outcome answers for the batch); ``fallback_step_rate`` the share of
steps in which some row missed. With reuse, eq. 10:

  T = T_t[1:l_e] + T_rv_ee + max(T_t[l_e+1:N], T_draft_gen) + T_rv_fv

where T_t[1:l_e] includes the exit head over one position per row (what the
top-kappa message needs), T_rv_ee is the top-k message's trip along the
platform's route and T_rv_fv the longer of the two rendezvous messages (they
cross in opposite directions).

The operations say what each runtime needs (``policies.ops``): the fresh
rollout samples on branch ``FRESH`` (0), one row per sequence; the window on
branch ``WINDOW`` (1) with ``tree=Roots(kappa, the branch under verification)``,
``batch * kappa`` rows, each step emitting ``n_tokens`` (eta, fewer in the last)
and taking the previous step's handle as ``inputs`` (the first: the top-k
message's payload, the early-exit Forward). The first step of each is a
``catch_up`` Forward: the runtime counts what its rows lack (``policies.cachebook``;
a window's rows, the correction, the proposal under verification and the root;
with kappa = 1 they are the draft's own rows, which fed that proposal but its
last token). The early exit is ``head=Head("exit", 1), emit=TopK(kappa)``: it
projects one position per row, its last (the simulator charges the head's FLOPs
over B rows, not B (gamma+1)); the suffix takes it as ``Feed.inputs`` and ends
in the ``lm`` head; both score the branch the
step verifies. The reuse Outcome ``observes=OnTree(into=WINDOW)``: a row that
takes its hit verifies its branch's continuation next, on ``WINDOW``; when
skipping, the next Verify's ``row_gamma`` is gamma for those rows and 0 for the
others.

Draft sharding is SPD-style by default: ``draft_collectives=2`` all-reduces per
draft step on a draft group (None: Megatron's two per layer). The target pays
Megatron's two per layer. The engine charges a Forward's all-reduces as one
aggregated span after its compute (exact without contention: the group's
members hold their stream through both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from policies.base import EventModel, LawCosts, OutcomeModels, PolicyContext, register
from policies.declared import LawView, NonNegative, Tuned, check
from policies.ops import (ENTRY_BYTES, LM, SAMPLE, VERDICT_BYTES, Branch, Feed, Forward, Head,
                          OnTree, Outcome, Parallel, Roots, TopK, Transfer, Verify, rows_of)
from policies.mirrorplan import MirrorParams, MirrorPlan, failing_rows, plan, skips
from policies.traces import covered_s, intervals, overlap_s

TOPK_POSITIONS = 1        # the exit head projects one position per row: the window's root
EXIT_HEAD = Head("exit", TOPK_POSITIONS)

PREFIX, TOPK, SUFFIX = "target prefix", "top-k to draft", "target suffix"
DRAFT, RV_WINDOW, RV_VERDICT = "draft window", "window to target", "verdict to draft"
FALLBACK, FALLBACK_SEND = "fallback draft", "fallback window to target"
PHASES = (("prefix", (PREFIX,)), ("rv_ee", (TOPK,)), ("suffix", (SUFFIX,)),
          ("draft_gen", (DRAFT,)), ("rv_fv", (RV_WINDOW, RV_VERDICT)),
          ("fallback", (FALLBACK, FALLBACK_SEND)))


class MirrorBranch(Branch):
    """Mirror-SD's speculation branches: the narrow rollout after a miss, and
    the branch-complete window grown from the target's early-exit candidates."""

    FRESH = 0
    WINDOW = 1


FRESH, WINDOW = MirrorBranch.FRESH, MirrorBranch.WINDOW


def _one(op):
    return (yield op)


def _rollout(ctx: PolicyContext, p: MirrorPlan, context: int, rows: int, branch: Branch,
             tree: Roots | None, inputs, label: str):
    """J speculative-streaming draft steps over ``rows`` rows (a window: ``tree``
    names its roots); returns the last handle. The first also feeds what its rows
    lack (``catch_up``)."""
    handle = inputs
    for j, n_tokens in enumerate(p.chunks):
        handle = yield Forward("draft", "draft", (0, p.draft_layers), n_tokens, rows,
                               context + j * p.eta, head=LM, emit=SAMPLE,
                               feed=Feed(handle, catch_up=j == 0), branch=branch, tree=tree,
                               collectives=p.collectives, label=label)
    return handle


def _fresh(ctx: PolicyContext, p: MirrorPlan, context: int):
    """A single-branch rollout on the critical path, then its trip to the target."""
    handle = yield from _rollout(ctx, p, context, ctx.batch, FRESH, None, None, FALLBACK)
    yield Transfer("draft", "target", ctx.batch * p.gamma * ENTRY_BYTES, payload=handle,
                   label=FALLBACK_SEND)


def _step(ctx: PolicyContext, p: MirrorPlan, context: int, branch: Branch,
          row_gamma: tuple[int, ...] | None):
    """One Mirror-SD step up to its Verify; returns (verdict, window handle)."""
    b, n = ctx.batch, p.n_layers
    width = p.gamma + 1  # rows padded to one width
    if row_gamma is not None and not ctx.expected_outcomes:
        width = max(row_gamma) + 1
    prefix = yield Forward("target", "target", (0, p.exit_layer), width, b, context,
                           head=EXIT_HEAD, emit=TopK(p.kappa), branch=branch, label=PREFIX)
    roots = yield Transfer("target", "draft", b * p.kappa * ENTRY_BYTES, payload=prefix,
                           label=TOPK)
    suffix_op = Forward("target", "target", (p.exit_layer, n), width, b, context,
                        head=LM, feed=Feed(prefix), branch=branch, label=SUFFIX)
    suffix, window = yield Parallel((
        _one(suffix_op),
        _rollout(ctx, p, context, b * p.kappa, WINDOW, Roots(p.kappa, branch), roots,
                 DRAFT)))
    verdict = yield Verify(p.gamma, b, target=suffix, branch=branch, row_gamma=row_gamma,
                           label="verify")
    return verdict, window


def _rendezvous(ctx: PolicyContext, p: MirrorPlan, window, verdict):
    b = ctx.batch
    yield Parallel((_one(Transfer("draft", "target", b * p.kappa * p.gamma * ENTRY_BYTES,
                                  payload=window, label=RV_WINDOW)),
                    _one(Transfer("target", "draft", b * VERDICT_BYTES, payload=verdict,
                                  label=RV_VERDICT))))


class _Tally:
    """What the schedule counts: steps, tokens, misses, accepted window tokens."""

    def __init__(self):
        self.steps = self.fallbacks = self.skipped = 0
        self.tokens = self.rows_failed = self.accepted = self.windows = 0.0

    def verdict(self, verdict, gamma: int, row_gamma) -> float:
        """Counts a verdict; returns the mean accepted length of a window so far."""
        self.steps += 1
        self.tokens += verdict.tokens
        rows = range(len(verdict.accepted)) if row_gamma is None else \
            [r for r, g in enumerate(row_gamma) if g == gamma]
        self.accepted += sum(verdict.accepted[r] for r in rows)
        self.windows += len(rows)
        return self.accepted / self.windows if self.windows else 0.0


def _schedule(ctx: PolicyContext, p: MirrorPlan):
    b, t = ctx.batch, _Tally()
    yield from _fresh(ctx, p, ctx.context(0))  # the first window, every row
    branch, row_gamma = FRESH, None  # None: every row verifies its window
    while t.tokens < ctx.budget:
        verdict, window = yield from _step(ctx, p, ctx.context(t.tokens / b), branch,
                                           row_gamma)
        skip = skips(p, b, t.verdict(verdict, p.gamma, row_gamma))
        reuse = yield Outcome("reuse", batch=b, per_row=skip, label="reuse",
                              observes=OnTree(into=WINDOW))
        yield from _rendezvous(ctx, p, window, verdict)
        held = rows_of(reuse, b)
        if skip:
            missed = b - sum(held)
            t.skipped, t.fallbacks = t.skipped + 1, t.fallbacks + (missed > 0)
            t.rows_failed += missed
            branch = WINDOW
            row_gamma = None if not missed else tuple(p.gamma if h else 0 for h in held)
            continue
        reuse = all(held)
        branch, row_gamma = (WINDOW if reuse else FRESH), None
        if not reuse:
            t.fallbacks += 1
            t.rows_failed += failing_rows(p.omega, b)
            if t.tokens < ctx.budget:
                yield from _fresh(ctx, p, ctx.context(t.tokens / b))
    return _stats(ctx, p, t)


def _stats(ctx: PolicyContext, p: MirrorPlan, t: _Tally) -> dict:
    steps = t.steps or 1
    return {"steps": t.steps, "tokens": t.tokens, "fallback_steps": t.fallbacks,
            "fallback_step_rate": t.fallbacks / steps,
            "fallback_rate": t.rows_failed / (steps * ctx.batch),
            "skip_step_share": t.skipped / steps,
            "kappa": p.kappa, "eta": p.eta, "exit_layer": p.exit_layer,
            "draft_steps_per_window": p.draft_steps, "omega": p.omega}


# timeline metrics ----------------------------------------------------------------
def mirror_timeline(spans) -> dict:
    """Share of window drafting hidden under the target suffix, and the mean time
    per step of each phase, ``step_<phase>_s`` (fallback: the critical-path
    rollouts and their trips)."""
    steps = sum(1 for s in spans if s.name == PREFIX)
    if not steps:
        return {}
    draft = intervals(spans, (DRAFT,))
    draft_s = covered_s(draft)
    hidden_s = overlap_s(draft, intervals(spans, (SUFFIX,)))
    out = {"hidden_draft_fraction": hidden_s / draft_s if draft_s else 0.0}
    for name, labels in PHASES:
        out[f"step_{name}_s"] = covered_s(intervals(spans, labels)) / steps
    return out


def mirror_outcomes(ctx: PolicyContext, params: MirrorParams) -> OutcomeModels:
    """Simulation: a row's corrected prefix lies on the window with chance Omega."""
    return {"reuse": EventModel(plan(ctx, params).omega)}


# closed forms (``hetspec law``) ------------------------------------------------
def mirror_law(t_prefix_s: NonNegative, t_suffix_s: NonNegative, t_draft_s: NonNegative,
           t_rv_s: NonNegative | None = None, t_rv_ee_s: NonNegative = 0.0,
           t_rv_fv_s: NonNegative = 0.0) -> dict:
    """Mirror-SD eq. 10: T = T_t[1:le] + T_rv_ee + max(T_t[le+1:N], T_draft_gen) + T_rv_fv,
    and appendix C's piecewise speedup over vanilla SD, T_SD = T_target + T_draft_gen."""
    for name, v in (("t_prefix_s", t_prefix_s), ("t_suffix_s", t_suffix_s),
                    ("t_draft_s", t_draft_s), ("t_rv_ee_s", t_rv_ee_s), ("t_rv_fv_s", t_rv_fv_s)):
        check(v >= 0, f"{name} must be >= 0 seconds")
    t_rv = t_rv_ee_s + t_rv_fv_s if t_rv_s is None else t_rv_s
    check(t_rv >= 0, "t_rv_s must be >= 0 seconds")
    check(t_prefix_s + t_suffix_s + t_draft_s + t_rv > 0,
           "mirror needs a step that takes time: give t_prefix_s, t_suffix_s, t_draft_s "
           "or t_rv_s a value > 0 seconds")
    delta = t_suffix_s
    t_target = t_prefix_s + t_suffix_s
    t_mirror = t_prefix_s + max(delta, t_draft_s) + t_rv
    if t_draft_s <= delta:
        speedup = (t_target + t_draft_s) / (t_target + t_rv)
    else:
        speedup = (t_prefix_s + delta + t_draft_s) / (t_prefix_s + t_draft_s + t_rv)
    return {"step_latency_s": t_mirror, "sd_step_latency_s": t_target + t_draft_s,
            "speedup_vs_sd": speedup, "overlap_budget_s": delta,
            "draft_hidden": t_draft_s <= delta, "mirror_wins": t_rv < min(delta, t_draft_s)}


# law terms ---------------------------------------------------------------------
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
    plan: MirrorPlan
    shared: bool  # one device runs suffix and draft in turn: no overlap budget
    closed_form: Callable[..., dict]  # eq. 10 (mirror_law above)
    startup_share: float = 0.0  # the start-up rollout spread over a run's steps

    @property
    def delta_s(self) -> float:
        return 0.0 if self.shared else self.suffix_s

    def eq10(self, draft_s: float) -> dict:
        return self.closed_form(self.prefix_s + self.suffix_s - self.delta_s, self.delta_s,
                                draft_s, t_rv_ee_s=self.rv_ee_s, t_rv_fv_s=self.rv_fv_s)

    def step_s(self, draft_s: float) -> float:
        stalls = self.stall_share + self.startup_share
        return self.eq10(draft_s)["step_latency_s"] + stalls * self.fresh_s

    def metrics(self) -> dict:
        """What a deterministic run at these terms measures (``mirror_timeline``):
        each phase's time per step, and the mean step."""
        return {"step_prefix_s": self.prefix_s, "step_rv_ee_s": self.rv_ee_s,
                "step_suffix_s": self.suffix_s, "step_draft_gen_s": self.draft_s,
                "step_rv_fv_s": self.rv_fv_s, "step_latency_s": self.step_s(self.draft_s)}


def mirror_law_terms(costs: LawCosts, ctx: PolicyContext,
                     params: MirrorParams) -> MirrorTerms:
    """Eq. 10's terms of a run, priced by ``costs`` (``policies.base.LawCosts``) as the
    schedule spends them: the prefix with its exit head over one position per
    row, the suffix, the window's rollout over B kappa rows, the top-k message
    and the longer rendezvous message; the fresh rollout with its trip."""
    p = plan(ctx, params)
    b, g = costs.batch, p.gamma

    def rollout(rows: int) -> float:
        return sum(costs.draft_s(n, rows, costs.context + j * p.eta, p.collectives)
                   for j, n in enumerate(p.chunks))

    rv_fv = max(costs.trip_s("draft", "target", b * p.kappa * g * ENTRY_BYTES),
                costs.trip_s("target", "draft", b * VERDICT_BYTES))
    stall = not skips(p, b, costs.mean_accepted(g))
    return MirrorTerms(costs.target_s((0, p.exit_layer), g + 1, "exit",
                                      head_tokens=TOPK_POSITIONS),
                       costs.target_s((p.exit_layer, p.n_layers), g + 1, "lm"),
                       rollout(b * p.kappa), costs.trip_s("target", "draft",
                                                          b * p.kappa * ENTRY_BYTES),
                       rv_fv, rollout(b) + costs.trip_s("draft", "target",
                                                        b * g * ENTRY_BYTES),
                       (1 - p.omega ** b) if stall else 0.0, p, costs.shared(),
                       mirror_law)


@register("mirror", MirrorParams, needs_draft=True, timeline=mirror_timeline,
          outcome_models=mirror_outcomes, law_terms=mirror_law_terms, tuned=Tuned("gamma"),
          laws={"mirror": mirror_law},
          law_views=(LawView("Mirror-SD: the knee at Δ", "knee"),))
def mirror(ctx: PolicyContext, params: MirrorParams):
    """Mirror-SD: a branch-complete draft window on a second accelerator, hidden
    under the target's suffix layers."""
    return _schedule(ctx, plan(ctx, params))
