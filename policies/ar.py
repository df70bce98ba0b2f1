"""Autoregressive decoding: one full target forward per token."""

from policies.base import PolicyContext, PolicyParams, register
from policies.ops import Forward, Verify


class ARParams(PolicyParams):
    pass


@register("ar", ARParams)
def ar(ctx: PolicyContext, params: ARParams):
    """Autoregressive baseline: one full target forward per token."""
    n = ctx.target.n_layers
    done, steps = 0.0, 0
    while done < ctx.budget:
        logits = yield Forward("target", "target", (0, n), 1, ctx.batch,
                               ctx.context(done / ctx.batch), head="lm", label="target")
        verdict = yield Verify(0, ctx.batch, target=logits, label="sample")
        done += verdict.tokens
        steps += 1
    return {"steps": steps, "tokens": done}
