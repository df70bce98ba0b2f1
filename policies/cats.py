"""Memory-limited self-speculation with weights streamed from flash: CATS,
Kangaroo, and autoregressive decoding under the same DRAM budget.

The DRAM budget (``dram_budget_gb``) is what the schedule may spend on decoder
layers: a streaming buffer of ``buffer_chunks`` chunks of ``chunk_layers``
layers, and resident layers 1..P with P as large as the rest allows (embedding,
LM head, adapters and KV cache are outside the budget). With
``buffer_in_budget=false`` the budget counts resident layers only and the buffer
comes on top of it (peak decoder-layer DRAM = budget + buffer): a budget the
size of a few layers, as the papers' 2 GB for a 7B model (0.40 GB a layer),
then still pins the draft and shallow-verifier layers, where counting the
buffer inside it would leave two resident layers beside a double buffer. Layers P+1..N stream
from the device's storage tier into the buffer chunk by chunk, in layer order,
one chunk after another (never two at once), every cycle. A chunk starts
streaming as soon as a buffer slot is free, so the next cycle's first chunks
load while this cycle finishes and while the next one drafts: flash transfers
overlap compute wherever the buffer allows, as far as the storage tier's
``stream_overlap_fraction`` lets them (a fitted Jetson AGX Orin overlaps none:
its streams and the GPU's passes serialize; ``docs/flash.md``). Every policy here pins as many
layers as fit, so CATS and its AR baseline stream the same layers; CATS needs
P >= L_SV, Kangaroo P >= L_DM.

CATS cycle: gamma draft passes through layers 1..L_DM (+ draft adapter), one
shallow-verifier pass over the gamma positions through L_DM+1..L_SV (+ SV
adapter), the last draft token and ``corrections`` correction tokens
re-forwarded through 1..L_SV under tree masking (resident layers: no flash
traffic), one tree-masked target pass through L_SV+1..N over the main branch
and the correction branches; the longest accepted prefix plus one token is
committed. Kangaroo: gamma draft passes through 1..L_DM, then one verification
pass over all N layers and the gamma + 1 positions.

Handles: a Forward whose ``inputs`` is a tuple takes its positions from those
Forwards' hidden states in order (the shallow verifier reads the gamma draft
passes' layer-L_DM states; the target pass reads the verifier's and the
re-forward's layer-L_SV states). The shallow verifier names ``top_k =
corrections + 1`` candidates at each position and the re-forward carries
``Feed.corrections``, which tells a real runtime which correction tokens it
feeds; every StreamWeights carries the buffer's size (``buffer_layers``).

``mean_accepted`` (tokens committed per cycle, bonus included, the papers'
beta+1) becomes the verify's outcome model, a mean of ``mean_accepted - 1``
accepted tokens (``stream_outcomes``): the simulator then draws accepted
lengths whose mean is that (exactly that in deterministic mode); a real
executor never sees it and reports the models' own acceptance. Without it the
run's acceptance model (e.g. ``alpha``) decides.

Metrics: ``bytes_per_token_gb`` is the papers' figure, decoder-layer weight
bytes of the gamma draft passes, the shallow-verifier pass and the target pass
(Kangaroo: the full verification pass) per committed token;
``flash_bytes_per_token_gb`` counts the bytes that really crossed flash -> DRAM;
``layer_bytes_read_per_token_gb`` counts every decoder-layer read, re-forwards
included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from hwprofiles.models import ModelSpec
from policies.base import (LawCosts, OutcomeModels, PolicyContext, PolicyError, VerifyModel,
                           register)
from policies.declared import Count, Default, LawView, Positive, Tuned, check
from policies.flashstream import FlashStreamer, Plan, StreamParams, plan_memory, target_pass
from policies.ops import SAMPLE, Feed, Forward, Head, TopK, Verify

ADAPTER_HEADS = {"norm": Head("exit"), "transformer": Head("exit_layer")}


class KangarooParams(StreamParams):
    gamma: int = Field(5, ge=1, le=64, description="draft tokens per cycle")
    l_dm: int = Field(3, ge=1, description="layers of the draft (1..L_DM)")
    mean_accepted: float | None = Field(
        None, ge=1, description="tokens committed per cycle, bonus included (beta+1); "
                                "default: from the acceptance model")
    adapter: Literal["norm", "transformer"] = Field(
        "transformer", description="adapter heads: norm + projection, or one decoder "
                                   "layer before them")


class CATSParams(KangarooParams):
    l_sv: int | None = Field(None, ge=2, description="last layer of the shallow verifier "
                                                     "(default: the deepest that fits)")
    corrections: int = Field(1, ge=0, le=64, description="correction tokens re-forwarded and "
                                                  "verified as tree branches per cycle")


def _stream_baseline(p: StreamParams) -> tuple[str, dict]:
    return "ar_stream", {"dram_budget_gb": p.dram_budget_gb, "chunk_layers": p.chunk_layers,
                         "buffer_chunks": p.buffer_chunks,
                         "buffer_in_budget": p.buffer_in_budget}


def _self_baseline(p: StreamParams) -> tuple[str, dict]:
    return "ar_stream", p.model_dump(exclude_unset=True)


class _Ledger:
    """Decoder-layer bytes per committed token: papers' count and every read."""

    def __init__(self, plan: Plan, streamer: FlashStreamer):
        self.plan, self.streamer = plan, streamer
        self.paper_layers = 0
        self.read_layers = 0

    def metrics(self, tokens: float, steps: int) -> dict:
        per_token_gb = self.plan.layer_bytes / 1e9 / tokens
        return {"steps": steps, "tokens": tokens,
                "bytes_per_token_gb": self.paper_layers * per_token_gb,
                "layer_bytes_read_per_token_gb": self.read_layers * per_token_gb,
                "flash_bytes_per_token_gb": self.streamer.flash_bytes / 1e9 / tokens,
                "resident_layers": self.plan.resident,
                "streamed_layers": self.plan.n_layers - self.plan.resident}


# closed forms (``hetspec law``) ------------------------------------------------
def cats_law(layer_gb: Positive, n_layers: Count, gamma: Count, l_dm: Count,
         mean_accepted: Positive, l_sv: Count | None = None) -> dict:
    """Bytes of decoder weights read per committed token:
    CATS (gamma B_DM + B_SV + B_target)/(beta+1); without l_sv, Kangaroo
    (gamma B_DM + B_all)/(beta+1). mean_accepted is beta+1."""
    check(layer_gb > 0, "layer_gb must be > 0")
    check(1 <= l_dm < n_layers, "l_dm must lie in [1, n_layers)")
    check(gamma >= 1, "gamma (draft passes per cycle) must be >= 1")
    check(1 <= mean_accepted <= gamma + 1,
           "mean_accepted (tokens committed per cycle, bonus included) must lie in "
           "[1, gamma + 1]")
    b_dm = l_dm * layer_gb
    if l_sv is None:
        per_cycle = gamma * b_dm + n_layers * layer_gb
    else:
        check(l_dm < l_sv < n_layers, "l_sv must lie in (l_dm, n_layers)")
        per_cycle = gamma * b_dm + (l_sv - l_dm) * layer_gb + (n_layers - l_sv) * layer_gb
    return {"bytes_per_token_gb": per_cycle / mean_accepted, "bytes_per_cycle_gb": per_cycle}


def kangaroo_law(layer_gb: Positive, n_layers: Count, gamma: Count, l_dm: Count,
             mean_accepted: Positive) -> dict:
    """Kangaroo's two-stage bytes per token (draft 1..L_DM, verify all N layers)."""
    return cats_law(layer_gb, n_layers, gamma, l_dm, mean_accepted)


# law terms ---------------------------------------------------------------------
@dataclass(frozen=True)
class StreamTerms:
    """Bytes per committed token of one streaming run's settings over budgets."""

    policy: str
    params: StreamParams
    ctx: PolicyContext
    layer_gb: float
    mean: float  # tokens committed per cycle (1 for AR)
    law_gb: float  # the law's decoder-weight bytes read per token

    def streamed_gb(self, budget_gb: float) -> float | None:
        """Flash bytes per token: the layers the policy's memory plan streams."""
        try:
            p = plan_memory(self.ctx, self.params.model_copy(
                update={"dram_budget_gb": budget_gb}), self.policy).resident
        except PolicyError:  # the budget cannot hold the stream buffer
            return None
        return (self.ctx.target.n_layers - p) * self.layer_gb / self.mean

    def metrics(self) -> dict:
        """What a deterministic run at these terms measures: decoder-weight bytes
        read per committed token and, under a budget, those streamed from flash."""
        out = {"bytes_per_token_gb": self.law_gb}
        if self.params.dram_budget_gb is not None:
            out["flash_bytes_per_token_gb"] = self.streamed_gb(self.params.dram_budget_gb)
        return out


def ar_stream_law_terms(costs: LawCosts, ctx: PolicyContext,
                        params: StreamParams) -> StreamTerms:
    """AR reads every decoder layer once per token."""
    n, layer_gb = ctx.target.n_layers, ctx.target.layer_bytes / 1e9
    return StreamTerms("ar_stream", params, ctx, layer_gb, 1.0, n * layer_gb)


def _staged_terms(costs: LawCosts, ctx: PolicyContext, params: KangarooParams, policy: str,
                  law, law_args: tuple) -> StreamTerms:
    """A staged schedule's terms: its closed form ``law`` at the run's mean tokens
    per cycle, with ``law_args`` after it."""
    n, layer_gb = ctx.target.n_layers, ctx.target.layer_bytes / 1e9
    mean = params.mean_accepted or 1 + costs.mean_accepted(params.gamma)
    found = law(layer_gb, n, params.gamma, params.l_dm, mean, *law_args)
    return StreamTerms(policy, params, ctx, layer_gb, mean, found["bytes_per_token_gb"])


def kangaroo_law_terms(costs: LawCosts, ctx: PolicyContext,
                       params: KangarooParams) -> StreamTerms:
    """Kangaroo's two stages: gamma drafts over 1..L_DM, a verify over all layers."""
    return _staged_terms(costs, ctx, params, "kangaroo", kangaroo_law, ())


def cats_law_terms(costs: LawCosts, ctx: PolicyContext,
                   params: CATSParams) -> StreamTerms:
    """CATS' three stages; the law's total does not depend on L_SV (any valid
    one gives it)."""
    return _staged_terms(costs, ctx, params, "cats", cats_law, (params.l_sv or params.l_dm + 1,))


# schedules ---------------------------------------------------------------------------
# the three streaming schedules share their comparison's DRAM budget and law figure
def _half_the_decoder_gb(target: ModelSpec) -> float:
    """Half the target's decoder weights, in GB: the memory-limited regime."""
    return round(0.5 * target.n_layers * target.layer_bytes / 1e9, 2)


STREAM_BUDGET = Default("dram_budget_gb", _half_the_decoder_gb, meaning=(
    "dram_budget_gb is the memory the weight-streaming schedules (cats, kangaroo, "
    "ar_stream) keep resident: half the target's decoder weights unless --set gives it, "
    "the memory-limited regime they are made for."))
STREAM_VIEW = LawView("CATS: bytes per token vs DRAM budget", "dram_budget",
                      along=("dram_budget_gb",))


@register("ar_stream", StreamParams, streams_weights=True, baseline=_self_baseline,
          law_terms=ar_stream_law_terms, law_views=(STREAM_VIEW,), defaults=(STREAM_BUDGET,),
          fits_profile=True)
def ar_stream(ctx: PolicyContext, params: StreamParams):
    """Autoregressive decoding under a DRAM budget, streaming what does not fit."""
    plan = plan_memory(ctx, params, "ar_stream")
    return _ar_stream(ctx, plan, FlashStreamer(plan, params.buffer_chunks))


def _ar_stream(ctx: PolicyContext, plan: Plan, streamer: FlashStreamer):
    ledger, b = _Ledger(plan, streamer), ctx.batch
    yield from streamer.fill()
    done, steps = 0.0, 0
    while done < ctx.budget:
        logits = yield from target_pass(streamer, 0, 1, b, ctx.context(done / b))
        verdict = yield Verify(0, b, target=logits, label="sample")
        done += verdict.tokens
        steps += 1
        ledger.paper_layers += plan.n_layers
        ledger.read_layers += plan.n_layers
    streamer.stopped = True
    return ledger.metrics(done, steps)


def _check_mean(params: KangarooParams, policy: str) -> None:
    m = params.mean_accepted
    if m is not None and m > params.gamma + 1:
        raise PolicyError(f"{policy}: mean_accepted={m:g} exceeds gamma + 1 = "
                          f"{params.gamma + 1} tokens a cycle can commit; lower it or "
                          "raise gamma")


def stream_outcomes(ctx: PolicyContext, params: KangarooParams) -> OutcomeModels:
    """The verify's modelled mean, when ``mean_accepted`` gives one."""
    m = params.mean_accepted
    return {} if m is None else {"verify": VerifyModel(expected=m - 1)}


def _drafts(params: KangarooParams, batch: int, context: int):
    """The gamma draft passes; returns their handles (layer-L_DM hidden states)."""
    head, handles = ADAPTER_HEADS[params.adapter], []
    for i in range(params.gamma):
        handles.append((yield Forward("target", "target", (0, params.l_dm), 1, batch,
                                      context + i, head=head, emit=SAMPLE,
                                      label="draft")))
    return tuple(handles)


@register("kangaroo", KangarooParams, streams_weights=True, baseline=_stream_baseline,
          outcome_models=stream_outcomes, law_terms=kangaroo_law_terms, tuned=Tuned("gamma"),
          laws={"kangaroo": kangaroo_law}, law_views=(STREAM_VIEW,), defaults=(STREAM_BUDGET,))
def kangaroo(ctx: PolicyContext, params: KangarooParams):
    """Kangaroo: draft with layers 1..L_DM + adapter, verify with the whole model."""
    if params.l_dm >= ctx.target.n_layers:
        raise PolicyError(f"kangaroo: l_dm={params.l_dm} must be below the target's "
                          f"{ctx.target.n_layers} layers; choose e.g. l_dm=3")
    _check_mean(params, "kangaroo")
    plan = plan_memory(ctx, params, "kangaroo", params.l_dm, "l_dm")
    return _kangaroo(ctx, params, plan)


def _kangaroo(ctx, params: KangarooParams, plan: Plan):
    streamer = FlashStreamer(plan, params.buffer_chunks)
    ledger, b, gamma, l_dm = _Ledger(plan, streamer), ctx.batch, params.gamma, params.l_dm
    yield from streamer.fill()
    done, steps = 0.0, 0
    while done < ctx.budget:
        context = ctx.context(done / b)
        yield from _drafts(params, b, context)
        logits = yield from target_pass(streamer, 0, gamma + 1, b, context, "verify")
        verdict = yield Verify(gamma, b, target=logits, label="verify")
        done += verdict.tokens
        steps += 1
        ledger.paper_layers += gamma * l_dm + plan.n_layers
        ledger.read_layers += gamma * l_dm + plan.n_layers
    streamer.stopped = True
    return ledger.metrics(done, steps)


@register("cats", CATSParams, streams_weights=True, baseline=_stream_baseline,
          outcome_models=stream_outcomes, law_terms=cats_law_terms, tuned=Tuned("gamma"),
          laws={"cats": cats_law}, law_views=(STREAM_VIEW,), defaults=(STREAM_BUDGET,))
def cats(ctx: PolicyContext, params: CATSParams):
    """CATS: draft, shallow verifier and flash-streamed tree-masked target pass."""
    n = ctx.target.n_layers
    _check_mean(params, "cats")
    if params.l_dm >= n - 1:
        raise PolicyError(f"cats: l_dm={params.l_dm} leaves no layers for the shallow "
                          f"verifier and the target pass of {n}; choose e.g. l_dm=3")
    l_sv = params.l_sv
    if l_sv is None:  # the deepest verifier the budget holds, at least l_dm + 1
        l_sv = max(min(plan_memory(ctx, params, "cats").resident, n - 1), params.l_dm + 1)
    if not params.l_dm < l_sv < n:
        raise PolicyError(f"cats: l_sv={l_sv} must lie between l_dm={params.l_dm} and the "
                          f"target's {n} layers; choose e.g. l_sv={min(n - 1, 15)}")
    plan = plan_memory(ctx, params, "cats", l_sv, "l_sv", params.l_dm + 1)
    return _cats(ctx, params, plan, l_sv)


def _cats(ctx, params: CATSParams, plan: Plan, l_sv: int):
    streamer = FlashStreamer(plan, params.buffer_chunks)
    ledger, b = _Ledger(plan, streamer), ctx.batch
    gamma, l_dm, extra = params.gamma, params.l_dm, params.corrections
    head = ADAPTER_HEADS[params.adapter]
    yield from streamer.fill()
    done, steps = 0.0, 0
    while done < ctx.budget:
        context = ctx.context(done / b)
        drafts = yield from _drafts(params, b, context)
        sv = yield Forward("target", "target", (l_dm, l_sv), gamma, b, context, head=head,
                           emit=TopK(extra + 1), feed=Feed(drafts), label="shallow verify")
        tail = yield Forward("target", "target", (0, l_sv), 1 + extra, b, context + gamma,
                             feed=Feed(corrections=extra), label="correction re-forward")
        logits = yield from target_pass(streamer, l_sv, gamma + 1 + extra, b, context,
                                        inputs=(sv, tail))
        verdict = yield Verify(gamma, b, target=logits, label="verify")
        done += verdict.tokens
        steps += 1
        ledger.paper_layers += gamma * l_dm + plan.n_layers - l_dm
        ledger.read_layers += gamma * l_dm + plan.n_layers - l_dm + l_sv
    streamer.stopped = True
    return ledger.metrics(done, steps) | {"l_sv": l_sv}
