"""Vanilla speculative decoding (Leviathan et al. 2023).

Each step the draft proposes gamma tokens one at a time, the target scores all
gamma+1 positions in one pass, and rejection sampling keeps the longest accepted
prefix plus one token from the target: T = T_draft(gamma) + T_target(gamma+1),
plus, when draft and target sit on different devices, the proposal's trip to
the target and the verdict's trip back (zero on one device).
The draft is a separate model, or (``draft_layers``) the target's own first
layers followed by an early-exit head. A draft placed on a tensor-parallel group
is sharded as every separate-draft schedule shards it by default (Mirror-SD,
SSD, token trees): SPD-style, two all-reduces per draft step, so that schedules
compare on equal terms; ``draft_collectives=none`` gives it Megatron's two
all-reduces per layer instead.

The draft's first step each round is a ``catch_up`` Forward: the runtime feeds
what the draft's cache lacks before it (``policies.cachebook``). The draft
samples its last proposed token without ever feeding it; when a row accepts all
gamma tokens, that step must compute that token's position and the bonus
token's: two positions. This holds for a self-draft too, whose layers on the
draft's device keep their own cache. Deterministic simulation verifies with
expected accepted lengths: the laws take the draft to cost gamma one-position
passes, so only whole outcomes (sampled, replayed or real) feed catch-up
positions.

With ``proposer=ngram`` (``--draft ngram``) no draft model runs: each step a
``Lookup`` on the host proposes up to gamma tokens by prompt lookup
(``policies.ngram``), and the target scores the longest row's proposal plus
one position. A step with no match is a one-token pass, an AR step.

``lookup_tree`` is the token tree's prompt lookup (``tree --draft ngram``),
here beside ``lookup_sd``, whose loop it widens (see its section below).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from policies.base import (MAX_COLLECTIVES, EventModel, LawCosts, OutcomeModels, PolicyContext,
                           PolicyError, PolicyParams, register)
from policies.declared import Count, NonNegative, Positive, Probability, Tuned, check
from policies.ops import (CATCH_UP, LM, OWN, SAMPLE, TOKEN_BYTES, VERDICT_BYTES, Branch, Forward,
                          Found, Head, LOOKUP_MAX_N, Lookup, Transfer, Verify)

# prompt lookup's default gamma: on the grounded prompts a lookup's greedy
# proposals, priced at one pass plus a fifth per position (cpu-local's measured
# verify widths), gain most at 10-12 (docs/ngram.md); transformers' docs use 10
LOOKUP_GAMMA = 10


class SDParams(PolicyParams):
    gamma: int = Field(4, ge=1, le=64, description="draft tokens proposed per step (the "
                                                  f"most, {LOOKUP_GAMMA} by default, with "
                                                  "--draft ngram)")
    draft_layers: int | None = Field(
        None, ge=1, description="self-speculate with the target's first N layers + exit head")
    draft_collectives: int | None = Field(
        2, ge=0, le=MAX_COLLECTIVES,
        description="all-reduces per draft step when the draft runs on a group "
                    "(2: SPD-style, as every separate-draft schedule by default; none: "
                    "Megatron's two per layer)")
    proposer: Literal["model", "ngram"] = Field(
        "model", description="who proposes: a draft model (a separate one, or "
                             "draft_layers), or ngram: prompt lookup on the host, no "
                             "model (--draft ngram sets it)")
    n: int = Field(4, ge=1, le=LOOKUP_MAX_N, description="ngram: longest match length tried")
    n_min: int = Field(3, ge=1, le=LOOKUP_MAX_N,
                       description="ngram: shortest match length tried (a shorter match "
                                   "proposes tokens the target mostly rejects, and on a CPU "
                                   "each verified position costs a fifth of a pass)")
    search: Literal["prompt", "output", "both"] = Field(
        "both", description="ngram: where a match is looked for")
    match: float | None = Field(
        None, ge=0, le=1, description="ngram, simulated: chance a lookup proposes "
                                      "(default: what an acceptance trace proposed)")

    @model_validator(mode="after")
    def _lookup_gamma(self):
        """Prompt lookup proposes up to LOOKUP_GAMMA tokens unless gamma is given: a
        match that copies a run keeps going, and a step with no match costs nothing."""
        if self.proposer == "ngram" and "gamma" not in self.model_fields_set:
            object.__setattr__(self, "gamma", LOOKUP_GAMMA)
        return self

    @property
    def proposes_by_lookup(self) -> bool:
        return self.proposer == "ngram"

    def unused(self) -> str | None:
        """A given setting this configuration ignores (PolicyParams.unused)."""
        given = self.model_fields_set
        lookup = sorted(given & {"n", "n_min", "search", "match"})
        if self.proposer == "model" and lookup:
            return (f"{lookup[0]} has no effect with a draft model (it sets up prompt "
                    f"lookup); pass --draft ngram or drop {lookup[0]}")
        model = sorted(given & {"draft_layers", "draft_collectives"})
        if self.proposer == "ngram" and model:
            return (f"{model[0]} has no effect with --draft ngram (no draft model runs); "
                    f"drop {model[0]}")
        if self.n_min > self.n:
            return f"n_min ({self.n_min}) is above n ({self.n}); lower n_min or raise n"
        return None


def expected_accepted(alpha: float, gamma: int) -> float:
    """E[accepted drafts] of gamma i.i.d. drafts accepted with probability alpha
    until the first rejection: sum_{j=1..gamma} alpha^j (the bonus not counted)."""
    return sum(alpha ** j for j in range(1, gamma + 1))


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per step] of speculative decoding: the accepted drafts plus the
    target's own token, (1 - alpha^(gamma+1)) / (1 - alpha)."""
    return 1.0 + expected_accepted(alpha, gamma)


# closed forms (``hetspec law``) ------------------------------------------------
def leviathan(alpha: Probability, gamma: Count, c: NonNegative = 0.0,
              c_hat: NonNegative | None = None) -> dict:
    """Vanilla SD (Leviathan et al. 2023): expected tokens per step, walltime
    speedup (1-a^(g+1))/((1-a)(g c+1)) and operations factor
    (1-a)(g c_hat + g + 1)/(1-a^(g+1)); c_hat defaults to c."""
    check(0 <= alpha <= 1, "alpha must lie in [0, 1]; set --set alpha=0.8 for example")
    check(gamma >= 1 and int(gamma) == gamma, "gamma must be an integer >= 1")
    check(c >= 0, "c (draft/target step-time ratio) must be >= 0")
    check(c_hat is None or c_hat >= 0, "c_hat (draft/target cost ratio) must be >= 0")
    gamma = int(gamma)
    c_hat = c if c_hat is None else c_hat
    expected = expected_tokens(alpha, gamma)
    return {"expected_tokens_per_step": expected,
            "speedup": expected / (gamma * c + 1),
            "operations_factor": (gamma * c_hat + gamma + 1) / expected}


def eesd_cost(alpha: Probability, gamma: Count, t_ar_s: Positive, t_draft_s: NonNegative,
              t_verify_s: Positive) -> dict:
    """EESD eq. 4 with step times from the cost model: gamma exit-head drafts (their
    total ``t_draft_s``) and one verify of gamma + 1 positions per step:
    rho = E[tokens] T_AR / (T_draft + T_verify). With layer times only
    (T_draft = gamma E, T_verify = T_AR = N) it is eq. 4."""
    check(0 <= alpha <= 1, "alpha must lie in [0, 1]")
    tokens = expected_tokens(alpha, gamma)
    step = t_draft_s + t_verify_s
    return {"speedup": tokens * t_ar_s / step, "expected_tokens_per_step": tokens,
            "step_latency_s": step}


def draft_source(ctx: PolicyContext, draft_layers: int | None, policy: str):
    """(model role, layer range, head) of the draft: separate model or early exit."""
    if draft_layers is None:
        draft = ctx.need_draft(policy)
        return "draft", (0, draft.n_layers), "lm"
    if draft_layers >= ctx.target.n_layers:
        raise PolicyError(f"draft_layers ({draft_layers}) must be below the target's "
                          f"{ctx.target.n_layers} layers; choose a smaller value")
    return "target", (0, draft_layers), "exit"


def outcome_models(ctx: PolicyContext, params: SDParams) -> OutcomeModels:
    """With prompt lookup and a given ``match``: the chance a lookup proposes."""
    return lookup_outcomes(params) if params.proposer == "ngram" else {}


@dataclass(frozen=True)
class SDTerms:
    """Leviathan's law with the cost model's step times (seconds): gamma draft steps
    with the proposal's and the verdict's trips (``t_draft_s``), one verify of
    gamma + 1 positions, one AR token."""

    t_ar_s: float
    t_draft_s: float
    t_verify_s: float
    gamma: int
    closed_form: Callable[..., dict]  # eq. 4 with step times (eesd_cost above)

    @property
    def c(self) -> float:
        """Leviathan's c: one draft step (its share of the trips included) over T_AR."""
        return self.t_draft_s / self.gamma / self.t_ar_s

    def law(self, alpha: float) -> dict:
        """Eq. with T_target(gamma+1) as the cost model has it (the paper takes it
        equal to T_AR; a compute-bound target pays for its gamma + 1 positions)."""
        return self.closed_form(alpha, self.gamma, self.t_ar_s, self.t_draft_s,
                                self.t_verify_s)

    def metrics(self) -> dict:
        """What a deterministic run at these terms measures: its mean step."""
        return {"step_latency_s": self.t_draft_s + self.t_verify_s}


def sd_law_terms(costs: LawCosts, ctx: PolicyContext, params: SDParams) -> SDTerms:
    """The step of a run, priced by ``costs`` (``policies.base.LawCosts``) at the
    run's context: gamma draft steps and both trips, the verify, one AR token."""
    model, layers, head = draft_source(ctx, params.draft_layers, "sd")
    spec = ctx.draft if model == "draft" else ctx.target
    n, b, c, g = ctx.target.n_layers, costs.batch, costs.context, params.gamma
    drafts = sum(costs.forward_s(spec, "draft", layers, 1, b, c + i, head,
                                 params.draft_collectives) for i in range(g))
    trips = (costs.trip_s("draft", "target", b * g * TOKEN_BYTES)
             + costs.trip_s("target", "draft", b * VERDICT_BYTES))
    return SDTerms(costs.target_s((0, n), 1, "lm"), drafts + trips,
                   costs.target_s((0, n), g + 1, "lm"), g, eesd_cost)


@register("sd", SDParams, outcome_models=outcome_models, law_terms=sd_law_terms,
          tuned=Tuned("gamma"), laws={"leviathan": leviathan}, fits_profile=True)
def sd(ctx: PolicyContext, params: SDParams):
    """Vanilla speculative decoding: gamma serial draft steps, one target verify."""
    if params.proposer == "ngram":
        return (yield from lookup_sd(ctx, params))
    model, layers, kind = draft_source(ctx, params.draft_layers, "sd")
    gamma, n, head = params.gamma, ctx.target.n_layers, Head(kind)
    done, steps = 0.0, 0
    while done < ctx.budget:
        context = ctx.context(done / ctx.batch)
        for i in range(gamma):  # the first also feeds what the draft's cache lacks
            yield Forward(model, "draft", layers, 1, ctx.batch, context + i, head=head,
                          emit=SAMPLE, feed=CATCH_UP if i == 0 else OWN,
                          collectives=params.draft_collectives, label="draft")
        yield Transfer("draft", "target", ctx.batch * gamma * TOKEN_BYTES, label="proposal")
        logits = yield Forward("target", "target", (0, n), gamma + 1, ctx.batch, context,
                               head=LM, label="verify")
        verdict = yield Verify(gamma, ctx.batch, target=logits, label="verify")
        yield Transfer("target", "draft", ctx.batch * VERDICT_BYTES, label="verdict")
        done += verdict.tokens
        steps += 1
    return {"steps": steps, "tokens": done}


def lookup_sd(ctx: PolicyContext, params: SDParams):
    """Prompt-lookup SD: a host lookup proposes, the target verifies what it found."""
    n = ctx.target.n_layers
    done, steps = 0.0, 0
    while done < ctx.budget:
        context = ctx.context(done / ctx.batch)
        found = yield Lookup(params.gamma, ctx.batch, params.n, params.n_min, params.search)
        gamma = max(found)
        logits = yield Forward("target", "target", (0, n), gamma + 1, ctx.batch, context,
                               head=LM, label="verify")
        rows = None if len(set(found)) == 1 else tuple(found)
        verdict = yield Verify(gamma, ctx.batch, target=logits, label="verify",
                               row_gamma=rows)
        done += verdict.tokens
        steps += 1
    return {"steps": steps, "tokens": done}


# prompt lookup as a token tree (``--policy tree --draft ngram``) -------------------
# Each step a host ``Lookup`` with ``siblings`` finds up to ``width`` continuations
# with distinct first tokens (``policies.ngram.siblings``), each at most ``depth``
# tokens and ``nodes`` in all, as chains under the root (the last committed token);
# the target scores the root and every node in one tree-masked pass and the Verify
# walks the tree (``policies.tree``): lossless, as the tree is fixed before the
# target runs. The simulator verifies the longest continuation with the run's
# acceptance model (the best branch's, which ``policies.ngram.fit`` fits from a
# tree-lookup trace) or replays a trace; a match model proposes the full tree, an
# upper bound on its width (docs/ngram.md, "Token trees").
LOOKUP_WIDTH = 3   # continuations tried as siblings (not tuned: docs/ngram.md)
# tokens in all continuations: the first's 10 (sd's LOOKUP_GAMMA) and 6 for siblings;
# on cpu-local each verified position costs about a fifth of a one-token pass
LOOKUP_NODES = 16
MODEL_ONLY = ("tree", "rank_alphas", "temperature", "target_top_mass", "draft_layers",
              "draft_collectives")


def lookup_shape(params):
    """TreeParams with prompt lookup: width, depth and nodes shape the lookup's
    tree; their lookup defaults where not given."""
    given = params.model_fields_set
    for name, value in (("width", LOOKUP_WIDTH), ("depth", LOOKUP_GAMMA),
                        ("nodes", LOOKUP_NODES)):
        if name not in given:
            object.__setattr__(params, name, value)
    return params


def lookup_unused(params) -> str | None:
    """A given setting a lookup tree ignores, or a contradiction in its shape."""
    model = sorted(params.model_fields_set & set(MODEL_ONLY))
    if model:
        return (f"{model[0]} has no effect with --draft ngram (no draft model runs; "
                f"width, depth and nodes shape the lookup's tree); drop {model[0]}")
    if params.n_min > params.n:
        return f"n_min ({params.n_min}) is above n ({params.n}); lower n_min or raise n"
    return None


def lookup_outcomes(params) -> OutcomeModels:
    """With a given ``match``: the chance a lookup proposes (its full proposal)."""
    return {} if params.match is None else {"lookup": EventModel(params.match)}


def lookup_tree(ctx: PolicyContext, params, branch: Branch):
    """Prompt-lookup token tree: a host lookup's continuations as siblings, one
    tree-masked target pass, the Verify's walk."""
    n = ctx.target.n_layers
    done, steps = 0.0, 0
    while done < ctx.budget:
        context = ctx.context(done / ctx.batch)
        found: Found = yield Lookup(params.depth, ctx.batch, params.n, params.n_min,
                                    params.search, branch=branch, siblings=params.width,
                                    nodes=params.nodes)
        depth = max(found.longest)
        logits = yield Forward("target", "target", (0, n), 1 + max(found.nodes), ctx.batch,
                               context, head=LM, branch=branch, label="verify")
        rows = None if len(set(found.longest)) == 1 else tuple(found.longest)
        verdict = yield Verify(depth, ctx.batch, target=logits, branch=branch,
                               label="verify", row_gamma=rows)
        done += verdict.tokens
        steps += 1
    return {"steps": steps, "tokens": done}
