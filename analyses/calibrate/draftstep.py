"""A published row's second quantity: the draft's time per speculation round.

SSD's draft process times each loop iteration that serves one round (the
request, building the tree, decoding it, populating the cache) and prints the
mean as "Avg draft step time (ms)". A row that carries that number as
``draft_step_s`` is compared with the simulated counterpart: the busy time of
the devices the draft runs on (its compute spans, the backup's included), per
decode round, on the busiest of them.
"""

from __future__ import annotations

from analyses.calibrate.accepted import matched_config
from analyses.calibrate.sources import runnable
from analyses.run.api import baseline_config, run_schedule
from hwprofiles import Platform
from hwprofiles.schema import resolve


def draft_devices(row, platform: Platform) -> tuple[str, ...]:
    """The devices of the row's draft placement (a group's members, or one device)."""
    where = resolve(platform, row.placement).get("draft")
    members = {g.name: tuple(g.members) for g in platform.groups}
    return members.get(where, (where,))


def simulate_row_full(row, platform: Platform, values=None) -> tuple[float, float | None]:
    """The simulated counterpart of a row's printed number (tokens/s, ms per
    token, or the speedup over the row's AR baseline on the same platform) and, where it has
    ``draft_step_s``, the simulated draft time per round (seconds); None where
    it has none. A row that prints its mean accepted tokens is simulated at the
    acceptance that matches them (analyses.calibrate.accepted)."""
    row = runnable(row)[0]  # a stack that is not shipped is priced as the default
    wants_step = row.draft_step_s is not None
    config = matched_config(row.config(values), getattr(row, "mean_accepted_tokens", None),
                            platform)
    result = run_schedule(config, record_spans=wants_step, platform=platform)
    value = result.tokens / result.time_s
    if getattr(row, "time_per_token_ms", None) is not None:  # one sequence's ms per token
        value = 1e3 * config.batch / value
    if getattr(row, "batch_latency_s", None) is not None:  # the batch end to end
        value = result.prefill_s + result.time_s
    if getattr(row, "speedup", None) is not None:
        base = run_schedule(baseline_config(config), record_spans=False, platform=platform)
        if getattr(row, "speedup_of", "decode") == "end_to_end":  # prefill included
            value = (base.prefill_s + base.time_s) / (result.prefill_s + result.time_s)
        else:
            value /= base.tokens / base.time_s
    if not wants_step:
        return value, None
    busy: dict[str, float] = {d: 0.0 for d in draft_devices(row, platform)}
    for span in result.spans:
        if span.kind == "compute" and span.device in busy:
            busy[span.device] += span.duration_s
    return value, max(busy.values()) / max(result.steps, 1)
