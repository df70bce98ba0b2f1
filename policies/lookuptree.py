"""A token tree drafted by prompt lookup (``--policy tree --draft ngram``).

Each step a host ``Lookup`` with ``siblings`` finds up to ``width`` continuations
of the sequence's tail with distinct first tokens (``policies.ngram.siblings``:
the longest match first, then the most recent occurrences, down to ``n_min``),
each at most ``depth`` tokens and ``nodes`` tokens in all. They hang under the
root (the last committed token) as chains; the target scores the root and every
node in one tree-masked pass, and the Verify walks the tree: the target's own
token at each node decides the child taken, so at most one sibling survives a
depth. A step with no match is a one-token pass, an AR step.

Lossless by construction: the tree is fixed before the target runs, so greedy
walking commits the target's argmax at every position (the output equals AR
token for token), and at temperature T the walk samples the target's token at
each node and follows it while it is a child, which is the target's law.

The simulator charges the lookup ``host_lookup_s`` per row and continuation
(each sibling is one more search), scores 1 + nodes positions, and takes the
best branch's acceptance from the run's acceptance model over the longest
continuation (fitted from a tree-lookup trace by ``policies.ngram.fit``: its
``accepted`` is the walk and ``proposed`` the longest branch), or replays a
trace's steps. A match model (``match``) proposes the full tree: ``width``
continuations of ``depth`` tokens within ``nodes``, an upper bound on its width.
"""

from __future__ import annotations

from policies.base import PolicyContext
from policies.modelled import EventModel, OutcomeModels
from policies.ops import Forward, Found, Lookup, Verify
from policies.sd import LOOKUP_GAMMA

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
    """With a given ``match``: the chance a lookup proposes (its full tree)."""
    return {} if params.match is None else {"lookup": EventModel(params.match)}


def lookup_tree(ctx: PolicyContext, params, branch: int):
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
        logits = yield Forward("target", "target", (0, n), 1 + max(found.nodes), ctx.batch, context,
                      head="lm", branch=branch, label="verify")
        rows = None if len(set(found.longest)) == 1 else tuple(found.longest)
        verdict = yield Verify(depth, ctx.batch, target=logits, branch=branch,
                               label="verify", row_gamma=rows)
        done += verdict.tokens
        steps += 1
    return {"steps": steps, "tokens": done}
