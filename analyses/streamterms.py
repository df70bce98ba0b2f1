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

Stream spans and their waits are fitted on their totals per run
(``merge_streams``), not span by span: on cpu-local the reads of one layer's
14 MB differ by layer (in an ar_stream run layers 12, 15, ..., 27 took ~1.6x
the others' time, every cycle) and the waits spread over 0.05-3 ms, so a
robust per-span fit would take the common mode, while tokens/s follow the
totals.
"""

from __future__ import annotations

import bisect

from analyses.costfit import Term

DISPATCH_KIND = "StreamWeights: waits before the reads"  # op kind of the waits, summed
STREAMS_KIND = "StreamWeights: every stream"  # op kind of the streams, summed


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


def merge_streams(terms: list[Term]) -> list[Term]:
    """Every StreamWeights term of a run summed into one, and every wait into
    another (measured and predicted times both add; module docstring); the
    other terms as they are. A total of 0 (no stream waited) is left out."""
    merged: dict[str, Term] = {}
    out = []
    for t in terms:
        if not t.op_kind.startswith("StreamWeights") or t.passes:
            out.append(t)
            continue
        kind = DISPATCH_KIND if t.op_kind == DISPATCH_KIND else STREAMS_KIND
        into = merged.get(kind)
        if into is None:
            into = merged[kind] = Term(0.0, kind, t.run)
            out.append(into)
        into.measured_s += t.measured_s
        into.fixed_s += t.fixed_s
        into.linear.extend(t.linear)
        into.inverse.extend(t.inverse)
    return [t for t in out if t.measured_s > 0]
