"""Tree-based drafting and verification (Medusa/EAGLE static trees, EAGLE-2
dynamic trees, SpecInfer's tree attention).

Each step the draft expands a token tree one depth at a time: one draft pass
over the nodes it expands at that depth (the root first: the last committed
token), whose top-k candidates become their children. The target then scores
the root and every node in ONE pass under a tree mask (each node sees the
committed context and its own ancestors): ``n_tokens = 1 + nodes`` positions
over the committed context. The longest root path whose every token is the
target's own next token is accepted, plus the target's token after it (the
bonus), so one step commits between 1 and depth + 1 tokens.

Shapes:
  * static (``tree=4,2,2,1``, the default): every node at depth d-1 has
    ``tree[d-1]`` children, its draft's top candidates; draft pass d runs over
    the prod(tree[:d-1]) nodes of depth d-1. The default 4,2,2,1 (44 nodes)
    spends its width where the draft is least sure, near the root, and has
    sd's default depth (gamma=4), so the two compare at equal depth.
  * dynamic (``width=W``, EAGLE-2): the root's top-W candidates are depth 1;
    at each later depth the W most confident nodes of the depth before
    (confidence: the product of draft probabilities along the path) expand into
    their top-W candidates, ``depth`` passes in all; the target scores the
    ``nodes`` most confident of all W + (depth-1) W^2 candidates (all of them
    when fewer; a set closed under ancestors, since confidence only falls along
    a path).

Acceptance by sibling rank: given its parent was accepted, the node whose token
is the draft's rank-i candidate (0-based) is accepted with probability
p_{d,i}. Greedy (``temperature=0``, the default): each candidate, in the draft's
rank order, matches the target's token with the run's per-depth acceptance
alpha_d given the ones ranked above it did not: p_{d,i} = alpha_d (1 - alpha_d)^i,
with alpha_d = P(A >= d) / P(A >= d-1) of the run's acceptance model (alpha for
``iid``, alphas[d-1] for ``positional``, and as implied by a histogram or trace).
Sampled (``temperature`` > 0): the siblings are tried in rank order by recursive
rejection sampling against the target's tempered distribution, whose most likely
token takes mass m (``target_top_mass``) and sits at the draft's rank i with the greedy
law a (1 - a)^i, a = alpha_d / m; the rest of its mass falls outside the tree.
So p_{d,i} = alpha_d (1 - alpha_d / m)^i (``rank_probs``): alpha_d is the first
candidate's acceptance at the run's temperature, and sibling i after i rejections
is accepted with ``sibling_acceptance``, far less than greedy's alpha_d; m = 1 is
the greedy rule exactly (docs/schedules.md, "Token trees at temperature > 0").
``rank_alphas`` replaces either with measured per-rank probabilities (the same at
every depth; 0 past the list). Siblings are exclusive events (the target names one
token), so E[accepted] = sum over nodes of the product of p along the node's path
(``expected_accepted``). A dynamic tree in simulation takes draft confidence to
equal this acceptance (EAGLE-2's premise), so its shape follows from p.

Deterministic simulation verifies with that mean (the tree's outcome model,
``tree_outcomes``); random simulation draws accepted lengths with that mean; an
acceptance ``trace`` (record it from a tree run: ``hetspec run --policy tree``) is replayed as
recorded, its lengths being tree walks already. The executor walks the real
tree (``executors.coordinate.tokentree``): greedy, or at temperature > 0 the target samples
its token at each node and the walk follows it while it is a child, which keeps
the target's distribution exactly (the draft's candidates are fixed, not
sampled): recursive rejection sampling over fixed candidates, the sampled law
above. The draft's caches keep no tree slots: its next root pass re-feeds
the accepted path and the bonus token (a ``catch_up`` Forward: the runtime
counts them from the verdict; with expected outcomes one position, as the
laws take it).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from policies.base import (MAX_COLLECTIVES, OutcomeModels, PolicyContext, PolicyError,
                           PolicyParams, VerifyModel, register, validate_params)
from policies.declared import Probability
from policies.ops import (CATCH_UP, LM, OWN, TOKEN_BYTES, VERDICT_BYTES, Branch, Children,
                          Forward, Head, LOOKUP_MAX_N, TopK, Transfer, Verify)
from policies.sd import (LOOKUP_GAMMA, LOOKUP_NODES, LOOKUP_WIDTH, draft_source, lookup_outcomes,
                         lookup_shape, lookup_tree, lookup_unused)


class TreeBranch(Branch):
    """Token-tree speculation's branch: the tree grows beside the main one."""
    TREE = 1


TREE = TreeBranch.TREE
MAX_NODES = 1024  # a larger tree is a typing slip, not a design
MAX_TEMPERATURE = 100.0  # far past any sampling temperature in use; larger is a slip
# The target's mean probability of its own most likely token at temperature 1, the
# default target_top_mass there: fitted on the temperature-1 mean accepted lengths of
# EAGLE-2 (arXiv 2406.16858, Table 1) and judged on EAGLE's (ICML 2024) and on
# EAGLE-3's own EAGLE-2 runs (arXiv 2503.01840, Table 1);
# ``python benchmarks/bench_trees.py`` refits it and prints both.
TOP_MASS_T1 = 0.965


class TreeParams(PolicyParams):
    tree: tuple[int, ...] = Field((4, 2, 2, 1), min_length=1, max_length=32,
                                  description="static tree: children per node at each "
                                              "depth, e.g. 4,2,2,1")
    width: int | None = Field(None, ge=1, le=32, description="dynamic tree (EAGLE-2): "
                              "nodes expanded per depth, each into its top-width candidates "
                              f"(--draft ngram: continuations, {LOOKUP_WIDTH} by default)")
    depth: int = Field(5, ge=1, le=32, description="dynamic tree: depth (draft passes; "
                       f"--draft ngram: the longest continuation, {LOOKUP_GAMMA} by default)")
    nodes: int = Field(32, ge=1, le=MAX_NODES, description="dynamic tree: the most "
                       "nodes the target scores (the most confident of those grown; "
                       f"--draft ngram: tokens in all continuations, {LOOKUP_NODES} by default)")
    rank_alphas: tuple[float, ...] | None = Field(
        None, min_length=1, description="P(target's token is the draft's rank-i candidate) "
                                        "per sibling rank; default: from the acceptance model")
    temperature: float = Field(
        0.0, ge=0, le=MAX_TEMPERATURE,
        description="sampling temperature the simulated tree is verified at: 0 greedy "
                    "(a child must be the target's argmax), above 0 recursive rejection "
                    "sampling over siblings, which accepts fewer (a measured run takes "
                    "hetspec run --temperature)")
    target_top_mass: float | None = Field(
        None, gt=0, le=1, description="at temperature > 0: the target's mean probability "
                                      f"of its own most likely token (default {TOP_MASS_T1} "
                                      "at temperature 1, fitted on EAGLE-2's tables)")
    draft_layers: int | None = Field(
        None, ge=1, description="self-speculate with the target's first N layers + exit head")
    draft_collectives: int | None = Field(
        2, ge=0, le=MAX_COLLECTIVES, description="all-reduces per draft pass on a group "
                                                 "(none: two per layer)")
    proposer: Literal["model", "ngram"] = Field(
        "model", description="who drafts: a draft model, or ngram: prompt lookup on the "
                             "host, its continuations as siblings (--draft ngram sets it)")
    n: int = Field(4, ge=1, le=LOOKUP_MAX_N, description="ngram: longest match length tried")
    n_min: int = Field(3, ge=1, le=LOOKUP_MAX_N, description="ngram: shortest match length tried")
    search: Literal["prompt", "output", "both"] = Field(
        "both", description="ngram: where a match is looked for")
    match: float | None = Field(
        None, ge=0, le=1, description="ngram, simulated: chance a lookup proposes "
                                      "(default: what an acceptance trace proposed)")

    @field_validator("tree", "rank_alphas", mode="before")
    @classmethod
    def _one_value(cls, v):
        return (v,) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    @field_validator("tree")
    @classmethod
    def _branching(cls, v):
        if any(b < 1 for b in v):
            raise ValueError("every branching factor must be >= 1, e.g. tree=4,2,2,1")
        if sum(math.prod(v[:d + 1]) for d in range(len(v))) > MAX_NODES:
            raise ValueError(f"the tree holds more than {MAX_NODES} nodes; use smaller "
                             "branching factors or fewer depths")
        return v

    @field_validator("rank_alphas")
    @classmethod
    def _ranks(cls, v):
        if v is not None and (any(not 0 <= p <= 1 for p in v) or sum(v) > 1 + 1e-9):
            raise ValueError("rank probabilities must lie in [0, 1] and sum to at most 1 "
                             "(the target's token is one candidate at most)")
        return v

    @model_validator(mode="after")
    def _one_shape(self):
        if self.proposer == "ngram":
            return lookup_shape(self)
        if self.width is not None and "tree" in self.model_fields_set:
            raise ValueError("tree (static) and width (dynamic) choose different shapes; "
                             "set one of them")
        if self.width is None and self.model_fields_set & {"depth", "nodes"}:
            raise ValueError("depth and nodes shape a dynamic tree; set width too, or use "
                             "tree=... for a static one")
        if self.target_top_mass is not None and self.temperature == 0:
            raise ValueError("target_top_mass prices sampled verification; at temperature "
                             "0 the target's argmax takes all its mass: set temperature or "
                             "drop target_top_mass")
        if self.target_top_mass is None and self.temperature not in (0, 1):
            raise ValueError(f"at temperature {self.temperature:g} give target_top_mass "
                             "(the target's mean probability of its most likely token "
                             f"there); the default {TOP_MASS_T1} holds at temperature 1 "
                             "only")
        return self

    @property
    def proposes_by_lookup(self) -> bool:
        return self.proposer == "ngram"

    def unused(self) -> str | None:
        """A given setting this configuration ignores (PolicyParams.unused)."""
        if self.proposer == "ngram":
            return lookup_unused(self)
        lookup = sorted(self.model_fields_set & {"n", "n_min", "search", "match"})
        if lookup:
            return (f"{lookup[0]} has no effect with a draft model (it sets up prompt "
                    f"lookup); pass --draft ngram or drop {lookup[0]}")
        if self.rank_alphas is not None and self.temperature > 0:
            return ("temperature prices the modelled sibling law, which rank_alphas "
                    "(measured per-rank probabilities) replaces; drop one of them")
        return None

    def top_mass_at(self) -> float:
        """m: the target's mean probability of its own most likely token at the
        tree's temperature (1 when greedy)."""
        if self.temperature == 0:
            return 1.0
        return TOP_MASS_T1 if self.target_top_mass is None else self.target_top_mass


# the tree's shape and its closed form ---------------------------------------------
def depth_alphas(model, depth: int) -> list[float]:
    """alpha_d = P(A >= d) / P(A >= d-1) for d = 1..depth of an acceptance model."""
    means = [model.expected(j) for j in range(depth + 1)]
    survive = [1.0] + [max(0.0, means[j] - means[j - 1]) for j in range(1, depth + 1)]
    return [survive[d] / survive[d - 1] if survive[d - 1] > 0 else 0.0
            for d in range(1, depth + 1)]


def rank_probs(alphas: list[float], ranks: int,
               rank_alphas: tuple[float, ...] | None = None,
               top_mass: float = 1.0) -> list[list[float]]:
    """p[d-1][i]: acceptance of a depth-d node of sibling rank i given its parent:
    alpha_d (1 - alpha_d / m)^i, m the target's top mass (1: greedy, the rule
    alpha_d (1 - alpha_d)^i exactly); a greedy rate alpha_d / m above 1 is 1."""
    if rank_alphas is not None:
        row = [rank_alphas[i] if i < len(rank_alphas) else 0.0 for i in range(ranks)]
        return [row for _ in alphas]
    return [[a * (1 - min(1.0, a / top_mass)) ** i for i in range(ranks)]
            for a in alphas]


def sibling_acceptance(alpha: float, top_mass: float, rank: int) -> float:
    """P(the candidate of rank j = ``rank`` is accepted | the j ranked above it
    were rejected) under recursive rejection sampling over fixed candidates: its
    share of the target's mass left after them, alpha (1-a)^j / (1 - m (1 - (1-a)^j)),
    a = alpha / m. Greedy (m = 1) it is alpha at every rank."""
    greedy = min(1.0, alpha / top_mass)
    left = 1.0 - top_mass * (1.0 - (1.0 - greedy) ** rank)  # mass not yet rejected
    return alpha * (1.0 - greedy) ** rank / left if left > 0 else 0.0


def tree_nodes(params: TreeParams, probs: list[list[float]] | None) -> list[tuple]:
    """The nodes the target scores, parents before children: (value, depth, parent
    index or -1, rank). A dynamic tree ranks candidates by ``value`` (the model's
    confidence); without probabilities (the executor) all values are 1."""
    def p(d, i):
        return 1.0 if probs is None else probs[d - 1][i]

    if params.width is None:
        nodes, level = [], [-1]
        for d, b in enumerate(params.tree, start=1):
            nxt = []
            for parent in level:
                base = 1.0 if parent < 0 else nodes[parent][0]
                for i in range(b):
                    nodes.append((base * p(d, i), d, parent, i))
                    nxt.append(len(nodes) - 1)
            level = nxt
        return nodes
    return _dynamic(params, p)


def _dynamic(params: TreeParams, p) -> list[tuple]:
    w, cands, level = params.width, [], [-1]
    for d in range(1, params.depth + 1):
        new = []
        for parent in level:
            base = 1.0 if parent < 0 else cands[parent][0]
            for i in range(w):
                cands.append((base * p(d, i), d, parent, i))
                new.append(len(cands) - 1)
        level = sorted(new, key=lambda j: (-cands[j][0], j))[:w]
    keep = sorted(sorted(range(len(cands)), key=lambda j: (-cands[j][0], cands[j][1], j))
                  [:params.nodes])
    index = {j: n for n, j in enumerate(keep)}
    return [(v, d, index[par] if par >= 0 else -1, i)
            for v, d, par, i in (cands[j] for j in keep)]


def draft_passes(params: TreeParams) -> list[tuple[int, int]]:
    """(positions, top-k) of each draft pass: the nodes it expands, their children."""
    if params.width is None:
        return [(math.prod(params.tree[:d]), b) for d, b in enumerate(params.tree)]
    return [(1, params.width)] + [(params.width, params.width)] * (params.depth - 1)


def expected_accepted(nodes: list[tuple]) -> float:
    """E[accepted] = sum over nodes of the product of p along the path (its value)."""
    return sum(v for v, *_ in nodes)


def tree_depth(params: TreeParams) -> int:
    return len(params.tree) if params.width is None else params.depth


def closed_form(params: TreeParams, alphas: list[float]) -> dict:
    """The tree's expected accepted length and its work, from per-depth alphas."""
    depth = tree_depth(params)
    if len(alphas) < depth:
        alphas = list(alphas) + [alphas[-1]] * (depth - len(alphas))
    ranks = max(params.tree) if params.width is None else params.width
    nodes = tree_nodes(params, rank_probs(alphas[:depth], ranks, params.rank_alphas,
                                          params.top_mass_at()))
    passes = draft_passes(params)
    e = expected_accepted(nodes)
    return {"expected_accepted": e, "expected_tokens_per_step": e + 1, "nodes": len(nodes),
            "depth": depth, "scored_depth": max(d for _, d, _, _ in nodes),
            "draft_passes": len(passes), "draft_positions": sum(n for n, _ in passes)}


# the schedule --------------------------------------------------------------------
def modelled_form(ctx: PolicyContext, params: TreeParams) -> dict | None:
    """The tree's closed form under the simulated run's acceptance model; None
    in the executor (no model) and for a trace (recorded from a tree run), which
    already holds the tree's accepted lengths and is replayed as it is."""
    if ctx.acceptance is None or getattr(ctx.acceptance, "kind", "") == "trace":
        return None
    return closed_form(params, depth_alphas(ctx.acceptance, tree_depth(params)))


def tree_outcomes(ctx: PolicyContext, params: TreeParams) -> OutcomeModels:
    """Simulation verifies the tree with its modelled mean accepted length."""
    if params.proposer == "ngram":
        return lookup_outcomes(params)
    form = modelled_form(ctx, params)
    return {} if form is None else {"verify": VerifyModel(expected=form["expected_accepted"])}


# the law (``hetspec law tree``) ---------------------------------------------------
def tree_law(alpha: Probability | None = None,
             alphas: Annotated[tuple[float, ...], Field(min_length=1)] | float | None = None,
             tree: tuple[int, ...] | int | None = None, width: int | None = None,
             depth: int | None = None, nodes: int | None = None,
             rank_alphas: tuple[float, ...] | float | None = None,
             temperature: float | None = None, target_top_mass: float | None = None,
             c: Annotated[float, Field(ge=0)] = 0.0,
             v: Annotated[float, Field(gt=0)] = 1.0) -> dict:
    """Token tree: E[accepted] = sum over nodes of the product of sibling-rank
    acceptances along its path (greedy, or sampled at ``temperature`` with the
    target's ``target_top_mass``); speedup (E+1)/(passes c + v), c one draft pass and v the
    tree verify over one target step."""
    given = {k: x for k, x in (("tree", tree), ("width", width), ("depth", depth),
                               ("nodes", nodes), ("rank_alphas", rank_alphas),
                               ("temperature", temperature),
                               ("target_top_mass", target_top_mass))
             if x is not None}
    try:
        params = validate_params("tree", TreeParams, given)
    except PolicyError as err:
        raise ValueError(str(err).replace("policy 'tree'", "law 'tree'", 1)) from None
    if alpha is not None and alphas is not None:
        raise ValueError("law 'tree' takes alpha or alphas, not both; keep one")
    if alpha is None and alphas is None and rank_alphas is None:
        raise ValueError("law 'tree' needs the acceptance: give alpha (i.i.d.) or alphas "
                         "(per depth), e.g. --set alpha=0.8")
    if isinstance(alphas, float):  # one depth's alpha: --set alphas=0.9
        alphas = (alphas,)
    per_depth = [alpha if alpha is not None else 1.0] if alphas is None else list(alphas)
    if any(not 0 <= a <= 1 for a in per_depth):
        raise ValueError("law 'tree' parameter 'alphas': every alpha must lie in [0, 1]")
    out = closed_form(params, per_depth)
    out["speedup"] = out["expected_tokens_per_step"] / (out["draft_passes"] * c + v)
    return out


@register("tree", TreeParams, outcome_models=tree_outcomes, laws={"tree": tree_law})
def tree(ctx: PolicyContext, params: TreeParams):
    """Token-tree speculation: a static or dynamic draft tree, one tree-masked verify."""
    if params.proposer == "ngram":
        return lookup_tree(ctx, params, TREE)
    model, layers, kind = draft_source(ctx, params.draft_layers, "tree")
    passes, depth = draft_passes(params), tree_depth(params)
    n_nodes, longest = len(tree_nodes(params, None)), depth
    form = modelled_form(ctx, params)
    if form is not None:  # a dynamic tree's shape follows from the modelled confidence
        # a dynamic tree's node budget may keep none of its deepest candidates:
        # no walk is longer than the deepest node scored
        n_nodes, longest = form["nodes"], form["scored_depth"]
    if max(k for _, k in passes) > ctx.target.vocab:
        raise PolicyError(f"tree: a node cannot have more children than the "
                          f"{ctx.target.vocab} tokens of the vocabulary; lower tree or width")
    return _steps(ctx, params, (model, layers, Head(kind)), (n_nodes, longest))


def _steps(ctx: PolicyContext, params: TreeParams, source: tuple, shape: tuple):
    (model, layers, head), passes = source, draft_passes(params)
    (n_nodes, depth), b, n = shape, ctx.batch, ctx.target.n_layers
    done, steps = 0.0, 0
    while done < ctx.budget:
        context, fed = ctx.context(done / b), 0
        for d, (count, k) in enumerate(passes):  # the first also feeds what the
            # draft's cache lacks: the committed path and bonus token it never fed
            yield Forward(model, "draft", layers, count, b, context + fed, head=head,
                          emit=TopK(k), feed=CATCH_UP if d == 0 else OWN, branch=TREE,
                          tree=Children(), collectives=params.draft_collectives,
                          label="tree draft")
            fed += count
        # each node: its token id and its parent's index
        yield Transfer("draft", "target", b * n_nodes * 2 * TOKEN_BYTES, label="tree")
        logits = yield Forward("target", "target", (0, n), 1 + n_nodes, b, context,
                               head=LM, branch=TREE, label="verify")
        verdict = yield Verify(depth, b, target=logits, branch=TREE, label="verify")
        yield Transfer("target", "draft", b * VERDICT_BYTES, label="verdict")
        done += verdict.tokens
        steps += 1
    return {"steps": steps, "tokens": done, "tree_nodes": n_nodes}
