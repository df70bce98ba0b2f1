"""Weight streams as fitted terms: each stream's read, and the wait before it.

A schedule under a DRAM budget streams its layers one after another
(``policies.cats.FlashStreamer``): a stream is free to start once the stream
before it has ended and a buffer slot is free, that is once the Forward that
released the slot has ended. The torch executor then still needs a round trip
before the read begins (the previous read's reply reaches the coordinator,
which sends the next command to a worker whose core is computing): on
cpu-local, ~0.4 ms when the core is idle and ~2 ms beside a Forward, per
streamed layer. ``dispatch_gaps`` measures that wait for every stream, and
the cost model charges it as ``Device.stream_dispatch_s``
(``simcore.costmodel.dispatch_terms``).

Stream spans and their waits are fitted on their total per run and kind
(``merge_by_kind``), not span by span: their durations are bimodal on
cpu-local (every third read of a layer takes ~1.6x as long) and the waits
spread over 0.05-3 ms, so the robust per-span fit would take the common
mode, while tokens/s follow the mean.
"""

from __future__ import annotations

import bisect

from analyses.costfit import Term

DISPATCH_KIND = "StreamWeights dispatch"  # the op kind of a stream's wait


def dispatch_gaps(spans: list[dict], placement: dict) -> dict[int, float]:
    """Span index of each StreamWeights span -> seconds from when it was free to
    start (the previous stream of its device and prompt batch ended, and the
    latest Forward on that device before it, which may have freed its buffer
    slot, ended) to its start. A batch's first stream has no previous one and
    no entry; a Forward ending later than the slot's (a draft pass beside the
    stream) only shortens the wait measured."""
    forward_ends: dict[tuple, list[float]] = {}
    streams: dict[tuple, list[int]] = {}
    for i, s in enumerate(spans):
        batch, kind = s.get("prompt_batch", 0), s["op"]["type"]
        if kind == "Forward":
            forward_ends.setdefault((batch, s.get("device")), []).append(s["end_s"])
        elif kind == "StreamWeights":
            role = s["op"].get("device")
            streams.setdefault((batch, placement.get(role, role)), []).append(i)
    for ends in forward_ends.values():
        ends.sort()
    out = {}
    for (batch, device), order in streams.items():
        ends = forward_ends.get((batch, device), [])
        order.sort(key=lambda i: spans[i]["start_s"])
        for prev, i in zip(order, order[1:]):
            start = spans[i]["start_s"]
            k = bisect.bisect_right(ends, start)
            ready = max(spans[prev]["end_s"], ends[k - 1] if k else float("-inf"))
            out[i] = max(0.0, start - ready)
    return out


def merge_by_kind(terms: list[Term], kinds: tuple[str, ...]) -> list[Term]:
    """The terms whose op kind starts with one of ``kinds`` summed into one term
    per kind (measured and predicted times both add); the others as they are."""
    merged: dict[str, Term] = {}
    out = []
    for t in terms:
        if not t.op_kind.startswith(kinds) or t.passes:
            out.append(t)
            continue
        into = merged.get(t.op_kind)
        if into is None:
            into = merged[t.op_kind] = Term(0.0, t.op_kind, t.run)
            out.append(into)
        into.measured_s += t.measured_s
        into.fixed_s += t.fixed_s
        into.linear.extend(t.linear)
        into.inverse.extend(t.inverse)
    return out
