"""Autoregressive decoding: one full target forward per token.

With ``pipeline_layers`` E the layers run as a pipeline of ceil(N/E) stages of E
layers on roles ``stage0``, ``stage1``, ... (the placement a pipelined schedule
uses), each token passing every stage in turn with its activations sent from
stage to stage and its token sent back to the first: the autoregressive
baseline a pipelined schedule (``ppsd``) is measured against, on the same
devices, as the PPSD paper measures it (one token costs all N layer times).
"""

from pydantic import Field

from policies.base import PolicyContext, PolicyParams, register
from policies.ops import LM, TOKEN_BYTES, Feed, Forward, Transfer, Verify


class ARParams(PolicyParams):
    pipeline_layers: int | None = Field(
        None, ge=1, description="run the layers as pipeline stages of this many layers "
                                "on roles stage0, stage1, ... (ppsd's baseline)")

    @property
    def stage_layers(self) -> int | None:
        return self.pipeline_layers

    @classmethod
    def pipelined(cls, stage_layers: int) -> dict:
        return {"pipeline_layers": stage_layers}


@register("ar", ARParams, fits_profile=True)
def ar(ctx: PolicyContext, params: ARParams):
    """Autoregressive baseline: one full target forward per token."""
    if params.pipeline_layers is not None:
        return (yield from _pipelined(ctx, params.pipeline_layers))
    n = ctx.target.n_layers
    done, steps = 0.0, 0
    while done < ctx.budget:
        logits = yield Forward("target", "target", (0, n), 1, ctx.batch,
                               ctx.context(done / ctx.batch), head=LM, label="target")
        verdict = yield Verify(0, ctx.batch, target=logits, label="sample")
        done += verdict.tokens
        steps += 1
    return {"steps": steps, "tokens": done}


def _pipelined(ctx: PolicyContext, e: int):
    n, b = ctx.target.n_layers, ctx.batch
    bounds = [(a, min(a + e, n)) for a in range(0, n, e)]
    last = len(bounds) - 1
    act_bytes = ctx.target.hidden * ctx.target.dtype_bytes * b
    done, steps = 0.0, 0
    while done < ctx.budget:
        context = ctx.context(done / b)
        hidden = None
        for k, layers in enumerate(bounds):
            if k:
                yield Transfer(f"stage{k - 1}", f"stage{k}", act_bytes, hidden,
                               "activations")
            hidden = yield Forward("target", f"stage{k}", layers, 1, b, context,
                                   LM if k == last else None, feed=Feed(hidden),
                                   label=f"stage{k}")
        verdict = yield Verify(0, b, target=hidden, label="sample")
        if last:
            yield Transfer(f"stage{last}", "stage0", TOKEN_BYTES * b, label="token")
        done += verdict.tokens
        steps += 1
    return {"steps": steps, "tokens": done, "stages": len(bounds)}
