"""Weight streams as fitted terms: each stream's read, and the wait before it.

A schedule under a DRAM budget streams its layers one after another
(``policies.flashstream.FlashStreamer``): a stream is free to start once the stream
before it has ended and a buffer slot is free, that is once the Forward that
released the slot has ended. The torch executor then still needs a round trip
before the read begins: the previous read's reply reaches the coordinator,
which sends the next command to the worker, whose core first finishes the
Forward the coordinator sent with it (the chunk that had just arrived), then
issues the read. The simulator charges this as ``Device.stream_dispatch_s``
on the device's compute stream, queued behind the compute before it
(``simcore.engine``). ``dispatch_gaps`` measures each stream's wait and the
compute its device ran meanwhile; the fit takes the wait as that compute plus
``stream_dispatch_s`` (``simcore.costmodel.dispatch_terms``).

Stream spans and their waits are fitted on their totals per run
(``merge_streams``), not span by span: on cpu-local the reads of one layer's
14 MB differ by layer (in an ar_stream run layers 12, 15, ..., 27 took ~1.7x
the others' time, every cycle) and the waits spread (10th-90th percentile
0.7-3.4 ms in an ar_stream run, 0.7-13 ms in a kangaroo run), so a robust
per-span fit would take the common mode, while tokens/s follow the totals.
"""

from __future__ import annotations

from analyses.calibrate.costfit import Term
from hwprofiles.schema import Placement
from policies.runs.measured import MeasuredSpan

DISPATCH_KIND = "StreamWeights: waits before the reads"  # op kind of the waits, summed
STREAMS_KIND = "StreamWeights: every stream"  # op kind of the streams, summed


def dispatch_gaps(spans: list[MeasuredSpan], placement: dict,
                  slots: int) -> dict[int, tuple[float, float]]:
    """Span index of each StreamWeights span -> (seconds from when it was free to
    start to its start, seconds of that time its device was computing). Free to
    start: the stream before it (on its device, in its prompt batch) has ended,
    and so has the Forward that freed its buffer slot, the first Forward over the
    chunk streamed ``slots`` streams earlier (the buffer's size,
    ``buffer_chunks``) after that chunk arrived. A batch's first stream has no
    wait measured."""
    placement = Placement(placement)
    forwards: dict[tuple, list[MeasuredSpan]] = {}
    streams: dict[tuple, list[int]] = {}
    for i, s in enumerate(spans):
        batch, kind = s.batch, s.type
        if kind == "Forward":
            forwards.setdefault((batch, s.device), []).append(s)
        elif kind == "StreamWeights":
            role = s.op.get("device")
            streams.setdefault((batch, placement[role]), []).append(i)
    out = {}
    for key, order in streams.items():
        order.sort(key=lambda i: spans[i].start_s)
        mine = sorted(forwards.get(key, []), key=lambda f: f.start_s)
        for m in range(1, len(order)):
            stream = spans[order[m]]
            ready = spans[order[m - 1]].end_s
            if m >= slots:
                ready = max(ready, _freed_s(spans[order[m - slots]], mine, stream.start_s))
            start = stream.start_s
            out[order[m]] = (max(0.0, start - ready), _busy_s(mine, ready, start))
    return out


def _busy_s(forwards: list[MeasuredSpan], a: float, b: float) -> float:
    """Seconds of [a, b] during which one of the Forwards (sorted by start) ran."""
    total, reach = 0.0, a
    for f in forwards:
        lo, hi = max(f.start_s, reach), min(f.end_s, b)
        if hi > lo:
            total, reach = total + hi - lo, hi
    return total


def _freed_s(chunk: MeasuredSpan, forwards: list[MeasuredSpan], before_s: float) -> float:
    """When the first Forward over a streamed chunk's layers, after it arrived,
    ended (-inf: none ended before ``before_s``)."""
    layers = list(chunk.op["layers"])
    for f in forwards:
        if f.start_s >= chunk.end_s and list(f.op["layers"]) == layers:
            return f.end_s if f.end_s <= before_s else float("-inf")
    return float("-inf")


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
