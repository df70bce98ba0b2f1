"""One decode whose rows change between rounds: iteration-level (continuous) batching.

``RunningBatch`` keeps one coordinator and the devices' caches across rounds of
the schedule. A *round* is one run of the schedule for the rows present with a
budget of one token a row, so one step of each row (its Verify commits one or
more tokens); the schedule is the one ``decode_batch`` and the simulator run,
built for the round's batch. Between rounds ``regroup`` lets rows leave (their
requests are done) and sequences join: every device cache and every book of the
coordinator keeps the staying rows and gains empty ones, and the newcomers'
prompts are prefilled into them as a pass of their own (the staying rows' caches
are not touched), before the next round decodes them with the rest.
"""

from __future__ import annotations

import time
from dataclasses import replace

from executors.coordinate.book import Sequences
from executors.coordinate.coordinator import Coordinator
from executors.coordinate.loop import call
from executors.coordinate.observers import OBSERVERS
from executors.session.devices import Devices
from executors.session.options import Options
from executors.session.plan import BatchPlan
from executors.session.prefill import prefill, set_streams


class RunningBatch:
    """Rows decoded together, joined and left between rounds of the schedule."""

    def __init__(self, plan: BatchPlan, devices: Devices, opts: Options):
        self.plan, self.devices = plan, devices
        clients = devices.start(plan.uses, 0)
        loaded = devices.models
        self.seqs = Sequences.start([])
        self.coord = Coordinator(clients, devices.placement, self.seqs, loaded.n_layers,
                                 temperature=opts.temperature, observers=OBSERVERS,
                                 adapters=loaded.adapters, ahead=loaded.ahead)
        self.streams = any(plan.streams.values())  # layers streamed from storage
        set_streams(devices, plan.streams, plan.buffer_layers, restore=False)
        self.coord.t0 = time.perf_counter()

    @property
    def rows(self) -> int:
        return self.seqs.batch

    def generated(self, row: int) -> list[int]:
        return self.seqs.generated(row)

    def regroup(self, keep: list[int], prompts: list[list[int]]) -> float:
        """Rows ``keep`` stay (in that order), one row joins per prompt, its prompt
        prefilled; the prefill's seconds."""
        if any(len(p) < 2 for p in prompts):
            raise ValueError("every prompt needs at least 2 tokens; write a longer prompt")
        first = len(keep)
        call(self.coord.clients, self.coord.regroup(keep, prompts))
        if not prompts:
            return 0.0
        start = time.perf_counter()
        if self.streams:
            set_streams(self.devices, self.plan.streams, self.plan.buffer_layers,
                        restore=True)
        prefill(self.coord, self.devices.placement, self.plan.uses, first)
        if self.streams:
            set_streams(self.devices, self.plan.streams, self.plan.buffer_layers,
                        restore=False)
        return time.perf_counter() - start

    def round(self) -> list[dict]:
        """One step of every row: the schedule run for this batch with a budget of one
        token a row; the acceptance lines (Verify steps) it wrote."""
        if not self.rows:
            raise ValueError("a round needs at least one row")
        seen = len(self.coord.acceptance)
        mean = sum(len(c) for c in self.seqs.committed) // self.rows
        ctx = replace(self.plan.ctx, tokens=1, batch=self.rows, prompt_tokens=mean)
        self.coord.run(self.plan.schedule(ctx))
        self.coord.drain()
        return [a for a in self.coord.acceptance[seen:] if "accepted" in a]
