"""A run's metrics, the record's ``metrics``, simulated or measured.

``run_metrics`` is the common part of every run's metrics (what ran, tokens, time,
steps); the simulator (analyses.run.api) and the executor (executors.measure) add
their own (prefill, outcome rates, acceptance). ``add_speedup`` is the only place
``speedup_vs_ar`` is computed (against the run ``policies.base.baseline_of``
names). Time: a simulated run's decoding time is ``simulated_time_s``; a measured
run's is ``wall_s`` (records written before the rename also carry it as
``simulated_time_s``: ``elapsed_s`` reads both). ``stops_paying`` finds where a
speedup against batch crosses 1 (a comparison's sweep and the published series).
"""

from __future__ import annotations

import math
import os

from policies.runs.config import RunSettings


def run_metrics(config: RunSettings, *, tokens: float, time_s: float, steps: int,
                rows_per_step: float, measured: bool = False) -> dict:
    """What ran and how fast: tokens, decoding time, tokens/s, steps, tokens per
    step of one row, step latency."""
    out = {"policy": config.policy, "platform": config.platform, "target": config.target,
           "draft": config.draft, "batch": config.batch, "seed": config.seed,
           "deterministic": False if measured else config.deterministic}
    if measured:
        out["measured"] = True
    whole = isinstance(tokens, float) and tokens.is_integer()
    out.update({"tokens": int(tokens) if whole else tokens,
                ("wall_s" if measured else "simulated_time_s"): time_s,
                "tokens_per_s": tokens / time_s if time_s else 0.0, "steps": steps,
                "mean_tokens_per_step": tokens / (steps * rows_per_step),
                "step_latency_s": time_s / steps})
    return out


def elapsed_s(metrics: dict) -> float | None:
    """A run's decoding time: ``wall_s`` when measured, ``simulated_time_s`` when
    simulated or measured before the rename."""
    value = metrics.get("wall_s", metrics.get("simulated_time_s"))
    return None if value is None else float(value)


def add_speedup(metrics: dict, ar_tokens_per_s: float | None = None, *,
                own_baseline: bool = False) -> dict:
    """Add ``speedup_vs_ar``: tokens/s over the baseline's (which is added as
    ``ar_tokens_per_s``); 1.0 for a run that is its own baseline; None when no
    baseline ran."""
    if ar_tokens_per_s is not None:
        metrics["ar_tokens_per_s"] = ar_tokens_per_s
        metrics["speedup_vs_ar"] = metrics["tokens_per_s"] / ar_tokens_per_s
    else:
        metrics["speedup_vs_ar"] = 1.0 if own_baseline else None
    return metrics


def load_1m() -> float | None:
    """The machine's 1-minute load average (None where the system has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def stops_paying(batches, speedups) -> tuple[int | None, int | None, float | None]:
    """(stops_at, pays_until, estimate) of speedups over increasing batches: the
    first batch from which every speedup is below 1, the batch before it, and the
    batch where the speedup is 1 by linear interpolation in log(batch)."""
    stops = None
    for i in range(len(batches) - 1, -1, -1):
        if speedups[i] >= 1.0:
            break
        stops = i
    if stops is None:
        return None, None, None
    if stops == 0:
        return batches[0], None, None
    b0, b1 = math.log(batches[stops - 1]), math.log(batches[stops])
    s0, s1 = speedups[stops - 1], speedups[stops]
    at = b0 + (b1 - b0) * (s0 - 1.0) / (s0 - s1)
    return batches[stops], batches[stops - 1], math.exp(at)
