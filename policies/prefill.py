"""Prompt processing (prefill): the prologue every schedule runs before decoding.

A decoding schedule starts with the prompt's ``prompt_tokens`` positions in every
KV cache it reads (``PolicyContext.context(0)``). The prologue computes them: a
Forward over the prompt's positions through every layer range the schedule runs,
with no head (the schedule's first step produces the first token, as in the
executor, whose prefill leaves the prompt's last token to that step).

Which caches need the prompt is read off the schedule itself, so a new schedule
gets its prefill without code of its own: its dry run (``policies.dryrun``, the
one the executor's footprint and the memory check ask too) notes, per (device
role, model), the layers its Forwards run and the layers it streams from storage.
Each such *segment* is prefilled:

  * the target on its device or group, a separate draft on the draft's, a
    self-draft's layers on the draft's device (they keep their own cache there);
  * segments of one model that continue each other on different devices (PPSD's
    stages: stage k starts where stage k-1 stops) form a *lane*: the prompt's
    activations travel from stage to stage (one Transfer per chunk and hop);
  * layers a schedule streams from flash (cats, kangaroo, ar_stream) stream once
    for the prefill, chunk by chunk in the schedule's own chunks, each chunk's
    load starting once a buffer slot is free (as many slots as the schedule
    fills before its first streamed pass), and every prompt chunk passes
    through a weight chunk while it is in memory (layer-major order).

Chunked prefill (``prefill_chunk`` = C): the prompt is cut into passes of C
positions, chunk i attending to the i*C positions before it (``context``), so the
chunks' FLOPs sum to the attention a causal pass over the prompt does, and each
pass reads the layers' weights again. Lanes run concurrently (different devices
work in parallel; roles on one device queue on it), chunks pipeline along a
lane. Decoding starts when every segment holds the prompt.

The prologue runs at every prompt length, the default 128 included: ``ttft_s``
counts it, while the decode metrics (tokens/s, step latency, speedup over AR,
every law in deterministic mode) never include it and are exactly what the
decoding alone gives (``analyses.run.api.run_schedule`` simulates the prologue
first, on its own, and the decoding from time 0 as before).

Not prefilled: an exit head's own decoder layer (``exit_layer`` heads: one
layer beside the model's N) and the extra rows of speculation trees (Mirror's
kappa roots, SSD's outcome rows), which copy their sequence's cache.
"""

from __future__ import annotations

from collections import deque

from policies.base import PolicyContext, PolicyError, PolicyParams, build
from policies.dryrun import Segment, dry_run
from policies.ops import OWN, Feed, Forward, Join, Parallel, Spawn, StreamWeights, Transfer

LABEL = "prefill"
MAX_PREFILL_PASSES = 65_536  # prompt chunks; beyond it the simulation would crawl


def segments_of(schedule) -> list[Segment]:
    """The segments a decoding schedule reads the prompt's KV cache in, in the
    order it first uses them (``policies.dryrun``)."""
    return dry_run(schedule).segments


def lanes_of(segments: list[Segment]) -> list[list[Segment]]:
    """Segments chained into lanes: a segment starting at layer s > 0 continues
    the lane of the same model whose last segment stops at s."""
    lanes: list[list[Segment]] = []
    for seg in sorted(segments, key=lambda s: s.start):
        host = next((lane for lane in lanes if seg.start > 0
                     and lane[-1].model == seg.model and lane[-1].stop == seg.start), None)
        if host is None:
            lanes.append([seg])
        else:
            host.append(seg)
    order = {id(s): i for i, s in enumerate(segments)}
    return sorted(lanes, key=lambda lane: order[id(lane[0])])


def chunks_of(prompt_tokens: int, chunk: int | None) -> list[tuple[int, int]]:
    """(positions, context) of each prefill pass: one pass over the prompt, or
    passes of ``chunk`` positions, each attending to the positions before it."""
    if prompt_tokens <= 0:
        return []
    size = prompt_tokens if chunk is None else chunk
    if size < 1:
        raise PolicyError(f"prefill_chunk must be at least 1, not {size}; pass e.g. "
                          "--set prefill_chunk=512")
    passes = -(-prompt_tokens // size)
    if passes > MAX_PREFILL_PASSES:
        raise PolicyError(f"prefill_chunk={size} cuts prompt_tokens={prompt_tokens:,} into "
                          f"{passes:,} passes, over the cap of {MAX_PREFILL_PASSES:,}; "
                          "raise prefill_chunk")
    return [(min(size, prompt_tokens - a), a) for a in range(0, prompt_tokens, size)]


def _spec(ctx: PolicyContext, model: str):
    return ctx.target if model == "target" or ctx.draft is None else ctx.draft


def _pass(seg: Segment, layers: tuple[int, int], n: int, context: int, batch: int,
          inputs=None) -> Forward:
    return Forward(seg.model, seg.device, layers, n, batch, context,
                   feed=OWN if inputs is None else Feed(inputs), collectives=seg.collectives,
                   label=LABEL)


def _journey(ctx: PolicyContext, lane: list[Segment], n: int, context: int):
    """One prompt chunk along a lane of resident segments."""
    handle, b = None, ctx.batch
    for i, seg in enumerate(lane):
        if i:
            spec = _spec(ctx, seg.model)
            yield Transfer(lane[i - 1].device, seg.device,
                           n * b * spec.hidden * spec.dtype_bytes, payload=handle,
                           label=f"{LABEL} activations")
        handle = yield _pass(seg, (seg.start, seg.stop), n, context, b, handle)


class _OnePass:
    """The weight chunks of one segment, streamed once: a chunk's load waits for
    the load before it (one flash read at a time) and for a free buffer slot."""

    def __init__(self, seg: Segment, spec):
        self.seg, self.spec = seg, spec
        self.todo = deque(seg.streamed)
        self.pending: deque = deque()
        self.last = None

    def _load(self, previous, layers):
        if previous is not None:
            yield Join((previous,))
        nbytes = (layers[1] - layers[0]) * self.spec.layer_bytes
        yield StreamWeights(self.seg.device, self.seg.model, layers, nbytes,
                            label=f"{LABEL} stream layers {layers[0]}-{layers[1] - 1}")

    def fill(self):
        while self.todo and len(self.pending) < max(1, self.seg.slots):
            layers = self.todo.popleft()
            self.last = yield Spawn(self._load(self.last, layers))
            self.pending.append((layers, self.last))

    def take(self):
        _layers, task = self.pending.popleft()
        yield Join((task,))


def pieces(seg: Segment) -> list[tuple[tuple[int, int], bool]]:
    """A segment's layers in order, as (layer range, streamed): runs of resident
    layers and the streamed chunks."""
    chunk_at = {a: (a, b) for a, b in seg.streamed}
    out, i = [], seg.start
    while i < seg.stop:
        if i in chunk_at:
            out.append((chunk_at[i], True))
            i = chunk_at[i][1]
            continue
        j = i + 1
        while j < seg.stop and j not in chunk_at:
            j += 1
        out.append(((i, j), False))
        i = j
    return out


def _streamed(ctx: PolicyContext, seg: Segment, chunks: list[tuple[int, int]]):
    """A segment with streamed layers, layer-major: each piece over every prompt
    chunk, a streamed chunk once loaded (the first loads run under the resident
    layers' passes)."""
    loads = _OnePass(seg, _spec(ctx, seg.model))
    yield from loads.fill()
    for layers, streamed in pieces(seg):
        if streamed:
            yield from loads.take()
        for n, context in chunks:
            yield _pass(seg, layers, n, context, ctx.batch)
        if streamed:
            yield from loads.fill()


def _lane(ctx: PolicyContext, lane: list[Segment], chunks: list[tuple[int, int]]):
    if not any(seg.streamed for seg in lane):
        tasks = []
        for n, context in chunks:  # chunk i+1 enters stage 0 as chunk i leaves it
            tasks.append((yield Spawn(_journey(ctx, lane, n, context))))
        yield Join(tuple(tasks))
        return
    for i, seg in enumerate(lane):  # streamed: each segment over the whole prompt
        if i:
            spec = _spec(ctx, seg.model)
            yield Transfer(lane[i - 1].device, seg.device, ctx.prompt_tokens * ctx.batch
                           * spec.hidden * spec.dtype_bytes, label=f"{LABEL} activations")
        yield from _streamed(ctx, seg, chunks)


def prologue(schedule, ctx: PolicyContext):
    """The prefill of the caches ``schedule`` (a fresh decoding generator, only
    dry-run here) reads, over ``ctx.prompt_tokens`` positions in passes of
    ``ctx.prefill_chunk``; returns {"prefill_passes": Forwards over the prompt}."""
    chunks = chunks_of(ctx.prompt_tokens, ctx.prefill_chunk)
    lanes = lanes_of(segments_of(schedule)) if chunks else []
    if lanes:
        yield Parallel(tuple(_lane(ctx, lane, chunks) for lane in lanes))
    passes = len(chunks) * sum(len(pieces(s)) if s.streamed else 1
                               for lane in lanes for s in lane)
    return {"prefill_passes": passes, "prefill_chunks": len(chunks)}


def build_prefill(name: str, ctx: PolicyContext, params: PolicyParams | dict):
    """The prologue of schedule ``name``: the prompt's prefill of every cache its
    decoding reads, as ordinary operations. ``policies.base.build`` returns the
    decoding alone, whose metrics exclude the prefill."""
    return prologue(build(name, ctx, params), ctx)
