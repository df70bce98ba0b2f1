"""The work the executor did for a schedule, as a rewriter a replay runs it through.

The executor feeds whatever positions a cache lacks, and samples one token a
pass unless the draft has multi-token heads there (the span's ``multi_token``),
so a measured Forward can be more work than the schedule's: a sampled Forward of
k tokens is k passes (one through multi-token heads), and a draft catching up on the bonus token, or
a speculation tree's first pass re-feeding its rows' prefixes, feeds more
positions (``n_fed``). ``ExecutorWork`` rewrites a schedule's Forwards into the
passes the executor ran for them (the mapping ``analyses.calibrate.terms`` fits the
cost model with, in the other direction), so ``analyses.measured.replay`` can simulate
the work that was measured.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from executors.passes import executor_passes
from policies.ops import Delay, Forward, Head, Parallel, Spawn, Verify
from policies.runs.measured import MeasuredSpan

STEP_END = "step end"  # the zero-length marker a replay puts after each Verify


class ExecutorWork:
    """Rewrites a schedule's Forwards into the passes the executor ran for them
    (``rewrite=False``: leaves them as they are), and marks the end of every step
    with a zero-length Delay labelled ``STEP_END``.

    The measured Forward for a simulated one is found by label, round (Verify
    spans ended before it started) and order within the round; a Forward with
    no measured counterpart runs as the schedule asked."""

    def __init__(self, spans: list[MeasuredSpan], rewrite: bool = True):
        ends = sorted(s.end_s for s in spans if s.type == "Verify")
        self.table: dict[tuple, dict] = {}
        seen: dict[tuple, int] = {}
        for s in sorted(spans, key=lambda s: s.start_s):
            if rewrite and s.type == "Forward":
                key = (s.op.get("label", ""), bisect.bisect_right(ends, s.start_s))
                self.table[key + (seen.get(key, 0),)] = s.op
                seen[key] = seen.get(key, 0) + 1
        self.round, self.counts = 0, {}

    def wrap(self, gen):
        value = None
        while True:
            try:
                op = gen.send(value)
            except StopIteration as stop:
                return stop.value
            if isinstance(op, Spawn):
                value = yield Spawn(self.wrap(op.branch))
            elif isinstance(op, Parallel):
                value = yield Parallel(tuple(self.wrap(b) for b in op.branches))
            elif isinstance(op, Forward):
                value = yield from self._forward(op)
            else:
                value = yield op
                if isinstance(op, Verify):
                    self.round += 1
                    yield Delay(0.0, label=STEP_END)

    def _forward(self, op: Forward):
        key = (op.label, self.round)
        i = self.counts[key] = self.counts.get(key, -1) + 1
        done = self.table.get(key + (i,))
        if done is None:
            return (yield op)
        head, emit = op.head, op.emit
        widths, one = executor_passes(op.n_tokens, done.get("n_fed") or op.n_tokens,
                                      emit and emit.name, head and head.kind,
                                      head and head.tokens, done.get("multi_token") or 0)
        head = head and Head(head.kind, one)
        # the measured positions include any catch-up, which the runtime's book
        # counted (``caught_up``) before the op's own: the replay adds none
        result = yield replace(op, n_tokens=widths[0], head=head,
                               feed=replace(op.feed, catch_up=False),
                               context=op.context - done.get("caught_up", 0))
        for j in range(1, len(widths)):
            result = yield replace(op, n_tokens=1, context=op.context + j, head=head)
        return result
