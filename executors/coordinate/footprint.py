"""What a schedule will touch, learnt by dry-running it before the real run.

The executor must know which models run on which placement roles, and how deep,
to start the right devices with the right weights and to fill their KV caches
with the prompt before the clock starts. It asks the schedule's dry run
(``policies.dryrun``), the one the simulator's prologue and the memory check
ask: every Forward's (device role, model, rows, deepest layer) and what streams.
"""

from __future__ import annotations

from policies.dryrun import dry_run


def footprint(schedule, batch: int) -> dict[tuple[str, str, int], int]:
    """{(device role, model role, row width): deepest layer stop} of a schedule's
    Forwards (width: rows per sequence, above 1 for speculation trees),
    {("stream", device role, model role): layers it streams from storage} and,
    when it streams, {"buffer_layers": the largest buffer its StreamWeights ask}."""
    answer = dry_run(schedule, batch)
    seen: dict = dict(answer.deepest)
    for seg in answer.segments:
        if seg.streamed:
            seen[("stream", seg.device, seg.model)] = frozenset(
                i for a, b in seg.streamed for i in range(a, b))
    if answer.buffer_layers is not None:
        seen["buffer_layers"] = answer.buffer_layers
    return seen
