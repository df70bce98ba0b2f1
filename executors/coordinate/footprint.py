"""What a schedule will touch, learnt by dry-running it before the real run.

The executor must know which models run on which placement roles, and how deep,
to start the right devices with the right weights and to fill their KV caches
with the prompt before the clock starts (the simulator's prologue finds the
same caches the same way, ``policies.prefill``). A policy is a plain generator, so a dry run costs nothing:
drive a fresh schedule with stand-in results for its first steps and note
every Forward's (device role, model, deepest layer).
"""

from __future__ import annotations

from policies.ops import (Forward, Join, Lookup, Outcome, Parallel, Spawn, StreamWeights, Verdict,
                          Verify, drive, widest_lookup)

DRY_STEPS = 3
DRY_OPS = 5000


class _Stop(Exception):
    pass


def footprint(schedule, batch: int) -> dict[tuple[str, str, int], int]:
    """{(device role, model role, row width): deepest layer stop} of a schedule's
    Forwards (width: rows per sequence, above 1 for speculation trees),
    {("stream", device role, model role): layers it streams from storage} and,
    when it streams, {"buffer_layers": the largest buffer its StreamWeights ask}."""
    seen: dict[tuple[str, str, int], int] = {"batch": batch}
    budget = {"ops": DRY_OPS, "verifies": DRY_STEPS}
    try:
        _drive(schedule, seen, budget)
    except _Stop:
        pass
    del seen["batch"]
    return seen


def _drive(gen, seen, budget):
    def answer(op):
        budget["ops"] -= 1
        if budget["ops"] <= 0:
            raise _Stop
        return _stand_in(op, seen, budget)
    return drive(gen, answer)


def _stand_in(op, seen, budget):
    if isinstance(op, Forward):
        key = (op.device, op.model, max(1, op.batch // seen["batch"]))
        seen[key] = max(seen.get(key, 0), op.layers[1])
        return object()
    if isinstance(op, StreamWeights):
        key = ("stream", op.device, op.model)
        seen[key] = seen.get(key, frozenset()) | frozenset(range(*op.layers))
        seen["buffer_layers"] = max(seen.get("buffer_layers", 1), op.buffer_layers)
        return None
    if isinstance(op, Verify):
        budget["verifies"] -= 1
        if budget["verifies"] < 0:
            raise _Stop
        return Verdict((0,) * op.batch)
    if isinstance(op, Outcome):
        return False
    if isinstance(op, Lookup):  # the widest pass a lookup can lead to
        return widest_lookup(op)
    if isinstance(op, Spawn):
        return _drive(op.branch, seen, budget)
    if isinstance(op, Join):
        return tuple(op.tasks)
    if isinstance(op, Parallel):
        return tuple(_drive(b, seen, budget) for b in op.branches)
    return getattr(op, "payload", None)
