"""How the executor observes a schedule's yes/no events (``Outcome``) for real,
and what it must know of a policy's layout beyond the operations.

The simulator draws an Outcome from its modelled probability; the executor
looks at the models' actual state instead. Each observer is
``fn(coordinator, op) -> bool`` (or ``Wait`` for replies still owed).
"""

from __future__ import annotations

from executors.trees import observe_on_path

OBSERVERS = {
    "reuse": observe_on_path,      # Mirror-SD: the corrected prefix is on the window
    "cache_hit": observe_on_path,  # SSD: the verify's outcome was pre-speculated
}


def hints_for(policy: str, params) -> dict:
    """Layout facts a policy documents for executors (SSD's fan-out F_k, CATS's
    correction branches per cycle)."""
    if hasattr(params, "buffer_chunks"):  # schedules streaming weights from storage
        hints = {"buffer_layers": params.buffer_chunks * params.chunk_layers}
        if getattr(params, "corrections", 0):  # CATS: correction branches per cycle
            hints["corrections"] = params.corrections
        return hints
    if policy == "ssd":
        from policies.ssd import fanout_of

        fanout = fanout_of(params)
        return {"fanout": fanout, "top": max(8, max(fanout) + 2)}
    return {}
