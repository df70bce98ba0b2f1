"""Vanilla speculative decoding (Leviathan et al. 2023).

Each step the draft proposes gamma tokens one at a time, the target scores all
gamma+1 positions in one pass, and rejection sampling keeps the longest accepted
prefix plus one token from the target: T = T_draft(gamma) + T_target(gamma+1),
plus, when draft and target sit on different devices, the proposal's trip to
the target and the verdict's trip back (zero on one device).
The draft is a separate model, or (``draft_layers``) the target's own first
layers followed by an early-exit head.

The draft samples its last proposed token without ever feeding it; when a row
accepts all gamma tokens, the draft's next step must compute that token's
position and the bonus token's: two positions (``catch_up``). This holds for a
self-draft too, whose layers on the draft's device keep their own cache (were
the two roles placed on one device, the target's pass would have fed them and
the step would cost one position less than declared).
Deterministic simulation verifies with expected accepted lengths (floats, not
counts): the laws take the draft to cost gamma one-position passes, so only a
verdict of whole counts (sampled, replayed or real) charges the extra position.
"""

from numbers import Integral

from pydantic import Field

from policies.base import PolicyContext, PolicyError, PolicyParams, register
from policies.ops import Forward, Transfer, Verify

TOKEN_BYTES = 4    # an int32 token id
VERDICT_BYTES = 8  # accepted count + the target's token, per row


class SDParams(PolicyParams):
    gamma: int = Field(4, ge=1, le=64, description="draft tokens proposed per step")
    draft_layers: int | None = Field(
        None, ge=1, description="self-speculate with the target's first N layers + exit head")
    draft_collectives: int | None = Field(
        2, ge=0, description="all-reduces per draft step when the draft runs on a group "
                             "(2: SPD-style, as Mirror-SD's draft, so the two compare on "
                             "equal terms; none: Megatron's two per layer)")


def draft_source(ctx: PolicyContext, draft_layers: int | None, policy: str):
    """(model role, layer range, head) of the draft: separate model or early exit."""
    if draft_layers is None:
        draft = ctx.need_draft(policy)
        return "draft", (0, draft.n_layers), "lm"
    if draft_layers >= ctx.target.n_layers:
        raise PolicyError(f"draft_layers ({draft_layers}) must be below the target's "
                          f"{ctx.target.n_layers} layers; choose a smaller value")
    return "target", (0, draft_layers), "exit"


def catch_up(verdict, gamma: int) -> int:
    """Positions a separate draft must feed beyond one in its first step after
    ``verdict``: 1 when some row accepted all ``gamma`` tokens (counted only for
    whole-number verdicts; expected values in deterministic mode add none)."""
    if verdict is None:
        return 0
    return int(any(isinstance(a, Integral) and a >= gamma for a in verdict.accepted))


@register("sd", SDParams)
def sd(ctx: PolicyContext, params: SDParams):
    """Vanilla speculative decoding: gamma serial draft steps, one target verify."""
    model, layers, head = draft_source(ctx, params.draft_layers, "sd")
    gamma, n = params.gamma, ctx.target.n_layers
    done, steps, verdict = 0.0, 0, None
    while done < ctx.budget:
        context = ctx.context(done / ctx.batch)
        lag = catch_up(verdict, gamma)
        for i in range(gamma):
            n_tokens = 1 + (lag if i == 0 else 0)
            yield Forward(model, "draft", layers, n_tokens, ctx.batch,
                          context + i - (n_tokens - 1), head=head, emit="sample",
                          collectives=params.draft_collectives, label="draft",
                          head_tokens=1 if n_tokens > 1 else None)
        yield Transfer("draft", "target", ctx.batch * gamma * TOKEN_BYTES, label="proposal")
        logits = yield Forward("target", "target", (0, n), gamma + 1, ctx.batch, context,
                               head="lm", label="verify")
        verdict = yield Verify(gamma, ctx.batch, target=logits, label="verify")
        yield Transfer("target", "draft", ctx.batch * VERDICT_BYTES, label="verdict")
        done += verdict.tokens
        steps += 1
    return {"steps": steps, "tokens": done}
