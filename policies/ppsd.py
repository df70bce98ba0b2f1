"""Early-exit self-speculation: pipelined (PPSD) and sequential (EESD).

The draft is the target's own first ``exit_layer`` layers plus an exit head:
a norm and vocabulary projection ("norm") or one decoder layer before them
("transformer").

PPSD cuts the N layers into ceil(N/E) stages of E layers, stage k on placement
role ``stage{k}``. Each token that enters stage 0 is at once the draft pass for
the next token (stage 0 plus the exit head) and the first stage of its own
verification. The drafted token enters stage 0 straight away, so while the
last stage verifies token i the first drafts token i+1. When a token leaves
the last stage the target's next token is compared with the draft already in
flight (``Verify(1, bonus=False)``): on a match decoding runs on, on a mismatch
the tokens behind it are flushed and the target's correction enters stage 0.
A token enters the last stage only once the token ahead of it is verified (the
stage is busy with that token until then anyway), so a flushed token never
takes a last-stage pass, whichever of the two reaches that stage first.
Every token leaving the pipeline commits one token, so the time per token is
one stage on a match and the whole pipeline on a mismatch: eq. 6.

Draft matches are decided by the acceptance model: a 0/1 verdict per row (in
deterministic simulation too, whose exact frequencies come from the simulator's
error diffusion), the draft's position counted by the simulator from the matches
since the last mismatch (``simcore.outcomes``).

EESD drafts gamma tokens with the first E layers, then verifies the gamma + 1
positions with one pass: eq. 4, T = gamma E + N layer times. The verify pass is
written as one Forward over all N layers (as ``sd`` verifies a self-draft), which
any runtime can execute from the token sequence; its first E layers read their
weights once whether they process only the last draft token (reusing the KV
cache the drafts wrote) or all gamma + 1 positions, so in the memory-bound
regime the cost is the same N layer reads; only the few extra FLOPs differ.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from policies.base import LawCosts, PolicyContext, PolicyError, PolicyParams, register
from policies.declared import Count, LawView, Positive, Probability, Tuned, check
from policies.ops import LM, SAMPLE, TOKEN_BYTES, Feed, Forward, Head, Join, Spawn, Transfer, Verify
from policies.sd import SDTerms, eesd_cost, expected_tokens

EXIT_HEADS = {"norm": "exit", "transformer": "exit_layer"}


class PPSDParams(PolicyParams):
    exit_layer: int = Field(8, ge=1, description="layers per stage (E); stage 0 + exit head "
                                                  "is the draft")
    exit_head: Literal["norm", "transformer"] = Field(
        "norm", description="exit head: norm + vocabulary projection, or one decoder "
                            "layer before them")

    @property
    def stage_layers(self) -> int | None:
        """Layers per pipeline stage: the target's weights live on the stage roles."""
        return self.exit_layer


class EESDParams(PPSDParams):
    gamma: int = Field(5, ge=1, le=64, description="draft tokens per verification")

    @property
    def stage_layers(self) -> None:  # sequential: the target runs on its own role
        return None


def _check_exit(ctx: PolicyContext, exit_layer: int, policy: str) -> int:
    n = ctx.target.n_layers
    if exit_layer >= n:
        raise PolicyError(f"{policy} parameter 'exit_layer' ({exit_layer}) must be below "
                          f"the target's {n} layers; choose e.g. exit_layer={max(1, n // 4)}")
    return n


class _Pipeline:
    """Mutable state shared by the main schedule and the tokens in flight."""

    def __init__(self, ctx: PolicyContext, exit_layer: int):
        n = ctx.target.n_layers
        self.ctx = ctx
        self.bounds = [(a, min(a + exit_layer, n)) for a in range(0, n, exit_layer)]
        self.roles = [f"stage{k}" for k in range(len(self.bounds))]
        self.act_bytes = ctx.target.hidden * ctx.target.dtype_bytes * ctx.batch
        self.epoch = 0  # bumped by every flush; tokens of an older epoch stop

    @property
    def stages(self) -> int:
        return len(self.bounds)

    def journey(self, hidden, context: int, epoch: int, ahead):
        """One token's way through stages 1..S-1 and its verification: the
        verdict and whether it matched, or None when flushed on the way. The
        last stage takes the token only once the token ``ahead`` (its task, or
        None) is verified, so a mismatch there flushes it before that pass."""
        b, roles, bounds, nbytes = self.ctx.batch, self.roles, self.bounds, self.act_bytes
        last = len(roles) - 1
        for k in range(1, last + 1):
            if self.epoch != epoch:
                return None
            yield Transfer(roles[k - 1], roles[k], nbytes, hidden, "activations")
            if k == last and ahead is not None:
                yield Join((ahead,))
            if self.epoch != epoch:
                return None
            hidden = yield Forward("target", roles[k], bounds[k], 1, b, context,
                                   LM if k == last else None, feed=Feed(hidden),
                                   label=roles[k])
        return (yield from self.verify(hidden))

    def verify(self, logits):
        """Compare the target's token with the draft in flight; a mismatch
        flushes every token behind this one."""
        verdict = yield Verify(1, self.ctx.batch, target=logits, bonus=False,
                               label="verify")
        hit = all(a >= 1 for a in verdict.accepted)  # every row's draft was the token
        if not hit:
            self.epoch += 1
        return verdict, hit


def _pipelined_baseline(p: PPSDParams) -> tuple[str, dict]:
    """AR through the same stages: one token costs all N layer times (eq. 6's
    denominator), not a tensor-parallel AR on whatever role ``target`` names."""
    return "ar", {"pipeline_layers": p.exit_layer}


# closed forms (``hetspec law``) ------------------------------------------------
def ppsd_law(n_layers: Count, exit_layer: Count, alpha: Probability,
         gamma: Count | None = None) -> dict:
    """PPSD eq. 6 rho* = N / (aE + (1-a) ceil(N/E) E); with gamma also EESD eq. 4
    rho = (1-a^(g+1)) N / ((1-a)(gE + N)), the eq. 5 bound on a_all and eq. 7 lambda."""
    check(1 <= exit_layer <= n_layers, "exit_layer must lie in [1, n_layers]")
    check(0 <= alpha <= 1, "alpha must lie in [0, 1]")
    n, e = n_layers, exit_layer
    rho_star = n / (alpha * e + (1 - alpha) * math.ceil(n / e) * e)
    out = {"speedup": rho_star, "stages": math.ceil(n / e)}
    if gamma is not None:
        check(gamma >= 1, "gamma must be >= 1")
        tokens = expected_tokens(alpha, gamma)
        rho = tokens * n / (gamma * e + n)
        bound = 1.0 if alpha == 1 else alpha * (1 - alpha ** gamma) / ((1 - alpha) * gamma)
        out.update({"eesd_speedup": rho, "alpha_all_bound": bound, "lambda": rho_star / rho})
    return out


def ppsd_cost(alpha: Probability, t_ar_s: Positive, t_match_s: Positive,
              t_flush_s: Positive) -> dict:
    """PPSD eq. 6 with step times from the cost model: each token leaving the
    pipeline commits one, one bottleneck stage time ``t_match_s`` after the one
    before it on a match, the pipeline's refill ``t_flush_s`` (correction
    message, every stage, every activation hop, the heads) on a mismatch:
    rho* = T_AR / (a T_match + (1-a) T_flush). With layer times only (T_AR = N,
    T_match = E, T_flush = ceil(N/E) E) it is eq. 6."""
    check(0 <= alpha <= 1, "alpha must lie in [0, 1]")
    per_token = alpha * t_match_s + (1 - alpha) * t_flush_s
    return {"speedup": t_ar_s / per_token, "time_per_token_s": per_token}


# law terms ---------------------------------------------------------------------
@dataclass(frozen=True)
class PPSDTerms:
    """PPSD's step times (seconds) for one run, from the cost model: the heads and
    the links included, which eq. 6 leaves out."""

    t_ar_s: float  # one token of AR through the same stages (ppsd's baseline)
    t_match_s: float  # between two outputs on a match (the bottleneck)
    t_flush_s: float  # from a mismatch to its correction's output
    match_rate: float  # every row's draft matches: alpha^batch
    closed_form: Callable[..., dict]  # eq. 6 with step times (ppsd_cost above)

    def ppsd(self, match_rate: float | None = None) -> dict:
        """Eq. 6 with these times, at the run's match rate or the one given."""
        rate = self.match_rate if match_rate is None else match_rate
        return self.closed_form(rate, self.t_ar_s, self.t_match_s, self.t_flush_s)

    def curve(self, match_rate: float) -> float:
        """The law view's curve (``COST_VIEW``): the speedup at a match rate."""
        return self.ppsd(match_rate)["speedup"]

    def metrics(self) -> dict:
        """What a deterministic run at these terms measures: its speedup over its
        baseline, AR through the same stages."""
        return {"speedup_vs_ar": self.ppsd()["speedup"]}


def _pipeline_s(costs: LawCosts, ctx: PolicyContext, e: int,
                head: str) -> tuple[float, float, float]:
    """(T_match, T_flush, T_AR) of the pipeline: on a match the next output
    follows after the busiest resource's share of a token (stage 0: exit head +
    its layers, which the schedule runs one token at a time; a later stage; a
    link; or the whole journey over the tokens in flight); on a mismatch the
    correction travels to stage 0 and through every stage and hop, while the
    schedule refills the pipeline behind it. T_AR is ppsd's baseline, AR through
    the same stages (``policies.ar`` with ``pipeline_layers``): a token passes
    every stage and hop, and its id travels back to stage 0."""
    target, b, c = ctx.target, costs.batch, costs.context
    n = target.n_layers
    bounds = [(a, min(a + e, n)) for a in range(0, n, e)]
    last = len(bounds) - 1
    roles = [f"stage{k}" for k in range(len(bounds))]

    def stage_s(k: int, head_name=None, layers=None) -> float:
        return costs.forward_s(target, roles[k], layers or bounds[k], 1, b, c, head_name,
                               None)

    stages = [stage_s(k, "lm" if k == last else None) for k in range(len(bounds))]
    exit_s = stage_s(0, head, (e, e))
    act = target.hidden * target.dtype_bytes * b
    hops = [costs.trip_s(roles[k - 1], roles[k], act) for k in range(1, len(bounds))]
    after = sum(hops) + sum(stages[1:])  # from the end of stage 0 to the verdict
    entry = exit_s + stages[0]  # the schedule drafts and enters one token at a time
    correction = costs.trip_s(roles[last], roles[0], TOKEN_BYTES * b)
    match = max([entry, *stages[1:], *hops, (entry + after) / len(bounds)])
    # after a flush the schedule refills the pipeline one entry at a time until the
    # correction's verdict arrives (or the pipeline is full), then takes it
    entries = min(len(bounds) - 1, math.ceil(after / entry))
    t_ar = stages[0] + after + (correction if last else 0.0)
    return match, correction + stages[0] + max(after, entries * entry), t_ar


def ppsd_law_terms(costs: LawCosts, ctx: PolicyContext, params: PPSDParams) -> PPSDTerms:
    """The pipeline's times for a run's settings (exit layer, head), priced by
    ``costs`` (``policies.base.LawCosts``) at the run's context."""
    head = EXIT_HEADS[params.exit_head]
    match, flush, t_ar = _pipeline_s(costs, ctx, params.exit_layer, head)
    alpha = costs.mean_accepted(1)  # P(one draft matches)
    return PPSDTerms(t_ar, match, flush, alpha ** costs.batch,
                     ppsd_cost)


def eesd_law_terms(costs: LawCosts, ctx: PolicyContext, params: EESDParams) -> SDTerms:
    """Eq. 4 with the cost model's times: gamma drafts of E layers with the exit
    head, one verify of gamma + 1 positions over N, one AR token on the target."""
    e, n, b, c = params.exit_layer, ctx.target.n_layers, costs.batch, costs.context
    head = EXIT_HEADS[params.exit_head]
    draft = sum(costs.forward_s(ctx.target, "target", (0, e), 1, b, c + i, head, None)
                for i in range(params.gamma))
    return SDTerms(costs.target_s((0, n), 1, "lm"), draft,
                   costs.target_s((0, n), params.gamma + 1, "lm"), params.gamma,
                   eesd_cost)


EQ6_VIEW = LawView("PPSD: speedup vs α and E", "exit_family", law=ppsd_law, note=(
    "PPSD's simulated runs are not plotted on eq. 6, which counts layer times only; they "
    "also pay the exit head and the links between stages. The second PPSD figure draws "
    "eq. 6 with the cost model's times, on which deterministic runs lie within 0.5%."))
COST_VIEW = LawView(
    "PPSD: speedup vs match rate, cost-model times", "curve", x="match_rate",
    y="speedup_vs_ar", along=("alpha",),
    heading="PPSD law with the cost model's times: speedup vs match rate<br><sup>T_AR / "
            "(p T_match + (1-p) T_flush): stage 0 with the exit head, the last stage with "
            "the LM head, activation hops and the refill after a mismatch</sup>",
    x_title="match rate p (every row's draft matches)", y_title="speedup vs AR")


@register("ppsd", PPSDParams, baseline=_pipelined_baseline, law_terms=ppsd_law_terms,
          laws={"ppsd": ppsd_law, "ppsd_cost": ppsd_cost}, law_views=(EQ6_VIEW, COST_VIEW),
          baseline_words="AR through the same stages")
def ppsd(ctx: PolicyContext, params: PPSDParams):
    """Pipeline-parallel early-exit SD: verify-while-draft over ceil(N/E) stages."""
    _check_exit(ctx, params.exit_layer, "ppsd")
    pipe = _Pipeline(ctx, params.exit_layer)
    head, b, depth = Head(EXIT_HEADS[params.exit_head]), ctx.batch, pipe.stages
    e = params.exit_layer
    inflight: deque = deque()
    pending = None  # (hidden, context) of the newest token, its exit head not yet run
    done, flushed, runs, matches, outputs, chain = 0.0, 0, 1, 0, 0, 0
    while done < ctx.budget:
        # every output commits one token per row: enter no token that cannot commit;
        # after a mismatch (chain behind the pipe's epoch) first take its verdict
        room = len(inflight) < min(depth, math.ceil((ctx.budget - done) / b))
        if room and chain == pipe.epoch:
            if pending is not None:  # draft the token about to enter
                yield Forward("target", "stage0", (e, e), 1, b, pending[1], head=head,
                              emit=SAMPLE, feed=Feed(pending[0]), label="exit head")
            context = ctx.context(done / b + len(inflight))
            hidden = yield Forward("target", "stage0", pipe.bounds[0], 1, b, context,
                                   label="stage0")
            ahead = inflight[-1] if inflight else None
            inflight.append((yield Spawn(pipe.journey(hidden, context, chain, ahead))))
            pending = (hidden, context)
            continue
        verdict, hit = (yield Join((inflight.popleft(),)))[0]
        done += verdict.tokens
        outputs += 1
        if hit:
            matches += 1
            continue
        flushed += len(inflight)  # the tokens behind the mismatch; skip their drafting
        inflight.clear()
        pending, runs, chain = None, runs + 1, pipe.epoch
        yield Transfer(f"stage{depth - 1}", "stage0", TOKEN_BYTES * b,
                       label="correction")
    return {"steps": runs, "tokens": done, "stages": depth, "match_rate": matches / outputs,
            "flushed_tokens": flushed}


@register("eesd", EESDParams, law_terms=eesd_law_terms, tuned=Tuned("gamma"),
          laws={"eesd_cost": eesd_cost})
def eesd(ctx: PolicyContext, params: EESDParams):
    """Sequential early-exit SD: gamma drafts from the first E layers, one verify."""
    n = _check_exit(ctx, params.exit_layer, "eesd")
    e, gamma, b = params.exit_layer, params.gamma, ctx.batch
    head = Head(EXIT_HEADS[params.exit_head])
    done, steps = 0.0, 0
    while done < ctx.budget:
        context = ctx.context(done / b)
        for i in range(gamma):
            yield Forward("target", "target", (0, e), 1, b, context + i, head=head,
                          emit=SAMPLE, label="draft")
        logits = yield Forward("target", "target", (0, n), gamma + 1, b, context,
                               head=LM, label="verify")
        verdict = yield Verify(gamma, b, target=logits, label="verify")
        done += verdict.tokens
        steps += 1
    return {"steps": steps, "tokens": done}
