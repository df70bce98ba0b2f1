"""One batch decoded: devices ready, caches prefilled, the schedule run to its budget.

The clock of ``BatchResult.wall_s`` starts after the prefill (timed apart as
``prefill_s``). The token budget is over every row: while a row is short, the
schedule runs again for the tokens still missing.
"""

from __future__ import annotations

import time
from dataclasses import replace

from executors.coordinate.book import Sequences
from executors.coordinate.coordinator import Coordinator
from executors.coordinate.observers import OBSERVERS
from executors.session.devices import Devices
from executors.session.options import BatchResult, Options
from executors.session.plan import BatchPlan
from executors.session.prefill import prefill, set_streams


def decode_batch(plan: BatchPlan, prompts: list[list[int]], devices: Devices,
                 opts: Options) -> BatchResult:
    """Decode ``prompts`` with the planned schedule on the session's devices."""
    clients = devices.start(plan.uses, len(prompts))
    seqs = Sequences.start(prompts)
    loaded = devices.models
    coord = Coordinator(clients, devices.placement, seqs, loaded.n_layers,
                        temperature=opts.temperature, observers=OBSERVERS,
                        adapters=loaded.adapters, ahead=loaded.ahead)
    start_s = time.perf_counter()  # streamed layers load once for the prefill
    set_streams(devices, plan.streams, plan.buffer_layers, restore=True)
    prefill(coord, devices.placement, plan.uses)
    prefill_s = time.perf_counter() - start_s
    set_streams(devices, plan.streams, plan.buffer_layers, restore=False)
    coord.t0 = time.perf_counter()
    stats = run_to_budget(coord, plan, opts.max_new_tokens)
    wall_s = time.perf_counter() - coord.t0
    coord.drain()
    generated = [seqs.generated(r) for r in range(seqs.batch)]
    return BatchResult(generated, wall_s, coord.steps, coord.spans, coord.acceptance,
                       stats if isinstance(stats, dict) else {}, prefill_s)


def run_to_budget(coord: Coordinator, plan: BatchPlan, max_new_tokens: int):
    """Run the schedule, then again for the tokens the shortest row still lacks,
    until every row has ``max_new_tokens``; the first run's stats."""
    seqs = coord.seqs
    stats = coord.run(plan.schedule())
    short = max_new_tokens - min(len(seqs.generated(r)) for r in range(seqs.batch))
    while short > 0:  # the budget is over all rows: run on until every row is done
        more = replace(plan.ctx, tokens=short, prompt_tokens=plan.ctx.prompt_tokens + short)
        coord.drain()
        coord.run(plan.schedule(more))
        short = max_new_tokens - min(len(g) for g in map(seqs.generated, range(seqs.batch)))
    return stats
